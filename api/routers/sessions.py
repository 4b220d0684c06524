"""``/v1/sessions``: launch sessions, send messages, read transcripts, stream events."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Annotated, Literal

from fastapi import APIRouter, Header, Path, Query, Request, status
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from sqlalchemy.engine import Engine
from sse_starlette import EventSourceResponse, ServerSentEvent
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
from api.mcp import MCP_PATH
from api.problems import problem_responses
from baton.agents import registry, teams
from baton.agents.schemas import MAX_OFFSET, Page
from baton.agents.spec import REF_PATTERN, SafeText, parse_ref
from baton.contracts import MAX_MESSAGE_CHARS, Provenance, TeamSnapshot
from baton.errors import BatonError
from baton.grants.auth import Forbidden, Role, Unauthorized
from baton.runs import external, inquiries, launch, run_tree, session_store
from baton.runs.external import ExternalIdentity
from baton.settings import Settings
from baton.storage.db import session_scope
from baton.storage.notify import EventNotifier

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])

SessionIdPath = Annotated[str, Path(pattern=r"^session-[0-9a-f-]{36}$", examples=["session-0b6c…"])]
#: Event ids are 64-bit integers in every backend.
MAX_EVENT_ID = 2**62
#: Statuses that end an ``until=idle`` stream.
CLOSING = ("idle", "cancelled", "failed")


def _require(engine: Engine, caller: Caller, role: Role, *, session_id: str) -> None:
    """ACL on the session's agent (auth mode); 404 for an unknown session either way."""
    with session_scope(engine) as s:
        row = session_store.get_session(s, session_id=session_id)
        caller.require(s, row.agent_slug, role)


class NoAgent(BatonError):
    """A session request that names no agent, team or target and has no default."""

    code = "no_agent"
    status = 422
    title = "No agent"


def _prompt(value: str) -> str:
    if not value.strip():
        raise ValueError("prompt must not be blank")
    return value


class SessionCreate(BaseModel):
    """``POST /v1/sessions``. Provenance is never accepted from clients."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,  # `"sync": "false"` or `1` is a 422, not a silent coercion (issue 10, item 11)
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
        description="Issue 13: an external session (no prompt): an outside process takes its "
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
        "instead of `prompt` (issue 15).",
    )
    role: Literal["user", "assistant"] = Field(
        default="user",
        description="Issue 13: on an external session, with its proxy token, the outside "
        "process posts its own messages (`assistant`: what it did).",
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
    client: TemporalDep,
    caller: CallerDep,
) -> SessionAccepted:
    """Resolve the agent to a pin, start its SessionWorkflow with the first message.

    In auth mode the user needs the ``user`` role on the agent (403 ``forbidden``).
    ``external`` (issue 13): no first message; the answer carries the session's proxy
    token (shown once) and the MCP server's URL.
    """

    def route() -> tuple[str, TeamSnapshot | None, launch.Recorded | None]:
        # AgentX Agent Teams, explicit routing: team > target agent > agent > default.
        with session_scope(engine) as s:
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
            slug, version = parse_ref(ref)
            caller.require(s, slug, "user")
            resolved = registry.resolve_agent(s, ref=ref)
            if registry.is_ambassador(s, slug=slug, live=resolved if version is None else None):
                raise inquiries.NotInvocable(
                    f"'{slug}' is an ambassador: ask it about a session with "
                    "POST /v1/sessions/{id}/inquiries",
                    path="agent",
                )
            for member in team.members if team else []:
                caller.require(s, member.agent_id, "user")  # a team run runs every member
            if body.external:
                return ref, team, None
            assert body.prompt is not None  # checked by SessionCreate
            # Issue 14: recorded in the transaction that checked the request, with the
            # snapshot just resolved (one transaction, one resolution per launch).
            recorded = launch.record_session(
                s,
                session_id=launch.new_session_id(),
                ref=ref,
                prompt=body.prompt,
                provenance=provenance(team),
                name=body.name,
                resolved=resolved,
            )
            return ref, team, recorded

    def provenance(team: TeamSnapshot | None) -> Provenance:
        return Provenance(
            created_by_user=caller.user,
            team=team.id if team else None,
            disable_delegation=body.disable_delegation,
        )

    ref, team, recorded = await asyncio.to_thread(route)
    if recorded is None:  # external
        return await _open_external(body, request, engine, settings, client, caller, ref)
    assert body.prompt is not None
    launched = await launch.launch_session(
        client,
        engine,
        task_queue=settings.task_queue,
        config=settings.session_config(),
        ref=ref,
        prompt=body.prompt,
        provenance=provenance(team),
        sync=body.sync,
        name=body.name,
        team=team,
        recorded=recorded,
    )
    return SessionAccepted(
        session_id=launched.session_id,
        status=await asyncio.to_thread(launch.session_status, engine, launched.session_id),
        agent=launched.agent,
        version=launched.version,
        response=launched.response,
        message_id=launched.outcome.message_id if launched.outcome else None,
        workflow_url=settings.workflow_url(launched.session_id),
    )


async def _open_external(
    body: SessionCreate,
    request: Request,
    engine: Engine,
    settings: Settings,
    client: Client,
    caller: Caller,
    ref: str,
) -> SessionAccepted:
    """``external: true`` (issue 13): the session, its proxy token and the MCP URL."""
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


def _proxy_sender(engine: Engine, session_id: str, token: str) -> ExternalIdentity:
    """The identity of a proxy token posting to ``session_id`` (issue 13): 401 for an
    invalid one, 403 for another session's."""
    with session_scope(engine) as s:
        identity = external.authenticate(s, token)
    if identity.session_id != session_id:
        raise Forbidden("this proxy token belongs to another session")
    return identity


def _ordinary_target(engine: Engine, caller: Caller, session_id: str, role: str) -> None:
    """404 / 403 (ACL) as before; an external session takes messages only with its proxy
    token (401); ``role: assistant`` is for external sessions only (409 not_external)."""
    with session_scope(engine) as s:
        row = session_store.get_session(s, session_id=session_id)
        caller.require(s, row.agent_slug, "user")
        if external.is_external(s, session_id=session_id):
            raise Unauthorized("an external session takes messages with its proxy token")
    if role != "user":
        raise external.NotExternal("only an external session takes assistant messages", path="role")


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
    authorization: Annotated[
        str | None, Header(description="`Bearer <token>`: an API token, or a proxy token.")
    ] = None,
) -> SessionAccepted:
    """Deliver a message by Update; 409 ``session_busy`` while a turn runs.

    ``from_draft`` sends the draft of one of the caller's inquiries on this session
    as the caller's own user turn (AgentX Agent Teams, 'Outbound relay'): 404
    ``inquiry_not_found``, 422 ``no_draft``, 409 ``draft_already_sent``.

    External sessions (issue 13) take messages only with their proxy token, stored in
    the transcript as they are (``role``; no model turn runs); ``role: assistant`` on
    an ordinary session is 409 ``not_external``.
    """
    token = external.bearer(authorization)
    if token is not None and token.startswith(external.PROXY_PREFIX):
        identity = await asyncio.to_thread(_proxy_sender, engine, session_id, token)
        client = await get_temporal(
            request, Caller(user=identity.user_id, auth=settings.auth == "on")
        )
        if body.prompt is None:  # from_draft: an ambassador's draft is a person's turn
            raise external.NotExternal("an external session posts a prompt", path="from_draft")
        message_id = await external.post_message(
            client, engine, identity, role=body.role, text=body.prompt
        )
        public = await asyncio.to_thread(_public, engine, session_id)
        return SessionAccepted(
            session_id=session_id,
            status=public.status,
            agent=public.agent,
            version=public.version,
            message_id=message_id,
            workflow_url=settings.workflow_url(session_id),
        )
    caller = await asyncio.to_thread(get_caller, request, authorization)  # 401 first
    client = await get_temporal(request, caller)
    await asyncio.to_thread(_ordinary_target, engine, caller, session_id, body.role)
    prompt = body.prompt or ""
    if body.from_draft is not None:
        draft_id = body.from_draft

        def draft() -> str:
            with session_scope(engine) as s:
                return inquiries.take_draft(
                    s, inquiry_id=draft_id, session_id=session_id, user=caller.user
                )

        prompt = await asyncio.to_thread(draft)
    outcome, text = await launch.send_message(
        client, engine, session_id=session_id, prompt=prompt, sync=body.sync, user=caller.user
    )
    if body.from_draft is not None:
        # The reply's id when the turn was awaited; a draft is sent once either way.
        sent_id, sent_message = body.from_draft, outcome.message_id if outcome else "sent"

        def sent() -> None:
            with session_scope(engine) as s:
                inquiries.mark_sent(s, inquiry_id=sent_id, message_id=sent_message)

        await asyncio.to_thread(sent)

    public = await asyncio.to_thread(_public, engine, session_id)
    return SessionAccepted(
        session_id=session_id,
        status=public.status,
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
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> Page[session_store.SessionPublic]:
    """Sessions newest first, optionally of one agent."""
    rows, total = session_store.list_sessions(
        session, agent=agent, limit=limit, offset=offset, agents=caller.visible(session)
    )
    return Page(data=[session_store.to_public(r) for r in rows], count=total)


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
        int | None,
        Query(
            ge=1,
            le=session_store.MAX_TRANSCRIPT_PAGE,
            description="Page size: at most this many messages, and `next_cursor` while "
            "more follow. Without it, the whole transcript.",
        ),
    ] = None,
    cursor: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=160,
            description="A previous page's `next_cursor`: the page after it (needs `limit`).",
        ),
    ] = None,
) -> session_store.Transcript:
    """Status line then messages; tool I/O summarised, thinking never stored.

    Paged with ``limit`` (1..500) and ``cursor`` (issue 14): each page is one range read,
    so a 10,000-message transcript pages in constant time. 422 ``invalid_cursor`` for a
    cursor naming no message of this session.
    """
    caller.require(
        session, session_store.get_session(session, session_id=session_id).agent_slug, "viewer"
    )
    if cursor is not None and limit is None:
        raise session_store.InvalidCursor("a cursor needs a limit (the page size)", path="limit")
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
    await asyncio.to_thread(_require, engine, caller, "viewer", session_id=session_id)
    cursor = last_event_id if last_event_id is not None else (after or 0)

    def fetch(after_id: int) -> tuple[list[tuple[int, str, str]], str]:
        with session_scope(engine) as s:
            # Status first: a SQLite SELECT runs outside any snapshot, and a status
            # read after the events could see a cancel whose event the read missed.
            state = session_store.get_session(s, session_id=session_id).status
            rows = session_store.events_after(s, session_id=session_id, after=after_id)
            return [(r.id or 0, r.type, json.dumps(r.data)) for r in rows], state

    notifier: EventNotifier = request.app.state.notifier

    async def gen() -> AsyncIterator[ServerSentEvent]:
        nonlocal cursor
        # Issue 14: read the log when the notifier says this session has new events (or
        # every FALLBACK_S), never on a timer per follower: idle followers cost nothing.
        with notifier.subscribe(session_id) as woken:
            while not await request.is_disconnected():
                woken.clear()  # before the read: an event committed after it still wakes
                rows, state = await asyncio.to_thread(fetch, cursor)
                for event_id, kind, data in rows:
                    cursor = event_id
                    yield ServerSentEvent(id=str(event_id), event=kind, data=data)
                    if until and kind == "status" and json.loads(data)["status"] in CLOSING:
                        return
                if rows:
                    continue  # read on until the log is drained, as before
                if until and state in CLOSING:
                    return
                await woken.wait()

    return EventSourceResponse(gen(), ping=15)


@router.post(
    "/{session_id}/cancel",
    status_code=status.HTTP_202_ACCEPTED,
    responses=problem_responses(404, 422, 503),
    summary="Cancel a session",
)
async def cancel(
    session_id: SessionIdPath, engine: EngineDep, client: TemporalDep, caller: CallerDep
) -> CancelAccepted:
    """Cancel the running turn and close the session (idempotent)."""
    await asyncio.to_thread(_require, engine, caller, "user", session_id=session_id)
    await launch.cancel_session(client, engine, session_id=session_id)
    state = await asyncio.to_thread(launch.session_status, engine, session_id)
    closed: Literal["cancelled", "failed"] | None = (
        "cancelled" if state == "cancelled" else "failed" if state == "failed" else None
    )
    return CancelAccepted(session_id=session_id, status=closed or "cancelling")
