"""``baton apply``: make the registry match a YAML file of agents, in one transaction.

File shape::

    agents:
      - slug: researcher
        name: Researcher
        description: Finds and cites sources.
        spec: {system_prompt: ..., extends: base-assistant, ...}

Each agent is created if missing, its name/description and draft updated, then
published; agents are published in dependency order (a base before the agents
that extend or reference it). Publishing an unchanged draft creates nothing, so
applying the same file twice changes nothing the second time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlmodel import Session

from baton import registry
from baton.errors import AgentNotFound, BatonError, spec_error, validation_entries
from baton.schemas import AgentCreate
from baton.spec import parse_ref


class ApplyFile(BaseModel):
    """The document ``baton apply`` reads."""

    model_config = ConfigDict(extra="forbid")

    agents: list[AgentCreate] = Field(default_factory=list)


class ApplyResult(BaseModel):
    """What applying one agent did."""

    slug: str
    version: int
    change: Literal["created", "published", "unchanged"]


class ApplyFileError(BatonError):
    """The file cannot be read or does not match the apply format."""

    code = "invalid_apply_file"
    title = "Invalid apply file"


def load_apply_file(path: Path) -> ApplyFile:
    """Parse and validate ``path``.

    Raises ApplyFileError, RemovedField or SpecValidationError (with the path).
    """
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ApplyFileError(f"cannot read {path}: {exc}") from exc
    try:
        return ApplyFile.model_validate(raw or {})
    except ValidationError as exc:
        raise spec_error(validation_entries(exc.errors())) from exc


def _publish_order(items: list[AgentCreate]) -> list[AgentCreate]:
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
        nxt = ready[0] if ready else pending[0]  # a cycle: publish will report it
        done.append(nxt)
        pending.remove(nxt)
    return [by_slug[s] for s in done]


def apply_agents(session: Session, *, doc: ApplyFile) -> list[ApplyResult]:
    """Create/update drafts and publish every agent in ``doc``; results in publish order.

    Flushes only: the caller commits, so a failure anywhere writes nothing.
    Raises ApplyFileError for duplicate slugs, or any registry error.
    """
    seen: set[str] = set()
    for item in doc.agents:
        if item.slug in seen:
            raise ApplyFileError(f"agent '{item.slug}' appears twice", path="agents")
        seen.add(item.slug)
    created: set[str] = set()
    for item in doc.agents:
        try:
            registry.get_agent(session, slug=item.slug)
        except AgentNotFound:
            registry.create_agent(
                session,
                slug=item.slug,
                name=item.name,
                description=item.description,
                spec=item.spec,
            )
            created.add(item.slug)
            continue
        registry.update_agent(session, slug=item.slug, name=item.name, description=item.description)
        registry.save_draft(session, slug=item.slug, spec=item.spec)
    results = []
    for item in _publish_order(doc.agents):
        rev, changed = registry.publish(session, slug=item.slug)
        change: Literal["created", "published", "unchanged"] = (
            "created" if item.slug in created else "published" if changed else "unchanged"
        )
        results.append(ApplyResult(slug=item.slug, version=rev.version, change=change))
    return results
