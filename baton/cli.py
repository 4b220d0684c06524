"""The ``baton`` command line (Typer + Rich)."""

from __future__ import annotations

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
err_console = Console(stderr=True)

EXAMPLES = Path("examples/agents.yaml")


def _fail(exc: BatonError) -> typer.Exit:
    where = f" at {exc.path}" if exc.path and exc.path not in exc.detail else ""
    err_console.print(
        f"[bold red]error[/] {escape(f'[{exc.code}]{where}: {exc.detail}')}", highlight=False
    )
    return typer.Exit(code=1)


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
    style = {"created": "green", "published": "yellow", "unchanged": "dim"}
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
    """A Rich tree of a resolved agent: chain, tools, limits, subagents."""
    tree = Tree(f"[bold cyan]{agent.pin}[/] {agent.name} [dim]{agent.digest[:19]}…[/]")
    tree.add(f"inherits: {' → '.join(agent.inheritance)}")
    tree.add(f"tools: {', '.join(agent.tools) or '—'}")
    limits = agent.limits.model_dump(exclude_none=True)
    tree.add(f"limits: {limits or 'none'}")
    if agent.subagents:
        subs = tree.add("subagents")
        for node in agent.subagents:
            _node_tree(subs, node)
    return tree


@app.command()
def show(ref: Annotated[str, typer.Argument(help="slug or slug@version")]) -> None:
    """Print the resolved configuration of an agent revision."""
    from baton.db import init_db, make_engine, session_scope
    from baton.registry import resolve_agent
    from baton.settings import get_settings

    engine = make_engine(get_settings().database_url)
    try:
        init_db(engine)
        with session_scope(engine) as session:
            console.print(render_resolved(resolve_agent(session, ref=ref)))
    except BatonError as exc:
        raise _fail(exc) from exc
    finally:
        engine.dispose()


@app.command()
def demo(
    file: Annotated[Path, typer.Option("--file", "-f", help="Agents to apply.")] = EXAMPLES,
) -> None:
    """Apply the example agents and print how each resolves."""
    import yaml

    try:
        _apply(file)
        for item in (yaml.safe_load(file.read_text()) or {}).get("agents", []):
            show(item["slug"])
    except BatonError as exc:
        raise _fail(exc) from exc


if __name__ == "__main__":
    app()
