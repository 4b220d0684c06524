"""``baton apply`` and ``baton show``: agent definitions from YAML into the registry
through the API (or, with ``--direct-db``, the database), and a revision's resolved
configuration (on the database); ``baton agents publish`` and ``baton agents rebase``
(through the API)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import httpx
import typer
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

from baton.agents.schemas import RevisionPublic
from baton.contracts.values import ResolvedAgent, ResolvedNode
from baton.errors import BatonError
from cli.common import ApiOption, api_client, checked, console, fail, one_line_errors, problem_exit

if TYPE_CHECKING:
    from baton.agents.apply import ApplyFile, ApplyResult, Change
    from baton.agents.schemas import AgentCreate

app = typer.Typer()
#: ``baton agents …``: registry operations through the API (the caller's token and ACL).
group = typer.Typer(help="Agents in the registry, through the API.", no_args_is_help=True)


class At:
    """Where a request's subject stands in the apply file: ``place`` (``agents[1]``,
    ``teams[0]``), ``within`` (what a problem's ``path`` is relative to: an agent's
    errors name places in its spec) and ``name`` (the slug, or ``team:ID``)."""

    def __init__(self, place: str, name: str, *, within: str | None = None) -> None:
        self.place, self.name = place, name
        self.within = within or place

    def answer(self, resp: httpx.Response, *ok: int) -> Any:
        """The JSON body of an expected answer (status in ``ok``); any other answer is
        printed as the API's problem, located in the file, and exits 1 (typer.Exit)."""
        if resp.status_code in ok:
            return resp.json()
        try:
            body: dict[str, Any] = resp.json()
        except ValueError:
            body = {}
        code = str(body.get("code") or f"http_{resp.status_code}")
        detail = str(body.get("detail") or resp.text or resp.reason_phrase)
        path = f"{self.within}.{body['path']}" if body.get("path") else self.place
        raise problem_exit(code, path, f"{self.name}: {detail}")


def _agent_at(index: int, slug: str) -> At:
    from baton.agents.apply import locate

    return At(locate(None, index), slug, within=f"{locate(None, index)}.spec")


def _upsert(http: httpx.Client, item: AgentCreate, at: At) -> Change:
    """Create the agent, or bring its name, description and draft to the file's:
    ``created``, ``updated`` or ``unchanged``, from the API's answers."""
    from baton.agents.spec import AgentSpec

    # Create first, and read the agent only when it exists (409): in auth mode a GET of
    # an agent the caller holds no role on answers 403 whether or not it exists.
    created = http.post("/v1/agents", json=item.model_dump(mode="json"))
    if created.status_code == 201:
        return "created"
    if created.status_code != 409 or created.json().get("code") != "agent_exists":
        at.answer(created, 201)
    agent = at.answer(http.get(f"/v1/agents/{item.slug}"), 200)
    change: Change = "unchanged"
    if (agent["name"], agent["description"]) != (item.name, item.description):
        meta = {"name": item.name, "description": item.description}
        at.answer(http.patch(f"/v1/agents/{item.slug}", json=meta), 200)
        change = "updated"
    if AgentSpec.model_validate(agent["draft"]) != item.spec:
        draft = item.spec.model_dump(mode="json")
        at.answer(http.put(f"/v1/agents/{item.slug}/draft", json=draft), 200)
        change = "updated"
    return change


def apply_through_api(http: httpx.Client, doc: ApplyFile) -> list[ApplyResult]:
    """Apply ``doc`` with the API at ``http`` (its base URL and the caller's token), as
    `kubectl apply` does: the file is checked whole first (:func:`check_file`); then each
    agent is created or updated (name, description, draft), then every agent is
    published in :func:`publish_order`, then each team is put.

    Results (agents in publish order, then teams) come from the API's answers: 201 on
    create → ``created``, 201 on publish → a new revision, 200 → the live one; a team's
    ``pins`` are its members' live versions. Not one transaction: the first refusal
    prints the API's problem at its place in the file and exits 1 (typer.Exit), and what
    was applied before it stays applied (applying the fixed file again converges).
    Raises the file's own errors (BatonError) before anything is sent.
    """
    from baton.agents.apply import ApplyResult, check_file, publish_order

    check_file(doc)
    index = {item.slug: i for i, item in enumerate(doc.agents)}
    changes = {
        item.slug: _upsert(http, item, _agent_at(i, item.slug)) for i, item in enumerate(doc.agents)
    }
    results: list[ApplyResult] = []
    live: dict[str, int] = {}
    for item in publish_order(doc.agents):
        resp = http.post(f"/v1/agents/{item.slug}/publish")
        rev = _agent_at(index[item.slug], item.slug).answer(resp, 200, 201)
        change = changes[item.slug]
        if resp.status_code == 201 and change != "created":
            change = "published"
        live[item.slug] = int(rev["version"])
        results.append(ApplyResult(slug=item.slug, version=live[item.slug], change=change))
    for i, team in enumerate(doc.teams):
        at = At(f"teams[{i}]", f"team:{team.id}")
        found = http.get(f"/v1/teams/{team.id}")
        before = None if found.status_code == 404 else at.answer(found, 200)
        resp = http.put(f"/v1/teams/{team.id}", json=team.model_dump(mode="json"))
        after = at.answer(resp, 200, 201)
        stamps = ("created_at", "updated_at")
        same = before is not None and {k: v for k, v in before.items() if k not in stamps} == {
            k: v for k, v in after.items() if k not in stamps
        }
        team_change: Change = (
            "created" if resp.status_code == 201 else "unchanged" if same else "updated"
        )
        pins = [f"{m.agent_id}@{_live_version(http, m.agent_id, live)}" for m in team.members]
        results.append(ApplyResult(slug=at.name, version=None, change=team_change, pins=pins))
    return results


def _live_version(http: httpx.Client, slug: str, known: dict[str, int]) -> int | None:
    """``slug``'s live version: from this apply's publishes, else from the API."""
    if slug in known:
        return known[slug]
    resp = http.get(f"/v1/agents/{slug}")
    return resp.json().get("live_version") if resp.status_code == 200 else None


def print_results(path: Path, results: list[ApplyResult]) -> None:
    """The slug/version/change table of an apply (a team's version: its members' pins)."""
    table = Table("slug", "version", "change", title=f"Applied {path}")
    style = {"created": "green", "published": "yellow", "updated": "cyan", "unchanged": "dim"}
    for r in results:
        version = str(r.version) if r.version is not None else ", ".join(r.pins)
        table.add_row(r.slug, version, f"[{style[r.change]}]{r.change}[/]")
    console.print(table)


def apply_file(path: Path, http: httpx.Client) -> None:
    """Apply the agents file at ``path`` through the API at ``http`` and print the table;
    raises BatonError for a bad file (nothing sent), typer.Exit for a refusal."""
    from baton.agents.apply import load_apply_file

    doc = load_apply_file(path)
    with console.status(f"Applying {path} through {http.base_url} …"):
        results = apply_through_api(http, doc)
    print_results(path, results)


def apply_to_database(path: Path) -> None:
    """`--direct-db`: apply the file to BATON_DATABASE_URL in one transaction, without
    the API (and so without its auth): a bootstrap for a database no API serves yet."""
    from baton.agents.apply import apply_agents, load_apply_file
    from baton.settings import get_settings
    from baton.storage.db import init_db, make_engine, session_scope

    settings = get_settings()
    with console.status(f"Applying {path} to {settings.database_url_redacted} …"):
        doc = load_apply_file(path)
        engine = make_engine(settings.database_url)
        try:
            init_db(engine)
            with session_scope(engine) as session:
                results = apply_agents(
                    session, doc=doc, default_gate=settings.publish_gate_config()
                )
        finally:
            engine.dispose()
    print_results(path, results)


@app.command()
def apply(
    file: Annotated[Path, typer.Option("--file", "-f", help="YAML file with an `agents:` list.")],
    api_url: ApiOption = None,
    direct_db: Annotated[
        bool,
        typer.Option(
            "--direct-db",
            help="Write to BATON_DATABASE_URL in one transaction instead of calling the API "
            "(a bootstrap; skips the API's auth).",
        ),
    ] = False,
) -> None:
    """Create or update, then publish, every agent and team in FILE through the API at
    BATON_API_URL (or --api) with BATON_TOKEN, like `kubectl apply`; idempotent. The
    file is checked whole before anything is sent; the first refusal stops the apply."""
    try:
        if direct_db:
            with one_line_errors():
                apply_to_database(file)
            return
        with api_client(api_url) as http:
            apply_file(file, http)
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
    from baton.agents.registry import base_pins, get_agent, resolve_agent
    from baton.settings import get_settings
    from baton.storage.db import init_db, make_engine, session_scope

    with one_line_errors():
        engine = make_engine(get_settings().database_url)
        try:
            init_db(engine)
            with session_scope(engine) as session:
                resolved = resolve_agent(session, ref=ref)
                agent = get_agent(session, slug=resolved.slug)
                bases = base_pins(session, agent=agent, version=resolved.version)
        finally:
            engine.dispose()
    if as_json:
        console.print_json(resolved.model_dump_json())
        return
    console.print(render_resolved(resolved))
    newer = [b for b in bases if b.live != b.pinned]
    for b in newer:
        now = f"{b.agent}@{b.live}" if b.live is not None else "no longer in the chain"
        console.print(f"base {b.agent}@{b.pinned} is pinned; live now: {now}", highlight=False)
    if newer:
        console.print(f"`baton agents rebase {resolved.slug}` publishes a revision on them")


@group.command("publish")
def publish(
    slug: Annotated[str, typer.Argument(help="The agent whose draft to publish.")],
    eval_id: Annotated[
        str | None,
        typer.Option(
            "--eval",
            help="The eval that lets the draft pass its publish gate; default: the newest "
            "completed eval of the draft.",
        ),
    ] = None,
    api_url: ApiOption = None,
) -> None:
    """Publish SLUG's draft as its next revision and make it live. Under a publish gate
    (docs/change-safely.md) the draft needs an eval that meets it: 409 eval_required /
    eval_failed otherwise, and nothing is published."""
    with api_client(api_url) as http:
        body = {"eval_id": eval_id} if eval_id else None
        resp = http.post(f"/v1/agents/{slug}/publish", json=body)
        rev = RevisionPublic.model_validate(checked(resp))
    pin = f"{rev.slug}@{rev.version}"
    if resp.status_code == 200:
        console.print(f"{pin}: unchanged, the draft is the live revision", highlight=False)
        return
    passed = f", passed eval {rev.eval_id}" if rev.eval_id else ""
    console.print(f"{pin}: published and live{passed}", highlight=False)


@group.command("rebase")
def rebase(
    slug: Annotated[str, typer.Argument(help="The agent whose live revision to rebase.")],
    api_url: ApiOption = None,
) -> None:
    """Republish SLUG's live revision pinned to its bases' live revisions (a published
    revision never follows a newer base by itself); the draft is untouched."""
    with api_client(api_url) as http:
        resp = http.post(f"/v1/agents/{slug}/rebase")
        body = checked(resp)
    rev = RevisionPublic.model_validate(body)
    pins = ", ".join(rev.extends_pins or []) or "no bases"
    pin = f"{rev.slug}@{rev.version}"
    if resp.status_code == 200:
        console.print(f"{pin}: unchanged, its bases are current ({pins})", highlight=False)
    else:
        console.print(f"{pin}: published, pinned to {pins}", highlight=False)
