"""The ``baton`` command line (Typer + Rich)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, cast

import httpx
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree
from typer.core import TyperGroup

from baton.contracts import ResolvedAgent, ResolvedNode
from baton.errors import BatonError
from baton.settings import Settings

if TYPE_CHECKING:
    from sqlmodel import Session

app = typer.Typer(
    name="baton",
    help="Durable multi-agent orchestration on Temporal.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True, soft_wrap=True)

EXAMPLES = Path("examples/agents.yaml")
STATE_DIR = Path(".baton")


def _fail(exc: BatonError) -> typer.Exit:
    """Print ``exc`` as ``error [code] at path: detail`` and return the exit to raise."""
    where = f" at {exc.path}" if exc.path and exc.path not in exc.detail else ""
    err_console.print(
        f"[bold red]error[/] {escape(f'[{exc.code}]{where}: {exc.detail}')}", highlight=False
    )
    return typer.Exit(code=1)


@contextlib.contextmanager
def _errors() -> Iterator[None]:
    """Turn domain, settings and database errors into one-line messages and exit 1."""
    from pydantic import ValidationError
    from sqlalchemy.exc import ArgumentError, SQLAlchemyError

    from baton.errors import InvalidSettings, from_database_error

    try:
        yield
    except BatonError as exc:
        raise _fail(exc) from exc
    except ValidationError as exc:  # only settings are validated outside BatonError paths
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "settings"
        msg = f"BATON_{where.upper()}: {first['msg']}"
        raise _fail(InvalidSettings(msg)) from exc
    except ArgumentError as exc:
        raise _fail(InvalidSettings(f"BATON_DATABASE_URL: {exc}")) from exc
    except SQLAlchemyError as exc:
        mapped = from_database_error(exc)
        if mapped is None:
            raise
        raise _fail(mapped) from exc


def _apply(path: Path, settings: Settings | None = None) -> None:
    from baton.agents.apply import apply_agents, load_apply_file
    from baton.settings import get_settings
    from baton.storage.db import init_db, make_engine, session_scope

    settings = settings or get_settings()
    with console.status(f"Applying {path} to {settings.database_url_redacted} …"):
        doc = load_apply_file(path)
        engine = make_engine(settings.database_url)
        try:
            init_db(engine)
            with session_scope(engine) as session:
                results = apply_agents(session, doc=doc)
        finally:
            engine.dispose()
    table = Table("slug", "version", "change", title=f"Applied {path}")
    style = {"created": "green", "published": "yellow", "updated": "cyan", "unchanged": "dim"}
    for r in results:
        table.add_row(r.slug, str(r.version), f"[{style[r.change]}]{r.change}[/]")
    console.print(table)


@app.command()
def apply(
    file: Annotated[Path, typer.Option("--file", "-f", help="YAML file with an `agents:` list.")],
) -> None:
    """Create or update drafts and publish every agent in FILE (idempotent, all or nothing)."""
    try:
        _apply(file)
    except BatonError as exc:
        raise _fail(exc) from exc


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

    with _errors():
        settings = get_settings()
        settings.review_key()  # auth mode needs BATON_REVIEW_SECRET: say so, exit 1
        target = describe_target(temporal_connect_config(settings))
    console.print(f"API on http://{host}:{port} · Temporal {target}", soft_wrap=True)
    _serve(
        settings,
        lambda stop: run_services(settings, stop=stop, api_host=host, api_port=port, worker=False),
    )


def _serve(settings: Settings, main: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Run a long-lived service; startup failures become one line and exit 1.

    An unreachable database is named by its redacted URL and the driver's first
    line (the password never reaches the terminal); Temporal and settings errors
    are already one-line :class:`BatonError`s.
    """
    from sqlalchemy.exc import OperationalError

    from baton.errors import DatabaseUnavailable

    with _errors():
        try:
            _run_until_signal(main)
        except OperationalError as exc:
            reason = str(exc.orig).strip().splitlines()[0] if str(exc.orig).strip() else ""
            msg = f"cannot reach the database at {settings.database_url_redacted}: {reason}"
            raise DatabaseUnavailable(msg) from exc


def _node_tree(parent: Tree, node: ResolvedNode) -> None:
    tools = ", ".join(node.tools) or "no tools"
    branch = parent.add(f"[bold]{node.alias}[/] → {node.agent}@{node.version} ({tools})")
    for child in node.subagents:
        _node_tree(branch, child)


def render_resolved(agent: ResolvedAgent) -> Tree:
    """A Rich tree of a resolved agent: prompt, model, chain, tools, limits, subagents."""
    tree = Tree(f"[bold cyan]{agent.pin}[/] {escape(agent.name)} [dim]{agent.digest[:19]}…[/]")
    lines = agent.system_prompt.strip().splitlines() or ["—"]
    more = " …" if len(lines) > 1 else ""
    tree.add(f"prompt: {escape(lines[0])}{more}")
    tree.add(f"model: {agent.model or 'deployment default'}")
    if len(agent.inheritance) > 1:
        tree.add(f"extends: {' → '.join(agent.inheritance[1:])}")
    tree.add(f"tools: {', '.join(agent.tools) or '—'}")
    if agent.blocked_tools:
        tree.add(f"blocked: {', '.join(agent.blocked_tools)}")
    if agent.skills:
        tree.add(f"skills: {', '.join(agent.skills)}")
    limits = agent.limits.model_dump(exclude_none=True)
    tree.add(f"limits: {limits or 'none'}")
    if agent.delegation.available_for_delegation:
        hint = agent.delegation.delegation_hint or agent.description
        tree.add(f"on the delegation roster: {escape(hint)}")
    tree.add(f"workspace: {agent.workspace_sharing}")
    if agent.subagents:
        subs = tree.add("subagents")
        for node in agent.subagents:
            _node_tree(subs, node)
    return tree


@app.command()
def show(
    ref: Annotated[str, typer.Argument(help="slug or slug@version")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the resolved JSON.")] = False,
) -> None:
    """Print the resolved configuration of an agent revision."""
    from baton.agents.registry import resolve_agent
    from baton.settings import get_settings
    from baton.storage.db import init_db, make_engine, session_scope

    with _errors():
        engine = make_engine(get_settings().database_url)
        try:
            init_db(engine)
            with session_scope(engine) as session:
                resolved = resolve_agent(session, ref=ref)
        finally:
            engine.dispose()
    if as_json:
        console.print_json(resolved.model_dump_json())
    else:
        console.print(render_resolved(resolved))


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


def _run_until_signal(main: Callable[[asyncio.Event], Awaitable[None]]) -> None:
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

    with _errors():
        settings = get_settings()
        settings.review_key()  # auth mode needs BATON_REVIEW_SECRET: say so, exit 1
    # Heavy (workflows, models): after the checks, so a refusal is quick.
    from worker.factory import describe_target, temporal_connect_config
    from worker.stack import run_services

    with _errors():
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
    _serve(settings, lambda stop: run_services(settings, stop=stop))


@app.command()
def setup() -> None:
    """Register Baton's search attributes on the configured Temporal namespace."""
    from baton.settings import get_settings
    from worker.factory import connect, ensure_search_attributes

    async def main() -> list[str]:
        settings = get_settings()
        client = await connect(settings)
        return await ensure_search_attributes(client, client.namespace)

    with _errors():
        added = asyncio.run(main())
    console.print(f"search attributes added: {', '.join(added) or 'none (all present)'}")


# --- db: schema migrations (Alembic; issue 11) ---------------------------------

db_app = typer.Typer(help="The database schema: Alembic migrations (see deploy/README.md).")
app.add_typer(db_app, name="db")


def _upgrade(settings: Settings, *, revision: str = "head", quiet: bool = False) -> None:
    """Migrate the configured database to ``revision``; ``quiet`` prints only a change."""
    from baton.storage import migrate
    from baton.storage.db import make_engine

    engine = make_engine(settings.database_url)
    try:
        state = migrate.schema_state(engine)
        before, after = migrate.upgrade(engine, revision)
    finally:
        engine.dispose()
    if before != after:
        console.print(f"{state.describe()}: upgraded to {after}", soft_wrap=True, highlight=False)
    elif not quiet:
        console.print(f"{state.describe()}: nothing to do", soft_wrap=True, highlight=False)


@db_app.command("upgrade")
def db_upgrade(
    revision: Annotated[
        str, typer.Argument(help="Target revision (default: the newest).")
    ] = "head",
) -> None:
    """Migrate BATON_DATABASE_URL to the newest schema (idempotent; run it before a rollout).

    A database made before migrations existed is checked and adopted first.
    """
    from baton.settings import get_settings

    with _errors():
        _upgrade(get_settings(), revision=revision)


@db_app.command("current")
def db_current() -> None:
    """Print the database's schema revision and whether it is the one this Baton needs."""
    from baton.settings import get_settings
    from baton.storage import migrate
    from baton.storage.db import make_engine

    with _errors():
        engine = make_engine(get_settings().database_url)
        try:
            state = migrate.schema_state(engine)
        finally:
            engine.dispose()
    hint = "" if state.up_to_date or state.unknown else f": {migrate.UPGRADE_HINT}"
    console.print(state.describe() + hint, soft_wrap=True, highlight=False)


@db_app.command("downgrade")
def db_downgrade(
    revision: Annotated[
        str, typer.Argument(help="Target: a revision id, base (empty), or `-- -1` (one back).")
    ],
) -> None:
    """Migrate BATON_DATABASE_URL back to REVISION (stop every API and worker first)."""
    from baton.settings import get_settings
    from baton.storage import migrate
    from baton.storage.db import make_engine

    with _errors():
        engine = make_engine(get_settings().database_url)
        try:
            before, after = migrate.downgrade(engine, revision)
        finally:
            engine.dispose()
    console.print(f"downgraded {before} → {after or 'base (no schema)'}", highlight=False)


@db_app.command("history")
def db_history() -> None:
    """List the revisions this Baton ships, newest first."""
    from baton.storage import migrate

    for script in migrate.history():
        console.print(f"[bold]{script.revision}[/] {escape(script.doc)}", highlight=False)


@db_app.command("revision")
def db_revision(
    message: Annotated[str, typer.Option("--message", "-m", help="What the change is.")],
) -> None:
    """Write the next revision, autogenerated from the models (for developers; review it)."""
    from baton.storage import migrate

    path = migrate.new_revision(message)
    console.print(f"wrote {path}", soft_wrap=True, highlight=False)


@app.command()
def dev(
    port: Annotated[int, typer.Option(help="API port.")] = 8000,
    temporal_port: Annotated[int, typer.Option(help="Temporal frontend port.")] = 7233,
    ui_port: Annotated[int, typer.Option(help="Temporal Web UI port.")] = 8233,
) -> None:
    """The whole embedded stack: Temporal dev server, worker and API, until Ctrl-C."""
    from baton.settings import get_settings
    from worker.stack import StateLock, port_free, run_services

    with _errors():
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
    with _errors():
        _upgrade(settings, quiet=True)
    with embedded_temporal(
        settings, port=temporal_port, ui_port=ui_port, db_file=STATE_DIR / "temporal.db"
    ) as cfg:
        console.print(
            f"[bold green]Baton is up[/]  API http://127.0.0.1:{port}  "
            f"Console http://127.0.0.1:{port}/ui  "
            f"Temporal {cfg.temporal_address}  "
            f"Temporal UI {cfg.temporal_ui_url}  (Ctrl-C to stop)"
        )
        _serve(cfg, lambda stop: run_services(cfg, stop=stop, api_port=port))
    lock.release()
    console.print("stopped")


def follow(
    http: httpx.Client,
    session_id: str,
    after: int = 0,
    on_review: Callable[[dict[str, str]], None] | None = None,
) -> tuple[int, bool]:
    """Print a session's events until it is idle: streamed text, tool calls, reviews, status.

    ``on_review`` is called with each ``review_requested`` event's data, also those
    forwarded from the run's delegations (the demo approves there). Returns the last
    event id (to resume the next turn from) and whether the turn ended in an error.
    """
    last = after
    failed = False
    streaming: set[str] = set()
    headers = {"Last-Event-ID": str(after)}
    with http.stream(
        "GET", f"/v1/sessions/{session_id}/events?until=idle", headers=headers, timeout=None
    ) as resp:
        resp.raise_for_status()
        event: dict[str, str] = {}
        for line in resp.iter_lines():
            if line:
                key, _, value = line.partition(":")
                event[key] = value.strip()
                continue
            if "data" not in event:
                event = {}
                continue
            last = int(event.get("id", last))
            kind, data = event.get("event", ""), json.loads(event["data"])
            event = {}
            if kind == "chunk":
                streaming.add(data["message_id"])
                console.print(escape(data["text"]), end="", style="bold")
            elif kind == "message" and data["role"] == "assistant":
                if data["message_id"] not in streaming:
                    console.print(escape(data["text"]), end="", style="bold")
                console.print()
                for call in data.get("tool_calls") or []:
                    console.print(f"  [yellow]→ {call['name']}[/]({json.dumps(call['args'])})")
            elif kind == "message" and data["role"] == "tool":
                console.print(f"  [cyan]← {data['tool_name']}[/]: {escape(data['text'])}")
            elif kind == "message" and data["role"] == "error":
                failed = True
                console.print(f"  [red]error[/]: {escape(data['text'])}")
            elif kind == "status":
                console.print(f"[dim]· {data['status']}[/]")
            elif kind in ("review_requested", "delegation_review_requested"):
                target = f" → {data['target']}" if data.get("target") else ""
                console.print(
                    f"  [bold magenta]⏸ review[/] {escape(data['caller'])} wants to "
                    f"{data['operation']}{target}: {escape(data.get('preview') or '')} "
                    f"[dim]({data['review_id']})[/]"
                )
                if on_review is not None:
                    on_review(data)
                else:
                    console.print(f"    [dim]{escape(review_hint(data['review_id']))}[/]")
            elif kind == "delegation_start":
                console.print(
                    f"  [blue]⇢ {data.get('kind', 'delegation')} → {data['target_agent_id']}[/]"
                    f" (depth {data['depth']}): {escape(str(data['task']))[:100]}"
                )
            elif kind == "delegation_complete":
                outcome = data["status"] + (f": {data['error']}" if data.get("error") else "")
                console.print(
                    f"  [blue]⇠ {data['target_agent_id']} {escape(outcome)}[/] "
                    f"{escape(str(data.get('result_preview') or ''))[:100]}"
                )
            elif kind in ("review_resolved", "delegation_review_resolved"):
                console.print(
                    f"  [magenta]▶ review {data['status']}[/] by {escape(str(data['decided_by']))}"
                )
    return last, failed


def review_hint(review_id: str) -> str:
    """How to decide a review from the shell, and how long it waits (issue 12, item 7).

    The wait is this process's ``BATON_REVIEW_TIMEOUT`` (seconds): the worker that runs
    the session reads the same setting, after which the review is denied (seed 003).
    """
    from baton.settings import get_settings

    timeout = get_settings().review_timeout
    return (
        f"approve: baton reviews approve {review_id}  ·  deny: baton reviews deny {review_id}"
        f"  ·  denied automatically {timeout:g} s after it opened (BATON_REVIEW_TIMEOUT)"
    )


def print_transcript(http: httpx.Client, session_id: str) -> None:
    """The transcript as a Rich table."""
    body = http.get(f"/v1/sessions/{session_id}/transcript").json()
    table = Table("role", "agent", "text", title=f"Transcript · {body['status']}", show_lines=True)
    for m in body["messages"]:
        role = m["role"] + (f" ({m['tool_name']})" if m.get("tool_name") else "")
        text = m["text"]
        if m.get("tool_calls"):
            text += "\n" + ", ".join(f"→ {c['name']}" for c in m["tool_calls"])
        table.add_row(role, m["agent"], escape(text))
    console.print(table)


@app.command()
def run(
    ref: Annotated[
        str | None, typer.Argument(help="AGENT or AGENT@VERSION (omit with --team)")
    ] = None,
    prompt: Annotated[str, typer.Argument(help="The message.")] = "",
    team: Annotated[str | None, typer.Option(help="Run a team: its lead answers.")] = None,
    solo: Annotated[bool, typer.Option(help="No ad-hoc delegation in this session.")] = False,
    api_url: Annotated[
        str | None, typer.Option("--api", help="Baton API base URL (default BATON_API_URL).")
    ] = None,
) -> None:
    """Start a session on a running Baton (``baton dev``) and stream the reply.

    Sends BATON_TOKEN as the bearer token when set (auth mode).
    """
    if team and ref and not prompt:  # `baton run --team desk "prompt"`
        prompt, ref = ref, None
    body: dict[str, object] = {"prompt": prompt, "disable_delegation": solo}
    if team:
        body["team"] = team
    if ref:
        body["agent"] = ref
    with _api_client(api_url) as http:
        session = _checked(http.post("/v1/sessions", json=body))
        console.print(f"[dim]{session['session_id']} · {session['agent']}@{session['version']}[/]")
        _, failed = follow(http, str(session["session_id"]))
        console.print(f"[dim]{session['workflow_url']}[/]", soft_wrap=True)
        if failed:
            raise typer.Exit(1)


DEMO_PROMPT = "Research question: what is 17 * 23, and is the result prime?"


TEAM_PROMPT = "Team: write a short report on the claim that 17 * 23 = 391."


def _demo_team(http: httpx.Client) -> bool:
    """Demo part 2: a team run of ``research-desk``. The lead fans out to its two members
    in parallel, then asks the researcher with invoke_agent, which waits on a policy
    review that the demo approves through the API; then the transcript, the trace, the
    invoked session's provenance and the audit log. Returns whether the turn failed."""
    console.rule(f"[bold]team research-desk[/] ← {escape(TEAM_PROMPT)}")
    resp = http.post("/v1/sessions", json={"team": "research-desk", "prompt": TEAM_PROMPT})
    session = _checked(resp)
    session_id = str(session["session_id"])

    def approve(review: dict[str, str]) -> None:
        console.print(
            f"  [dim]approving through the API: POST /v1/reviews/{review['review_id']}"
            '/decision {"decision": "allow_once"}[/]'
        )
        body = _checked(
            http.post(
                f"/v1/reviews/{review['review_id']}/decision", json={"decision": "allow_once"}
            )
        )
        console.print(f"  [dim]→ {body['status']} by {body['decided_by']}[/]")

    _, failed = follow(http, session_id, on_review=approve)
    print_transcript(http, session_id)
    console.print(render_trace(_checked(http.get(f"/v1/sessions/{session_id}/trace"))))
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
    from worker.stack import ServicesThread, StateLock, pick_port, port_free

    with _errors():
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
    with _errors():
        _upgrade(settings, quiet=True)
        _apply(file, settings)
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


def _usage_line(u: dict[str, object]) -> str:
    """``tokens in/out · cost · model time`` of a trace node; an unpriced model's cost
    (``cost_usd`` null: no price known for it) reads "cost unknown", never $0."""
    cost = u.get("cost_usd")
    priced = f"${cost:.4f}" if isinstance(cost, int | float) else "unknown"
    return (
        f"tokens in/out {u['input_tokens']}/{u['output_tokens']} · cost {priced}"
        f" · model time {u['wall_ms']} ms"
    )


def render_trace(node: dict[str, object]) -> Tree:
    """The delegation tree (``GET /v1/sessions/{id}/trace``) as a Rich tree: per node the
    agent, the session's id and status, the delegation's kind and status, usage and the
    delegation's wall-clock time (issue 12, item 7)."""

    def label(n: dict[str, object]) -> str:
        d = n.get("delegation") or {}
        assert isinstance(d, dict)
        how = f"[blue]{d['kind']}[/] " if d else ""
        alias = f" ({d['alias']})" if d.get("alias") else ""
        outcome = f" · delegation {d['status']}" if d.get("status") else ""
        wall = f" · delegation wall {d['wall_ms']} ms" if d.get("wall_ms") is not None else ""
        step = n["usage"]
        assert isinstance(step, dict)
        text = (
            f"{how}[bold]{n['agent']}@{n['version']}[/]{alias} · session {n['session_id']}"
            f" ({n['status']}){outcome}\n{_usage_line(step)}{wall}"
        )
        if d.get("task"):
            text += f"\n[dim]{escape(str(d['task']))[:120]}[/]"
        if d.get("error"):
            text += f"\n[red]{escape(str(d['error']))[:160]}[/]"
        return text

    def grow(tree: Tree, n: dict[str, object]) -> None:
        for child in n.get("children") or []:  # type: ignore[attr-defined]
            grow(tree.add(label(child)), child)

    total = node["subtree_usage"]
    assert isinstance(total, dict)
    tree = Tree(f"{label(node)}\n[green]run total: {_usage_line(total)}[/]")
    grow(tree, node)
    return tree


@app.command()
def trace(
    session_id: Annotated[str, typer.Argument(help="session-… id (the run's root)")],
    api_url: Annotated[
        str | None, typer.Option("--api", help="Baton API base URL (default BATON_API_URL).")
    ] = None,
) -> None:
    """Print a session's delegation tree: who delegated to whom, tokens, cost, wall-clock."""
    with _api_client(api_url) as http:
        body = _checked(http.get(f"/v1/sessions/{session_id}/trace"))
    console.print(render_trace(body))


# --- steps, usage, balance (over the API) ---------------------------------------

ApiOption = Annotated[
    str | None, typer.Option("--api", help="Baton API base URL (default BATON_API_URL).")
]
STEP_DONE = ("completed", "failed", "rejected", "awaiting_handoff")
STEP_DECISIONS = ("approve", "revise", "reject")


class _StepGroup(TyperGroup):
    """``baton step``: ``run`` is the default subcommand, so ``baton step AGENT -i …``
    (the pre-issue-12 form) still runs a step; ``approve|revise|reject|run`` are the
    subcommands (an agent with one of those slugs: ``baton step run approve -i …``)."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:  # type: ignore[override]
        if args and args[0] not in self.commands and args[0] not in ctx.help_option_names:
            args = ["run", *args]
        return super().parse_args(ctx, args)


step_app = typer.Typer(
    cls=_StepGroup,
    help="Workflow-agent steps: run one (the default), decide its handoff (talks to the API).",
)
app.add_typer(step_app, name="step")


@step_app.command("run")
def step(
    ref: Annotated[str, typer.Argument(help="AGENT or AGENT@VERSION (a slug is pinned at launch)")],
    input_file: Annotated[
        Path, typer.Option("--input", "-i", help="The step's input: a text or JSON file.")
    ],
    schema: Annotated[
        Path | None, typer.Option(help="JSON Schema file the deliverable must validate against.")
    ] = None,
    handoff: Annotated[bool, typer.Option(help="Wait for a human's approval.")] = False,
    max_attempts: Annotated[int, typer.Option(help="Attempts (invalid deliverables).")] = 3,
    api_url: Annotated[
        str | None, typer.Option("--api", help="Baton API base URL (default BATON_API_URL).")
    ] = None,
) -> None:
    """Run an agent as a workflow-agent step and show its progress and deliverable."""
    import time

    try:
        text = input_file.read_text(encoding="utf-8")
        body: dict[str, object] = {"agent": ref, "handoff": handoff}
        try:
            body["input"] = json.loads(text) if input_file.suffix == ".json" else text
        except ValueError:
            body["input"] = text
        if schema is not None:
            body["output_schema"] = json.loads(schema.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        err_console.print(f"[bold red]error[/] cannot read the input or schema: {exc}")
        raise typer.Exit(1) from exc
    body["retry"] = {"max_attempts": max_attempts}
    with _api_client(api_url) as http:
        launched = _checked(http.post("/v1/steps", json=body))
        step_id = str(launched["step_id"])
        console.print(f"[dim]{step_id} · {launched['agent']}@{launched['version']}[/]")
        state: dict[str, object] = launched
        with console.status("running …") as spinner:
            while state["status"] not in STEP_DONE:
                time.sleep(0.5)
                state = _checked(http.get(f"/v1/steps/{step_id}"))
                spinner.update(f"{state['status']} · attempt {state.get('attempts', 0)}")
    console.print(f"status: [bold]{state['status']}[/] after {state['attempts']} attempt(s)")
    if state.get("deliverable") is not None:
        console.print_json(json.dumps(state["deliverable"]))
    if state.get("error"):
        console.print(f"[red]{escape(str(state['error']))}[/]")
    if state["status"] == "awaiting_handoff":
        console.print(
            f"decide: POST /v1/steps/{step_id}/handoff "
            '{"decision": "approve" | "revise" | "reject", "feedback": …}'
        )
        console.print(
            f"  or: baton step approve {step_id}  ·  baton step revise {step_id} "
            f'--feedback "…"  ·  baton step reject {step_id}',
            soft_wrap=True,
            highlight=False,
        )
    if state["status"] in ("failed", "rejected"):
        raise typer.Exit(1)


def _handoff(step_id: str, decision: str, feedback: str | None, api_url: str | None) -> None:
    """Deliver a handoff decision and print the step as the API returns it after it."""
    body: dict[str, object] = {"decision": decision}
    if feedback is not None:
        body["feedback"] = feedback
    with _api_client(api_url) as http:
        state = _checked(http.post(f"/v1/steps/{step_id}/handoff", json=body))
    console.print(
        f"{step_id}: {decision} → [bold]{state['status']}[/] after {state['attempts']} attempt(s)",
        soft_wrap=True,
        highlight=False,
    )


StepIdArg = Annotated[str, typer.Argument(help="step-… id (awaiting_handoff)")]
FeedbackOption = Annotated[
    str | None, typer.Option(help="Feedback for the agent (revise) or the reason (reject).")
]


@step_app.command("approve")
def step_approve(step_id: StepIdArg, api_url: ApiOption = None) -> None:
    """Accept the deliverable of a step awaiting handoff: it completes."""
    _handoff(step_id, "approve", None, api_url)


@step_app.command("revise")
def step_revise(
    step_id: StepIdArg, feedback: FeedbackOption = None, api_url: ApiOption = None
) -> None:
    """Send the deliverable back with feedback: the agent makes another attempt."""
    _handoff(step_id, "revise", feedback, api_url)


@step_app.command("reject")
def step_reject(
    step_id: StepIdArg, feedback: FeedbackOption = None, api_url: ApiOption = None
) -> None:
    """Refuse the deliverable: the step ends rejected."""
    _handoff(step_id, "reject", feedback, api_url)


@app.command()
def usage(
    by: Annotated[str, typer.Option(help="agent | session | step | day | model")] = "agent",
    api_url: Annotated[
        str | None, typer.Option("--api", help="Baton API base URL (default BATON_API_URL).")
    ] = None,
) -> None:
    """Metered model usage (tokens, cost) grouped by agent, session, step, day or model."""
    with _api_client(api_url) as http:
        body = _checked(http.get("/v1/usage", params={"group_by": by}))
        balance = _checked(http.get("/v1/balance"))["balance"]
    table = Table(by, "requests", "tokens in", "tokens out", "cost (USD)", title="Usage")
    for g in body["data"]:  # type: ignore[attr-defined]
        table.add_row(
            g["key"],
            str(g["requests"]),
            str(g["input_tokens"]),
            str(g["output_tokens"]),
            "unknown" if g["cost_usd"] is None else f"{g['cost_usd']:.6f}",
        )
    console.print(table)
    console.print("balance: " + ("unlimited" if balance is None else f"${balance:.4f}"))


# --- reviews (over the API), users and tokens (on the database) -----------------

reviews_app = typer.Typer(help="Decide X-Agent policy reviews (talks to the API).")
users_app = typer.Typer(help="Users of auth mode and their roles on agents (database).")
tokens_app = typer.Typer(help="Bearer API tokens of auth mode (database).")
app.add_typer(reviews_app, name="reviews")
balance_app = typer.Typer(help="The organisation balance, the spending ceiling (database).")
app.add_typer(users_app, name="users")
app.add_typer(tokens_app, name="tokens")
app.add_typer(balance_app, name="balance")


@contextlib.contextmanager
def _api_client(api_url: str | None) -> Iterator[httpx.Client]:
    """An HTTP client for the API, sending BATON_TOKEN as the bearer token when set."""
    from baton.settings import get_settings

    with _errors():
        settings = get_settings()
    url = api_url or settings.api_url
    headers = (
        {"Authorization": f"Bearer {settings.token.get_secret_value()}"} if settings.token else {}
    )
    with httpx.Client(base_url=url, timeout=30, headers=headers) as http:
        try:
            yield http
        except httpx.HTTPError as exc:
            where = "--api" if api_url else "BATON_API_URL"
            err_console.print(
                f"[bold red]error[/] cannot reach {url} (the Baton API, from {where}): {exc} "
                "(is `baton dev` up? set BATON_API_URL or --api to where the API listens)",
                soft_wrap=True,
                highlight=False,
            )
            raise typer.Exit(1) from exc


def _checked(resp: httpx.Response) -> dict[str, object]:
    """The JSON body, or print the problem (``error [code]: detail``) and exit 1."""
    if resp.status_code >= 400:
        try:
            body = resp.json()
            problem = f"[{body.get('code')}]: {body.get('detail', '')}"
        except ValueError:
            problem = f"HTTP {resp.status_code}"
        err_console.print(f"[bold red]error[/] {escape(problem)}", highlight=False)
        raise typer.Exit(1)
    result: dict[str, object] = resp.json()
    return result


@reviews_app.command("list")
def reviews_list(
    status: Annotated[str | None, typer.Option(help="pending | allowed | denied | …")] = "pending",
    api_url: ApiOption = None,
) -> None:
    """List reviews (pending by default), newest first."""
    with _api_client(api_url) as http:
        params = {"status": status} if status and status != "all" else {}
        body = _checked(http.get("/v1/reviews", params=params | {"limit": 200}))
    # One review per line, ids first and never cut (they are what approve/deny take):
    # a table squeezes every other column to nothing in an 80-column terminal.
    if not body["data"]:
        console.print(
            f"no {status if status and status != 'all' else ''} reviews".replace("  ", " ")
        )
    for r in body["data"]:  # type: ignore[attr-defined]
        target = f" {r['target']}" if r["target"] else ""
        console.print(
            f"[bold]{r['id']}[/] {r['status']} · {r['caller']} → {r['operation']}{target}"
            f" · session {r['session_id']}",
            soft_wrap=True,
            highlight=False,
        )
        if r["preview"]:
            console.print(f"    {escape(r['preview'][:200])}", soft_wrap=True, highlight=False)


def _decide(review_id: str, decision: str, scope: str | None, api_url: str | None) -> None:
    with _api_client(api_url) as http:
        resp = http.post(
            f"/v1/reviews/{review_id}/decision", json={"decision": decision, "scope": scope}
        )
        body = _checked(resp)
    if resp.status_code == 202:
        console.print(f"{review_id}: decision delivered; the session has not applied it yet")
    else:
        console.print(f"{review_id}: [bold]{body['status']}[/] (by {body['decided_by']})")


@reviews_app.command("approve")
def reviews_approve(
    review_id: Annotated[str, typer.Argument(help="review-… id")],
    always: Annotated[
        bool, typer.Option("--always", help="Save an allow policy (always_allow).")
    ] = False,
    scope: Annotated[
        str, typer.Option(help="With --always: 'target' (this agent) or 'all' (global).")
    ] = "target",
    api_url: ApiOption = None,
) -> None:
    """Allow the reviewed operation (once, or --always)."""
    _decide(
        review_id, "always_allow" if always else "allow_once", scope if always else None, api_url
    )


@reviews_app.command("deny")
def reviews_deny(
    review_id: Annotated[str, typer.Argument(help="review-… id")], api_url: ApiOption = None
) -> None:
    """Deny the reviewed operation; the calling agent gets an error."""
    _decide(review_id, "deny", None, api_url)


@contextlib.contextmanager
def _db() -> Iterator[Session]:
    from baton.settings import get_settings
    from baton.storage.db import init_db, make_engine, session_scope

    with _errors():
        engine = make_engine(get_settings().database_url)
        try:
            init_db(engine)
            with session_scope(engine) as s:
                yield s
        finally:
            engine.dispose()


@users_app.command("add")
def users_add(
    user_id: Annotated[str, typer.Argument(help="Lower-case id, e.g. alice")],
    name: Annotated[str, typer.Option(help="Display name.")] = "",
) -> None:
    """Create a user."""
    from baton.grants import auth

    with _db() as s:
        auth.create_user(s, user_id=user_id, name=name)
    console.print(f"user {user_id} created")


@users_app.command("list")
def users_list() -> None:
    """Users and their roles on agents."""
    from sqlmodel import select

    from baton.grants import auth
    from baton.storage.db import AgentAcl

    with _db() as s:
        table = Table("user", "name", "roles")
        for u in auth.list_users(s):
            roles = s.exec(select(AgentAcl).where(AgentAcl.user_id == u.id)).all()
            table.add_row(u.id, u.name, ", ".join(f"{r.agent_slug}:{r.role}" for r in roles))
    console.print(table)


@users_app.command("grant")
def users_grant(
    user_id: Annotated[str, typer.Argument(help="User id.")],
    agent: Annotated[str, typer.Argument(help="Agent slug.")],
    role: Annotated[str, typer.Argument(help="viewer | user | owner")],
) -> None:
    """Give USER the ROLE on AGENT (viewer < user < owner)."""
    from baton.agents import registry
    from baton.grants import auth

    if role not in auth.ROLE_RANK:
        raise _fail(auth.InvalidUser(f"role must be viewer, user or owner, not {role!r}"))
    with _db() as s:
        registry.get_agent(s, slug=agent)
        auth.grant(s, agent=agent, user_id=user_id, role=cast("auth.Role", role))
    console.print(f"{user_id} is {role} of {agent}")


@users_app.command("revoke")
def users_revoke(
    user_id: Annotated[str, typer.Argument(help="User id.")],
    agent: Annotated[str, typer.Argument(help="Agent slug.")],
) -> None:
    """Remove USER's role on AGENT."""
    from baton.grants import auth

    with _db() as s:
        removed = auth.revoke(s, agent=agent, user_id=user_id)
    console.print(f"{user_id} {'no longer has a role on' if removed else 'had no role on'} {agent}")


@balance_app.command("show")
def balance_show() -> None:
    """Print the balance (USD, or unlimited)."""
    from baton.runs import metering

    with _db() as s:
        amount = metering.get_balance(s)
    console.print("balance: " + ("unlimited" if amount is None else f"${amount:.4f}"))


@balance_app.command("set")
def balance_set(
    amount: Annotated[str, typer.Argument(help="USD, e.g. 25 or 0.5; or `unlimited`.")],
) -> None:
    """Set the balance. Model calls are refused once it is spent (≤ 0). Works in auth
    mode too, where ``PUT /v1/balance`` is refused (no API user is an organisation admin)."""
    from pydantic import ValidationError

    from baton.errors import InvalidBalance
    from baton.runs import metering

    try:
        body = metering.BalanceUpdate.model_validate(
            {"balance": None if amount == "unlimited" else float(amount)}
        )
    except (ValidationError, ValueError) as exc:
        msg = f"amount must be a finite, non-negative number of USD or `unlimited`, not {amount!r}"
        raise _fail(InvalidBalance(msg, path="amount")) from exc
    with _db() as s:
        metering.set_balance(s, amount=body.balance)
    balance_show()


@tokens_app.command("issue")
def tokens_issue(
    user_id: Annotated[str, typer.Argument(help="User id.")],
    name: Annotated[str, typer.Option(help="What the token is for.")] = "",
) -> None:
    """Issue a bearer token for USER; it is printed once (only its hash is stored)."""
    from baton.grants import auth

    with _db() as s:
        row, plain = auth.issue_token(s, user_id=user_id, name=name)
        token_id = row.id
    err_console.print(f"token {token_id} for {user_id} (shown once; store it now):")
    print(plain)


@tokens_app.command("list")
def tokens_list(
    user_id: Annotated[str | None, typer.Option("--user", help="Only this user's.")] = None,
) -> None:
    """Tokens (id, user, prefix, revoked); never their value."""
    from baton.grants import auth

    with _db() as s:
        table = Table("id", "user", "prefix", "name", "revoked", "created")
        for t in auth.list_tokens(s, user_id=user_id):
            table.add_row(
                str(t.id), t.user_id, t.prefix + "…", t.name, str(t.revoked), str(t.created_at)
            )
    console.print(table)


@tokens_app.command("revoke")
def tokens_revoke(token_id: Annotated[int, typer.Argument(help="Token id.")]) -> None:
    """Revoke a token: requests with it get 401 from now on."""
    from baton.grants import auth

    with _db() as s:
        auth.revoke_token(s, token_id=token_id)
    console.print(f"token {token_id} revoked")


# --- mcp: external sessions' proxy tokens (issue 13, on the database) ------------------

mcp_app = typer.Typer(help="Agents outside Baton: proxy tokens of external sessions (database).")
app.add_typer(mcp_app, name="mcp")


@mcp_app.command("token")
def mcp_token(
    session_id: Annotated[str, typer.Argument(help="An external session's id.")],
    ttl: Annotated[
        int | None, typer.Option("--ttl", min=60, help="Token lifetime in seconds (default: none).")
    ] = None,
) -> None:
    """Reissue an external session's proxy token: the old one stops working (401) at once.
    Prints the new token (shown once) and the MCP client's Authorization header."""
    from baton.runs import external

    with _db() as s:
        if not external.is_external(s, session_id=session_id):
            raise external.NotExternal(f"session '{session_id}' is not an external session")
        _, plain = external.issue_proxy_token(s, session_id=session_id, expires_in_s=ttl)
    typer.echo(plain)
    err_console.print(f"Authorization: Bearer {plain[:16]}… (the previous token is revoked)")


if __name__ == "__main__":
    app()
