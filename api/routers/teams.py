"""``/v1/teams``: teams of a lead and its members (AgentX Agent Teams, 'Storage & API';
docs/teams.md)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query, Response, status
from sqlmodel import Session

from api.deps import Caller, CallerDep, SessionDep
from api.idempotency import IDEMPOTENT
from api.problems import problem_responses
from baton.agents import teams
from baton.agents.schemas import MAX_OFFSET, Page

router = APIRouter(prefix="/v1/teams", tags=["teams"], dependencies=[])

TeamIdPath = Annotated[str, Path(pattern=teams.TEAM_ID, examples=["research-desk"])]


def _require_members(
    caller: Caller, session: Session, slugs: list[str], role: Literal["viewer", "user"]
) -> None:
    """A team's access is its members' (auth mode): seeing it needs viewer on every
    member, writing it needs user on every member, before and after the write.
    Raises Forbidden (403)."""
    for slug in dict.fromkeys(slugs):
        caller.require(session, slug, role)


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    responses=problem_responses(403, 404, 409, 422),
    summary="Create a team",
    dependencies=IDEMPOTENT,
)
def create_team(body: teams.TeamIn, session: SessionDep, caller: CallerDep) -> teams.TeamPublic:
    """Validate and store a team. 409 ``team_exists``; 404 when a member is not an agent;
    403 in auth mode unless the caller holds the user role on every member."""
    _require_members(caller, session, [m.agent_id for m in body.members], "user")
    team = teams.create_team(session, team=body)
    session.commit()
    return team


@router.get("", responses=problem_responses(422), summary="List teams")
def list_teams(
    session: SessionDep,
    caller: CallerDep,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> Page[teams.TeamPublic]:
    """Teams by id (auth mode: those whose every member the caller can see)."""
    visible = caller.visible(session)
    rows, total = teams.list_teams(session, limit=limit, offset=offset, visible=visible)
    return Page(data=rows, count=total)


@router.get("/{team_id}", responses=problem_responses(403, 404, 422), summary="Get a team")
def get_team(team_id: TeamIdPath, session: SessionDep, caller: CallerDep) -> teams.TeamPublic:
    """One team; 404 ``team_not_found``, also when the caller cannot see every member."""
    caller.team_members(session, team_id)
    return teams.get_team(session, team_id=team_id)


@router.put(
    "/{team_id}",
    responses={201: {"model": teams.TeamPublic}, **problem_responses(403, 404, 409, 422)},
    summary="Create or replace a team",
)
def put_team(
    team_id: TeamIdPath,
    body: teams.TeamIn,
    session: SessionDep,
    response: Response,
    caller: CallerDep,
) -> teams.TeamPublic:
    """Replace the team (201 when it did not exist). The body's id must match the path.
    403 in auth mode unless the caller holds the user role on every old and new member."""
    old = teams.member_slugs(session, team_id=team_id)
    if old and not caller.sees_team(session, old):
        # As POST would answer: the id is taken (ids are global), by a team you cannot see.
        raise teams.TeamExists(f"team '{team_id}' already exists")
    _require_members(caller, session, old + [m.agent_id for m in body.members], "user")
    team, created = teams.put_team(session, team_id=team_id, team=body)
    session.commit()
    if created:
        response.status_code = status.HTTP_201_CREATED
    return team


@router.delete(
    "/{team_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses=problem_responses(403, 404, 422),
    summary="Delete a team",
)
def delete_team(team_id: TeamIdPath, session: SessionDep, caller: CallerDep) -> Response:
    """Delete the team; runs already started keep their snapshot. In auth mode the
    caller needs the user role on every member, or owns one of them: a team built
    around an owner's agent must never lock her out of retiring it. 404 for a team
    the caller cannot see (unless she owns a member), else 403."""
    slugs = teams.member_slugs(session, team_id=team_id)
    if not any(caller.has(session, s, "owner") for s in slugs):
        if not caller.sees_team(session, slugs):
            raise teams.TeamNotFound(f"no team '{team_id}'")
        _require_members(caller, session, slugs, "user")
    teams.delete_team(session, team_id=team_id)
    session.commit()
    return Response(status_code=status.HTTP_204_NO_CONTENT)
