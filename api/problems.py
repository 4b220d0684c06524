"""RFC 9457 problem+json: the one error shape every route answers with.

Domain errors map by type (:class:`baton.errors.BatonError` carries ``code`` and
``status``); request validation errors become 422 ``validation_error`` naming
the field, except the removed ``maxFanout`` field, which is a 400
``removed_field`` like every other publish-time spec error. A database error is mapped by
its own handler (503 ``database_unavailable``, 409 ``concurrent_modification``) and anything
else unexpected by :class:`UnexpectedErrors` (500 ``internal_error``): neither re-raises, so
each is logged once and the client's connection stays open.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from baton.errors import (
    BatonError,
    RemovedField,
    from_database_error,
    spec_error,
    validation_entries,
)

PROBLEM_JSON = "application/problem+json"
log = logging.getLogger("baton.api")


class Problem(BaseModel):
    """An RFC 9457 problem document with Baton's machine-readable ``code``."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "examples": [
                {
                    "type": "https://baton.dev/problems/tree-too-deep",
                    "title": "Invalid agent spec",
                    "status": 400,
                    "detail": "subagent tree is 7 levels deep at 'leaf'; at most 6 are allowed",
                    "code": "tree_too_deep",
                    "path": "subagents[0].subagents[0].subagents[0].subagents[0]"
                    ".subagents[0].subagents[0]",
                }
            ]
        },
    )

    type: str = "about:blank"
    title: str
    status: int
    detail: str
    code: str = Field(description="Stable machine-readable error code.")
    path: str | None = Field(default=None, description="Where in the request the problem is.")


def problem_response(body: dict[str, Any]) -> JSONResponse:
    """A problem+json response with ``body['status']`` as status."""
    return JSONResponse(body, status_code=int(body["status"]), media_type=PROBLEM_JSON)


def _validation_problem(exc: RequestValidationError) -> dict[str, Any]:
    entries = validation_entries(exc.errors()) or [
        {"path": "", "type": "invalid", "message": "invalid request"}
    ]
    error = spec_error(entries)
    if isinstance(error, RemovedField):
        return error.to_problem()
    body = error.to_problem()
    body.update(
        type="https://baton.dev/problems/validation-error",
        title="Malformed request",
        status=422,
        code="validation_error",
    )
    return body


def install_problem_handlers(app: FastAPI) -> None:
    """Make every error response problem+json."""

    @app.exception_handler(BatonError)
    async def _baton_error(_request: Request, exc: BatonError) -> JSONResponse:
        response = problem_response(exc.to_problem())
        if exc.status == 401:  # RFC 9110 §11.6.1: a 401 names the scheme to use
            response.headers["WWW-Authenticate"] = 'Bearer realm="baton"'
        return response

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return problem_response(_validation_problem(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        codes = {400: "malformed_body", 404: "not_found", 405: "method_not_allowed"}
        return problem_response(
            {
                "type": "about:blank",
                "title": str(exc.detail),
                "status": exc.status_code,
                "detail": str(exc.detail),
                "code": codes.get(exc.status_code, f"http_{exc.status_code}"),
            }
        )

    # A handler of its own, not the catch-all: Starlette's ServerErrorMiddleware (which runs
    # the handler of `Exception`) re-raises after answering, so uvicorn logged a traceback
    # for every 503 and dropped the keep-alive connection under the client's next request.
    @app.exception_handler(SQLAlchemyError)
    async def _database(request: Request, exc: SQLAlchemyError) -> JSONResponse:
        mapped = from_database_error(exc)
        if mapped is None:
            return _internal_error(request.method, request.url.path)
        log.warning("%s %s: %s", request.method, request.url.path, mapped.detail)
        return problem_response(mapped.to_problem())

    app.add_middleware(UnexpectedErrors)  # first added, so innermost: inside the others


INTERNAL_ERROR = {
    "type": "about:blank",
    "title": "Internal server error",
    "status": 500,
    "detail": "an unexpected error occurred; it has been logged",
    "code": "internal_error",
}


def _internal_error(method: str, path: str) -> JSONResponse:
    """Log the exception being handled (one record, with its traceback) and answer the
    500 problem ``internal_error``, which tells nothing of the failure."""
    log.exception("unhandled error on %s %s", method, path)
    return problem_response(dict(INTERNAL_ERROR))


class UnexpectedErrors:
    """A pure ASGI middleware answering 500 problem+json ``internal_error`` for an exception
    no handler mapped, and keeping the connection: the exception stops here, so uvicorn
    neither logs it a second time nor closes the keep-alive connection (Starlette's own
    catch-all, ServerErrorMiddleware, always re-raises after answering). Installed by
    :func:`install_problem_handlers` as the innermost middleware, so the body limit and
    the request metrics see the 500 like any answer. When the response had already started
    (a stream failing midway) the exception goes on: closing the connection is then the
    only way to tell the client the body is cut."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self._app(scope, receive, sending)
        except Exception:
            if started:
                raise
            response = _internal_error(scope["method"], scope["path"])
            await response(scope, receive, send)


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries documenting problem+json for ``statuses``."""
    return {
        status: {"model": Problem, "content": {PROBLEM_JSON: {}}, "description": "Problem"}
        for status in statuses
    }


def _problem_entry(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}},
    }


#: What every /v1 route can answer besides its own problems: the
#: caller's identity (auth mode), the caller's rights on a named resource or on the
#: organisation (auth mode), and a body FastAPI cannot read at all.
UNAUTHORIZED = "Auth mode: no or an unknown bearer token (`unauthorized`)"
FORBIDDEN = (
    "Auth mode: the caller lacks the role this needs on the agent, session, step, review "
    "or team it names (`forbidden`), or the setting is organisation-wide (`admin_only`)"
)
MALFORMED_BODY = (
    "The body cannot be read: not UTF-8, or nested past the JSON parser's limit (`malformed_body`)"
)


def document_common_problems(schema: dict[str, Any]) -> None:
    """Add to an OpenAPI document the problem responses no route declares itself.

    Every ``/v1`` operation: 401 (``get_caller`` runs on all of them). Every ``/v1``
    operation that names a resource (a path parameter) or takes a body: 403 (the ACL of
    Gamut X-Agent Policies, or ``admin_only``). Every operation with a request body: 400
    ``malformed_body`` (FastAPI's own answer to an unreadable body; a 400 a route
    already documents, such as an invalid spec, gets this added to its description).
    Lists and GET /v1/balance filter instead of refusing, so they get no 403.
    """
    for path, operations in schema.get("paths", {}).items():
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            has_body = "requestBody" in operation
            if has_body:
                if "400" in responses:
                    responses["400"]["description"] += f"; or: {MALFORMED_BODY}"
                else:
                    responses["400"] = _problem_entry(MALFORMED_BODY)
            if not path.startswith("/v1/"):
                continue
            responses.setdefault("401", _problem_entry(UNAUTHORIZED))
            names_resource = any(p.get("in") == "path" for p in operation.get("parameters", []))
            if names_resource or has_body:
                responses.setdefault("403", _problem_entry(FORBIDDEN))
