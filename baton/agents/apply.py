"""``baton apply``: make the registry match a YAML file of agents, in one transaction.

File shape::

    agents:
      - slug: researcher
        name: Researcher
        description: Finds and cites sources.
        spec: {system_prompt: ..., extends: base-assistant, ...}
    teams:                      # optional, applied after the agents
      - {id: research-desk, name: ..., supervisor_agent_id: lead, members: [...]}

Each agent is created if missing, its name/description and draft updated, then
published; agents are published in dependency order (a base before the agents
that extend or reference it). Publishing an unchanged draft creates nothing, so
applying the same file twice changes nothing the second time.

`baton apply` sends these steps to the API (``cli/agents.py``); :func:`apply_agents`
runs them on a database session in one transaction (`baton apply --direct-db`). Both
check the file first with :func:`check_file` and publish in :func:`publish_order`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlmodel import Session

from baton.agents import registry, teams
from baton.agents.schemas import AgentCreate
from baton.agents.spec import parse_ref
from baton.agents.teams import TeamIn
from baton.contracts.evals import PublishGate
from baton.errors import (
    AgentNotFound,
    BatonError,
    InheritanceCycle,
    spec_error,
    validation_entries,
)


class ApplyFile(BaseModel):
    """The document ``baton apply`` reads."""

    model_config = ConfigDict(extra="forbid")

    agents: list[AgentCreate] = Field(default_factory=list)
    teams: list[TeamIn] = Field(default_factory=list)


Change = Literal["created", "published", "updated", "unchanged"]


class ApplyResult(BaseModel):
    """What applying one agent or team did: ``created`` (new agent at version 1, or new
    team), ``published`` (new revision), ``updated`` (name, description or draft changed
    and no new revision; a changed team), ``unchanged``.

    ``version`` is the agent's live version; a team has none (None) and ``pins`` lists
    the revisions a run of it launched now would use (``slug@version`` per member).
    """

    slug: str
    version: int | None
    change: Change
    pins: list[str] = Field(default_factory=list)


class ApplyFileError(BatonError):
    """The file cannot be read or does not match the apply format."""

    code = "invalid_apply_file"
    title = "Invalid apply file"


class _NoAliasLoader(yaml.SafeLoader):
    """SafeLoader without anchors/aliases: a few bytes of nested aliases can expand to
    gigabytes once validated (the "billion laughs"), so apply files spell values out."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yaml.composer.ComposerError(
                None,
                None,
                "YAML aliases (*name) are not supported in apply files",
                event.start_mark,
            )
        return super().compose_node(parent, index)


def load_apply_file(path: Path) -> ApplyFile:
    """Parse and validate ``path``.

    Raises ApplyFileError, RemovedField or SpecValidationError (with the path).
    """
    try:
        with path.open(encoding="utf-8") as f:
            raw = yaml.load(f, Loader=_NoAliasLoader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError) as exc:
        raise ApplyFileError(f"cannot read {path}: {exc}") from exc
    if raw is not None and not isinstance(raw, dict):
        msg = f"{path} must be a mapping with an 'agents:' list, not a {type(raw).__name__}"
        raise ApplyFileError(msg)
    try:
        return ApplyFile.model_validate(raw or {})
    except ValidationError as exc:
        raise spec_error(validation_entries(exc.errors())) from exc


def _in_file_extends_cycle(items: list[AgentCreate]) -> None:
    """Report an ``extends`` cycle among the file's own agents before publishing anything."""
    index = {item.slug: i for i, item in enumerate(items)}
    for start in items:
        seen, current = [start.slug], start
        while current.spec.extends:
            base = parse_ref(current.spec.extends)[0]
            if base not in index:
                break
            if base in seen:
                cycle = " -> ".join([*seen, base])
                raise InheritanceCycle(
                    f"extends chain forms a cycle: {cycle}",
                    path=f"agents[{index[start.slug]}].spec.extends",
                )
            seen.append(base)
            current = items[index[base]]


def publish_order(items: list[AgentCreate]) -> list[AgentCreate]:
    """Items ordered so that in-file references come first; stable, cycles left in file order."""
    by_slug = {item.slug: item for item in items}
    deps = {
        item.slug: {s for s in (parse_ref(r)[0] for r in item.spec.references()) if s in by_slug}
        - {item.slug}
        for item in items
    }
    done: list[str] = []
    pending = [item.slug for item in items]
    while pending:
        ready = [s for s in pending if deps[s] <= set(done)]
        nxt = ready[0] if ready else pending[0]  # a subagent cycle: publish will report it
        done.append(nxt)
        pending.remove(nxt)
    return [by_slug[s] for s in done]


def locate(path: str | None, index: int) -> str:
    """Where an error about ``agents[index]`` (``path`` relative to its spec) stands in
    the file: ``agents[1].spec.extends``, or ``agents[1]`` without a path."""
    where = f"agents[{index}]"
    return f"{where}.spec.{path}" if path else where


def _locate(exc: BatonError, index: int, slug: str) -> BatonError:
    """Prefix a registry error with where the agent stands in the file."""
    exc.path = locate(exc.path, index)
    exc.detail = f"{slug}: {exc.detail}"
    return exc


def check_file(doc: ApplyFile) -> None:
    """What can be refused from the file alone, before anything is written: a slug
    listed twice (ApplyFileError) and an ``extends`` cycle among the file's own agents
    (InheritanceCycle), each at its place in the file."""
    seen: set[str] = set()
    for i, item in enumerate(doc.agents):
        if item.slug in seen:
            raise ApplyFileError(f"agent '{item.slug}' appears twice", path=f"agents[{i}].slug")
        seen.add(item.slug)
    _in_file_extends_cycle(doc.agents)


def apply_agents(
    session: Session, *, doc: ApplyFile, default_gate: PublishGate | None = None
) -> list[ApplyResult]:
    """Create/update drafts and publish every agent in ``doc``; results in publish order.
    A changed agent under a publish gate (its spec's, else ``default_gate``:
    ``BATON_PUBLISH_GATE``) needs a completed eval of its draft as the API's publish does
    (:func:`baton.agents.registry.publish`); the file cannot name one.

    Flushes only: the caller commits, so a failure anywhere writes nothing.
    Raises ApplyFileError for duplicate slugs, InheritanceCycle for an extends
    cycle within the file, or any registry error located at ``agents[i]``.
    """
    check_file(doc)
    index = {item.slug: i for i, item in enumerate(doc.agents)}
    changes: dict[str, Change] = {}
    for i, item in enumerate(doc.agents):
        try:
            changes[item.slug] = _upsert(session, item)
        except BatonError as exc:
            raise _locate(exc, i, item.slug) from exc
    results = []
    for item in publish_order(doc.agents):
        try:
            rev, published = registry.publish(session, slug=item.slug, default_gate=default_gate)
        except BatonError as exc:
            raise _locate(exc, index[item.slug], item.slug) from exc
        change = changes[item.slug]
        if published and change != "created":
            change = "published"
        results.append(ApplyResult(slug=item.slug, version=rev.version, change=change))
    for i, team in enumerate(doc.teams):
        try:
            before = _existing_team(session, team.id)
            stored, created = teams.put_team(session, team_id=team.id, team=team)
        except BatonError as exc:
            exc.path = f"teams[{i}].{exc.path}" if exc.path else f"teams[{i}]"
            raise
        same = before is not None and before.model_dump(exclude={"created_at", "updated_at"}) == (
            stored.model_dump(exclude={"created_at", "updated_at"})
        )
        team_change: Change = "created" if created else "unchanged" if same else "updated"
        pins = [f"{m.agent_id}@{_live(session, m.agent_id)}" for m in team.members]
        results.append(
            ApplyResult(slug=f"team:{team.id}", version=None, change=team_change, pins=pins)
        )
    return results


def _live(session: Session, slug: str) -> int | None:
    return registry.to_public(session, registry.get_agent(session, slug=slug)).live_version


def _existing_team(session: Session, team_id: str) -> teams.TeamPublic | None:
    try:
        return teams.get_team(session, team_id=team_id)
    except teams.TeamNotFound:
        return None


def _upsert(session: Session, item: AgentCreate) -> Change:
    try:
        agent = registry.get_agent(session, slug=item.slug)
    except AgentNotFound:
        registry.create_agent(
            session, slug=item.slug, name=item.name, description=item.description, spec=item.spec
        )
        return "created"
    before = (agent.name, agent.description, registry.to_public(session, agent).draft)
    registry.update_agent(session, slug=item.slug, name=item.name, description=item.description)
    registry.save_draft(session, slug=item.slug, spec=item.spec)
    return "unchanged" if before == (item.name, item.description, item.spec) else "updated"
