"""``baton apply`` and ``baton show``: agent definitions from YAML into the registry, and a
revision's resolved configuration (on the database)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

from baton.contracts import ResolvedAgent, ResolvedNode
from baton.errors import BatonError
from baton.settings import Settings
from cli.common import console, fail, one_line_errors

app = typer.Typer()


def apply_file(path: Path, settings: Settings | None = None) -> None:
    """Apply the agents file at ``path`` to the database of ``settings`` (default: the
    environment's) and print a slug/version/change table; raises :class:`BatonError`
    for a bad file or a refused change (nothing is applied then)."""
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
        apply_file(file)
    except BatonError as exc:
        raise fail(exc) from exc


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

    with one_line_errors():
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
