"""The FastAPI app factory: ``api.app:create_app``.

Resources live in the lifespan (DB engine now; the Temporal client once
sessions exist), never at import time.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.openapi.utils import get_openapi
from temporalio.client import Client

from api.mcp import MountedMCP
from api.problems import (
    PROBLEM_JSON,
    document_common_problems,
    install_problem_handlers,
    problem_response,
)
from api.routers import agents, reviews, sessions, steps, teams
from baton.db import make_engine
from baton.migrate import require_current
from baton.settings import Settings, get_settings


def _openapi(app: FastAPI) -> dict[str, Any]:
    """OpenAPI with 422s documented as problem+json (FastAPI's default shape is not ours),
    and the 400/401/403 problems every route can give (:func:`document_common_problems`)."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=app.routes
    )
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            responses = operation.get("responses", {})
            if "422" in responses:
                responses["422"] = {
                    "description": "Malformed request (problem+json naming the field)",
                    "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}},
                }
    document_common_problems(schema)
    components = schema.get("components", {}).get("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        components.pop(unused, None)
    app.openapi_schema = schema
    return schema


#: Largest request body accepted (bytes).
MAX_BODY_BYTES = 8 * 1024 * 1024


def create_app(settings: Settings | None = None, *, temporal: Client | None = None) -> FastAPI:
    """Build the API. ``settings`` defaults to :func:`baton.settings.get_settings`.

    ``temporal`` is a connected client to share (the dev stack and tests pass
    theirs); otherwise the app connects on the first request that needs it.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        cfg = settings or get_settings()
        cfg.review_key()  # auth mode without BATON_REVIEW_SECRET: refuse to start, clearly
        engine = make_engine(cfg.database_url)
        require_current(engine)  # refuse a database behind the code (issue 11)
        app.state.settings = cfg
        app.state.engine = engine
        app.state.temporal = temporal
        app.state.temporal_lock = asyncio.Lock()
        try:
            async with mcp.running():  # issue 13: the `agents` MCP server's sessions
                yield
        finally:
            engine.dispose()

    mcp = MountedMCP()
    app = FastAPI(
        title="Baton",
        version="0.1.0",
        description="Durable multi-agent orchestration on Temporal.",
        lifespan=lifespan,
    )
    install_problem_handlers(app)

    @app.middleware("http")
    async def limit_body(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        # Refuse oversized bodies before reading them (the largest valid spec is far smaller).
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > MAX_BODY_BYTES:
            return problem_response(
                {
                    "type": "about:blank",
                    "title": "Payload too large",
                    "status": 413,
                    "detail": f"request bodies are limited to {MAX_BODY_BYTES} bytes",
                    "code": "payload_too_large",
                }
            )
        return await call_next(request)

    @app.get("/healthz", tags=["ops"], summary="Liveness")
    def healthz() -> dict[str, str]:
        """``{"status": "ok"}`` while the process serves requests."""
        return {"status": "ok"}

    app.include_router(agents.router)
    app.include_router(sessions.router)
    app.include_router(reviews.router)
    app.include_router(reviews.audit_router)
    app.include_router(teams.router)
    app.include_router(steps.router)
    app.include_router(steps.usage_router)
    app.router.routes.append(mcp.route)  # /mcp: the `agents` MCP server (issue 13)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app
