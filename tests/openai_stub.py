"""A local stand-in for the OpenAI Chat Completions API, spoken over real HTTP and SSE.

Tests point ``OPENAI_BASE_URL`` at it so that Baton's real-model path (pydantic-ai,
the OpenAI SDK, httpx) runs unchanged. Its behaviour is scripted:

* answered requests whose last message is a ``tool`` result get the text
  ``The result is <tool content>.``, streamed in several deltas;
* any other request gets a ``calculator`` tool call with arguments
  ``{"expression": "2 + 2"}`` (or the ``tool`` it was built with), the arguments JSON
  split across several deltas;
* with ``reply`` set, every request gets that text at once (an instant model: the
  benchmarks' model, bench/peer.py);
* ``failures`` holds HTTP statuses answered (with an OpenAI-style error body)
  before the stub behaves, one per request.

Every request body is recorded in ``requests`` (and its headers in ``headers``),
failed ones included.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

#: Token counts the stub reports for every answered request.
PROMPT_TOKENS = 17
COMPLETION_TOKENS = 9

TOOL_NAME = "calculator"
TOOL_ARGUMENTS = '{"expression": "2 + 2"}'

_ERRORS: dict[int, dict[str, Any]] = {
    400: {"message": "Invalid request.", "type": "invalid_request_error", "code": None},
    401: {
        "message": "Incorrect API key provided: test-key. You can find your API key at "
        "https://platform.openai.com/account/api-keys.",
        "type": "invalid_request_error",
        "code": "invalid_api_key",
    },
    429: {
        "message": "Rate limit reached for requests.",
        "type": "requests",
        "code": "rate_limit_exceeded",
    },
    500: {
        "message": "The server had an error while processing your request. Sorry about that!",
        "type": "server_error",
        "code": None,
    },
}


def error_body(status: int) -> dict[str, Any]:
    """The JSON body OpenAI answers a failed request with."""
    error = _ERRORS.get(status, {"message": f"HTTP {status}", "type": "api_error", "code": None})
    return {"error": {**error, "param": None}}


def _text_of(content: Any) -> str:
    """A message's content as text: a string, or the text parts of a content list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _split(text: str, parts: int) -> list[str]:
    """``text`` cut into ``parts`` non-empty consecutive pieces (fewer if it is short)."""
    size = max(1, -(-len(text) // parts))
    return [text[i : i + size] for i in range(0, len(text), size)]


class OpenAIStub:
    """The scripted server: ``app`` is the ASGI app, ``requests`` what it received."""

    def __init__(
        self,
        *,
        failures: Iterable[int] = (),
        model: str = "stub-model",
        tool: tuple[str, str] = (TOOL_NAME, TOOL_ARGUMENTS),
        reply: str | None = None,
    ) -> None:
        self.model = model
        #: When set, the text every request is answered with (never a tool call).
        self.reply = reply
        #: The tool call (name, JSON arguments) it answers a request with.
        self.tool = tool
        self.failures: deque[int] = deque(failures)
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self._lock = threading.Lock()
        self.app = Starlette(
            routes=[Route("/v1/chat/completions", self._completions, methods=["POST"])]
        )

    # --- the endpoint -------------------------------------------------------------

    async def _completions(self, request: Request) -> Response:
        body: dict[str, Any] = await request.json()
        with self._lock:
            self.requests.append(body)
            self.headers.append(dict(request.headers))
            number = len(self.requests)
            failure = self.failures.popleft() if self.failures else None
        if failure is not None:
            return JSONResponse(error_body(failure), status_code=failure)
        completion_id = f"chatcmpl-stub{number:04d}"
        messages: list[dict[str, Any]] = body.get("messages") or []
        last = messages[-1] if messages else {}
        if self.reply is not None:
            reply: str | None = self.reply
            call: dict[str, Any] | None = None
        elif last.get("role") == "tool":
            reply = f"The result is {_text_of(last.get('content'))}."
            call = None
        else:
            reply = None
            name, arguments = self.tool
            call = {"id": f"call_stub{number:04d}", "name": name, "arguments": arguments}
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(
                self._stream(completion_id, reply, call, include_usage),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        return JSONResponse(self._completion(completion_id, reply, call))

    # --- response shapes ----------------------------------------------------------

    def _usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": PROMPT_TOKENS,
            "completion_tokens": COMPLETION_TOKENS,
            "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
        }

    def _completion(
        self, completion_id: str, reply: str | None, call: dict[str, Any] | None
    ) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply, "refusal": None}
        if call is not None:
            message["tool_calls"] = [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["name"], "arguments": call["arguments"]},
                }
            ]
        return {
            "id": completion_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "system_fingerprint": "fp_stub",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": "tool_calls" if call else "stop",
                }
            ],
            "usage": self._usage(),
        }

    async def _stream(
        self,
        completion_id: str,
        reply: str | None,
        call: dict[str, Any] | None,
        include_usage: bool,
    ) -> AsyncIterator[str]:
        created = int(time.time())

        def chunk(delta: dict[str, Any] | None, finish: str | None = None, **extra: Any) -> str:
            data: dict[str, Any] = {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": self.model,
                "system_fingerprint": "fp_stub",
                "choices": []
                if delta is None
                else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
            }
            if include_usage:
                data["usage"] = None
            data.update(extra)
            return f"data: {json.dumps(data)}\n\n"

        if call is not None:
            first, *rest = _split(call["arguments"], 4)
            yield chunk(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": call["id"],
                            "type": "function",
                            "function": {"name": call["name"], "arguments": ""},
                        }
                    ],
                    "refusal": None,
                }
            )
            for piece in [first, *rest]:
                yield chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
            yield chunk({}, "tool_calls")
        else:
            yield chunk({"role": "assistant", "content": "", "refusal": None})
            for word in _words(reply or ""):
                yield chunk({"content": word})
            yield chunk({}, "stop")
        if include_usage:
            yield chunk(None, usage=self._usage())
        yield "data: [DONE]\n\n"


def _words(text: str) -> list[str]:
    """``"The result is 4."`` → ``["The", " result", " is", " 4."]``, as a model streams it."""
    words = text.split(" ")
    return [words[0], *(f" {w}" for w in words[1:])] if words else []
