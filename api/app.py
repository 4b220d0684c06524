"""The FastAPI app factory: ``api.app:create_app``.

Resources live in the lifespan (DB engine now; the Temporal client once
sessions exist), never at import time.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from sqlalchemy import text
from sqlalchemy.engine import Engine
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.client import Client

from api import docs, ui
from api.deps import app_temporal
from api.limits import BodyLimit
from api.mcp import MountedMCP
from api.problems import (
    PROBLEM_JSON,
    document_common_problems,
    install_problem_handlers,
    problem_response,
)
from api.routers import agents, inquiries, reviews, sessions, steps, teams
from baton import telemetry
from baton.errors import EngineUnavailable
from baton.settings import Settings, get_settings
from baton.storage.db import make_engine
from baton.storage.migrate import require_current
from baton.storage.notify import EventNotifier


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


#: Seconds each readiness check (database, Temporal) may take before it counts as failed.
READY_CHECK_TIMEOUT_S = 5.0


def _ping_database(engine: Engine) -> None:
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))


async def readiness_checks(state: Any) -> dict[str, str]:
    """``{"database": "ok" | reason, "temporal": "ok" | reason}`` for ``/readyz``.

    Both checks run concurrently, each bounded by :data:`READY_CHECK_TIMEOUT_S`; a
    reason is one line naming the error type (URLs and keys are never included).
    """

    async def database() -> str:
        await asyncio.wait_for(
            asyncio.to_thread(_ping_database, state.engine), READY_CHECK_TIMEOUT_S
        )
        return "ok"

    async def temporal() -> str:
        client = await asyncio.wait_for(app_temporal(state), READY_CHECK_TIMEOUT_S)
        await client.workflow_service.get_system_info(
            GetSystemInfoRequest(), timeout=timedelta(seconds=READY_CHECK_TIMEOUT_S)
        )
        return "ok"

    async def run(check: Callable[[], Awaitable[str]]) -> str:
        try:
            return await check()
        except TimeoutError:
            return f"no answer within {READY_CHECK_TIMEOUT_S:g} s"
        except EngineUnavailable as exc:
            return exc.detail
        except Exception as exc:  # any failure is "not ready", never a 500
            return f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"

    db, tp = await asyncio.gather(run(database), run(temporal))
    return {"database": db, "temporal": tp}


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
        # Issue 14: SSE followers wait on this, not on a poll loop each.
        app.state.notifier = EventNotifier(engine)
        try:
            async with mcp.running():  # issue 13: the `agents` MCP server's sessions
                yield
        finally:
            await app.state.notifier.close()
            engine.dispose()

    mcp = MountedMCP()
    app = FastAPI(
        title="Baton",
        version="0.1.0",
        description="Durable multi-agent orchestration on Temporal.",
        lifespan=lifespan,
        docs_url=None,  # served offline by api.docs (issue 12, item 7)
        redoc_url=None,  # ReDoc would load its script from a CDN
    )
    install_problem_handlers(app)
    docs.install(app)

    # Refuse oversized bodies, declared or streamed (the largest valid spec is far smaller).
    app.add_middleware(BodyLimit, max_bytes=MAX_BODY_BYTES)

    # Issue 12 item 6: outermost, so every answer (a 413 above included) is counted.
    request_metrics = telemetry.RequestMetrics()
    app.add_middleware(telemetry.MeteredApp, metrics=request_metrics)

    @app.get("/metrics", tags=["ops"], summary="Prometheus metrics", include_in_schema=False)
    def metrics() -> Response:
        """This API process's request metrics in the Prometheus text format
        (:class:`baton.telemetry.RequestMetrics`). Unauthenticated, like the probes."""
        body, content_type = request_metrics.render()
        return Response(body, media_type=content_type)

    @app.get("/healthz", tags=["ops"], summary="Liveness")
    def healthz() -> dict[str, str]:
        """``{"status": "ok"}`` while the process serves requests."""
        return {"status": "ok"}

    @app.get(
        "/readyz",
        tags=["ops"],
        summary="Readiness",
        responses={503: {"content": {PROBLEM_JSON: {}}, "description": "Not ready"}},
    )
    async def readyz(request: Request) -> Response:
        """200 ``{"status": "ready", "checks": {"database": "ok", "temporal": "ok"}}`` when
        the database answers ``SELECT 1`` and Temporal answers ``GetSystemInfo``, each
        within :data:`READY_CHECK_TIMEOUT_S`; else 503 problem+json ``not_ready`` whose
        ``checks`` name what failed and why (no secrets). Unauthenticated: probes call it.
        """
        checks = await readiness_checks(request.app.state)
        if all(v == "ok" for v in checks.values()):
            return JSONResponse({"status": "ready", "checks": checks})
        failed = "; ".join(f"{k}: {v}" for k, v in checks.items() if v != "ok")
        return problem_response(
            {
                "type": "about:blank",
                "title": "Not ready",
                "status": 503,
                "detail": failed,
                "code": "not_ready",
                "checks": checks,
            }
        )

    app.include_router(agents.router)
    app.include_router(sessions.router)
    app.include_router(inquiries.router)
    ui.install(app)  # the web console at /ui (issue 15)
    app.include_router(reviews.router)
    app.include_router(reviews.audit_router)
    app.include_router(teams.router)
    app.include_router(steps.router)
    app.include_router(steps.usage_router)
    app.router.routes.append(mcp.route)  # /mcp: the `agents` MCP server (issue 13)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    telemetry.instrument_app(app)  # issue 12 item 5: server spans when OTEL_* turns tracing on
    return app
