"""Session, transcript and event-log storage, shared by the API and the activities.

Transcripts live here, not in workflow history (claim-check, docs/sessions.md).
Message ids are chosen by the workflow: :func:`add_message` is idempotent on the
id, so a retried activity never duplicates a message. Every message is written
in the same transaction as its ``message`` event.
"""

from __future__ import annotations

import base64
import json
from datetime import datetime
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import JSON, Table, Text, bindparam
from sqlalchemy import and_ as sa_and
from sqlalchemy import event as sa_event
from sqlalchemy import exists as sa_exists
from sqlalchemy import func as sa_func
from sqlalchemy import insert as sa_insert
from sqlalchemy import select as sa_select
from sqlalchemy import text as sa_text
from sqlalchemy import tuple_ as sa_tuple
from sqlalchemy import type_coerce as sa_type_coerce
from sqlalchemy import update as sa_update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlmodel import Session, col, select

from baton.contracts.activity_io import ResumePoint
from baton.contracts.tool_args import CLAIM_CHECKED, PRESENT_EXHIBIT, compact_args
from baton.contracts.values import CLOSED_STATUSES, SessionStatus, Usage
from baton.contracts.workflow_io import Provenance
from baton.errors import InvalidCursor as InvalidCursor  # its lists raise it: re-exported
from baton.errors import SessionClosed, SessionNotFound
from baton.storage import notify
from baton.storage.db import (
    EventRow,
    MessageRow,
    ProxyTokenRow,
    SessionRow,
    StepRow,
    utcnow,
)

#: Largest transcript page (``limit``) the API serves.
MAX_TRANSCRIPT_PAGE = 500
#: A transcript page's size when the caller gives no ``limit``: a transcript is always paged.
DEFAULT_TRANSCRIPT_PAGE = 100

SUMMARY_CHARS = 300
#: ``attachment``: a file a person attached to the session's workspace (docs/workspaces.md).
Role = Literal["user", "assistant", "tool", "error", "attachment"]


def summarise(text: str, limit: int = SUMMARY_CHARS) -> str:
    """``text`` cut to ``limit`` characters with an ellipsis (tool I/O in transcripts)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


class SessionPublic(BaseModel):
    """A session as the API shows it."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "session_id": "session-6f1c…",
                    "name": "What changed in the Q3 report?",
                    "agent": "researcher",
                    "version": 2,
                    "status": "idle",
                    "running": False,
                    "created_at": "2026-11-29T12:00:00Z",
                    "last_activity_at": "2026-11-29T12:00:09Z",
                    "message_count": 4,
                    "created_by_user": "local",
                    "invoked_by_agent": None,
                    "parent_session_id": None,
                    "team": None,
                    "depth": 0,
                    "input_tokens": 812,
                    "output_tokens": 133,
                }
            ]
        }
    )

    session_id: str
    name: str
    agent: str
    version: int
    status: str
    running: bool
    created_at: datetime
    last_activity_at: datetime
    message_count: int
    created_by_user: str
    invoked_by_agent: str | None
    parent_session_id: str | None
    team: str | None
    depth: int
    input_tokens: int
    output_tokens: int
    forked_from: str | None = Field(
        default=None, description="A fork: the session it was forked from."
    )
    fork_point: str | None = Field(
        default=None, description="A fork: the message of the original it was forked after."
    )
    sandbox: bool = Field(default=False, description="Runs an agent's draft (the sandbox).")


class TranscriptMessage(BaseModel):
    """One transcript entry; tool input and output are summarised, thinking never stored."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": "session-6f1c…:t1:s1:assistant",
                    "role": "assistant",
                    "agent": "researcher",
                    "text": "Let me compute that.",
                    "tool_name": None,
                    "tool_input": None,
                    "tool_calls": [{"id": "call_0_0", "name": "calculator"}],
                    "at": "2026-11-29T12:00:03Z",
                }
            ]
        }
    )

    id: str
    role: str
    agent: str
    text: str
    tool_name: str | None = None
    tool_input: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    exhibit: dict[str, Any] | None = Field(
        default=None,
        description="A present_exhibit turn: the exhibit's wire, as its `exhibit` event "
        "carried it (docs/exhibits.md), so a reloaded conversation rebuilds the card.",
    )
    at: datetime


class Transcript(BaseModel):
    """``GET /v1/sessions/{id}/transcript``: status line, then a page of the messages in order."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"session_id": "session-6f1c…", "status": "idle", "messages": []}]
        }
    )

    session_id: str
    status: str
    messages: list[TranscriptMessage] = Field(default_factory=list)
    next_cursor: str | None = Field(
        default=None,
        description="Pass as `cursor` for the next page; null on the last page (and on a "
        "step's transcript, which is never paged).",
    )


def to_public(row: SessionRow) -> SessionPublic:
    """The API view of a session row."""
    return SessionPublic(
        session_id=row.id,
        name=row.name,
        agent=row.agent_slug,
        version=row.agent_version,
        status=row.status,
        running=row.status in ("running", "awaiting_input"),
        created_at=row.created_at,
        last_activity_at=row.last_activity_at,
        message_count=row.message_count,
        created_by_user=row.created_by_user,
        invoked_by_agent=row.invoked_by_agent,
        parent_session_id=row.parent_session_id,
        team=row.team,
        depth=row.depth,
        input_tokens=row.input_tokens,
        output_tokens=row.output_tokens,
        forked_from=row.forked_from,
        fork_point=row.fork_point,
        sandbox=row.sandbox,
    )


def create_session(
    session: Session,
    *,
    session_id: str,
    agent_slug: str,
    agent_version: int,
    provenance: Provenance,
    name: str,
) -> SessionRow:
    """Insert the session row (status ``running``: its first turn is about to start)."""
    row = SessionRow(
        id=session_id,
        name=name,
        agent_slug=agent_slug,
        agent_version=agent_version,
        created_by_user=provenance.created_by_user,
        invoked_by_agent=provenance.invoked_by_agent,
        parent_session_id=provenance.parent_session_id,
        team=provenance.team,
        depth=provenance.depth,
        workspace_id=provenance.workspace_id,
        eval_id=provenance.eval_id,
        replay_of=provenance.replay_of,
        sandbox=provenance.sandbox,
    )
    session.add(row)
    session.flush()
    return row


def get_session(session: Session, *, session_id: str) -> SessionRow:
    """The row for ``session_id``. Raises SessionNotFound."""
    row = session.get(SessionRow, session_id)
    if row is None:
        raise SessionNotFound(f"no session '{session_id}'")
    return row


def agent_snapshot(session: Session, *, session_id: str) -> dict[str, Any] | None:
    """The ``resolved_agent`` snapshot recorded on ``session_id``'s row (by the launch, or
    the workflow's ``load_agent``); None until one is. Read by a session's first model call
    on each worker: one column by a Core query, not the whole row through the ORM.
    Raises SessionNotFound."""
    session.flush()
    found = session.connection().execute(_SNAPSHOT, {"session_id": session_id}).first()
    if found is None:
        raise SessionNotFound(f"no session '{session_id}'")
    snapshot: dict[str, Any] | None = found[0]
    return snapshot


def list_sessions(
    session: Session,
    *,
    agent: str | None = None,
    limit: int = 50,
    offset: int = 0,
    agents: list[str] | None = None,
    sandbox: bool | None = None,
    ids: list[str] | None = None,
    since: datetime | None = None,
) -> tuple[list[SessionRow], int]:
    """Sessions newest first, filtered as :func:`page_sessions` filters them, and the total
    count (:func:`page_sessions` without a cursor)."""
    rows, total, _ = page_sessions(
        session,
        agent=agent,
        limit=limit,
        offset=offset,
        agents=agents,
        sandbox=sandbox,
        ids=ids,
        since=since,
    )
    return rows, total


def session_cursor(row: SessionRow) -> str:
    """The opaque list cursor after ``row``: its ``created_at`` and id, base64url."""
    raw = f"{row.created_at.isoformat()}|{row.id}"
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _after_cursor(cursor: str) -> tuple[datetime, str]:
    """``(created_at, id)`` a :func:`session_cursor` names. Raises InvalidCursor."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        at, _, sid = raw.partition("|")
        created = datetime.fromisoformat(at)
    except ValueError:
        created, sid = None, ""
    if created is None or created.tzinfo is None or not sid:
        raise InvalidCursor(f"cursor '{cursor[:160]}' is not a session list's", path="cursor")
    return created, sid


def page_sessions(
    session: Session,
    *,
    agent: str | None = None,
    limit: int = 50,
    offset: int = 0,
    cursor: str | None = None,
    agents: list[str] | None = None,
    sandbox: bool | None = None,
    ids: list[str] | None = None,
    since: datetime | None = None,
) -> tuple[list[SessionRow], int, str | None]:
    """One page of sessions newest first (``created_at`` descending, then id descending),
    optionally of one agent or of ``agents``; ``sandbox``: only sandbox sessions, or none;
    only ``ids``; only those created at or after ``since``: ``(rows, total count,
    next_cursor)``.

    ``cursor`` (a previous page's ``next_cursor``, :func:`session_cursor`) is keyset paging:
    the sessions after that one, one range read of ``ix_sessions_created_at`` whatever the
    depth, and disjoint from the pages before it however many sessions were created since.
    ``offset`` skips rows instead (the database reads and drops them: a deep page costs its
    depth). ``next_cursor`` is set while more sessions follow, None on the last page.
    Steps are not sessions here: a step keeps its transcript in a session row under its own
    id, but lists of sessions (API, console, tools) omit it. Nor are an eval's replays
    (``eval_id``): they are the eval's, read through its report. Raises InvalidCursor.
    """
    where: list[Any] = [
        col(SessionRow.id).not_in(select(StepRow.id)),
        col(SessionRow.eval_id).is_(None),
    ]
    if sandbox is not None:
        where.append(col(SessionRow.sandbox) == sandbox)
    if ids is not None:
        where.append(col(SessionRow.id).in_(ids))
    if since is not None:
        where.append(col(SessionRow.created_at) >= since)
    if agent is not None:
        where.append(col(SessionRow.agent_slug) == agent)
    if agents is not None:
        where.append(col(SessionRow.agent_slug).in_(agents))
    total = session.exec(select(sa_func.count()).select_from(SessionRow).where(*where)).one()
    if cursor is not None:
        at, sid = _after_cursor(cursor)
        # The range on created_at alone is what an index serves; the OR breaks its ties.
        where.append(col(SessionRow.created_at) <= at)
        where.append((col(SessionRow.created_at) < at) | (col(SessionRow.id) < sid))
    found = list(
        session.exec(
            select(SessionRow)
            .where(*where)
            .order_by(col(SessionRow.created_at).desc(), col(SessionRow.id).desc())
            .offset(offset)
            .limit(limit + 1)  # one more tells whether another page follows
        ).all()
    )
    rows = found[:limit]
    next_cursor = session_cursor(rows[-1]) if len(found) > limit else None
    return rows, int(total), next_cursor


#: The tables of the hot writes, for Core statements (no ORM machinery per statement).
_SESSIONS: Table = SessionRow.__table__  # type: ignore[attr-defined]
_MESSAGES: Table = MessageRow.__table__  # type: ignore[attr-defined]
_EVENTS: Table = EventRow.__table__  # type: ignore[attr-defined]

#: ``Session.info`` key of the events a PostgreSQL transaction writes at commit.
_PENDING_EVENTS = "baton_pending_events"

# The statements of a turn's writes, built once per process. Building a
# statement and generating its cache key cost more CPU than running it; a statement
# object built once keeps its cache key (SQLAlchemy memoizes it), so each execution is a
# compiled-cache hit with new bind values. Closed statuses are spelled out as constants,
# not ``NOT IN (…)``, whose expanding parameter is re-rendered at every execution.
_OPEN = sa_and(*(_SESSIONS.c.status != s for s in CLOSED_STATUSES))
_INSERT_EVENT = sa_insert(_EVENTS)
#: PostgreSQL's events, written at commit, announce themselves (``LISTEN baton_events``).
_INSERT_EVENT_NOTIFY = sa_insert(_EVENTS).returning(notify.notify_returning(_EVENTS.c.session_id))
#: The message row unless its id exists: a concurrent attempt of the same activity (the
#: first one still running after its heartbeat timed out) may store it between the
#: bump's check and this insert on PostgreSQL, whose READ COMMITTED re-check of the bump
#: does not see the other's message; the unique key decides, and ``RETURNING`` tells.
_INSERT_MESSAGE_ONCE = {
    "sqlite": sqlite_insert(_MESSAGES)
    .on_conflict_do_nothing(index_elements=["id"])
    .returning(_MESSAGES.c.id),
    "postgresql": pg_insert(_MESSAGES)
    .on_conflict_do_nothing(index_elements=["id"])
    .returning(_MESSAGES.c.id),
}
_MESSAGE_EXISTS = sa_select(_MESSAGES.c.id).where(_MESSAGES.c.id == bindparam("message_id"))
_MESSAGE_ROW = sa_select(_MESSAGES).where(_MESSAGES.c.id == bindparam("message_id"))
_SESSION_EXISTS = sa_select(_SESSIONS.c.id).where(_SESSIONS.c.id == bindparam("session_id"))
_SNAPSHOT = sa_select(_SESSIONS.c.resolved_agent).where(_SESSIONS.c.id == bindparam("session_id"))
_SET_STATUS = (
    sa_update(_SESSIONS)
    .where(_SESSIONS.c.id == bindparam("session_id"), _OPEN, _SESSIONS.c.status != bindparam("to"))
    .values(status=bindparam("to"), last_activity_at=bindparam("now"))
)
_LOCK_PG = (
    sa_select(_SESSIONS.c.status).where(_SESSIONS.c.id == bindparam("session_id")).with_for_update()
)
#: SQLite: a no-op UPDATE takes the write lock (see :func:`lock_session`).
_LOCK_SQLITE = (
    sa_update(_SESSIONS)
    .where(_SESSIONS.c.id == bindparam("session_id"))
    .values(id=_SESSIONS.c.id)
    .returning(_SESSIONS.c.status)
)


def _bump(with_usage: bool) -> Any:
    """``add_message``'s counter increment, in place (no read of the row, no lost update),
    only while no message ``message_id`` exists: the check and the bump are one statement."""
    counters: dict[str, Any] = {
        "message_count": _SESSIONS.c.message_count + 1,
        "last_activity_at": bindparam("now"),
    }
    if with_usage:
        counters["input_tokens"] = _SESSIONS.c.input_tokens + bindparam("add_in")
        counters["output_tokens"] = _SESSIONS.c.output_tokens + bindparam("add_out")
    absent = ~sa_exists().where(_MESSAGES.c.id == bindparam("message_id"))
    return (
        sa_update(_SESSIONS)
        .where(_SESSIONS.c.id == bindparam("session_id"), absent)
        .values(**counters)
    )


_BUMP, _BUMP_USAGE = _bump(False), _bump(True)


def _unbump(with_usage: bool) -> Any:
    """The bump taken back, when the insert found the message stored meanwhile."""
    counters: dict[str, Any] = {"message_count": _SESSIONS.c.message_count - 1}
    if with_usage:
        counters["input_tokens"] = _SESSIONS.c.input_tokens - bindparam("add_in")
        counters["output_tokens"] = _SESSIONS.c.output_tokens - bindparam("add_out")
    return sa_update(_SESSIONS).where(_SESSIONS.c.id == bindparam("session_id")).values(**counters)


_UNBUMP, _UNBUMP_USAGE = _unbump(False), _unbump(True)


def _history_columns(tool_calls: Any) -> tuple[Any, ...]:
    """The columns of a :class:`HistoryItem`, ``tool_calls`` being the column expression
    that reads the messages' tool calls."""
    return (
        _MESSAGES.c.role,
        _MESSAGES.c.text,
        _MESSAGES.c.tool_name,
        _MESSAGES.c.tool_call_id,
        tool_calls,
        _MESSAGES.c.is_error,
    )


def _history_statements(tool_calls: Any) -> tuple[Any, Any]:
    """:func:`history`'s two reads (all messages; the newest ``last``)."""
    query = sa_select(*_history_columns(tool_calls)).where(
        _MESSAGES.c.session_id == bindparam("session_id")
    )
    newest = query.order_by(_MESSAGES.c.position.desc(), _MESSAGES.c.id.desc())
    return query.order_by(_MESSAGES.c.position), newest.limit(bindparam("last"))


#: Most messages carry no tool calls, stored as JSON ``null``. SQLite hands the text back
#: to be decoded row by row, so there ``NULLIF(…, 'null')`` returns SQL NULL, which is
#: never decoded (PostgreSQL's driver decodes JSON itself, and has no ``=`` for json).
_TOOL_CALLS = {
    "sqlite": sa_type_coerce(
        sa_func.nullif(sa_type_coerce(_MESSAGES.c.tool_calls, Text), "null"), JSON
    ).label("tool_calls"),
    "postgresql": _MESSAGES.c.tool_calls,
}
_HISTORY = {dialect: _history_statements(column) for dialect, column in _TOOL_CALLS.items()}
_FORK_PREFIX = sa_select(_SESSIONS.c.fork_prefix).where(_SESSIONS.c.id == bindparam("session_id"))


class Segment(NamedTuple):
    """One stretch of a transcript: ``session_id``'s messages up to and including the one at
    (``position``, ``message_id``), or all of them when ``position`` is None."""

    session_id: str
    position: str | None = None
    message_id: str | None = None

    def holds(self, message: MessageRow) -> bool:
        """Whether ``message`` lies in this stretch."""
        return message.session_id == self.session_id and (
            self.position is None
            or (message.position, message.id) <= (self.position, self.message_id or "")
        )

    def where(self) -> list[Any]:
        """The SQL conditions of this stretch."""
        where: list[Any] = [col(MessageRow.session_id) == self.session_id]
        if self.position is not None:
            where.append(
                sa_tuple(col(MessageRow.position), col(MessageRow.id))
                <= sa_tuple(self.position, self.message_id)
            )
        return where


def fork_prefix(session: Session, *, session_id: str) -> list[Segment]:
    """The stretches of other sessions a fork reads before its own messages, oldest first
    (``[]`` for a session that is no fork, or an unknown one): one column read."""
    session.flush()
    found = session.connection().execute(_FORK_PREFIX, {"session_id": session_id}).first()
    return [Segment(*seg) for seg in found[0]] if found is not None and found[0] else []


def segments(session: Session, *, session_id: str) -> list[Segment]:
    """Every stretch of ``session_id``'s transcript, oldest first: its fork prefix (held by
    reference), then its own messages."""
    return [*fork_prefix(session, session_id=session_id), Segment(session_id)]


def read_messages(
    session: Session,
    segs: list[Segment],
    *,
    after: MessageRow | None = None,
    limit: int | None = None,
    role: Role | None = None,
) -> list[MessageRow]:
    """Messages of the transcript ``segs`` in order, after ``after`` (a message in one of
    them), at most ``limit``, only of ``role`` when given: one indexed range read per
    stretch it reaches, whatever the transcript's length."""
    start = next((i for i, seg in enumerate(segs) if after and seg.holds(after)), 0)
    out: list[MessageRow] = []
    for i, seg in enumerate(segs[start:], start):
        query = select(MessageRow).where(*seg.where())
        if after is not None and i == start:
            query = query.where(
                sa_tuple(col(MessageRow.position), col(MessageRow.id))
                > sa_tuple(after.position, after.id)
            )
        if role is not None:
            query = query.where(col(MessageRow.role) == role)
        query = query.order_by(col(MessageRow.position), col(MessageRow.id))
        if limit is not None:
            query = query.limit(limit - len(out))
        out += session.exec(query).all()
        if limit is not None and len(out) >= limit:
            break
    return out


def count_messages(session: Session, segs: list[Segment]) -> int:
    """How many messages the transcript ``segs`` holds (one COUNT per stretch)."""
    return sum(
        int(session.exec(select(sa_func.count()).select_from(MessageRow).where(*seg.where())).one())
        for seg in segs
    )


def _forked_history(
    session: Session, prefix: list[Segment], *, session_id: str, last: int | None
) -> list[HistoryItem]:
    """:func:`history` of a fork: the newest ``last`` messages across its stretches, read
    newest stretch first and stopping once the window is full."""
    conn = session.connection()
    columns = _history_columns(_TOOL_CALLS[conn.dialect.name])
    chunks: list[list[HistoryItem]] = []
    remaining = last
    for seg in reversed([*prefix, Segment(session_id)]):
        query = (
            sa_select(*columns)
            .where(*seg.where())
            .order_by(_MESSAGES.c.position.desc(), _MESSAGES.c.id.desc())
        )
        if remaining is not None:
            query = query.limit(remaining)
        rows = conn.execute(query).all()
        chunks.append([HistoryItem._make(row) for row in reversed(rows)])
        if remaining is not None:
            remaining -= len(rows)
            if remaining <= 0:
                break
    return [item for chunk in reversed(chunks) for item in chunk]


def append_event(
    session: Session,
    *,
    session_id: str,
    type: str,
    data: dict[str, Any],
    unless_closed: bool = False,
) -> None:
    """Add an event to the durable log, written when the transaction commits.

    SSE readers page by event id, so a session's events must become visible in id
    order. SQLite has one writer at a time, so they do. PostgreSQL allocates ids
    from a sequence, and a transaction that took id 100 could commit after another
    that took 101. A reader would then pass 100 and never see it. There the events
    wait until commit, in :func:`_write_pending_events`.

    ``unless_closed`` drops the event if ``session_id`` is cancelled or failed by the
    time it is written. Writers from another session use it (a delegation forwarding
    to its run's root), so nothing lands after the root's ``cancelled``.
    """
    # A plain row, inserted without an ORM object: events are the hottest write.
    row = {"session_id": session_id, "type": type, "data": data, "created_at": utcnow()}
    notify.touched(session, session_id)  # its followers in this process wake at commit
    conn = session.connection()
    if conn.dialect.name == "postgresql":
        # Remember the (nested) transaction: rolling back a savepoint drops its events.
        txn = session.get_nested_transaction() or session.get_transaction()
        session.info.setdefault(_PENDING_EVENTS, []).append((row, unless_closed, txn))
    elif not (unless_closed and lock_session(session, session_id=session_id) in CLOSED_STATUSES):
        # The status was read under SQLite's write lock: no cancel slips in.
        conn.execute(_INSERT_EVENT, row)


@sa_event.listens_for(Session, "before_commit")
def _write_pending_events(session: Session) -> None:
    """Insert a PostgreSQL transaction's events under per-session stream locks.

    Each lock is a transaction-scoped advisory lock per session id. The locks are
    taken in sorted order and only here, at the very end of the transaction, so two
    writers cannot deadlock. Ids are allocated while the locks are held, so each
    session's ids commit in order. The ``unless_closed`` check also runs under these
    locks. A cancel's ``status`` event needs the same lock, so the check sees a cancel
    that committed earlier, and a later cancel's event is ordered after this one.
    """
    if session.in_nested_transaction():
        return  # SQLAlchemy fires this when a savepoint is released, too: not the commit
    pending: list[tuple[dict[str, Any], bool, Any]] = session.info.pop(_PENDING_EVENTS, [])
    if not pending:
        return
    for sid in sorted({r["session_id"] for r, _, _ in pending}):
        session.execute(
            sa_text("SELECT pg_advisory_xact_lock(hashtextextended(:sid, 0))"), {"sid": sid}
        )
    guarded = {r["session_id"] for r, unless_closed, _ in pending if unless_closed}
    closed = set(
        session.exec(
            select(SessionRow.id).where(
                col(SessionRow.id).in_(guarded), col(SessionRow.status).in_(CLOSED_STATUSES)
            )
        ).all()
        if guarded
        else ()
    )
    rows = [r for r, unless, _ in pending if not (unless and r["session_id"] in closed)]
    if rows:  # one multi-row INSERT: ids follow the list's order
        # Followers in other processes: LISTEN baton_events hears it at commit.
        session.connection().execute(_INSERT_EVENT_NOTIFY, rows)


@sa_event.listens_for(Session, "after_soft_rollback")
def _drop_pending_events(session: Session, previous: Any) -> None:
    """A rolled-back transaction's events are never written: the whole transaction's,
    or a savepoint's own (those of the enclosing transaction stay)."""

    def inside(txn: Any) -> bool:
        while txn is not None:
            if txn is previous:
                return True
            txn = txn.parent
        return False

    pending = session.info.get(_PENDING_EVENTS)
    if pending:
        session.info[_PENDING_EVENTS] = [p for p in pending if not inside(p[2])]


def lock_session(session: Session, *, session_id: str) -> str | None:
    """Take ``session_id``'s row lock until the transaction ends; returns its committed
    status (None: no such session), read in the same statement.

    PostgreSQL: ``SELECT status … FOR UPDATE``. SQLite has no row locks and its driver
    opens no transaction for a bare SELECT, so a status read that way could go stale
    before the next write: a no-op ``UPDATE … RETURNING status`` takes the database
    write lock instead. A column query, so a row this transaction loaded earlier
    cannot answer with a stale value.
    """
    session.flush()  # as a query through the session would: its pending writes go first
    conn = session.connection()
    stmt = _LOCK_PG if conn.dialect.name == "postgresql" else _LOCK_SQLITE
    found = conn.execute(stmt, {"session_id": session_id}).first()
    return found[0] if found is not None else None


def is_closed(session: Session, *, session_id: str) -> bool:
    """Whether ``session_id`` is cancelled or failed, read under its row lock.

    A running activity learns of a cancel only at its next heartbeat (up to 0.8 x the
    heartbeat timeout later), so every writer checks this first. One that checks it
    and then writes in the same transaction cannot land after the ``cancelled`` status
    event: the cancel waits for the lock, or the writer sees it. Raises SessionNotFound.
    """
    status = lock_session(session, session_id=session_id)
    if status is None:
        raise SessionNotFound(f"no session '{session_id}'")
    return status in CLOSED_STATUSES


def _expire_loaded(session: Session, session_id: str, columns: list[str]) -> None:
    # After an UPDATE statement, a row this transaction already loaded reloads these.
    loaded = session.identity_map.get(session.identity_key(SessionRow, session_id))
    if loaded is not None:
        session.expire(loaded, columns)


def set_status(session: Session, *, session_id: str, status: SessionStatus) -> None:
    """Record a status change and its ``status`` event.

    Takes the session's row lock first, so the ``status`` event is ordered after
    any event a writer holding the lock (see :func:`is_closed`) adds.
    """
    # One conditional UPDATE: it takes the row lock (waiting for a writer that holds it)
    # and only then reads the status. A closed session is terminal, so late writers
    # cannot reopen it, and an unchanged status writes no event.
    conn = session.connection()
    changed = conn.execute(_SET_STATUS, {"session_id": session_id, "to": status, "now": utcnow()})
    if changed.rowcount:
        _expire_loaded(session, session_id, ["status", "last_activity_at"])
        append_event(session, session_id=session_id, type="status", data={"status": status})
    elif conn.execute(_SESSION_EXISTS, {"session_id": session_id}).first() is None:
        raise SessionNotFound(f"no session '{session_id}'")
    session.flush()


def set_resume_input(session: Session, *, point: ResumePoint) -> None:
    """Store ``point`` as where session ``point.input.session_id``'s next run starts.

    Written by the ``record_resume`` activity just before an idle run completes.
    A closed session is left as it is: nothing may start it again.
    Raises SessionNotFound.
    """
    session_id = point.input.session_id
    changed = session.execute(
        sa_update(SessionRow)
        .where(
            col(SessionRow.id) == session_id,
            col(SessionRow.status).not_in(CLOSED_STATUSES),
        )
        .values(resume_input=point.model_dump(mode="json")),
        execution_options={"synchronize_session": False},
    )
    if not changed.rowcount and session.get(SessionRow, session_id) is None:  # type: ignore[attr-defined]
        raise SessionNotFound(f"no session '{session_id}'")
    _expire_loaded(session, session_id, ["resume_input"])
    session.flush()


def resume_input(session: Session, *, session_id: str) -> tuple[ResumePoint, str]:
    """``(resume point, name)`` of the next workflow run of a session whose run ended.

    The point its last run stored (:func:`set_resume_input`), with the turn counter
    raised to the newest turn in the transcript: a run that ended otherwise (an
    operator's ``temporal workflow terminate`` after a restart) may have stored an
    older one, and a reused turn number would make the next turn find the old turn's
    messages (their ids derive from it) instead of running.

    Raises SessionNotFound; SessionClosed when the session is closed (cancelled or
    failed: it stays closed) or has no resume point (its run ended without
    completing idle, e.g. terminated before it ever did).
    """
    row = get_session(session, session_id=session_id)
    if row.status in CLOSED_STATUSES:
        raise SessionClosed(f"session '{session_id}' is {row.status}")
    if row.resume_input is None:
        raise SessionClosed(f"session '{session_id}' is no longer running")
    point = ResumePoint.model_validate(row.resume_input)
    stored_turn = newest_turn(session, session_id=session_id)
    if stored_turn > point.input.turn:
        point.input = point.input.model_copy(update={"turn": stored_turn})
    return point, row.name


def newest_turn(session: Session, *, session_id: str) -> int:
    """The newest turn ``session_id``'s own messages reach (the first field of their
    positions); 0 without messages."""
    newest = session.execute(
        sa_select(sa_func.max(col(MessageRow.position))).where(
            col(MessageRow.session_id) == session_id
        )
    ).scalar()
    return int(str(newest).split(".", 1)[0]) if newest else 0


def get_message(session: Session, *, message_id: str) -> MessageRow | None:
    """The message with ``message_id``, if it was stored: a row read by one Core query (a
    retry's check before every write; no ORM identity lookup), detached from ``session``."""
    found = session.connection().execute(_MESSAGE_ROW, {"message_id": message_id}).first()
    return None if found is None else MessageRow(**found._mapping)


def add_message(
    session: Session,
    *,
    message_id: str,
    session_id: str,
    position: str,
    role: Role,
    agent_slug: str,
    text: str,
    tool_name: str | None = None,
    tool_call_id: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    tool_args: dict[str, Any] | None = None,
    is_error: bool = False,
    usage: Usage | None = None,
) -> bool:
    """Store a message once; returns whether it was stored now (False: the id exists).

    Also bumps the session's counters and appends a ``message`` event. Raises
    SessionNotFound. Written with two statements (the hot path of every turn): the
    counter increment, which also checks that the id is new, then the message row unless
    a concurrent attempt stored it meanwhile (then the increment is taken back); built
    once per process, run on the transaction's connection, no ORM object built.
    """
    # Core statements on the transaction's connection: the ORM's per-statement machinery
    # (identity lookups, bulk-persistence compile) cost more CPU than the SQL.
    now = utcnow()
    conn = session.connection()
    bump = {"session_id": session_id, "message_id": message_id, "now": now}
    if usage is not None:
        bump |= {"add_in": usage.input_tokens, "add_out": usage.output_tokens}
    if not conn.execute(_BUMP if usage is None else _BUMP_USAGE, bump).rowcount:
        # Nothing bumped: the message exists (a retry), or the session does not.
        if conn.execute(_MESSAGE_EXISTS, {"message_id": message_id}).first():
            return False
        raise SessionNotFound(f"no session '{session_id}'")
    counters = ["message_count", "last_activity_at"]
    if usage is not None:
        counters += ["input_tokens", "output_tokens"]
    _expire_loaded(session, session_id, counters)
    stored = conn.execute(
        _INSERT_MESSAGE_ONCE[conn.dialect.name],
        {
            "id": message_id,
            "session_id": session_id,
            "position": position,
            "role": role,
            "agent_slug": agent_slug,
            "text": text,
            "tool_name": tool_name,
            "tool_call_id": tool_call_id,
            "tool_calls": tool_calls,
            "tool_args": tool_args,
            "is_error": is_error,
            "usage": usage.model_dump() if usage else None,
            "created_at": now,
        },
    ).first()
    if stored is None:  # the other attempt's row won: this one stores and counts nothing
        conn.execute(_UNBUMP if usage is None else _UNBUMP_USAGE, bump)
        return False
    event: dict[str, Any] = {"message_id": message_id, "role": role, "text": summarise(text)}
    if tool_name:
        event["tool_name"] = tool_name
    if tool_calls:
        # A claim-checked call's bulk never rides the stream: an exhibit's content reaches
        # it once, in its own ``exhibit`` event; a written file is read from the workspace.
        event["tool_calls"] = [
            {**c, "args": compact_args(c["name"], c.get("args") or {})}
            if c.get("name") in CLAIM_CHECKED
            else c
            for c in tool_calls
        ]
    if is_error:
        event["is_error"] = True
    append_event(session, session_id=session_id, type="message", data=event)
    session.flush()
    return True


def messages(session: Session, *, session_id: str) -> list[MessageRow]:
    """The transcript in order (a fork's prefix read through)."""
    return read_messages(session, segments(session, session_id=session_id))


class HistoryItem(NamedTuple):
    """The columns a model call needs from one stored message (a tuple: up to
    ``BATON_CONTEXT_MESSAGES`` of them are built per model call)."""

    role: str
    text: str
    tool_name: str | None
    tool_call_id: str | None
    tool_calls: list[dict[str, Any]] | None
    is_error: bool


def history(session: Session, *, session_id: str, last: int | None = None) -> list[HistoryItem]:
    """The conversation for a model call, in order: only the needed columns.

    ``last`` bounds it to the newest ``last`` messages (the context window,
    ``BATON_CONTEXT_MESSAGES``), trimmed to start at a user message when the window holds
    one, so the model never reads a reply whose question was cut off; None loads all.
    Loaded on every model call, so it skips ORM objects and unused JSON columns, and a
    bounded read never touches the older rows.
    """
    conn = session.connection()
    every, newest_first = _HISTORY[conn.dialect.name]
    prefix = fork_prefix(session, session_id=session_id)
    if prefix:
        return _trim(_forked_history(session, prefix, session_id=session_id, last=last), last)
    if last is None:
        rows = conn.execute(every, {"session_id": session_id}).all()
        return [HistoryItem._make(row) for row in rows]
    newest = conn.execute(newest_first, {"session_id": session_id, "last": last}).all()
    return _trim([HistoryItem._make(row) for row in reversed(newest)], last)


def _trim(items: list[HistoryItem], last: int | None) -> list[HistoryItem]:
    """A bounded window starts at its first user message (when it holds one)."""
    if last is None:
        return items
    first_user = next((i for i, m in enumerate(items) if m.role == "user"), 0)
    return items[first_user:]


def transcript(
    session: Session, *, session_id: str, limit: int | None = None, cursor: str | None = None
) -> Transcript:
    """Status line and messages, tool I/O summarised (Gamut X-Agent,
    get_agent_session_transcript).

    Without ``limit``: every message. With ``limit``: at most that many, in order, after
    the message ``cursor`` names (a previous page's ``next_cursor``: the id of its last
    message), with ``next_cursor`` set while more follow. One indexed range read per page
    (a fork's: per stretch the page reaches, its prefix read through), whatever the
    transcript's length. Raises SessionNotFound, InvalidCursor.
    """
    row = get_session(session, session_id=session_id)
    segs = segments(session, session_id=session_id)
    after = None
    if cursor is not None:
        after = session.get(MessageRow, cursor)
        if after is None or not any(seg.holds(after) for seg in segs):
            raise InvalidCursor(
                f"cursor '{cursor[:160]}' names no message of this session", path="cursor"
            )
    # One more than the page tells whether another page follows.
    found = read_messages(session, segs, after=after, limit=None if limit is None else limit + 1)
    next_cursor = None
    if limit is not None and len(found) > limit:
        found = found[:limit]
        next_cursor = found[-1].id
    out = []
    for m in found:
        tool_input = None
        exhibit = exhibit_wire(m.tool_name, m.tool_args)
        if m.tool_args is not None and exhibit is None:
            tool_input = summarise(json_compact(m.tool_args))
        out.append(
            TranscriptMessage(
                id=m.id,
                role=m.role,
                agent=m.agent_slug,
                text=summarise(m.text) if m.role == "tool" else m.text,
                tool_name=m.tool_name,
                tool_input=tool_input,
                tool_calls=[{"id": c["id"], "name": c["name"]} for c in m.tool_calls]
                if m.tool_calls
                else None,
                exhibit=exhibit,
                at=m.created_at,
            )
        )
    return Transcript(session_id=row.id, status=row.status, messages=out, next_cursor=next_cursor)


def exhibit_wire(tool_name: str | None, tool_args: Any) -> dict[str, Any] | None:
    """The exhibit wire a ``present_exhibit`` turn stores in its ``tool_args``, if any."""
    if tool_name != PRESENT_EXHIBIT or not isinstance(tool_args, dict):
        return None
    wire = tool_args.get("exhibit")
    return wire if isinstance(wire, dict) else None


def json_compact(value: Any) -> str:
    """Compact JSON for summaries."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


def events_after(
    session: Session, *, session_id: str, after: int = 0, limit: int = 500
) -> list[EventRow]:
    """Events of ``session_id`` with id > ``after``, oldest first."""
    return list(
        session.exec(
            select(EventRow)
            .where(EventRow.session_id == session_id, col(EventRow.id) > after)
            .order_by(col(EventRow.id))
            .limit(limit)
        ).all()
    )


def is_external(s: Session, *, session_id: str) -> bool:
    """Whether ``session_id`` is an external session (it has had a proxy token)."""
    found = s.exec(
        select(ProxyTokenRow.id).where(ProxyTokenRow.session_id == session_id).limit(1)
    ).first()
    return found is not None
