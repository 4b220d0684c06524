"""``baton dev`` and ``baton demo``: the whole stack embedded in one process (a Temporal
dev server, a worker and the API) for a laptop, and the main job end to end on it."""

from __future__ import annotations

import contextlib
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import httpx
import typer
from rich.markup import escape
from rich.table import Table

from baton.settings import Settings
from cli.agents import apply_through_api, print_results
from cli.common import EXAMPLES, STATE_DIR, checked, console, err_console, one_line_errors
from cli.db import upgrade_schema
from cli.services import serve
from cli.sessions import follow, print_transcript, render_trace
from cli.webhooks import LocalReceiver

if TYPE_CHECKING:
    from baton.agents.apply import ApplyFile

app = typer.Typer()


def stop_cleanly_on_sigterm() -> None:
    """SIGTERM while the embedded stack starts (before the services install their own
    graceful handler) exits through the ``finally`` blocks, so the Temporal dev server is
    stopped rather than orphaned; the default action killed the process outright."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))


#: How a user moves each port of the embedded stack, named in the one-line refusal of a
#: taken one: `baton dev`/`baton demo` options, and the Make variables of `make demo`.
PORT_FLAGS = {
    "API": "--port, make demo PORT=…",
    "Temporal frontend": "--temporal-port, make demo TEMPORAL_PORT=…",
    "Temporal Web UI": "--ui-port, make demo UI_PORT=…",
}


def link_to_embedded_api(settings: Settings, port: int) -> Settings:
    """``settings`` whose webhook payload links point at the embedded API on ``port``,
    unless BATON_PUBLIC_URL names another address. The embedded API and worker take their
    webhook settings from this object (``Settings.webhook_config``), which was read before
    the port was known: an environment variable set now would reach neither."""
    if settings.public_url:
        return settings
    return settings.model_copy(update={"public_url": f"http://127.0.0.1:{port}"})


def port_taken(port: int, what: str) -> typer.Exit:
    """Print ``error <what> port N is already in use (flag)`` and return the exit to raise."""
    err_console.print(
        f"[bold red]error[/] {what} port {port} is already in use ({PORT_FLAGS[what]})",
        highlight=False,
    )
    return typer.Exit(1)


@contextlib.contextmanager
def embedded_temporal(
    settings: Settings, *, state_dir: Path, port: int, ui_port: int, db_file: Path | None
) -> Iterator[Settings]:
    """Run a Temporal dev server (logging to ``state_dir``/temporal.log); yields
    ``settings`` pointed at it, on the task queue of ``state_dir`` (unless
    BATON_TASK_QUEUE names one), and stops it on exit. A taken port or a failed start
    is one line and exit 1."""
    from worker.stack import DevServer, PortInUse, stack_task_queue

    state_dir.mkdir(parents=True, exist_ok=True)
    server = DevServer(
        port=port, ui_port=ui_port, db_file=db_file, log_file=state_dir / "temporal.log"
    )
    with console.status("Starting the Temporal dev server …"):
        try:
            server.start()
        except PortInUse as exc:
            raise port_taken(exc.port, exc.what) from exc
        except (RuntimeError, FileNotFoundError) as exc:
            err_console.print(f"[bold red]error[/] {escape(str(exc))}")
            raise typer.Exit(1) from exc
    explicit_queue = "task_queue" in settings.model_fields_set
    try:
        yield settings.model_copy(
            # The embedded server is plain and local: a user's Temporal CLI profile
            # (TLS, API key, another namespace) must not apply to it.
            update={
                "temporal_address": server.address,
                "temporal_ui_url": server.ui_url,
                "temporal_namespace": server.namespace,
                "temporal_env_config": False,
                "task_queue": settings.task_queue
                if explicit_queue
                else stack_task_queue(state_dir),
            }
        )
    finally:
        server.stop()


def banner(cfg: Settings, port: int) -> None:
    """The one line of `baton dev` with every address, printed once the API accepts
    connections; off the default port it says what the CLI needs to find the API."""
    console.print(
        f"[bold green]Baton is up[/]  API http://127.0.0.1:{port}  "
        f"Console http://127.0.0.1:{port}/ui  "
        f"Temporal {cfg.temporal_address}  "
        f"Temporal UI {cfg.temporal_ui_url}  task queue {cfg.task_queue}  (Ctrl-C to stop)",
        soft_wrap=True,
    )
    url = f"http://127.0.0.1:{port}"
    if cfg.api_url.rstrip("/") != url:
        console.print(
            f"[dim]the CLI finds this API with: export BATON_API_URL={url}[/]", soft_wrap=True
        )


@app.command()
def dev(
    port: Annotated[int, typer.Option(help="API port.")] = 8000,
    temporal_port: Annotated[int, typer.Option(help="Temporal frontend port.")] = 7233,
    ui_port: Annotated[int, typer.Option(help="Temporal Web UI port.")] = 8233,
) -> None:
    """The whole embedded stack: Temporal dev server, worker and API, until Ctrl-C.

    A taken port is one line and exit 1; the stack polls a task queue of its own,
    named after its state folder (.baton/), so no other stack's worker takes its work."""
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
        raise port_taken(port, "API")
    with one_line_errors():
        upgrade_schema(settings, quiet=True)
    settings = link_to_embedded_api(settings, port)
    with embedded_temporal(
        settings,
        state_dir=STATE_DIR,
        port=temporal_port,
        ui_port=ui_port,
        db_file=STATE_DIR / "temporal.db",
    ) as cfg:
        serve(
            cfg,
            lambda stop: run_services(
                cfg, stop=stop, api_port=port, on_ready=lambda: banner(cfg, port)
            ),
        )
    lock.release()
    console.print("stopped")


DEMO_PROMPT = "Research question: what is 17 * 23, and is the result prime?"


TEAM_PROMPT = "Team: write a short report on the claim that 17 * 23 = 391."


def run_problems(node: dict[str, Any]) -> list[str]:
    """What went wrong in a run, from its trace (``GET /v1/sessions/{id}/trace``): each
    session that failed or was cancelled and each delegation that did not complete, as
    ``agent: what`` lines; empty for a run that went as planned."""
    problems = []
    delegation = node.get("delegation") or {}
    if delegation and delegation.get("status") != "completed":
        error = f": {delegation['error']}" if delegation.get("error") else ""
        problems.append(f"{node['agent']}: delegation {delegation.get('status')}{error}")
    if node.get("status") in ("failed", "cancelled"):
        problems.append(f"{node['agent']}: session {node['status']}")
    for child in node.get("children") or []:
        problems += run_problems(child)
    return problems


def _demo_team(http: httpx.Client) -> list[str]:
    """Demo part 2: a team run of ``research-desk``. The lead fans out to its two members
    in parallel, then asks the researcher with invoke_agent, which waits on a policy
    review that the demo approves through the API; then the transcript, the trace, the
    invoked session's provenance and the audit log. Returns what went wrong (an error
    turn, a review not allowed, a failed delegation or session): empty when all went well."""
    console.rule(f"[bold]team research-desk[/] ← {escape(TEAM_PROMPT)}")
    resp = http.post("/v1/sessions", json={"team": "research-desk", "prompt": TEAM_PROMPT})
    session = checked(resp)
    session_id = str(session["session_id"])
    problems: list[str] = []

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
        if body["status"] != "allowed":
            problems.append(f"review {review['review_id']}: {body['status']}")

    _, failed = follow(http, session_id, on_review=approve)
    if failed:
        problems.append("the team run's turn ended in an error")
    print_transcript(http, session_id)
    trace = checked(http.get(f"/v1/sessions/{session_id}/trace"))
    console.print(render_trace(trace))
    problems += run_problems(trace)
    invoked = checked(http.get("/v1/sessions", params={"agent": "researcher", "limit": 1}))
    for row in invoked["data"]:  # type: ignore[attr-defined]
        console.print(
            f"invoked session {row['session_id']}: name '{row['name']}', invoked_by_agent="
            f"{row['invoked_by_agent']}, parent_session_id={row['parent_session_id']}"
        )
    audit = checked(http.get("/v1/audit", params={"session_id": session_id}))
    table = Table("caller", "operation", "target", "outcome", "decided by", title="Audit log")
    for a in audit["data"]:  # type: ignore[attr-defined]
        table.add_row(a["caller"], a["operation"], a["target"] or "", a["outcome"], a["decided_by"])
    console.print(table)
    console.print(f"Temporal UI: {session['workflow_url']}", soft_wrap=True)
    base = str(http.base_url).rstrip("/")
    console.print(f"Web console: {base}/ui/sessions/{session_id}", soft_wrap=True)
    return problems


def _demo_ports(
    port: int | None, temporal_port: int | None, ui_port: int | None
) -> tuple[int, int, int, bool]:
    """The demo's API, Temporal and UI ports, and whether a default Temporal port (7233,
    8233) was taken so another was picked. A port given explicitly must be free (else
    one line, exit 1); one left out is its default when free, else any free port."""
    from worker.stack import pick_port, port_free

    chosen = []
    for given, default, what in (
        (port, 8000, "API"),
        (temporal_port, 7233, "Temporal frontend"),
        (ui_port, 8233, "Temporal Web UI"),
    ):
        if given is not None and not port_free(given):
            raise port_taken(given, what)
        chosen.append(given if given is not None else pick_port(default))
    moved = (temporal_port is None and chosen[1] != 7233) or (ui_port is None and chosen[2] != 8233)
    return chosen[0], chosen[1], chosen[2], moved


@app.command()
def demo(
    file: Annotated[Path, typer.Option("--file", "-f", help="Agents to apply.")] = EXAMPLES,
    agent: Annotated[str, typer.Option(help="Agent to talk to.")] = "researcher",
    prompt: Annotated[str, typer.Option(help="First message.")] = DEMO_PROMPT,
    port: Annotated[
        int | None, typer.Option(help="API port (default 8000, or a free one).")
    ] = None,
    temporal_port: Annotated[
        int | None, typer.Option(help="Temporal frontend port (default 7233, or a free one).")
    ] = None,
    ui_port: Annotated[
        int | None, typer.Option(help="Temporal Web UI port (default 8233, or a free one).")
    ] = None,
) -> None:
    """The main job end to end on the embedded stack: apply (through the API), launch,
    stream, transcript, then a team run with a review. Exits 1 when any step fails."""
    from baton.agents.apply import load_apply_file
    from baton.settings import get_settings

    stop_cleanly_on_sigterm()
    from worker.stack import ServicesThread, StateLock

    with one_line_errors():
        settings = get_settings()
        settings.review_key()  # auth mode needs BATON_REVIEW_SECRET: say so, exit 1
        doc = load_apply_file(file)  # a bad file fails before anything starts
    api_port, t_port, u_port, moved = _demo_ports(port, temporal_port, ui_port)
    lock = StateLock(STATE_DIR)
    why_in_memory = (
        "another stack owns .baton/"
        if not lock.acquire()
        else "port 7233 or 8233 is taken"
        if moved
        else ""
    )
    state_dir = STATE_DIR
    db_file: Path | None = STATE_DIR / "temporal.db"
    if why_in_memory:
        # Another stack owns .baton/: run on a throwaway DB and in-memory Temporal, so
        # no session row ever points at a workflow that server does not have.
        state_dir = Path(tempfile.mkdtemp(prefix="baton-demo-"))
        settings = settings.model_copy(update={"database_url": f"sqlite:///{state_dir}/baton.db"})
        db_file = None
    with one_line_errors():
        upgrade_schema(settings, quiet=True)
    settings = link_to_embedded_api(settings, api_port)
    with embedded_temporal(
        settings, state_dir=state_dir, port=t_port, ui_port=u_port, db_file=db_file
    ) as cfg:
        services = ServicesThread(cfg, api_port=api_port)
        with console.status("Starting the worker and the API …"):
            try:
                services.start()
            except RuntimeError as exc:  # one line, as every other failed start
                err_console.print(f"[bold red]error[/] {escape(str(exc))}", highlight=False)
                raise typer.Exit(1) from exc
        try:
            with httpx.Client(base_url=services.api_url, timeout=120) as http:
                problems = _demo_steps(http, cfg, file, doc, agent, prompt)
                if why_in_memory:
                    console.print(
                        f"[dim]({why_in_memory}: this demo ran on a scratch database and an "
                        "in-memory Temporal; its UI links end with it)[/]"
                    )
                else:
                    console.print("[dim]`baton dev` serves this history again from .baton/[/]")
                if problems:
                    for line in problems:
                        err_console.print(f"[bold red]error[/] {escape(line)}", highlight=False)
                    raise typer.Exit(1)
        finally:
            services.stop()
    lock.release()


def _demo_steps(
    http: httpx.Client, cfg: Settings, file: Path, doc: ApplyFile, agent: str, prompt: str
) -> list[str]:
    """Apply ``file`` through the API (as `baton apply` does), talk to ``agent``, then
    the team run. Returns what went wrong; an HTTP refusal exits 1 at once."""
    with one_line_errors():
        print_results(file, apply_through_api(http, doc))
    console.rule(f"[bold]{agent}[/] ← {escape(prompt)}")
    session = checked(http.post("/v1/sessions", json={"agent": agent, "prompt": prompt}))
    session_id = str(session["session_id"])
    _, failed = follow(http, session_id)
    problems = [f"{agent}: the turn ended in an error"] if failed else []
    print_transcript(http, session_id)
    usage = checked(http.get(f"/v1/sessions/{session_id}"))
    console.print(
        f"tokens in/out: {usage['input_tokens']}/{usage['output_tokens']} · "
        f"model: {cfg.model or 'scripted (offline)'}"
    )
    console.print(f"Temporal UI: {session['workflow_url']}", soft_wrap=True)
    problems += run_problems(checked(http.get(f"/v1/sessions/{session_id}/trace")))
    with LocalReceiver() as receiver:
        hook = checked(
            http.post(
                "/v1/webhooks",
                json={
                    "url": receiver.url,
                    "events": ["review.opened", "review.resolved"],
                    "team": "research-desk",
                    "description": "make demo",
                },
            )
        )
        receiver.secret = str(hook["secret"])
        console.print(
            f"[dim]webhook {hook['id']}: review events of research-desk → {receiver.url}[/]"
        )
        try:
            team_problems = _demo_team(http)
            problems += team_problems + _demo_deliveries(http, receiver, str(hook["id"]))
            if not receiver.received and not team_problems:
                problems.append("webhooks: the team run's review sent no delivery")
        finally:
            # The receiver ends with the demo: a subscription left behind would retry.
            checked(http.delete(f"/v1/webhooks/{hook['id']}"))
    return problems


#: Seconds the demo waits for its review's two webhook deliveries after the team run.
DELIVERY_WAIT_S = 60.0


def _demo_deliveries(http: httpx.Client, receiver: LocalReceiver, webhook_id: str) -> list[str]:
    """Demo part 3: the signed deliveries the local receiver got for the team run's review
    (review.opened, review.resolved), and the delivery log. Returns what went wrong."""
    queued = checked(http.get(f"/v1/webhooks/{webhook_id}/deliveries"))["count"]
    assert isinstance(queued, int)  # every delivery queued so far: the events are committed
    arrived = receiver.wait_for(queued, DELIVERY_WAIT_S)
    console.rule("[bold]webhook deliveries[/] (Standard Webhooks signatures verified)")
    for payload in receiver.received.values():
        data = payload["data"]
        assert isinstance(data, dict)
        what = f"{data.get('caller')} → {data.get('operation')} {data.get('target') or ''}"
        outcome = f" · {data['status']}" if "status" in data else ""
        console.print(f"{payload['type']} {payload['id']}: {what}{outcome}", highlight=False)
        if "links" in data and "decision" in data["links"]:
            console.print(f"  decide at: POST {data['links']['decision']}", soft_wrap=True)
    log = checked(http.get(f"/v1/webhooks/{webhook_id}/deliveries"))
    for d in log["data"]:  # type: ignore[attr-defined]
        console.print(f"  [dim]log: {d['id']} {d['status']} after {d['attempts']} attempt(s)[/]")
    if not arrived or receiver.refused:
        return [f"webhooks: {len(receiver.received)} of {queued} deliveries verified"]
    return []
