"""The FastAPI app factory: ``api.app:create_app``.

Resources live in the lifespan (DB engine now; the Temporal client once
sessions exist), never at import time.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from importlib.metadata import version
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from sqlalchemy import text
from sqlalchemy.engine import Engine
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.client import Client

from activities.webhooks import DeliveryStarter
from api import docs, idempotency, ui
from api.deps import app_temporal
from api.feeds import SessionFeeds
from api.limits import BodyLimit
from api.mcp import MountedMCP
from api.problems import (
    PROBLEM_JSON,
    document_common_problems,
    install_problem_handlers,
    problem_response,
)
from api.routers import (
    agents,
    evals,
    files,
    inquiries,
    reviews,
    sessions,
    steps,
    teams,
    webhooks,
)
from baton import telemetry
from baton.errors import EngineUnavailable
from baton.runs import metering
from baton.settings import Settings, get_settings
from baton.storage.db import make_engine, session_scope
from baton.storage.migrate import require_current
from baton.storage.notify import EventNotifier
from baton.workspaces.store import WorkspaceStore


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
    idempotency.document(schema)
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


def _install_probes(app: FastAPI, request_metrics: telemetry.RequestMetrics) -> None:
    """The unauthenticated operations routes: ``/metrics`` (Prometheus), ``/healthz``
    (liveness) and ``/readyz`` (readiness: the database and Temporal answer)."""

    @app.get("/metrics", tags=["ops"], summary="Prometheus metrics", include_in_schema=False)
    def metrics() -> Response:
        """This API process's request metrics and the organisation's balance (read now)
        in the Prometheus text format (:class:`baton.telemetry.RequestMetrics`).
        Unauthenticated, like the probes."""
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
        require_current(engine)  # refuse a database behind the code (run `baton db upgrade`)
        app.state.settings = cfg
        app.state.engine = engine
        app.state.workspaces = WorkspaceStore.from_settings(cfg)
        app.state.temporal = temporal
        app.state.temporal_lock = asyncio.Lock()
        # SSE followers wait on this, not on a poll loop each.
        app.state.notifier = EventNotifier(engine)
        # ... and share one reader per followed session (api.feeds).
        app.state.feeds = SessionFeeds(engine, app.state.notifier)
        # Deliveries this process queues (a test-send, a review cancelled here) start on
        # its Temporal client, connected on first use.
        DeliveryStarter(
            lambda: app_temporal(app.state),
            loop=asyncio.get_running_loop(),
            config=cfg.webhook_config(),
            task_queue=cfg.task_queue,
        ).install(engine)
        try:
            async with mcp.running():  # the `agents` MCP server's sessions
                yield
        finally:
            await app.state.notifier.close()
            engine.dispose()

    mcp = MountedMCP()
    app = FastAPI(
        title="Baton",
        version=version("baton"),  # the release (pyproject.toml), as `baton --version`
        description="Durable multi-agent orchestration on Temporal.",
        lifespan=lifespan,
        docs_url=None,  # served offline by api.docs (no CDN)
        redoc_url=None,  # ReDoc would load its script from a CDN
    )
    install_problem_handlers(app)
    docs.install(app)
    # Inside the body limit and the metrics: a refused body never claims a key.
    idempotency.install(app)

    # Refuse oversized bodies, declared or streamed (the largest valid spec is far smaller).
    # A workspace upload is bounded by its route (BATON_WORKSPACE_MAX_FILE_BYTES) instead.
    app.add_middleware(BodyLimit, max_bytes=MAX_BODY_BYTES)

    def read_balance() -> float | None:
        engine: Engine | None = getattr(app.state, "engine", None)
        if engine is None:  # scraped before the lifespan opened the database
            return None
        with session_scope(engine) as s:
            return metering.get_balance(s)

    # Outermost, so every answer (a 413 above included) is counted.
    request_metrics = telemetry.RequestMetrics(balance=read_balance)
    app.add_middleware(telemetry.MeteredApp, metrics=request_metrics)

    _install_probes(app, request_metrics)

    app.include_router(agents.router)
    app.include_router(evals.router)
    app.include_router(sessions.router)
    app.include_router(files.router)
    app.include_router(inquiries.router)
    ui.install(app)  # the web console at /ui
    app.include_router(reviews.router)
    app.include_router(reviews.audit_router)
    app.include_router(teams.router)
    app.include_router(webhooks.router)
    app.include_router(steps.router)
    app.include_router(steps.usage_router)
    app.router.routes.append(mcp.route)  # /mcp: the `agents` MCP server
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    telemetry.instrument_app(app)  # server spans when OTEL_* turns tracing on
    return app
