"""The ad-hoc delegation roster and the prompts of delegating agents (AgentX Agent Teams).

The roster is every live agent whose effective configuration opts in with
``delegation.available_for_delegation`` (default off); each one's specialty is
its ``delegation_hint``, else its description.
"""

from __future__ import annotations

import time

from sqlmodel import Session, col, select

from baton.contracts.values import TeamSnapshot
from baton.storage.db import Agent, AgentLivePointer

#: The roster is read on every delegating model call: keep it for a few seconds.
CACHE_S = 5.0
_cache: tuple[float, list[tuple[str, str]]] | None = None


def _all(session: Session) -> list[tuple[str, str]]:
    from baton.agents import registry
    from baton.errors import BatonError

    global _cache
    now = time.monotonic()
    if _cache is not None and now - _cache[0] < CACHE_S:
        return _cache[1]
    slugs = session.exec(
        select(Agent.slug)
        .join(AgentLivePointer, col(AgentLivePointer.agent_id) == col(Agent.id))
        .where(col(Agent.retired).is_(False))
        .order_by(col(Agent.slug))
    ).all()
    out: list[tuple[str, str]] = []
    for slug in slugs:
        try:
            agent = registry.resolve_agent(session, ref=slug)
        except BatonError:
            continue  # a live agent that no longer resolves cannot take work
        if agent.delegation.available_for_delegation and agent.kind != "ambassador":
            out.append((slug, agent.delegation.delegation_hint or agent.description))
    _cache = (now, out)
    return out


def roster(session: Session, *, exclude: str) -> list[tuple[str, str]]:
    """``[(slug, specialty)]`` of the roster, without ``exclude`` (no self-delegation)."""
    return [(slug, hint) for slug, hint in _all(session) if slug != exclude]


def clear_cache() -> None:
    """Forget the cached roster (tests, or right after publishing)."""
    global _cache
    _cache = None


ORCHESTRATE_BRIEF = (
    "You lead a team. Orchestrate, don't execute: break the request into focused, "
    "self-contained tasks, hand each to the best-suited member with delegate_to (several "
    "calls in one turn run in parallel), then synthesise their results into one answer. "
    "Members see only the task you write, not this conversation."
)


def team_block(team: TeamSnapshot) -> str:
    """The supervisor's brief plus its members (AgentX Agent Teams, 'orchestrate, don't
    execute')."""
    lines = "\n".join(f"- {m.agent_id}: {m.hint}" for m in team.specialists())
    return f"{ORCHESTRATE_BRIEF}\n\nTeam '{team.id}' members:\n{lines}"


def roster_block(entries: list[tuple[str, str]]) -> str:
    """The soft roster guidance of ad-hoc delegation (AgentX Agent Teams, 'Ad-hoc delegation')."""
    lines = "\n".join(f"- {slug}: {hint}" for slug, hint in entries)
    return (
        "Teammates you can hand a subtask to with delegate_to. Handle requests yourself "
        "by default; delegate only when a teammate is clearly better suited.\n" + lines
    )
