"""``baton api``, ``baton worker`` and ``baton setup``: the processes of a deployment and
the one-time setup of its Temporal namespace.

The worker and the API are imported inside the commands, after the settings checks,
so a refusal is quick and ``baton --help`` loads neither.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Annotated

import typer

from baton.settings import Settings
from cli.common import console, one_line_errors

app = typer.Typer()


@app.command()
def api(
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
) -> None:
    """Serve the HTTP API (uvicorn) until Ctrl-C / SIGTERM; the database and Temporal are
    checked first, and a failure is one line and exit 1."""
    from baton.settings import get_settings
    from worker.factory import describe_target, temporal_connect_config
    from worker.stack import run_services

    with one_line_errors():
        settings = get_settings()
        settings.review_key()  # auth mode needs BATON_REVIEW_SECRET: say so, exit 1
        target = describe_target(temporal_connect_config(settings))
    console.print(f"API on http://{host}:{port} · Temporal {target}", soft_wrap=True)
    serve_alone(
        settings,
        lambda stop: run_services(settings, stop=stop, api_host=host, api_port=port, worker=False),
    )


def serve(settings: Settings, main: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Run a long-lived service; startup failures become one line and exit 1.

    An unreachable database is named by its redacted URL and the driver's first
    line (the password never reaches the terminal); Temporal and settings errors
    are already one-line :class:`BatonError`s.
    """
    from sqlalchemy.exc import OperationalError

    from baton.errors import DatabaseUnavailable

    with one_line_errors():
        try:
            run_until_signal(main)
        except OperationalError as exc:
            reason = str(exc.orig).strip().splitlines()[0] if str(exc.orig).strip() else ""
            msg = f"cannot reach the database at {settings.database_url_redacted}: {reason}"
            raise DatabaseUnavailable(msg) from exc


def serve_alone(settings: Settings, main: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """:func:`serve` for a process that owns nothing else (`baton worker`, `baton api`):
    it leaves without finalizing the interpreter, exit 0 after a clean stop and the failed
    start's one line and exit 1 otherwise.

    The Temporal bridge's own threads outlive the client (a connect abandoned at its
    timeout, a drained worker's runtime), and finalizing the interpreter under them can
    abort the process after everything was done (pyo3 "interpreter is not initialized",
    CPython "PyGILState_Release … finalizing"), turning a clean stop into a crash. So
    what finalizing would have done that matters — flushing spans, logs and the standard
    streams — is done here, and the process ends with ``os._exit``.
    """
    from baton import telemetry

    code = 0
    try:
        serve(settings, main)
    except typer.Exit as failed:
        code = failed.exit_code
    telemetry.shutdown()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_until_signal(main: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Run ``main(stop)`` on a fresh loop; Ctrl-C / SIGTERM set ``stop`` for a clean exit."""

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await main(stop)

    asyncio.run(runner())


@app.command()
def worker() -> None:
    """Run a worker for BATON_TASK_QUEUE until Ctrl-C / SIGTERM (in-flight activities get
    BATON_WORKER_GRACEFUL_SHUTDOWN_S to finish); startup failures are one line, exit 1."""
    from baton.settings import get_settings

    with one_line_errors():
        settings = get_settings()
        settings.review_key()  # auth mode needs BATON_REVIEW_SECRET: say so, exit 1
    # Heavy (workflows, models): after the checks, so a refusal is quick.
    from worker.factory import describe_target, temporal_connect_config
    from worker.stack import run_services

    with one_line_errors():
        target = describe_target(temporal_connect_config(settings))
    versioned = (
        f" · deployment {settings.worker_deployment} build {settings.build_id}"
        if settings.worker_deployment
        else ""
    )
    console.print(
        f"worker on task queue [bold]{settings.task_queue}[/] at {target}{versioned}",
        soft_wrap=True,
    )
    serve_alone(settings, lambda stop: run_services(settings, stop=stop))


@app.command()
def setup() -> None:
    """Register Baton's search attributes on the configured Temporal namespace."""
    from baton.settings import get_settings
    from worker.factory import connect, ensure_search_attributes

    async def main() -> list[str]:
        settings = get_settings()
        client = await connect(settings)
        return await ensure_search_attributes(client, client.namespace)

    with one_line_errors():
        added = asyncio.run(main())
    console.print(f"search attributes added: {', '.join(added) or 'none (all present)'}")
