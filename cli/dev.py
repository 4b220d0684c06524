"""``baton dev`` and ``baton demo``: the whole stack embedded in one process (a Temporal
dev server, a worker and the API) for a laptop, and the main job end to end on it."""

from __future__ import annotations

import contextlib
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import httpx
import typer
from rich.markup import escape
from rich.table import Table

from baton.settings import Settings
from cli.agents import apply_file
from cli.common import EXAMPLES, STATE_DIR, checked, console, err_console, one_line_errors
from cli.db import upgrade_schema
from cli.services import serve
from cli.sessions import follow, print_transcript, render_trace

app = typer.Typer()


def stop_cleanly_on_sigterm() -> None:
    """SIGTERM while the embedded stack starts (before the services install their own
    graceful handler) exits through the ``finally`` blocks, so the Temporal dev server is
    stopped rather than orphaned; the default action killed the process outright."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))


@contextlib.contextmanager
def embedded_temporal(
    settings: Settings, *, port: int, ui_port: int, db_file: Path | None
) -> Iterator[Settings]:
    """Run a Temporal dev server; yields ``settings`` pointed at it, stops it on exit."""
    from worker.stack import DevServer

    server = DevServer(
        port=port, ui_port=ui_port, db_file=db_file, log_file=STATE_DIR / "temporal.log"
    )
    with console.status("Starting the Temporal dev server …"):
        try:
            server.start()
        except (RuntimeError, FileNotFoundError) as exc:
            err_console.print(f"[bold red]error[/] {escape(str(exc))}")
            raise typer.Exit(1) from exc
    try:
        yield settings.model_copy(
            # The embedded server is plain and local: a user's Temporal CLI profile
            # (TLS, API key, another namespace) must not apply to it.
            update={
                "temporal_address": server.address,
                "temporal_ui_url": server.ui_url,
                "temporal_namespace": server.namespace,
                "temporal_env_config": False,
            }
        )
    finally:
        server.stop()


@app.command()
def dev(
    port: Annotated[int, typer.Option(help="API port.")] = 8000,
    temporal_port: Annotated[int, typer.Option(help="Temporal frontend port.")] = 7233,
    ui_port: Annotated[int, typer.Option(help="Temporal Web UI port.")] = 8233,
) -> None:
    """The whole embedded stack: Temporal dev server, worker and API, until Ctrl-C."""
    from baton.settings import get_settings
    from worker.stack import StateLock, port_free, run_services

    stop_cleanly_on_sigterm()

    with one_line_errors():
        settings = get_settings()
        settings.review_key()  # auth mode needs BATON_REVIEW_SECRET: say so, exit 1
    lock = StateLock(STATE_DIR)
    if not lock.acquire():
        err_console.print(
            f"[bold red]error[/] another `baton dev` or `baton demo` is using {STATE_DIR}/ "
            "(stop it, or run from another folder)"
        )
        raise typer.Exit(1)
    if not port_free(port):
        err_console.print(f"[bold red]error[/] API port {port} is already in use (--port)")
        raise typer.Exit(1)
    with one_line_errors():
        upgrade_schema(settings, quiet=True)
    with embedded_temporal(
        settings, port=temporal_port, ui_port=ui_port, db_file=STATE_DIR / "temporal.db"
    ) as cfg:
        console.print(
            f"[bold green]Baton is up[/]  API http://127.0.0.1:{port}  "
            f"Console http://127.0.0.1:{port}/ui  "
            f"Temporal {cfg.temporal_address}  "
            f"Temporal UI {cfg.temporal_ui_url}  (Ctrl-C to stop)"
        )
        serve(cfg, lambda stop: run_services(cfg, stop=stop, api_port=port))
    lock.release()
    console.print("stopped")


DEMO_PROMPT = "Research question: what is 17 * 23, and is the result prime?"


TEAM_PROMPT = "Team: write a short report on the claim that 17 * 23 = 391."


def _demo_team(http: httpx.Client) -> bool:
    """Demo part 2: a team run of ``research-desk``. The lead fans out to its two members
    in parallel, then asks the researcher with invoke_agent, which waits on a policy
    review that the demo approves through the API; then the transcript, the trace, the
    invoked session's provenance and the audit log. Returns whether the turn failed."""
    console.rule(f"[bold]team research-desk[/] ← {escape(TEAM_PROMPT)}")
    resp = http.post("/v1/sessions", json={"team": "research-desk", "prompt": TEAM_PROMPT})
    session = checked(resp)
    session_id = str(session["session_id"])

    def approve(review: dict[str, str]) -> None:
        console.print(
            f"  [dim]approving through the API: POST /v1/reviews/{review['review_id']}"
            '/decision {"decision": "allow_once"}[/]'
        )
        body = checked(
            http.post(
                f"/v1/reviews/{review['review_id']}/decision", json={"decision": "allow_once"}
            )
        )
        console.print(f"  [dim]→ {body['status']} by {body['decided_by']}[/]")

    _, failed = follow(http, session_id, on_review=approve)
    print_transcript(http, session_id)
    console.print(render_trace(checked(http.get(f"/v1/sessions/{session_id}/trace"))))
    invoked = http.get("/v1/sessions", params={"agent": "researcher", "limit": 1}).json()
    for row in invoked["data"]:
        console.print(
            f"invoked session {row['session_id']}: name '{row['name']}', invoked_by_agent="
            f"{row['invoked_by_agent']}, parent_session_id={row['parent_session_id']}"
        )
    audit = http.get("/v1/audit", params={"session_id": session_id}).json()
    table = Table("caller", "operation", "target", "outcome", "decided by", title="Audit log")
    for a in audit["data"]:
        table.add_row(a["caller"], a["operation"], a["target"] or "", a["outcome"], a["decided_by"])
    console.print(table)
    console.print(f"Temporal UI: {session['workflow_url']}", soft_wrap=True)
    base = str(http.base_url).rstrip("/")
    console.print(f"Web console: {base}/ui/sessions/{session_id}", soft_wrap=True)
    return failed


@app.command()
def demo(
    file: Annotated[Path, typer.Option("--file", "-f", help="Agents to apply.")] = EXAMPLES,
    agent: Annotated[str, typer.Option(help="Agent to talk to.")] = "researcher",
    prompt: Annotated[str, typer.Option(help="First message.")] = DEMO_PROMPT,
) -> None:
    """The main job end to end on the embedded stack: apply, launch, stream, transcript."""
    from baton.settings import get_settings

    stop_cleanly_on_sigterm()
    from worker.stack import ServicesThread, StateLock, pick_port, port_free

    with one_line_errors():
        settings = get_settings()
        settings.review_key()  # auth mode needs BATON_REVIEW_SECRET: say so, exit 1
    lock = StateLock(STATE_DIR)
    why_in_memory = (
        "another stack owns .baton/"
        if not lock.acquire()
        else "port 7233 or 8233 is taken"
        if not (port_free(7233) and port_free(8233))
        else ""
    )
    db_file: Path | None = STATE_DIR / "temporal.db"
    if why_in_memory:
        # Another stack owns .baton/: run on a throwaway DB and in-memory Temporal, so
        # no session row ever points at a workflow that server does not have.
        scratch = Path(tempfile.mkdtemp(prefix="baton-demo-"))
        settings = settings.model_copy(update={"database_url": f"sqlite:///{scratch}/baton.db"})
        db_file = None
    with one_line_errors():
        upgrade_schema(settings, quiet=True)
        apply_file(file, settings)
    with embedded_temporal(
        settings, port=pick_port(7233), ui_port=pick_port(8233), db_file=db_file
    ) as cfg:
        services = ServicesThread(cfg, api_port=pick_port(8000))
        with console.status("Starting the worker and the API …"):
            services.start()
        try:
            with httpx.Client(base_url=services.api_url, timeout=120) as http:
                console.rule(f"[bold]{agent}[/] ← {escape(prompt)}")
                resp = http.post("/v1/sessions", json={"agent": agent, "prompt": prompt})
                if resp.status_code >= 400:
                    err_console.print(f"[bold red]error[/] {escape(resp.text)}")
                    raise typer.Exit(1)
                session = resp.json()
                _, failed = follow(http, session["session_id"])
                print_transcript(http, session["session_id"])
                usage = http.get(f"/v1/sessions/{session['session_id']}").json()
                console.print(
                    f"tokens in/out: {usage['input_tokens']}/{usage['output_tokens']} · "
                    f"model: {cfg.model or 'scripted (offline)'}"
                )
                console.print(f"Temporal UI: {session['workflow_url']}", soft_wrap=True)
                failed = _demo_team(http) or failed
                if db_file is None:
                    console.print(
                        f"[dim]({why_in_memory}: this demo ran on a scratch database and an "
                        "in-memory Temporal; its UI links end with it)[/]"
                    )
                else:
                    console.print("[dim]`baton dev` serves this history again from .baton/[/]")
                if failed:
                    raise typer.Exit(1)
        finally:
            services.stop()
    lock.release()
