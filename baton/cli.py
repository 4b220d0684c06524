"""The ``baton`` command line (Typer + Rich)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

from baton.contracts import ResolvedAgent, ResolvedNode
from baton.errors import BatonError

app = typer.Typer(
    name="baton",
    help="Durable multi-agent orchestration on Temporal.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True, soft_wrap=True)

EXAMPLES = Path("examples/agents.yaml")


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


def _apply(path: Path) -> None:
    from baton.apply import apply_agents, load_apply_file
    from baton.db import init_db, make_engine, session_scope
    from baton.settings import get_settings

    settings = get_settings()
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
    """Serve the HTTP API (uvicorn)."""
    import uvicorn

    uvicorn.run("api.app:create_app", factory=True, host=host, port=port)


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
    from baton.db import init_db, make_engine, session_scope
    from baton.registry import resolve_agent
    from baton.settings import get_settings

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


@app.command()
def demo(
    file: Annotated[Path, typer.Option("--file", "-f", help="Agents to apply.")] = EXAMPLES,
) -> None:
    """Apply the example agents and print how each resolves."""
    import yaml

    with _errors():
        _apply(file)
    for item in (yaml.safe_load(file.read_text()) or {}).get("agents", []):
        show(item["slug"])


if __name__ == "__main__":
    app()
