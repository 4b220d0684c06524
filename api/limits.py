"""The request-body bound of the API: one ASGI wrapper every route sits behind."""

from __future__ import annotations

import re
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.problems import problem_response

#: A workspace upload: ``PUT /v1/sessions/{id}/files/{path}`` (docs/workspaces.md).
UPLOAD_PATH = re.compile(r"^/v1/sessions/session-[0-9a-f-]{36}/files/.")


def too_large(max_bytes: int) -> Any:
    """The 413 problem+json (code ``payload_too_large``) of a body over ``max_bytes``."""
    return problem_response(
        {
            "type": "about:blank",
            "title": "Payload too large",
            "status": 413,
            "detail": f"request bodies are limited to {max_bytes} bytes",
            "code": "payload_too_large",
        }
    )


class BodyLimit:
    """Refuse request bodies over ``max_bytes`` with 413 ``payload_too_large``.

    A declared ``Content-Length`` over the bound is refused before anything is read.
    A body without one (``Transfer-Encoding: chunked``) is counted as it arrives: past
    the bound the app is handed an empty end of body (so nothing more is buffered, in
    memory or in a spooled upload) and whatever it answers is replaced by the 413.
    Checking the header alone let any client stream an unbounded body into the process.
    """

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self._app = app
        self._max = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        if scope.get("method") == "PUT" and UPLOAD_PATH.match(scope.get("path", "")):
            # A workspace upload: its route reads the body against the workspace's own
            # bound (BATON_WORKSPACE_MAX_FILE_BYTES) and stops past it (file_too_large).
            await self._app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > self._max:
                await too_large(self._max)(scope, receive, send)
                return
        seen = 0
        exceeded = False

        async def counted() -> Message:
            nonlocal seen, exceeded
            if exceeded:
                return {"type": "http.request", "body": b"", "more_body": False}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self._max:
                    exceeded = True
                    return {"type": "http.request", "body": b"", "more_body": False}
            return message

        started = False

        async def guarded(message: Message) -> None:
            nonlocal started
            if exceeded:
                if not started:
                    started = True
                    await too_large(self._max)(scope, _nothing, send)
                return  # the app's own answer to a truncated body is dropped
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self._app(scope, counted, guarded)


async def _nothing() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}
