"""``/v1/sessions``: launch sessions, send messages, read transcripts, stream events."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal
from urllib.parse import quote

from fastapi import APIRouter, Header, Path, Query, Request, Response, status
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from sqlalchemy.engine import Engine
from sqlmodel import Session
from sse_starlette import EventSourceResponse
from temporalio.client import Client

from api.deps import (
    Caller,
    CallerDep,
    EngineDep,
    SessionDep,
    SettingsDep,
    TemporalDep,
    get_caller,
    get_temporal,
)
from api.feeds import SessionFeeds
from api.idempotency import IDEMPOTENT, IdempotencyDep
from api.mcp import MCP_PATH
from api.problems import problem_responses
from baton.agents import registry, teams
from baton.agents.schemas import MAX_OFFSET, CursorPage
from baton.agents.spec import REF_PATTERN, SafeText, parse_ref
from baton.contracts.values import MAX_MESSAGE_CHARS, ResolvedAgent, TeamSnapshot
from baton.contracts.workflow_io import IfBusy, Provenance
from baton.errors import BatonError, EngineUnavailable, ExhibitNotFound
from baton.grants.auth import Forbidden, Role, Unauthorized
from baton.runs import exhibits, external, fork, inquiries, launch, run_tree, session_store
from baton.runs.external import ExternalIdentity
from baton.settings import Settings
from baton.storage.db import session_scope

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])

SessionIdPath = Annotated[str, Path(pattern=r"^session-[0-9a-f-]{36}$", examples=["session-0b6c…"])]
#: Event ids are 64-bit integers in every backend.
MAX_EVENT_ID = 2**62
#: Statuses that end an ``until=idle`` stream.
CLOSING = ("idle", "cancelled", "failed")


def require_session(engine: Engine, caller: Caller, role: Role, *, session_id: str) -> None:
    """ACL on the session's agent (auth mode); 404 for an unknown session either way."""
    with session_scope(engine) as s:
        row = session_store.get_session(s, session_id=session_id)
        caller.require(s, row.agent_slug, role)


def runnable(s: Session, caller: Caller, ref: str) -> ResolvedAgent:
    """``ref`` resolved for a session the caller starts: the one rule of who may run which
    agent. ``slug`` / ``slug@V``: the ``user`` role on the agent (auth mode, 403), a
    published revision (the registry's 4xx), never an ambassador (422 ``not_invocable``).
    ``slug@draft`` (the authoring sandbox only, see :func:`start_fork`): the ``owner``
    role, who edits the draft, and the draft resolved as publishing would resolve it."""
    slug, _, tail = ref.partition("@")
    if tail == fork.DRAFT_VERSION:
        caller.require(s, slug, "owner")
        resolved = registry.resolve_draft(s, slug=slug)
        inquiries.require_invocable(s, slug=slug, live=resolved)
        return resolved
    slug, version = parse_ref(ref)
    caller.require(s, slug, "user")
    resolved = registry.resolve_agent(s, ref=ref)
    inquiries.require_invocable(s, slug=slug, live=resolved if version is None else None)
    return resolved


class NoAgent(BatonError):
    """A session request that names no agent, team or target and has no default."""

    code = "no_agent"
    status = 422
    title = "No agent"


def _prompt(value: str | None) -> str | None:
    """A sent prompt is text and not blank (pydantic runs this only for a value the request
    sent, never for the default): ``"prompt": null`` is refused like a blank one, since
    null is no message; leave the field out to send none (``external``, ``from_draft``)."""
    if value is None:
        raise ValueError("prompt must be text: leave it out rather than send null")
    if not value.strip():
        raise ValueError("prompt must not be blank")
    return value


class SessionCreate(BaseModel):
    """``POST /v1/sessions``. Provenance is never accepted from clients."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,  # `"sync": "false"` or `1` is a 422, not a silent coercion
        json_schema_extra={
            "examples": [{"agent": "researcher@2", "prompt": "What changed in Q3?", "sync": True}]
        },
    )

    agent: str | None = Field(
        default=None, pattern=REF_PATTERN, description="`slug` (live) or `slug@version`."
    )
    prompt: SafeText | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_MESSAGE_CHARS,
        description="The first message (required unless `external`).",
    )
    sync: bool = Field(default=False, description="Wait for the final reply.")
    name: SafeText | None = Field(default=None, max_length=200)
    team: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9][a-z0-9-]{0,62}$",
        description="A team run: the team's supervisor becomes the session's agent.",
    )
    target_agent: str | None = Field(
        default=None, pattern=REF_PATTERN, description="Explicit routing: wins over `agent`."
    )
    disable_delegation: bool = Field(
        default=False, description="Solo: no ad-hoc delegation (ignored for team runs)."
    )

    external: bool = Field(
        default=False,
        description="An external session (no prompt): an outside process takes its "
        "turns and calls the X-Agent tools over MCP with the returned proxy token.",
    )
    token_ttl_s: int | None = Field(
        default=None, ge=60, le=90 * 86400, description="External: proxy token lifetime (s)."
    )

    _not_blank = field_validator("prompt")(_prompt)

    @model_validator(mode="after")
    def _prompt_unless_external(self) -> SessionCreate:
        if self.external and (self.prompt is not None or self.team or self.sync):
            raise ValueError("an external session takes no prompt, team or sync")
        if not self.external and self.prompt is None:
            raise ValueError("prompt is required (unless external)")
        return self


class MessageCreate(BaseModel):
    """``POST /v1/sessions/{id}/messages``."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={"examples": [{"prompt": "And Q4?", "sync": True}]},
    )

    prompt: SafeText | None = Field(default=None, min_length=1, max_length=MAX_MESSAGE_CHARS)
    sync: bool = False
    from_draft: str | None = Field(
        default=None,
        pattern=r"^inquiry-[0-9a-f-]{36}$",
        description="Send an ambassador's draft (its inquiry id) as your message; "
        "instead of `prompt`.",
    )
    role: Literal["user", "assistant"] = Field(
        default="user",
        description="On an external session, with its proxy token, the outside "
        "process posts its own messages (`assistant`: what it did).",
    )

    if_busy: IfBusy = Field(
        default="reject",
        description="While a turn runs: `reject` (409 `session_busy`), `enqueue` (run it "
        "as a later turn, in order; 409 `queue_full` past `BATON_MAX_QUEUED_MESSAGES`) or "
        "`interrupt` (stop the running turn, keeping its partial reply, then run it).",
    )

    _not_blank = field_validator("prompt")(_prompt)

    @model_validator(mode="after")
    def _one_source(self) -> MessageCreate:
        if (self.prompt is None) == (self.from_draft is None):
            raise ValueError("send exactly one of prompt and from_draft")
        return self


class SessionAccepted(BaseModel):
    """A launched session or a sent message: ``response`` is set when ``sync``."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "session_id": "session-0b6c…",
                    "status": "idle",
                    "agent": "researcher",
                    "version": 2,
                    "response": "Revenue grew 4%.",
                    "message_id": "session-0b6c…:t1:s1:assistant",
                    "workflow_url": "http://localhost:8233/namespaces/default/workflows/session-0b6c…",
                }
            ]
        }
    )

    session_id: str
    status: str
    agent: str
    version: int
    response: str | None = None
    message_id: str | None = None
    workflow_url: str
    proxy_token: str | None = Field(
        default=None, description="External sessions: the proxy token, shown once."
    )
    mcp_url: str | None = Field(default=None, description="External sessions: the MCP server.")


def _accepted(launched: launch.Launched, *, sync: bool, settings: Settings) -> dict[str, Any]:
    """The :class:`SessionAccepted` fields of a started session, from what the launch
    returned, not read back: the session exists and runs, so a database that drops now
    must not turn its success into a 503 (and a retry)."""
    return {
        "session_id": launched.session_id,
        "status": launch.accepted_status(sync=sync),
        "agent": launched.agent,
        "version": launched.version,
        "response": launched.response,
        "message_id": launched.outcome.message_id if launched.outcome else None,
        "workflow_url": settings.workflow_url(launched.session_id),
    }


class SessionDetail(session_store.SessionPublic):
    """A session with its Temporal UI link."""

    workflow_url: str


class CancelAccepted(BaseModel):
    """``POST /v1/sessions/{id}/cancel``."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"session_id": "session-0b6c…", "status": "cancelling"}]}
    )

    session_id: str
    status: Literal["cancelling", "cancelled", "failed"]


def _resolve_target(
    s: Session, body: SessionCreate, settings: Settings, caller: Caller
) -> tuple[str, TeamSnapshot | None, ResolvedAgent]:
    """The agent a new session runs, by AgentX Agent Teams' explicit routing: team (its
    supervisor) > target agent > agent > BATON_DEFAULT_AGENT. Returns the ref, the team
    snapshot (None: no team) and the resolved agent.

    Raises NoAgent (422) when none is named, the registry's errors for a bad ref, 404 for
    a team the caller may not see, 403 ``forbidden`` without the ``user`` role on the
    agent or on any member of the team (a team run runs every member), and
    ``not_invocable`` for an ambassador."""
    if body.team:
        caller.team_members(s, body.team)  # a hidden team is 404, as a missing one
    team = teams.snapshot(s, team_id=body.team) if body.team else None
    if team is not None:
        ref = next(m.pin for m in team.members if m.role == "supervisor")
    else:
        ref = body.target_agent or body.agent or settings.default_agent or ""
        if not ref:
            raise NoAgent(
                "name an agent, a target_agent or a team (no BATON_DEFAULT_AGENT is set)",
                path="agent",
            )
    resolved = runnable(s, caller, ref)
    for member in team.members if team else []:
        caller.require(s, member.agent_id, "user")
    return ref, team, resolved


def _provenance(body: SessionCreate, caller: Caller, team: TeamSnapshot | None) -> Provenance:
    """A session started over the API: by the caller, in the team when there is one."""
    return Provenance(
        created_by_user=caller.user,
        team=team.id if team else None,
        disable_delegation=body.disable_delegation,
    )


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    responses=problem_responses(404, 409, 422, 502, 503),
    summary="Start a session",
)
async def create_session(
    body: SessionCreate,
    request: Request,
    engine: EngineDep,
    settings: SettingsDep,
    temporal: TemporalDep,
    caller: CallerDep,
    claim: IdempotencyDep,
) -> SessionAccepted:
    """Resolve the agent to a pin, start its SessionWorkflow with the first message.

    With an ``Idempotency-Key`` the session id is derived from it, so a retry that takes
    over a request whose API process was killed attaches to the session it started.

    In auth mode the user needs the ``user`` role on the agent (403 ``forbidden``).
    ``external``: no first message; the answer carries the session's proxy
    token (shown once) and the MCP server's URL.
    """

    def route() -> tuple[str, TeamSnapshot | None, launch.Recorded | None]:
        with session_scope(engine) as s:
            ref, team, resolved = _resolve_target(s, body, settings, caller)
            if body.external:
                return ref, team, None
            assert body.prompt is not None  # checked by SessionCreate
            # Recorded in the transaction that checked the request, with the snapshot just
            # resolved (one transaction, one resolution per launch).
            recorded = launch.record_session(
                s,
                session_id=f"session-{claim.uuid()}" if claim else launch.new_session_id(),
                idempotent=claim is not None,
                ref=ref,
                prompt=body.prompt,
                provenance=_provenance(body, caller, team),
                name=body.name,
                resolved=resolved,
            )
            return ref, team, recorded

    ref, team, recorded = await asyncio.to_thread(route)
    try:  # only once the request is valid: a bad one is its 4xx even with Temporal down
        client = await temporal.client()
    except EngineUnavailable:
        if recorded is not None:
            await asyncio.to_thread(launch.forget_session, engine, recorded.session_id)
        raise
    if recorded is None:  # external
        if claim is not None:
            # The answer shows the proxy token once; stored for a replay it would sit in
            # the database in plaintext, where Baton keeps tokens only hashed.
            claim.keep = False
        return await _open_external(body, request, engine, settings, client, caller, ref)
    assert body.prompt is not None
    launched = await launch.launch_session(
        client,
        engine,
        task_queue=settings.task_queue,
        config=settings.session_config(),
        ref=ref,
        prompt=body.prompt,
        provenance=_provenance(body, caller, team),
        sync=body.sync,
        name=body.name,
        team=team,
        recorded=recorded,
        keyed=claim is not None,
    )
    return SessionAccepted(**_accepted(launched, sync=body.sync, settings=settings))


async def _open_external(
    body: SessionCreate,
    request: Request,
    engine: Engine,
    settings: Settings,
    client: Client,
    caller: Caller,
    ref: str,
) -> SessionAccepted:
    """``external: true``: the session, its proxy token and the MCP URL."""
    opened = await external.open_external_session(
        client,
        engine,
        task_queue=settings.task_queue,
        config=settings.session_config(),
        ref=ref,
        provenance=Provenance(
            created_by_user=caller.user, disable_delegation=body.disable_delegation
        ),
        name=body.name,
        token_ttl_s=body.token_ttl_s,
    )
    return SessionAccepted(
        session_id=opened.session_id,
        status="idle",
        agent=opened.agent,
        version=opened.version,
        workflow_url=settings.workflow_url(opened.session_id),
        proxy_token=opened.proxy_token,
        mcp_url=str(request.base_url).rstrip("/") + MCP_PATH,
    )


#: ``slug``, ``slug@V`` or, in the sandbox only, ``slug@draft``.
FORK_REF_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}(@([1-9][0-9]{0,8}|draft))?$"


class ForkCreate(BaseModel):
    """``POST /v1/sessions/{id}/fork``."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [
                {"after_message_id": "session-0b6c…:t1:s1:assistant", "prompt": "And Q4?"},
                {
                    "after_message_id": "session-0b6c…:t1:user",
                    "agent": "researcher@draft",
                    "sandbox": True,
                },
            ]
        },
    )

    after_message_id: str = Field(
        min_length=1, max_length=160, description="The original's message the fork ends at."
    )
    agent: str | None = Field(
        default=None,
        pattern=FORK_REF_PATTERN,
        description="`slug`, `slug@version` or (with `sandbox`) `slug@draft`; "
        "default: the original's pin.",
    )
    prompt: SafeText | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_MESSAGE_CHARS,
        description="Replaces the original's next user message (not after a user message).",
    )
    sandbox: bool = Field(
        default=False, description="The authoring sandbox: needed to run `slug@draft`."
    )
    sync: bool = Field(default=False, description="Wait for the fork's first reply.")

    _not_blank = field_validator("prompt")(_prompt)


class ForkAccepted(SessionAccepted):
    """A started fork: the launch's answer and its lineage."""

    forked_from: str
    fork_point: str
    sandbox: bool


@router.post(
    "/{session_id}/fork",
    status_code=status.HTTP_201_CREATED,
    responses=problem_responses(403, 404, 409, 422, 502, 503),
    summary="Fork a session",
)
async def start_fork(
    session_id: SessionIdPath,
    body: ForkCreate,
    engine: EngineDep,
    settings: SettingsDep,
    temporal: TemporalDep,
    caller: CallerDep,
    claim: IdempotencyDep,
) -> ForkAccepted:
    """Start a new session whose transcript is this one's up to and including
    ``after_message_id`` (held by reference), then run from there (docs/change-safely.md, Fork
    a session). The original is never touched.

    Needs read on the original (``viewer``, as its transcript) and the right to run the
    chosen agent (:func:`runnable`), a revision of the original's agent (422
    ``fork_of_other_agent``). ``slug@draft`` needs ``sandbox: true`` (422
    ``draft_outside_sandbox``); a sandbox fork is marked ``sandbox``. 422
    ``unknown_message``, ``message_of_another_session``, ``prompt_after_user_message``,
    ``fork_needs_prompt``; the registry's 404 / 409 / 422 for the agent.
    """

    def record() -> tuple[str, launch.Recorded, fork.ForkPlan, Provenance]:
        with session_scope(engine) as s:
            original = session_store.get_session(s, session_id=session_id)
            caller.require(s, original.agent_slug, "viewer")
            agent = runnable(s, caller, fork.agent_ref(original, body.agent, body.sandbox))
            planned = fork.plan(
                s, original=original, after_message_id=body.after_message_id, prompt=body.prompt
            )
            prov = fork.provenance(original, planned, user=caller.user, sandbox=body.sandbox)
            recorded = fork.record(
                s,
                session_id=f"session-{claim.uuid()}" if claim else launch.new_session_id(),
                original=original,
                fork=planned,
                agent=agent,
                prov=prov,
                idempotent=claim is not None,
            )
            return fork.name_of(original), recorded, planned, prov

    name, recorded, planned, prov = await asyncio.to_thread(record)
    try:  # only once the request is valid: a bad one is its 4xx even with Temporal down
        client = await temporal.client()
    except EngineUnavailable:
        await asyncio.to_thread(launch.forget_session, engine, recorded.session_id)
        raise
    launched = await launch.launch_session(
        client,
        engine,
        task_queue=settings.task_queue,
        config=settings.session_config(),
        ref=f"{recorded.slug}@{recorded.version}",
        prompt=planned.prompt,
        provenance=prov,
        sync=body.sync,
        name=name,
        recorded=recorded,
        keyed=claim is not None,
        turn=planned.turn,
        in_transcript=planned.in_transcript,
    )
    return ForkAccepted(
        **_accepted(launched, sync=body.sync, settings=settings),
        forked_from=session_id,
        fork_point=planned.point.id,
        sandbox=prov.sandbox,
    )


def _proxy_sender(engine: Engine, session_id: str, token: str) -> ExternalIdentity:
    """The identity of a proxy token posting to ``session_id``: 401 for an
    invalid one, 403 for another session's."""
    with session_scope(engine) as s:
        identity = external.authenticate(s, token)
    if identity.session_id != session_id:
        raise Forbidden("this proxy token belongs to another session")
    return identity


def _ordinary_target(
    engine: Engine, caller: Caller, session_id: str, role: str
) -> session_store.SessionPublic:
    """The session a message goes to, read before it is sent. 404 / 403 (ACL) as before;
    an external session takes messages only with its proxy token (401); ``role:
    assistant`` is for external sessions only (409 not_external)."""
    with session_scope(engine) as s:
        row = session_store.get_session(s, session_id=session_id)
        caller.require(s, row.agent_slug, "user")
        if session_store.is_external(s, session_id=session_id):
            raise Unauthorized("an external session takes messages with its proxy token")
        public = session_store.to_public(row)
    if role != "user":
        raise external.NotExternal("only an external session takes assistant messages", path="role")
    return public


async def _send_external(
    session_id: str,
    body: MessageCreate,
    request: Request,
    engine: Engine,
    settings: Settings,
    token: str,
) -> SessionAccepted:
    """A message an external process posts to its own session with its proxy token (401
    for a wrong one): stored in the transcript as it is (``role``); no model turn runs.
    ``from_draft`` is refused (409 ``not_external``): a draft is a person's turn."""
    identity = await asyncio.to_thread(_proxy_sender, engine, session_id, token)
    if body.prompt is None:
        raise external.NotExternal("an external session posts a prompt", path="from_draft")
    client = await get_temporal(request, Caller(user=identity.user_id, auth=settings.auth == "on"))
    # Read before the post: after it, a dropped database must not answer 503 for a
    # message that was stored (the client's retry would store it twice).
    public = await asyncio.to_thread(_public, engine, session_id)
    message_id = await external.post_message(
        client, engine, identity, role=body.role, text=body.prompt
    )
    return SessionAccepted(
        session_id=session_id,
        status=public.status,
        agent=public.agent,
        version=public.version,
        message_id=message_id,
        workflow_url=settings.workflow_url(session_id),
    )


@router.post(
    "/{session_id}/messages",
    responses=problem_responses(401, 403, 404, 409, 422, 502, 503),
    summary="Send a message",
)
async def send_message(
    session_id: SessionIdPath,
    body: MessageCreate,
    request: Request,
    engine: EngineDep,
    settings: SettingsDep,
    claim: IdempotencyDep,
    authorization: Annotated[
        str | None, Header(description="`Bearer <token>`: an API token, or a proxy token.")
    ] = None,
) -> SessionAccepted:
    """Deliver a message by Update; while a turn runs, 409 ``session_busy`` unless
    ``if_busy`` asks to enqueue it (409 ``queue_full`` when the queue is full) or to
    interrupt the turn.

    ``from_draft`` sends the draft of one of the caller's inquiries on this session
    as the caller's own user turn (AgentX Agent Teams, 'Outbound relay'): 404
    ``inquiry_not_found``, 422 ``no_draft``, 409 ``draft_already_sent``.

    External sessions take messages only with their proxy token, stored in
    the transcript as they are (``role``; no model turn runs); ``role: assistant`` on
    an ordinary session is 409 ``not_external``.
    """
    token = external.bearer(authorization)
    if token is not None and token.startswith(external.PROXY_PREFIX):
        return await _send_external(session_id, body, request, engine, settings, token)
    caller = await asyncio.to_thread(get_caller, request, authorization)  # 401 first
    public = await asyncio.to_thread(_ordinary_target, engine, caller, session_id, body.role)
    prompt = body.prompt or ""
    if body.from_draft is not None:
        draft_id = body.from_draft

        def draft() -> str:
            with session_scope(engine) as s:
                return inquiries.take_draft(
                    s, inquiry_id=draft_id, session_id=session_id, user=caller.user
                )

        prompt = await asyncio.to_thread(draft)
    client = await get_temporal(request, caller)  # after every check: a bad request is its 4xx
    outcome, text = await launch.send_message(
        client,
        engine,
        session_id=session_id,
        prompt=prompt,
        sync=body.sync,
        update_id=f"{session_id}:message-{claim.uuid()}" if claim else None,
        user=caller.user,
        settle_s=settings.message_settle_timeout,
        if_busy=body.if_busy,
    )
    if body.from_draft is not None:
        # The reply's id when the turn was awaited; a draft is sent once either way.
        sent_id, sent_message = body.from_draft, outcome.message_id if outcome else "sent"

        def sent() -> None:
            with session_scope(engine) as s:
                inquiries.mark_sent(s, inquiry_id=sent_id, message_id=sent_message)

        await asyncio.to_thread(sent)

    # Agent and version were read before the Update (a session's pin never changes), the
    # status is what the delivery returned: the Update was delivered, so a database that
    # drops now must not answer 503 for a message the session has taken.
    return SessionAccepted(
        session_id=session_id,
        status=launch.accepted_status(sync=body.sync),
        agent=public.agent,
        version=public.version,
        response=text,
        message_id=outcome.message_id if outcome else None,
        workflow_url=settings.workflow_url(session_id),
    )


def _public(engine: Engine, session_id: str) -> session_store.SessionPublic:
    with session_scope(engine) as s:
        return session_store.to_public(session_store.get_session(s, session_id=session_id))


@router.get("", responses=problem_responses(422), summary="List sessions")
def list_sessions(
    session: SessionDep,
    caller: CallerDep,
    agent: Annotated[str | None, Query(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=200,
            description="A previous page's `next_cursor`: the page after it, at the cost of "
            "the first page whatever its depth.",
        ),
    ] = None,
    offset: Annotated[
        int,
        Query(
            ge=0,
            le=MAX_OFFSET,
            description="Deprecated, prefer `cursor`: rows skipped, which the database reads "
            "and drops (a deep page costs its depth). Not with `cursor`.",
        ),
    ] = 0,
) -> CursorPage[session_store.SessionPublic]:
    """Sessions newest first, optionally of one agent; ``next_cursor`` while more follow.

    Keyset paging (``cursor``): each page is one range read, disjoint from the pages before
    it however many sessions were created since. 422 ``invalid_cursor`` for a cursor this
    list never gave, or with ``offset``.
    """
    if cursor is not None and offset:
        raise session_store.InvalidCursor("a cursor pages alone: drop offset", path="offset")
    rows, total, next_cursor = session_store.page_sessions(
        session,
        agent=agent,
        limit=limit,
        offset=offset,
        cursor=cursor,
        agents=caller.visible(session),
    )
    return CursorPage(
        data=[session_store.to_public(r) for r in rows], count=total, next_cursor=next_cursor
    )


@router.get("/{session_id}", responses=problem_responses(404, 422), summary="Get a session")
def get_session(
    session_id: SessionIdPath, session: SessionDep, settings: SettingsDep, caller: CallerDep
) -> SessionDetail:
    """Status, counters, provenance and the Temporal UI link."""
    row = session_store.get_session(session, session_id=session_id)
    caller.require(session, row.agent_slug, "viewer")
    public = session_store.to_public(row)
    return SessionDetail(**public.model_dump(), workflow_url=settings.workflow_url(session_id))


@router.get("/{session_id}/transcript", responses=problem_responses(404, 422), summary="Transcript")
def get_transcript(
    session_id: SessionIdPath,
    session: SessionDep,
    caller: CallerDep,
    limit: Annotated[
        int,
        Query(
            ge=1,
            le=session_store.MAX_TRANSCRIPT_PAGE,
            description="Page size: at most this many messages, and `next_cursor` while "
            "more follow.",
        ),
    ] = session_store.DEFAULT_TRANSCRIPT_PAGE,
    cursor: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=160,
            description="A previous page's `next_cursor`: the page after it.",
        ),
    ] = None,
) -> session_store.Transcript:
    """Status line then messages; tool I/O summarised, thinking never stored.

    Always paged: ``limit`` (1..500, 100 when not given) and ``cursor``; each page is one
    range read, so a 10,000-message transcript pages in constant time. 422
    ``invalid_cursor`` for a cursor naming no message of this session.
    """
    caller.require(
        session, session_store.get_session(session, session_id=session_id).agent_slug, "viewer"
    )
    return session_store.transcript(session, session_id=session_id, limit=limit, cursor=cursor)


@router.get(
    "/{session_id}/trace", responses=problem_responses(403, 404, 422), summary="Delegation trace"
)
def get_trace(
    session_id: SessionIdPath, session: SessionDep, settings: SettingsDep, caller: CallerDep
) -> run_tree.TraceNode:
    """The delegation tree under the session: each step's agent, status, tokens, cost and
    wall-clock, and subtree totals (AgentX Agent Teams, 'Team Run Trace'); each node's Temporal UI
    link (``workflow_url``) and, on the root, the run tree's list (``run_tree_url``)."""
    row = session_store.get_session(session, session_id=session_id)
    caller.require(session, row.agent_slug, "viewer")
    return run_tree.trace(session, session_id=session_id, links=settings)


ExhibitIdPath = Annotated[str, Path(pattern=r"^ex-[0-9a-f]{24}$", examples=["ex-3f2a…"])]


@router.get(
    "/{session_id}/exhibits/{exhibit_id}",
    response_class=Response,
    responses={
        200: {"content": {"application/octet-stream": {}}, "description": "The content"},
        **problem_responses(403, 404, 422),
    },
    summary="An exhibit's content",
)
def get_exhibit(
    session_id: SessionIdPath, exhibit_id: ExhibitIdPath, session: SessionDep, caller: CallerDep
) -> Response:
    """The content of an image or download exhibit shown in ``session_id``
    (docs/exhibits.md), for whoever may read that session or its run's root (where a
    delegated exhibit is shown). Served as stored: an image of a safe raster type inline,
    anything else as an attachment; ``nosniff`` and a sandboxing CSP either way.
    404 ``exhibit_not_found``."""
    row = exhibits.content(session, session_id=session_id, ident=exhibit_id)
    if row is None or row.content is None:
        raise ExhibitNotFound(f"no exhibit '{exhibit_id}' with content in '{session_id}'")
    owner = session_store.get_session(session, session_id=session_id).agent_slug
    root = session_store.get_session(session, session_id=row.root_session_id).agent_slug
    if not caller.has(session, root, "viewer"):
        caller.require(session, owner, "viewer")
    media = row.media_type or "application/octet-stream"
    inline = row.kind == "image" and media in exhibits.SAFE_IMAGE_TYPES
    name = str(row.wire.get("filename") or exhibit_id)
    disposition = "inline" if inline else "attachment"
    return Response(
        content=row.content,
        media_type=media,
        headers={
            "Content-Disposition": f"{disposition}; filename*=UTF-8''{quote(name)}",
            "X-Content-Type-Options": "nosniff",
            "Content-Security-Policy": "default-src 'none'; sandbox",
            "Cache-Control": "private, max-age=3600",
        },
    )


@router.get(
    "/{session_id}/events",
    responses={
        200: {"content": {"text/event-stream": {}}, "description": "Server-sent events"},
        **problem_responses(404, 422),
    },
    summary="Stream events (SSE)",
)
async def stream_events(
    session_id: SessionIdPath,
    request: Request,
    engine: EngineDep,
    caller: CallerDep,
    last_event_id: Annotated[
        int | None, Header(alias="Last-Event-ID", ge=0, le=MAX_EVENT_ID)
    ] = None,
    after: Annotated[
        int | None, Query(ge=0, le=MAX_EVENT_ID, description="Same as Last-Event-ID.")
    ] = None,
    until: Annotated[
        Literal["idle"] | None,
        Query(description="`idle`: close once the session is idle (or cancelled)."),
    ] = None,
) -> EventSourceResponse:
    """Events from the durable log, resumable with ``Last-Event-ID``.

    Each event has ``id`` (the resume cursor), ``event`` (message, chunk,
    status, …) and JSON ``data``. Disconnecting never affects the run.
    """
    # 404 / 403 before streaming
    await asyncio.to_thread(require_session, engine, caller, "viewer", session_id=session_id)
    cursor = last_event_id if last_event_id is not None else (after or 0)
    # One reader per session for all of this process's followers of it (api.feeds): a woken
    # follower costs a queue hand-off, not a read; idle followers cost nothing.
    feeds: SessionFeeds = request.app.state.feeds

    async def gen() -> AsyncIterator[bytes]:
        closing = CLOSING if until else None
        async for group in feeds.stream(session_id, cursor, until=closing):
            # Each frame is encoded once for every follower; what a follower has when it
            # wakes goes out in one write (one send through the middleware and the socket).
            yield b"".join(frame for _, _, _, frame in group)

    return EventSourceResponse(gen(), ping=15)


@router.post(
    "/{session_id}/cancel",
    status_code=status.HTTP_202_ACCEPTED,
    dependencies=IDEMPOTENT,
    responses=problem_responses(404, 422, 503),
    summary="Cancel a session",
)
async def cancel(
    session_id: SessionIdPath, engine: EngineDep, temporal: TemporalDep, caller: CallerDep
) -> CancelAccepted:
    """Cancel the running turn and close the session (idempotent)."""
    await asyncio.to_thread(require_session, engine, caller, "user", session_id=session_id)
    await launch.cancel_session(await temporal.client(), engine, session_id=session_id)
    state = await asyncio.to_thread(launch.session_status, engine, session_id)
    closed: Literal["cancelled", "failed"] | None = (
        "cancelled" if state == "cancelled" else "failed" if state == "failed" else None
    )
    return CancelAccepted(session_id=session_id, status=closed or "cancelling")
