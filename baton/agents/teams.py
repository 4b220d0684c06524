"""Teams: a lead (supervisor) with specialist members and a shared memory channel
(AgentX Agent Teams, 'Data Model'; docs/teams.md).

Validation on create/update: kebab-case id, exactly one supervisor, every member
an existing agent (by slug, so a renamed agent never breaks a team), routes that
name a specialist with a bounded regular expression. ``shared_channel`` defaults
to ``_team_<id>``. Routes are *executed* (the reference only stores them): see
:func:`match_route`.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from sqlalchemy import delete as sa_delete
from sqlmodel import Session, col, select

from baton.agents import registry
from baton.agents.spec import SLUG_PATTERN, SafeText, compile_pattern, pattern_matches
from baton.contracts.values import TeamMemberSnapshot, TeamSnapshot
from baton.errors import AgentNotFound, BatonError, Conflict, NotFound
from baton.storage.db import Agent, ChannelMemory, TeamRow, page, utcnow

TEAM_ID = r"^[a-z0-9][a-z0-9-]{0,62}$"
MAX_MEMBERS = 32
MAX_ROUTES = 32
#: How many shared-channel memories a member receives with its task.
MEMORY_LIMIT = 5
MEMORY_CHARS = 1_000


class TeamNotFound(NotFound):
    """No team with this id."""

    code = "team_not_found"


class TeamExists(Conflict):
    """A team with this id already exists."""

    code = "team_exists"


class InvalidTeam(BatonError):
    """A team breaks a validation rule (AgentX Agent Teams, 'Validation')."""

    code = "invalid_team"
    status = 422
    title = "Invalid team"


class TeamMember(BaseModel):
    """A member: agent slug, role, and the hint shown in ``delegate_to``'s description."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"agent_id": "fact-checker", "role": "specialist", "delegation_hint": "checks"}
            ]
        },
    )

    agent_id: Annotated[str, Field(pattern=SLUG_PATTERN)]
    role: Literal["supervisor", "specialist"] = "specialist"
    delegation_hint: SafeText | None = Field(default=None, max_length=500)


class TeamRoute(BaseModel):
    """``{when: <regex on the user message>, to: <specialist>}`` (executed, see docs/teams.md)."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"when": "^check:", "to": "fact-checker"}]}
    )

    when: str = Field(min_length=1, max_length=500)
    to: Annotated[str, Field(pattern=SLUG_PATTERN)]

    @field_validator("when")
    @classmethod
    def _compiles(cls, value: str) -> str:
        compile_pattern(value)  # raises ValueError for a bad or unbounded pattern
        return value


class TeamIn(BaseModel):
    """``POST /v1/teams`` / ``PUT /v1/teams/{id}`` body (and a ``teams:`` entry in apply)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "id": "research-desk",
                    "name": "Research desk",
                    "description": "A lead with a checker and a writer.",
                    "supervisor_agent_id": "lead",
                    "members": [
                        {"agent_id": "lead", "role": "supervisor"},
                        {
                            "agent_id": "fact-checker",
                            "role": "specialist",
                            "delegation_hint": "verifies claims",
                        },
                    ],
                    "routes": [{"when": "^check:", "to": "fact-checker"}],
                }
            ]
        },
    )

    id: Annotated[str, Field(pattern=TEAM_ID)]
    name: SafeText = Field(min_length=1, max_length=200)
    description: SafeText = Field(default="", max_length=2000)
    supervisor_agent_id: Annotated[str, Field(pattern=SLUG_PATTERN)]
    members: list[TeamMember] = Field(min_length=1, max_length=MAX_MEMBERS)
    routes: list[TeamRoute] = Field(default_factory=list, max_length=MAX_ROUTES)
    shared_channel: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,79}$",
        description="Default _team_<id>.",
    )

    @model_validator(mode="after")
    def _shape(self) -> TeamIn:
        supervisors = [m for m in self.members if m.role == "supervisor"]
        if len(supervisors) != 1:
            raise ValueError(f"a team needs exactly one supervisor, not {len(supervisors)}")
        if supervisors[0].agent_id != self.supervisor_agent_id:
            raise ValueError("supervisor_agent_id must be the member with role supervisor")
        slugs = [m.agent_id for m in self.members]
        if len(set(slugs)) != len(slugs):
            raise ValueError("each agent may be a member once")
        specialists = {m.agent_id for m in self.members if m.role == "specialist"}
        for i, route in enumerate(self.routes):
            if route.to not in specialists:
                raise ValueError(f"routes[{i}].to '{route.to}' is not a specialist of this team")
        return self


class TeamPublic(TeamIn):
    """A stored team."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"id": "research-desk", "shared_channel": "_team_research-desk"}]
        }
    )

    shared_channel: str
    created_at: datetime
    updated_at: datetime


def _public(row: TeamRow) -> TeamPublic:
    return TeamPublic(
        id=row.id,
        name=row.name,
        description=row.description,
        supervisor_agent_id=row.supervisor_agent_id,
        members=[TeamMember.model_validate(m) for m in row.members],
        routes=[TeamRoute.model_validate(r) for r in row.routes],
        shared_channel=row.shared_channel,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def _check_members(session: Session, team: TeamIn) -> None:
    for i, member in enumerate(team.members):
        agent = session.exec(select(Agent).where(Agent.slug == member.agent_id)).first()
        if agent is None:
            raise AgentNotFound(
                f"member '{member.agent_id}' is not an agent", path=f"members[{i}].agent_id"
            )
        if registry.is_ambassador(session, slug=member.agent_id):
            # AgentX Agent Teams, 'Ambassador': "Ambassadors are never team members."
            raise InvalidTeam(
                f"member '{member.agent_id}' is an ambassador; ambassadors are never team members",
                path=f"members[{i}].agent_id",
            )


def _fill(row: TeamRow, team: TeamIn) -> None:
    row.name = team.name
    row.description = team.description
    row.supervisor_agent_id = team.supervisor_agent_id
    row.members = [m.model_dump() for m in team.members]
    row.routes = [r.model_dump() for r in team.routes]
    row.shared_channel = team.shared_channel or f"_team_{team.id}"
    row.updated_at = utcnow()


def _check_channel(session: Session, team: TeamIn) -> None:
    channel = team.shared_channel or f"_team_{team.id}"
    other = session.exec(
        select(TeamRow.id).where(TeamRow.shared_channel == channel, TeamRow.id != team.id)
    ).first()
    if other is not None:
        # A channel is one team's memory: sharing it would read another team's results.
        raise InvalidTeam(
            f"shared_channel '{channel}' belongs to team '{other}'", path="shared_channel"
        )


def create_team(session: Session, *, team: TeamIn) -> TeamPublic:
    """Store a new team. Raises TeamExists, AgentNotFound (a member), InvalidTeam."""
    if session.get(TeamRow, team.id) is not None:
        raise TeamExists(f"team '{team.id}' already exists")
    _check_members(session, team)
    _check_channel(session, team)
    row = TeamRow(id=team.id, name="", supervisor_agent_id="", shared_channel="")
    _fill(row, team)
    session.add(row)
    session.flush()
    return _public(row)


def put_team(session: Session, *, team_id: str, team: TeamIn) -> tuple[TeamPublic, bool]:
    """Create or replace ``team_id``: ``(team, created)``. Raises InvalidTeam (id mismatch)."""
    if team.id != team_id:
        raise InvalidTeam(f"body id '{team.id}' differs from the path '{team_id}'", path="id")
    row = session.get(TeamRow, team_id)
    if row is None:
        return create_team(session, team=team), True
    _check_members(session, team)
    _check_channel(session, team)
    released = row.shared_channel
    _fill(row, team)
    if row.shared_channel != released:
        forget_channel(session, channel=released)
    session.add(row)
    session.flush()
    return _public(row), False


def get_team(session: Session, *, team_id: str) -> TeamPublic:
    """The team. Raises TeamNotFound."""
    row = session.get(TeamRow, team_id)
    if row is None:
        raise TeamNotFound(f"no team '{team_id}'")
    return _public(row)


def list_teams(
    session: Session, *, limit: int = 50, offset: int = 0, visible: list[str] | None = None
) -> tuple[list[TeamPublic], int]:
    """Teams by id, and the total. With ``visible`` (auth mode: the slugs the caller
    may see), only teams whose every member is among them."""
    if visible is None:
        order = [col(TeamRow.id)]
        rows, total = page(session, TeamRow, order_by=order, limit=limit, offset=offset)
        return [_public(r) for r in rows], total
    # Members live in a JSON column, so the filter runs here; teams are few.
    seen = set(visible)
    every = session.exec(select(TeamRow).order_by(col(TeamRow.id))).all()
    shown = [r for r in every if all(m.get("agent_id") in seen for m in r.members)]
    return [_public(r) for r in shown[offset : offset + limit]], len(shown)


def member_slugs(session: Session, *, team_id: str) -> list[str]:
    """The agents of a stored team (none when it does not exist)."""
    row = session.get(TeamRow, team_id)
    return [m["agent_id"] for m in row.members] if row is not None else []


def delete_team(session: Session, *, team_id: str) -> None:
    """Delete the team and its channel's memories (the channel name becomes free, and
    whoever claims it next must not read them). Past runs keep their transcripts."""
    row = session.get(TeamRow, team_id)
    if row is None:
        raise TeamNotFound(f"no team '{team_id}'")
    forget_channel(session, channel=row.shared_channel)
    session.delete(row)
    session.flush()


def snapshot(session: Session, *, team_id: str) -> TeamSnapshot:
    """The team as a run sees it, members pinned to their live revisions at launch.

    Raises TeamNotFound, and the registry's errors when a member cannot run.
    """
    team = get_team(session, team_id=team_id)
    members = []
    for m in team.members:
        agent, rev = registry.resolve_ref(session, ref=m.agent_id)
        members.append(
            TeamMemberSnapshot(
                agent_id=m.agent_id,
                pin=f"{agent.slug}@{rev.version}",
                role=m.role,
                hint=m.delegation_hint or agent.description,
            )
        )
    return TeamSnapshot(
        id=team.id,
        supervisor=team.supervisor_agent_id,
        members=members,
        routes=[(r.when, r.to) for r in team.routes],
        shared_channel=team.shared_channel,
    )


def match_route(routes: list[tuple[str, str]], text: str) -> str | None:
    """The member the first matching route sends ``text`` to, or None (bounded matching)."""
    for when, to in routes:
        if pattern_matches(when, text):
            return to
    return None


_WORD = re.compile(r"[a-z0-9]{3,}")
#: Words too common to make a memory relevant to a task ("do the thing" must not
#: match every memory that says "the").
# fmt: off
STOP_WORDS = frozenset((
    "about", "above", "after", "again", "all", "also", "and", "any", "are", "because", "been",
    "before", "being", "below", "between", "both", "but", "can", "could", "did", "does",
    "doing", "done", "down", "during", "each", "few", "for", "from", "further", "had", "has",
    "have", "having", "her", "here", "hers", "him", "his", "how", "into", "its", "itself",
    "just", "more", "most", "must", "not", "now", "off", "once", "only", "other", "our", "ours",
    "out", "over", "own", "please", "same", "she", "should", "some", "such", "than", "that",
    "the", "their", "theirs", "them", "then", "there", "these", "they", "this", "those",
    "through", "too", "under", "until", "very", "was", "were", "what", "when", "where", "which",
    "while", "who", "whom", "why", "will", "with", "would", "you", "your", "yours",
))
# fmt: on


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower())) - STOP_WORDS


def owns_channel(session: Session, *, team_id: str, channel: str) -> bool:
    """Whether ``channel`` is (still) the shared channel of team ``team_id``."""
    row = session.get(TeamRow, team_id)
    return row is not None and row.shared_channel == channel


def forget_channel(session: Session, *, channel: str) -> None:
    """Delete a channel's memories: a team released it (deleted, or moved to another
    channel), and whoever claims the name next must not read them."""
    session.execute(sa_delete(ChannelMemory).where(col(ChannelMemory.channel) == channel))


def remember(
    session: Session, *, team_id: str, channel: str, agent: str, text: str, delegation_id: str
) -> None:
    """Write a delegated result to the shared channel (once per delegation); nothing
    when the team no longer owns the channel (a run outlived a release)."""
    if not owns_channel(session, team_id=team_id, channel=channel):
        return
    exists = session.exec(
        select(ChannelMemory.id).where(
            ChannelMemory.channel == channel, ChannelMemory.delegation_id == delegation_id
        )
    ).first()
    if exists is None and text.strip():
        session.add(
            ChannelMemory(
                channel=channel, agent_slug=agent, delegation_id=delegation_id, text=text[:4000]
            )
        )
        session.flush()


def relevant_memories(
    session: Session, *, team_id: str, channel: str, task: str
) -> list[ChannelMemory]:
    """The channel's memories most relevant to ``task``: word overlap, newest first on ties.

    Deliberately simple and deterministic (no embeddings): members get at most
    :data:`MEMORY_LIMIT` memories that share words with the task. None when team
    ``team_id`` no longer owns the channel (another team may have claimed it).
    """
    if not owns_channel(session, team_id=team_id, channel=channel):
        return []
    words = _words(task)
    rows = session.exec(
        select(ChannelMemory)
        .where(ChannelMemory.channel == channel)
        .order_by(col(ChannelMemory.id).desc())
        .limit(200)
    ).all()
    scored = [(len(words & _words(r.text)), r) for r in rows]
    best: dict[str, ChannelMemory] = {}  # each text once (the newest copy)
    for score, r in sorted(scored, key=lambda x: -x[0]):
        if score > 0 and r.text not in best:
            best[r.text] = r
    return list(best.values())[:MEMORY_LIMIT]
