"""Persistence: SQLModel tables and the engine factory.

The same code runs on SQLite (default, a file under ``./.baton/``) and
PostgreSQL (``postgresql+psycopg://…``). Engines are created by the app
lifespan or the CLI entry, never at import time. Timestamps are tz-aware UTC on
both backends (:class:`UTCDateTime`).

Agent storage follows Xema Agent Concepts 'Identity, drafts, revisions, and rollback':
identity (``agents``), one mutable draft (``agent_drafts``), immutable
revisions (``agent_revisions``) and the live pointer (``agent_live_pointers``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import func
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.types import TypeDecorator
from sqlmodel import Field, Session, SQLModel, create_engine, select


def utcnow() -> datetime:
    """The current time, tz-aware UTC."""
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp stored as UTC and always read back tz-aware (SQLite drops the zone)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            msg = "naive datetime given; Baton stores tz-aware UTC only"
            raise ValueError(msg)
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _ts(**kwargs: Any) -> Any:
    return Field(default_factory=utcnow, sa_type=UTCDateTime, **kwargs)


class Agent(SQLModel, table=True):
    """Agent identity: stable slug; name and description are editable, not versioned."""

    __tablename__ = "agents"

    id: int | None = Field(default=None, primary_key=True)
    slug: str = Field(index=True, unique=True, max_length=63)
    name: str = Field(max_length=200)
    description: str = Field(default="", max_length=2000)
    retired: bool = False
    created_at: datetime = _ts()
    updated_at: datetime = _ts()


class AgentDraft(SQLModel, table=True):
    """The one mutable draft of an agent: an ``AgentSpec`` as JSON."""

    __tablename__ = "agent_drafts"

    agent_id: int = Field(foreign_key="agents.id", primary_key=True)
    spec: dict[str, Any] = Field(default_factory=dict, sa_type=sa.JSON)
    updated_at: datetime = _ts()


class AgentRevision(SQLModel, table=True):
    """An immutable published revision; ``version`` counts 1, 2, 3 … per agent.

    ``extends_pins`` is the ``extends`` chain the revision was published against, as
    pins nearest base first (``["mid@2", "base@3"]``, ``[]`` without ``extends``): its
    resolution reads those revisions, never the bases' live pointers (docs/agents.md,
    'Pinned bases'). NULL only for a revision whose chain did not resolve when
    migration 0009 pinned the existing rows; it follows the live pointers.
    """

    __tablename__ = "agent_revisions"
    __table_args__ = (sa.UniqueConstraint("agent_id", "version", name="uq_revision_version"),)

    id: int | None = Field(default=None, primary_key=True)
    agent_id: int = Field(foreign_key="agents.id", index=True)
    version: int
    digest: str = Field(max_length=71)
    spec: dict[str, Any] = Field(default_factory=dict, sa_type=sa.JSON)
    extends_pins: list[str] | None = Field(default=None, sa_type=sa.JSON)
    published_at: datetime = _ts()
    #: The eval this revision passed to be published (its agent's publish gate), or None.
    eval_id: str | None = Field(default=None, max_length=80)
    #: Who published it (the caller's user; ``local`` with auth off), or None when not
    #: recorded (published before migration 0020, or by ``baton apply`` on the database).
    published_by: str | None = Field(default=None, max_length=200)


class AgentLivePointer(SQLModel, table=True):
    """Which revision ``slug`` resolves to. No row = nothing live (never published or retired)."""

    __tablename__ = "agent_live_pointers"

    agent_id: int = Field(foreign_key="agents.id", primary_key=True)
    version: int
    updated_at: datetime = _ts()


class SessionRow(SQLModel, table=True):
    """One conversation (docs/sessions.md): its pinned agent, provenance and activity counters.

    Provenance columns are written by the engine only, never from API input.
    ``resolved_agent`` is the snapshot the ``load_agent`` activity recorded at launch.
    ``resume_input`` is the ``SessionInput`` the session's next workflow run starts from,
    written by its run just before it completes idle (``record_resume``); NULL until then.
    """

    __tablename__ = "sessions"
    #: The session list (``session_store.page_sessions``): replays are left out by
    #: ``eval_id IS NULL`` and pages come newest first, so (eval_id, created_at, id) serves a
    #: page as a range read in index order, with no sort of every session, and its total
    #: count from the index alone, without reading the rows and their agent snapshots.
    #: An eval's replays are found by its leading column.
    __table_args__ = (sa.Index("ix_sessions_listed", "eval_id", "created_at", "id"),)

    id: str = Field(primary_key=True, max_length=80)
    name: str = Field(default="", max_length=200)
    agent_slug: str = Field(index=True, max_length=63)
    agent_version: int
    resolved_agent: dict[str, Any] | None = Field(default=None, sa_type=sa.JSON)
    resume_input: dict[str, Any] | None = Field(default=None, sa_type=sa.JSON)
    status: str = Field(default="running", max_length=20)
    created_by_user: str = Field(default="local", max_length=200)
    invoked_by_agent: str | None = Field(default=None, max_length=63)
    parent_session_id: str | None = Field(default=None, max_length=80)
    team: str | None = Field(default=None, max_length=63)
    depth: int = 0
    #: A fork (docs/change-safely.md, Fork a session): the session it was forked from and the
    #: message it was forked after; ``fork_prefix`` lists the transcript segments it reads
    #: through, oldest first, as ``[session_id, position, message_id]`` (each segment is
    #: that session's messages up to and including that one): the prefix is held by
    #: reference, never copied.
    forked_from: str | None = Field(default=None, index=True, max_length=80)
    fork_point: str | None = Field(default=None, max_length=160)
    fork_prefix: list[list[str | None]] | None = Field(default=None, sa_type=sa.JSON)
    #: Runs an agent's draft (the authoring sandbox): never a published revision.
    sandbox: bool = False
    #: The workspace the session works in when it is another session's (a ``shareable``
    #: subagent task or delegation: docs/workspaces.md); NULL = its own, named by its id.
    workspace_id: str | None = Field(default=None, max_length=80)
    #: A replay an eval started (docs/change-safely.md, Replay against a candidate): the
    #: eval, and the recorded session whose user turns it replays. Ordinary lists omit it.
    eval_id: str | None = Field(default=None, max_length=80)
    replay_of: str | None = Field(default=None, max_length=80)
    message_count: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    created_at: datetime = _ts(index=True)
    last_activity_at: datetime = _ts()


class MessageRow(SQLModel, table=True):
    """A transcript message. ``id`` is chosen by the workflow, so a retried activity
    writing the same message finds it instead of duplicating it."""

    __tablename__ = "messages"

    id: str = Field(primary_key=True, max_length=160)
    session_id: str = Field(foreign_key="sessions.id", index=True, max_length=80)
    position: str = Field(max_length=40, description="Sort key within the session.")
    role: str = Field(max_length=20)  # user | assistant | tool | error
    agent_slug: str = Field(default="", max_length=63)
    text: str = ""
    tool_name: str | None = Field(default=None, max_length=64)
    tool_call_id: str | None = Field(default=None, max_length=120)
    tool_calls: list[dict[str, Any]] | None = Field(default=None, sa_type=sa.JSON)
    tool_args: dict[str, Any] | None = Field(default=None, sa_type=sa.JSON)
    is_error: bool = False
    usage: dict[str, Any] | None = Field(default=None, sa_type=sa.JSON)
    created_at: datetime = _ts()


class EventRow(SQLModel, table=True):
    """The durable event log behind SSE; ``id`` is the SSE event id (``Last-Event-ID``)."""

    __tablename__ = "events"

    id: int | None = Field(default=None, primary_key=True)
    session_id: str = Field(index=True, max_length=80)
    type: str = Field(max_length=40)
    data: dict[str, Any] = Field(default_factory=dict, sa_type=sa.JSON)
    created_at: datetime = _ts()


class ExhibitRow(SQLModel, table=True):
    """Something an agent showed the person (docs/exhibits.md): its wire (the JSON the
    ``exhibit`` event, the transcript and ``delegation_complete`` carry) and, for an image
    or a download, its decoded ``content``, served by the API and never sent through
    Temporal. ``session_id`` presented it; ``root_session_id`` is its run's root, where a
    delegated exhibit is forwarded; ``delegation_id`` the delegation it was made in."""

    __tablename__ = "exhibits"

    id: str = Field(primary_key=True, max_length=40)
    session_id: str = Field(foreign_key="sessions.id", index=True, max_length=80)
    root_session_id: str = Field(max_length=80)
    delegation_id: str | None = Field(default=None, index=True, max_length=200)
    message_id: str = Field(max_length=160, description="The present_exhibit tool message.")
    kind: str = Field(max_length=20)
    wire: dict[str, Any] = Field(default_factory=dict, sa_type=sa.JSON)
    media_type: str | None = Field(default=None, max_length=100)
    content: bytes | None = Field(default=None, sa_type=sa.LargeBinary)
    created_at: datetime = _ts()


class XAgentPolicy(SQLModel, table=True):
    """A stored X-Agent policy (Gamut X-Agent Policies, 'Policy storage'). ``review`` is
    never stored.

    ``target_agent_slug`` NULL = the caller's global policy for the operation.
    One row per (caller, target, operation): two partial unique indexes, because
    NULLs are distinct in a plain unique constraint on both backends.
    """

    __tablename__ = "x_agent_policies"
    __table_args__ = (
        sa.Index(
            "uq_policy_target",
            "caller_agent_slug",
            "target_agent_slug",
            "operation",
            unique=True,
            sqlite_where=sa.text("target_agent_slug IS NOT NULL"),
            postgresql_where=sa.text("target_agent_slug IS NOT NULL"),
        ),
        sa.Index(
            "uq_policy_global",
            "caller_agent_slug",
            "operation",
            unique=True,
            sqlite_where=sa.text("target_agent_slug IS NULL"),
            postgresql_where=sa.text("target_agent_slug IS NULL"),
        ),
    )

    id: int | None = Field(default=None, primary_key=True)
    caller_agent_slug: str = Field(max_length=63, index=True)
    target_agent_slug: str | None = Field(default=None, max_length=63, index=True)
    operation: str = Field(max_length=10)  # list | read | invoke
    decision: str = Field(max_length=10)  # allow | block
    updated_at: datetime = _ts()


class ReviewRow(SQLModel, table=True):
    """A policy review waiting for (or settled by) a human decision (docs/xagent.md, Reviews)."""

    __tablename__ = "reviews"
    # The review inbox (GET /v1/reviews?status=pending, newest first) reads one page off
    # this index instead of sorting every pending review (bench/held.py keeps 1,000 pending).
    __table_args__ = (sa.Index("ix_reviews_status_created_at", "status", "created_at"),)

    id: str = Field(primary_key=True, max_length=80)
    session_id: str = Field(index=True, max_length=80)
    caller_agent_slug: str = Field(max_length=63, index=True)
    operation: str = Field(max_length=10)
    target_agent_slug: str | None = Field(default=None, max_length=63)
    preview: str = ""
    status: str = Field(default="pending", max_length=20)
    decision: str | None = Field(default=None, max_length=20)
    scope: str | None = Field(default=None, max_length=10)
    decided_by: str | None = Field(default=None, max_length=200)
    decision_id: str | None = Field(default=None, max_length=80)
    created_at: datetime = _ts(index=True)
    decided_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    # The deadline a decision must be received by (the workflow's, stored by `authorize`);
    # None for reviews opened before it was stored.
    expires_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class AuditRow(SQLModel, table=True):
    """One audited X-Agent operation: every review outcome and every block (Gamut X-Agent
    Policies)."""

    __tablename__ = "audit_log"

    id: int | None = Field(default=None, primary_key=True)
    session_id: str = Field(index=True, max_length=80)
    review_id: str | None = Field(default=None, max_length=80)
    caller_agent_slug: str = Field(max_length=63, index=True)
    operation: str = Field(max_length=10)
    target_agent_slug: str | None = Field(default=None, max_length=63, index=True)
    outcome: str = Field(
        max_length=20
    )  # allow | block | denied_by_user | review_timeout | cancelled
    decided_by: str = Field(max_length=200)
    reason: str = Field(default="", max_length=500)
    #: The path an operation that makes another agent run came by (docs/xagent.md):
    #: invoke | delegate_to | route | mention | task; None for list, read and create.
    via: str | None = Field(default=None, max_length=20)
    at: datetime = _ts(index=True)


class User(SQLModel, table=True):
    """A user of auth mode (``BATON_AUTH=on``)."""

    __tablename__ = "users"

    id: str = Field(primary_key=True, max_length=63)
    name: str = Field(default="", max_length=200)
    created_at: datetime = _ts()


class ApiToken(SQLModel, table=True):
    """A bearer API token; only its SHA-256 is stored (tokens are 256-bit random)."""

    __tablename__ = "api_tokens"

    id: int | None = Field(default=None, primary_key=True)
    user_id: str = Field(foreign_key="users.id", index=True, max_length=63)
    token_hash: str = Field(unique=True, max_length=64)
    prefix: str = Field(max_length=16, description="First characters, to recognise a token.")
    name: str = Field(default="", max_length=200)
    revoked: bool = False
    created_at: datetime = _ts()


class AgentAcl(SQLModel, table=True):
    """A user's role on an agent: viewer < user < owner (Gamut X-Agent Policies, 'Auth mode')."""

    __tablename__ = "agent_acl"

    agent_slug: str = Field(primary_key=True, max_length=63)
    user_id: str = Field(primary_key=True, max_length=63, foreign_key="users.id")
    role: str = Field(max_length=10)


class TeamRow(SQLModel, table=True):
    """A team: one supervisor (lead) and its specialists (members), AgentX Agent Teams 'Data Model'.

    Members are referenced by agent slug, so renaming an agent never breaks a team.
    """

    __tablename__ = "teams"

    id: str = Field(primary_key=True, max_length=63)
    name: str = Field(max_length=200)
    description: str = Field(default="", max_length=2000)
    supervisor_agent_id: str = Field(max_length=63)
    members: list[dict[str, Any]] = Field(default_factory=list, sa_type=sa.JSON)
    routes: list[dict[str, Any]] = Field(default_factory=list, sa_type=sa.JSON)
    shared_channel: str = Field(max_length=80)
    created_at: datetime = _ts()
    updated_at: datetime = _ts()


class DelegationRow(SQLModel, table=True):
    """One delegation (invoke_agent, delegate_to, task): the edge of a run's tree.

    ``root_session_id`` is the session the run started from; the trace and the
    run-wide limits (spawns, token budget) read the tree from here.
    """

    __tablename__ = "delegations"

    id: str = Field(primary_key=True, max_length=200)
    root_session_id: str = Field(index=True, max_length=80)
    parent_session_id: str = Field(index=True, max_length=80)
    child_session_id: str | None = Field(default=None, index=True, max_length=80)
    kind: str = Field(max_length=20)  # invoke | delegate_to | task | route | mention
    caller_agent_slug: str = Field(max_length=63)
    target_agent_slug: str = Field(max_length=63)
    alias: str | None = Field(default=None, max_length=63)
    task: str = ""
    depth: int = 1
    status: str = Field(default="running", max_length=20)  # running | completed | failed
    error: str | None = None
    result_preview: str = ""
    started_at: datetime = _ts()
    finished_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class ChannelMemory(SQLModel, table=True):
    """A memory on a team's shared channel (AgentX Agent Teams): delegated results and facts."""

    __tablename__ = "channel_memories"

    id: int | None = Field(default=None, primary_key=True)
    channel: str = Field(index=True, max_length=80)
    agent_slug: str = Field(max_length=63)
    delegation_id: str | None = Field(default=None, max_length=200)
    text: str
    created_at: datetime = _ts()


class StepRow(SQLModel, table=True):
    """A workflow-agent step (Xema Agent Concepts, 'One Agent, two execution experiences')."""

    __tablename__ = "steps"

    id: str = Field(primary_key=True, max_length=80)
    agent_slug: str = Field(index=True, max_length=63)
    agent_version: int
    input: str = ""
    output_schema: dict[str, Any] | None = Field(default=None, sa_type=sa.JSON)
    retry: dict[str, Any] | None = Field(default=None, sa_type=sa.JSON)
    handoff: bool = False
    timeout_s: float | None = None
    status: str = Field(default="running", max_length=20)
    deliverable: Any = Field(default=None, sa_type=sa.JSON)
    attempts: int = 0
    error: str | None = None
    created_by_user: str = Field(default="local", max_length=200)
    created_at: datetime = _ts(index=True)
    updated_at: datetime = _ts()


class UsageRow(SQLModel, table=True):
    """One metered model call: tokens and cost, by agent, session, step and day."""

    __tablename__ = "usage"

    id: int | None = Field(default=None, primary_key=True)
    message_id: str = Field(unique=True, max_length=160)
    day: str = Field(index=True, max_length=10)
    agent_slug: str = Field(index=True, max_length=63)
    session_id: str = Field(index=True, max_length=80)
    step_id: str | None = Field(default=None, index=True, max_length=80)
    model: str = Field(default="", max_length=200)
    requests: int = 1
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None  # None: no price known for the model
    at: datetime = _ts()


class BalanceRow(SQLModel, table=True):
    """The organisation balance in USD (one row, id 1); NULL amount = unlimited."""

    __tablename__ = "balance"

    id: int = Field(default=1, primary_key=True)
    amount_usd: float | None = None
    updated_at: datetime = _ts()


class ProxyTokenRow(SQLModel, table=True):
    """An external session's proxy token (docs/mcp.md): bound to one session and
    its agent, acting with the session owner's roles. Only the SHA-256 is stored, as for
    API tokens; a session with a row here is external (its turns are taken outside)."""

    __tablename__ = "proxy_tokens"

    id: int | None = Field(default=None, primary_key=True)
    session_id: str = Field(foreign_key="sessions.id", index=True, max_length=80)
    agent_slug: str = Field(max_length=63)
    user_id: str = Field(max_length=200, description="The session owner (created_by_user).")
    token_hash: str = Field(unique=True, max_length=64)
    prefix: str = Field(max_length=16, description="First characters, to recognise a token.")
    revoked: bool = False
    expires_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    created_at: datetime = _ts()


class TokenReservationRow(SQLModel, table=True):
    """What one model call under a run's ``token_budget`` may spend.

    Keyed by the assistant message id the workflow chose, so a retried call reuses its
    reservation; settled (``settled_at``, ``actual_tokens``) in the transaction that
    meters the call, released when the session's turn fails or the session closes.
    Unsettled rows count against the budget; settled ones keep the estimate beside the
    actual usage (the documented overshoot bound is read from them).
    """

    __tablename__ = "token_reservations"

    message_id: str = Field(primary_key=True, max_length=160)
    root_session_id: str = Field(index=True, max_length=80)
    session_id: str = Field(index=True, max_length=80)
    input_estimate: int = 0
    max_tokens: int = 0
    reserved: int = 0
    actual_tokens: int | None = None
    actual_input_tokens: int | None = None
    created_at: datetime = _ts()
    settled_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class InquiryRow(SQLModel, table=True):
    """One question to an ambassador about a session, and its answer.

    The thread of a session and user is their inquiries by ``created_at``. Nothing
    here is ever read into the session's transcript, events or usage (AgentX Agent Teams,
    'Ambassador': the no-pollution invariant).
    """

    __tablename__ = "inquiries"

    id: str = Field(primary_key=True, max_length=80)  # inquiry-<uuid>, the workflow id
    session_id: str = Field(index=True, max_length=80)
    user_id: str = Field(index=True, max_length=200)
    ambassador_slug: str = Field(max_length=63)
    ambassador_version: int = 0
    question: str = ""
    status: str = Field(default="running", max_length=20)  # running | answered | failed
    answer: str | None = None
    draft: str | None = None
    error: str | None = None
    steps: int = 0
    sent_message_id: str | None = Field(default=None, max_length=160)
    created_at: datetime = _ts(index=True)
    answered_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class InquiryStepRow(SQLModel, table=True):
    """The ambassador's own working transcript of one inquiry: its replies and tool results,
    under ids the Inquiry workflow chooses (a retried activity never duplicates one)."""

    __tablename__ = "inquiry_steps"

    id: str = Field(primary_key=True, max_length=200)
    inquiry_id: str = Field(index=True, max_length=80)
    position: str = Field(max_length=40)
    role: str = Field(max_length=20)  # assistant | tool
    text: str = ""
    tool_name: str | None = Field(default=None, max_length=64)
    tool_call_id: str | None = Field(default=None, max_length=120)
    tool_calls: list[dict[str, Any]] | None = Field(default=None, sa_type=sa.JSON)
    is_error: bool = False
    created_at: datetime = _ts()


class IdempotencyKeyRow(SQLModel, table=True):
    """One ``Idempotency-Key`` a caller sent with a POST (docs/api.md, Idempotency): the
    request's fingerprint and, once answered, the answer replayed to a retry.

    ``scope`` is the caller (``local``, ``user:<id>``, ``proxy:<session>``), so one
    caller's key never answers another's. While ``response_status`` is null the request
    is in flight, held until ``locked_until`` (renewed by the API process running it; a
    killed process stops renewing, so a retry may take over). Rows past ``expires_at``
    are purged (``BATON_IDEMPOTENCY_TTL``).
    """

    __tablename__ = "idempotency_keys"

    scope: str = Field(primary_key=True, max_length=200)
    key: str = Field(primary_key=True, max_length=255)
    fingerprint: str = Field(max_length=64, description="SHA-256 of method, path and body.")
    response_status: int | None = None
    response_type: str | None = Field(default=None, max_length=100)
    response_body: str | None = Field(default=None, sa_type=sa.Text)
    locked_until: datetime = Field(sa_type=UTCDateTime)
    created_at: datetime = _ts()
    expires_at: datetime = Field(sa_type=UTCDateTime, index=True)


class WebhookRow(SQLModel, table=True):
    """A webhook subscription (docs/webhooks.md): where to POST which events, signed with
    its own secret. ``owner`` is the user who created it (``local`` with auth off); the
    secret is shown once, at creation, and kept to sign every delivery."""

    __tablename__ = "webhooks"

    id: str = Field(primary_key=True, max_length=80)
    url: str = Field(max_length=2048)
    events: list[str] = Field(default_factory=list, sa_type=sa.JSON)
    agent_slug: str | None = Field(default=None, max_length=63)
    team: str | None = Field(default=None, max_length=63)
    balance_low_usd: float | None = None
    description: str = Field(default="", max_length=500)
    secret: str = Field(max_length=100)
    owner: str = Field(index=True, max_length=63)
    created_at: datetime = _ts()


class WebhookDeliveryRow(SQLModel, table=True):
    """One event for one subscription: the signed body sent on every attempt (so a retry
    sends the same bytes under the same ``webhook-id``) and how its attempts went."""

    __tablename__ = "webhook_deliveries"

    id: str = Field(primary_key=True, max_length=80)
    webhook_id: str = Field(index=True, max_length=80)
    event: str = Field(max_length=40)
    payload: str = Field(sa_type=sa.Text)
    status: str = Field(default="pending", max_length=20)
    attempts: int = 0
    last_error: str | None = Field(default=None, max_length=1000)
    last_status_code: int | None = None
    created_at: datetime = _ts(index=True)
    last_attempt_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    delivered_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class EvalRow(SQLModel, table=True):
    """An eval (docs/change-safely.md, Replay against a candidate): recorded sessions of
    ``agent_slug`` replayed on a ``candidate`` and on a ``baseline``, and what changed.

    ``candidate`` / ``baseline`` are agent references as given (``draft``, ``live``,
    ``slug@V``); ``candidate_digest`` is the digest of the spec the candidate resolved to
    when the eval started, so the publish gate can tell an eval of *this* draft from one
    of an earlier edit. ``status`` is ``running``, ``completed``, ``failed`` or
    ``cancelled``; ``total`` / ``done`` count replays (sessions), ``changed`` /
    ``regressions`` count sessions whose final answer changed and whose replay on the
    candidate did worse than the baseline (an error, a failed deliverable, a block the
    baseline did not meet). ``report`` is the full comparison once finished.
    """

    __tablename__ = "evals"

    id: str = Field(primary_key=True, max_length=80)
    agent_slug: str = Field(index=True, max_length=63)
    candidate: str = Field(max_length=80)
    candidate_digest: str = Field(max_length=71)
    baseline: str = Field(max_length=80)
    options: dict[str, Any] = Field(default_factory=dict, sa_type=sa.JSON)
    status: str = Field(default="running", max_length=20)
    total: int = 0
    done: int = 0
    changed: int = 0
    regressions: int = 0
    report: dict[str, Any] | None = Field(default=None, sa_type=sa.JSON)
    error: str | None = Field(default=None, max_length=1000)
    owner: str = Field(index=True, max_length=63)
    workflow_id: str = Field(max_length=200)
    created_at: datetime = _ts(index=True)
    finished_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


def make_engine(database_url: str) -> Engine:
    """An engine for ``database_url``; for a SQLite file, its folder is created.

    SQLite gets WAL, a busy timeout and foreign keys on, so the API and worker
    processes can share one file.
    """
    url = make_url(database_url)
    if url.get_backend_name() == "sqlite":
        if url.database and url.database != ":memory:":
            from pathlib import Path

            Path(url.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @sa.event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA journal_mode=WAL")
            # WAL + NORMAL never corrupts and survives process crashes; only an OS crash
            # or power loss can drop the last commits. It saves an fsync per commit.
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

        return engine
    return create_engine(url, pool_pre_ping=True)


def init_db(engine: Engine) -> None:
    """Give an empty database Baton's schema at the newest revision; accept a current one.

    For the CLI's database commands (``apply``, ``show``, ``users``, …) and tests:
    an empty database (a fresh SQLite file) is migrated to head with Alembic, as
    ``baton db upgrade`` would; an existing one is never changed here and must
    already be at head. Raises :class:`baton.storage.migrate.SchemaOutOfDate` (naming
    ``baton db upgrade``) otherwise: only ``baton db upgrade``, ``baton dev`` and
    ``baton demo`` migrate an existing database, so no other command changes a schema.
    """
    from baton.storage import migrate

    if migrate.schema_state(engine).empty:
        migrate.upgrade(engine)
    else:
        migrate.require_current(engine)


RowT = TypeVar("RowT", bound=SQLModel)


def page(
    session: Session,
    model: type[RowT],
    *,
    where: Sequence[Any] = (),
    order_by: Sequence[Any],
    limit: int,
    offset: int,
) -> tuple[list[RowT], int]:
    """One page of ``model`` rows matching ``where`` in ``order_by`` order, and the total
    count of matching rows (every list endpoint: ``{"data": [...], "count": N}``)."""
    total = session.exec(select(func.count()).select_from(model).where(*where)).one()
    rows = session.exec(
        select(model).where(*where).order_by(*order_by).offset(offset).limit(limit)
    ).all()
    return list(rows), int(total)


@contextmanager
def session_scope(engine: Engine) -> Iterator[Session]:
    """A session whose transaction commits on success and rolls back on any error."""
    with Session(engine, expire_on_commit=False) as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise
