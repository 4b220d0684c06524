"""External sessions: agents that run outside Baton and reach it over MCP (docs/mcp.md).

Gamut X-Agent, 'How it works': each agent container has an MCP server ``agents`` whose
calls travel back to the host authenticated with the container's *proxy token*;
the host resolves which agent is calling, applies the policies and performs the
operation on the caller's behalf. In Baton an external session is a
SessionWorkflow (``Provenance.external``) in which no model turn runs; its proxy
token is bound to that session and its agent, stored as a SHA-256 digest like an
API token (:mod:`baton.grants.auth`), acts with the session owner's roles, and stops
working when the session is cancelled or fails, when it is reissued or when it
expires. Every MCP tool call is the Update ``external_tool_call`` on the session's
workflow, which runs it through the same guard → authorize → review → operation
path as a model's tool call.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select
from temporalio.client import Client, WorkflowUpdateFailedError, WorkflowUpdateStage
from temporalio.service import RPCError, RPCStatusCode

from baton import temporal_ui
from baton.agents import registry
from baton.contracts.activity_io import ToolOutcome
from baton.contracts.codes import NOT_EXTERNAL, SESSION_CLOSED, UNKNOWN_TOOL
from baton.contracts.search import initial_search_attributes
from baton.contracts.values import CLOSED_STATUSES
from baton.contracts.workflow_io import (
    EXTERNAL_MESSAGE,
    EXTERNAL_TOOL_CALL,
    ExternalMessage,
    ExternalMessageOutcome,
    ExternalToolCall,
    Provenance,
    SessionConfig,
    SessionInput,
)
from baton.errors import BatonError, Conflict, EngineUnavailable, SessionClosed
from baton.grants.auth import Unauthorized, _digest
from baton.runs import launch, session_store
from baton.storage.db import ProxyTokenRow, SessionRow, session_scope, utcnow

#: Proxy tokens are recognisable (and never mistaken for API tokens, ``baton_…``).
PROXY_PREFIX = "baton_px_"
#: How often a waiting MCP call reports progress (s): well inside any HTTP read timeout.
KEEPALIVE_S = 10.0


class NotExternal(Conflict):
    """The session is not external: its turns are the model's (409)."""

    code = "not_external"


class UnknownTool(BatonError):
    """An MCP tool call naming anything but the five X-Agent tools (400)."""

    code = "unknown_tool"


@dataclass(frozen=True)
class ExternalIdentity:
    """Who a valid proxy token speaks for: the session, its agent and its owner."""

    session_id: str
    agent_slug: str
    user_id: str


@dataclass(frozen=True)
class ToolResult:
    """An MCP tool call's answer: ``ok`` and its JSON ``text``; for a refusal, ``code``
    (the Baton error code the text starts with)."""

    ok: bool
    text: str
    code: str | None = None


# --- tokens ------------------------------------------------------------------


def issue_proxy_token(
    s: Session, *, session_id: str, expires_in_s: float | None = None
) -> tuple[ProxyTokenRow, str]:
    """A new proxy token for ``session_id``: ``(row, plaintext)``; shown once, stored hashed.

    Every earlier token of the session is revoked (one live token per session: a
    reissue, ``baton mcp token``, cuts off a leaked one). Raises SessionNotFound,
    SessionClosed (the session is cancelled or failed).
    """
    row = session_store.get_session(s, session_id=session_id)
    if row.status in CLOSED_STATUSES:
        raise SessionClosed(f"session '{session_id}' is {row.status}", session_id=session_id)
    revoke_proxy_tokens(s, session_id=session_id)
    plain = PROXY_PREFIX + secrets.token_urlsafe(32)
    expires = utcnow() + timedelta(seconds=expires_in_s) if expires_in_s else None
    token = ProxyTokenRow(
        session_id=session_id,
        agent_slug=row.agent_slug,
        user_id=row.created_by_user,
        token_hash=_digest(plain),
        prefix=plain[:16],
        expires_at=expires,
    )
    s.add(token)
    s.flush()
    return token, plain


def revoke_proxy_tokens(s: Session, *, session_id: str) -> int:
    """Revoke every live proxy token of ``session_id``; how many were live."""
    rows = s.exec(
        select(ProxyTokenRow).where(
            ProxyTokenRow.session_id == session_id, col(ProxyTokenRow.revoked).is_(False)
        )
    ).all()
    for row in rows:
        row.revoked = True
        s.add(row)
    s.flush()
    return len(rows)


def authenticate(s: Session, token: str, *, now: datetime | None = None) -> ExternalIdentity:
    """The identity a bearer proxy token speaks for. The one check every MCP request and
    every external message passes.

    Raises Unauthorized (401) for an unknown, revoked or expired token, and for one
    whose session is cancelled or failed (Gamut X-Agent: the token lives as long as its
    container's session).
    """
    row = s.exec(select(ProxyTokenRow).where(ProxyTokenRow.token_hash == _digest(token))).first()
    if row is None or row.revoked:
        raise Unauthorized("invalid or revoked proxy token")
    if row.expires_at is not None and row.expires_at <= (now or utcnow()):
        raise Unauthorized("the proxy token has expired; reissue it (`baton mcp token`)")
    session = s.get(SessionRow, row.session_id)
    if session is None or session.status in CLOSED_STATUSES:
        raise Unauthorized("the proxy token's session is closed")
    return ExternalIdentity(row.session_id, row.agent_slug, row.user_id)


def bearer(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None."""
    scheme, _, token = (authorization or "").partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


# --- launching -----------------------------------------------------------------


@dataclass(frozen=True)
class Opened:
    """An external session: its id, pin and its proxy token (plaintext, shown once)."""

    session_id: str
    agent: str
    version: int
    proxy_token: str
    expires_at: datetime | None


async def open_external_session(
    client: Client,
    engine: Engine,
    *,
    task_queue: str,
    config: SessionConfig,
    ref: str,
    provenance: Provenance,
    name: str | None = None,
    token_ttl_s: float | None = None,
) -> Opened:
    """Resolve ``ref``, record the session (idle) and its proxy token, start its
    SessionWorkflow with no first message (no model turn ever runs in it).

    Raises the registry's AgentNotFound / RevisionNotFound / AgentRetired /
    AgentNotPublished / InvalidReference, or EngineUnavailable (Temporal refused the
    start; nothing is left behind).
    """
    session_id = f"session-{uuid.uuid4()}"
    prov = provenance.model_copy(update={"external": True})

    def record() -> tuple[str, int, str, datetime | None]:
        with session_scope(engine) as s:
            found, rev = registry.resolve_ref(s, ref=ref)
            session_store.create_session(
                s,
                session_id=session_id,
                agent_slug=found.slug,
                agent_version=rev.version,
                provenance=prov,
                name=name or f"External · {found.slug}",
            )
            session_store.set_status(s, session_id=session_id, status="idle")
            row, plain = issue_proxy_token(s, session_id=session_id, expires_in_s=token_ttl_s)
            return found.slug, rev.version, plain, row.expires_at

    slug, version, plain, expires = await asyncio.to_thread(record)
    pin = f"{slug}@{version}"
    inp = SessionInput(
        session_id=session_id,
        agent_pin=pin,
        provenance=prov,
        config=config,
    )
    try:
        await client.start_workflow(
            launch.WORKFLOW,
            inp,
            id=session_id,
            task_queue=task_queue,
            search_attributes=initial_search_attributes(inp),
            static_summary=f"{pin} · external",
            static_details=temporal_ui.session_details(
                namespace=client.namespace, session_id=session_id, pin=pin, provenance=prov
            ),
        )
    except RPCError as exc:

        def forget() -> None:
            with session_scope(engine) as s:
                for token in s.exec(
                    select(ProxyTokenRow).where(ProxyTokenRow.session_id == session_id)
                ).all():
                    s.delete(token)
                s.flush()
                row = s.get(SessionRow, session_id)
                if row is not None:
                    s.delete(row)

        await asyncio.to_thread(forget)
        raise EngineUnavailable(f"Temporal refused to start the session: {exc.message}") from exc
    return Opened(session_id, slug, version, plain, expires)


# --- calls -----------------------------------------------------------------------


def _update_error(exc: WorkflowUpdateFailedError, session_id: str) -> BatonError:
    """The external Updates' own refusals; the rest as :func:`baton.runs.launch._update_error`."""
    kind, message = launch.refusal(exc)
    if kind == NOT_EXTERNAL:
        return NotExternal(message, session_id=session_id)
    if kind == UNKNOWN_TOOL:
        return UnknownTool(message)
    return launch._update_error(exc, session_id)


async def _await_with_keepalive(
    result: Awaitable[Any], waiting: Callable[[float], Awaitable[None]] | None
) -> Any:
    task = asyncio.ensure_future(result)
    elapsed = 0.0
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=KEEPALIVE_S)
            if done:
                return task.result()
            elapsed += KEEPALIVE_S
            if waiting is not None:
                await waiting(elapsed)
    finally:
        task.cancel()


async def call_tool(
    client: Client,
    engine: Engine,
    identity: ExternalIdentity,
    *,
    name: str,
    args: dict[str, Any],
    key: str,
    waiting: Callable[[float], Awaitable[None]] | None = None,
) -> ToolResult:
    """Run one X-Agent tool call of an external process through its session's workflow.

    ``key`` is the call's idempotency key: the Update id is ``<session>:mcp:<key>``, so
    a repeated request attaches to the call already made instead of making it again.
    ``waiting(seconds)`` is awaited every :data:`KEEPALIVE_S` while the call waits (a
    review, a sync invoke), to keep the client's stream alive. A refusal is
    ``ok=False`` with ``code`` (see :func:`refusal_code`).

    Raises SessionClosed, NotExternal, UnknownTool, EngineUnavailable.
    """
    try:
        update = await launch.deliver_update(
            client,
            engine,
            session_id=identity.session_id,
            update=EXTERNAL_TOOL_CALL,
            arg=ExternalToolCall(call_id=key, name=name, args=args),
            update_id=f"{identity.session_id}:mcp:{key}",
            wait_for_stage=WorkflowUpdateStage.ACCEPTED,
            result_type=ToolOutcome,
        )
        outcome: ToolOutcome = await _await_with_keepalive(update.result(), waiting)
    except WorkflowUpdateFailedError as exc:
        raise _update_error(exc, identity.session_id) from exc
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            raise SessionClosed(f"session '{identity.session_id}' is no longer running") from exc
        raise EngineUnavailable(f"Temporal refused the call: {exc.message}") from exc
    text = await asyncio.to_thread(launch.final_text, engine, outcome.message_id)
    if outcome.ok:
        return ToolResult(ok=True, text=_as_json(name, text))
    if not text:  # nothing stored: the session closed while the call ran
        return ToolResult(
            ok=False, text=f"{SESSION_CLOSED}: the session closed", code=SESSION_CLOSED
        )
    code = refusal_code(text)
    shown = text if text.startswith(f"{code}: ") else f"{code}: {text}"
    return ToolResult(ok=False, text=shown, code=code)


async def post_message(
    client: Client,
    engine: Engine,
    identity: ExternalIdentity,
    *,
    role: Literal["user", "assistant"],
    text: str,
) -> str:
    """Store a message of the external process in its transcript (Update
    ``external_message``); returns its id. Raises SessionClosed, NotExternal,
    InvalidPrompt, EngineUnavailable."""
    try:
        update = await launch.deliver_update(
            client,
            engine,
            session_id=identity.session_id,
            update=EXTERNAL_MESSAGE,
            arg=ExternalMessage(role=role, text=text),
            update_id=f"{identity.session_id}:message-{uuid.uuid4()}",
            wait_for_stage=WorkflowUpdateStage.COMPLETED,
            result_type=ExternalMessageOutcome,
        )
        done = await update.result()
    except WorkflowUpdateFailedError as exc:
        raise _update_error(exc, identity.session_id) from exc
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            raise SessionClosed(f"session '{identity.session_id}' is no longer running") from exc
        raise EngineUnavailable(f"Temporal refused the message: {exc.message}") from exc
    return done.message_id


def _as_json(name: str, text: str) -> str:
    """Results are JSON text; the transcript (a status line and messages, Gamut X-Agent) is
    wrapped as ``{"transcript": ...}``."""
    try:
        json.loads(text)
    except ValueError:
        return json.dumps({"transcript" if name.endswith("transcript") else "result": text})
    return text


# --- refusal codes -------------------------------------------------------------------

#: How a stored refusal names its code (the model path's texts, left as they are):
#: ``code: …`` (guards, ACL, policy, argument errors), ``<tool> failed (code): …``
#: (delegations), ``<tool> failed: …`` (list/create/read), ``<tool> cancelled: …``, and
#: settle_review's two review outcomes.
_REFUSALS: tuple[tuple[re.Pattern[str], str | None], ...] = (
    (re.compile(r"^([a-z][a-z0-9_]{1,63}): "), None),
    (re.compile(r"^[a-z_]+ failed \(([a-z][a-z0-9_]{1,63})\): "), None),
    (re.compile(r"^[a-z_]+ cancelled: "), "cancelled"),
    (re.compile(r"^the review timed out "), "review_timeout"),
    (re.compile(r"^the .+ operation was denied by "), "review_denied"),
    (re.compile(r"^[a-z_]+ failed: "), "tool_failed"),
)


def refusal_code(text: str) -> str:
    """The Baton error code of a stored tool refusal (``self_invocation``,
    ``one_hop_violation``, ``blocked_by_policy``, ``review_denied``,
    ``review_timeout``, …); ``tool_failed`` when the text names none."""
    for pattern, code in _REFUSALS:
        found = pattern.match(text)
        if found:
            return code or found.group(1)
    return "tool_failed"
