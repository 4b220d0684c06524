"""``/v1/agents``: identities, drafts, revisions, the live pointer, resolution (docs/api.md)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response, status

from api.deps import CallerDep, SessionDep, SettingsDep
from api.idempotency import IDEMPOTENT
from api.problems import problem_responses
from baton.agents import registry
from baton.agents.schemas import (
    MAX_OFFSET,
    MAX_VERSION,
    AgentCreate,
    AgentPublic,
    AgentUpdate,
    Page,
    PublishBody,
    RevisionPublic,
    VersionBody,
)
from baton.agents.spec import SLUG_PATTERN, AgentSpec
from baton.contracts.values import ResolvedAgent
from baton.grants import auth, policies

router = APIRouter(prefix="/v1/agents", tags=["agents"])

SlugPath = Annotated[str, Path(pattern=SLUG_PATTERN, examples=["researcher"])]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    responses=problem_responses(400, 409, 422),
    summary="Create an agent (identity + draft)",
    dependencies=IDEMPOTENT,
)
def create_agent(body: AgentCreate, session: SessionDep, caller: CallerDep) -> AgentPublic:
    """Create ``slug`` with its first draft. 409 ``agent_exists`` when taken.

    In auth mode the creator becomes the agent's owner, and a slug that still has
    sessions of a deleted agent is taken too (``registry.slug_taken``).
    """
    agent = registry.create_agent(
        session,
        slug=body.slug,
        name=body.name,
        description=body.description,
        spec=body.spec,
        user=caller.acl_user,
    )
    if caller.auth:
        auth.grant(session, agent=body.slug, user_id=caller.user, role="owner")
    session.commit()
    return registry.to_public(session, agent)


@router.get("", responses=problem_responses(422), summary="List agents")
def list_agents(
    session: SessionDep,
    caller: CallerDep,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> Page[AgentPublic]:
    """Agents ordered by slug (in auth mode, those the user holds a role on)."""
    agents, total = registry.list_agents(
        session, limit=limit, offset=offset, only=caller.visible(session)
    )
    return Page(data=[registry.to_public(session, a) for a in agents], count=total)


@router.get("/{slug}", responses=problem_responses(404, 422), summary="Get an agent")
def get_agent(slug: SlugPath, session: SessionDep, caller: CallerDep) -> AgentPublic:
    """The agent's identity, draft, live version and whether its bases have newer revisions
    (``bases``, ``base_update_available``)."""
    caller.require(session, slug, "viewer")
    return registry.to_public(session, registry.get_agent(session, slug=slug))


@router.patch("/{slug}", responses=problem_responses(404, 422), summary="Edit name/description")
def update_agent(
    slug: SlugPath, body: AgentUpdate, session: SessionDep, caller: CallerDep
) -> AgentPublic:
    """Name and description are identity metadata: editing them creates no revision."""
    caller.require(session, slug, "owner")
    agent = registry.update_agent(session, slug=slug, name=body.name, description=body.description)
    session.commit()
    return registry.to_public(session, agent)


@router.delete(
    "/{slug}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses=problem_responses(404, 409, 422),
    summary="Delete an agent",
)
def delete_agent(slug: SlugPath, session: SessionDep, caller: CallerDep) -> Response:
    """Delete identity, draft and revisions. 409 ``agent_in_use`` if a live revision uses it."""
    caller.require(session, slug, "owner")
    registry.delete_agent(session, slug=slug)
    session.commit()
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.put(
    "/{slug}/draft", responses=problem_responses(400, 404, 422), summary="Replace the draft"
)
def put_draft(
    slug: SlugPath, body: AgentSpec, session: SessionDep, caller: CallerDep
) -> AgentPublic:
    """Replace the mutable draft; tree bounds are checked now, references at publish."""
    caller.require(session, slug, "owner")
    agent = registry.save_draft(session, slug=slug, spec=body, user=caller.acl_user)
    session.commit()
    return registry.to_public(session, agent)


@router.post(
    "/{slug}/publish",
    status_code=status.HTTP_201_CREATED,
    responses={
        200: {"model": RevisionPublic, "description": "Draft identical to the live revision"},
        **problem_responses(400, 404, 409, 422),
    },
    summary="Publish the draft",
    dependencies=IDEMPOTENT,
)
def publish(
    slug: SlugPath,
    session: SessionDep,
    response: Response,
    caller: CallerDep,
    settings: SettingsDep,
    body: PublishBody | None = None,
) -> RevisionPublic:
    """Validate and publish the draft as the next version; 200 with the live one if
    identical. Under a publish gate (the spec's ``publish_gate`` or
    ``BATON_PUBLISH_GATE``, docs/change-safely.md) it needs an eval of this draft that
    meets it: ``eval_id``, else the newest completed one; 409 ``eval_required`` when
    there is none, 409 ``eval_failed`` (with ``eval_id`` and ``failed``: the limit or
    condition not met) when it does not meet the gate, 404 ``eval_not_found``. The
    revision records the eval (``eval_id``)."""
    caller.require(session, slug, "owner")
    rev, created = registry.publish(
        session,
        slug=slug,
        user=caller.acl_user,
        eval_id=body.eval_id if body else None,
        default_gate=settings.publish_gate_config(),
        published_by=caller.user,
    )
    session.commit()
    if not created:
        response.status_code = status.HTTP_200_OK
    return registry.revision_public(registry.get_agent(session, slug=slug), rev)


@router.post(
    "/{slug}/rebase",
    status_code=status.HTTP_201_CREATED,
    dependencies=IDEMPOTENT,
    responses={
        200: {
            "model": RevisionPublic,
            "description": "The bases' live revisions are the pinned ones",
        },
        **problem_responses(400, 403, 404, 409, 422),
    },
    summary="Republish the live revision on its bases' live revisions",
)
def rebase(
    slug: SlugPath, session: SessionDep, response: Response, caller: CallerDep
) -> RevisionPublic:
    """Publish the live revision's spec as the next version, pinned to the bases' live
    revisions now (a published revision never follows a base by itself); the draft is
    untouched. The publish path's validation and ACL apply: 403 ``forbidden`` without
    viewer on a base. 200 with the live revision when nothing moved; 409
    ``agent_retired`` / ``agent_not_published`` without a live revision."""
    caller.require(session, slug, "owner")
    rev, created = registry.rebase(
        session, slug=slug, user=caller.acl_user, published_by=caller.user
    )
    session.commit()
    if not created:
        response.status_code = status.HTTP_200_OK
    return registry.revision_public(registry.get_agent(session, slug=slug), rev)


@router.get("/{slug}/revisions", responses=problem_responses(404, 422), summary="List revisions")
def list_revisions(slug: SlugPath, session: SessionDep, caller: CallerDep) -> Page[RevisionPublic]:
    """Every published revision, newest first."""
    caller.require(session, slug, "viewer")
    agent = registry.get_agent(session, slug=slug)
    revs = registry.list_revisions(session, slug=slug)
    return Page(data=[registry.revision_public(agent, r) for r in revs], count=len(revs))


@router.get(
    "/{slug}/revisions/{version}",
    responses=problem_responses(404, 422),
    summary="Get one revision",
)
def get_revision(
    slug: SlugPath,
    version: Annotated[int, Path(ge=1, le=MAX_VERSION)],
    session: SessionDep,
    caller: CallerDep,
) -> RevisionPublic:
    """Revision ``version``; 404 ``revision_not_found`` when it does not exist."""
    caller.require(session, slug, "viewer")
    rev = registry.get_revision(session, slug=slug, version=version)
    return registry.revision_public(registry.get_agent(session, slug=slug), rev)


@router.post(
    "/{slug}/restore",
    responses=problem_responses(404, 422),
    summary="Copy a revision into the draft",
    dependencies=IDEMPOTENT,
)
def restore(
    slug: SlugPath, body: VersionBody, session: SessionDep, caller: CallerDep
) -> AgentPublic:
    """The draft becomes revision ``version``'s spec; the live pointer stays."""
    caller.require(session, slug, "owner")
    agent = registry.restore(session, slug=slug, version=body.version, user=caller.acl_user)
    session.commit()
    return registry.to_public(session, agent)


@router.post(
    "/{slug}/rollback",
    responses=problem_responses(400, 404, 422),
    summary="Move the live pointer",
    dependencies=IDEMPOTENT,
)
def rollback(
    slug: SlugPath, body: VersionBody, session: SessionDep, caller: CallerDep
) -> AgentPublic:
    """The live pointer moves to existing revision ``version``; nothing new is stored."""
    caller.require(session, slug, "owner")
    agent = registry.rollback(session, slug=slug, version=body.version, user=caller.acl_user)
    session.commit()
    return registry.to_public(session, agent)


@router.post(
    "/{slug}/retire",
    responses=problem_responses(404, 409, 422),
    summary="Retire an agent",
    dependencies=IDEMPOTENT,
)
def retire(slug: SlugPath, session: SessionDep, caller: CallerDep) -> AgentPublic:
    """Clear the live pointer; launches are refused with ``agent_retired`` afterwards."""
    caller.require(session, slug, "owner")
    agent = registry.retire(session, slug=slug)
    session.commit()
    return registry.to_public(session, agent)


@router.get(
    "/{slug}/resolved",
    responses=problem_responses(400, 404, 409, 422),
    summary="Effective configuration",
)
def resolved(
    slug: SlugPath,
    session: SessionDep,
    caller: CallerDep,
    version: Annotated[
        int | None, Query(ge=1, le=MAX_VERSION, description="A pinned revision; omit = live")
    ] = None,
) -> ResolvedAgent:
    """The revision after inheritance and narrowing (docs/agents.md, 'Resolution rules')."""
    caller.require(session, slug, "viewer")
    ref = f"{slug}@{version}" if version is not None else slug
    return registry.resolve_agent(session, ref=ref, user=caller.acl_user)


@router.get(
    "/{slug}/policies",
    responses=problem_responses(404, 422),
    summary="X-Agent policies of an agent",
    tags=["policies"],
)
def get_policies(slug: SlugPath, session: SessionDep, caller: CallerDep) -> policies.Policies:
    """``{global: {list, read, invoke}, targets: {slug: {read, invoke}}}``; review = no row.

    In auth mode, targets the user cannot see are hidden (Gamut X-Agent Policies); a PUT keeps
    their rows and refuses to name them (404, as for an unknown agent).
    """
    caller.require(session, slug, "viewer")
    current = policies.get_policies(session, caller=slug)
    visible = caller.visible(session)
    if visible is not None:
        current.targets = {t: p for t, p in current.targets.items() if t in visible}
    return current


@router.put(
    "/{slug}/policies",
    responses=problem_responses(404, 422),
    summary="Replace the X-Agent policies of an agent",
    tags=["policies"],
)
def put_policies(
    slug: SlugPath, body: policies.Policies, session: SessionDep, caller: CallerDep
) -> policies.Policies:
    """Replace every policy row of ``slug`` as caller (Gamut X-Agent Policies, 'Managing policies').

    404 for an unknown target; 422 ``invalid_policy`` when the agent names itself.
    """
    caller.require(session, slug, "owner")
    result = policies.put_policies(
        session, caller=slug, policies=body, visible=caller.visible(session)
    )
    session.commit()
    return result
