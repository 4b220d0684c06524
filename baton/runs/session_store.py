"""Session, transcript and event-log storage, shared by the API and the activities.

Transcripts live here, not in workflow history (claim-check, docs/sessions.md).
Message ids are chosen by the workflow: :func:`add_message` is idempotent on the
id, so a retried activity never duplicates a message. Every message is written
in the same transaction as its ``message`` event.
"""

from __future__ import annotations

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
from sqlmodel import Session, col, select

from baton.contracts import CLOSED_STATUSES, Provenance, ResumePoint, SessionStatus, Usage
from baton.errors import BatonError, SessionClosed, SessionNotFound
from baton.storage import notify
from baton.storage.db import EventRow, MessageRow, SessionRow, StepRow, page, utcnow


class InvalidCursor(BatonError):
    """A transcript ``cursor`` that names no message of this session."""

    code = "invalid_cursor"
    status = 422
    title = "Invalid cursor"


#: Largest transcript page (``limit``) the API serves.
MAX_TRANSCRIPT_PAGE = 500

SUMMARY_CHARS = 300
Role = Literal["user", "assistant", "tool", "error"]


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
    at: datetime


class Transcript(BaseModel):
    """``GET /v1/sessions/{id}/transcript``: status line, then the messages in order."""

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
        description="Paged reads (`limit`): pass as `cursor` for the next page; null on the "
        "last page (and always without `limit`).",
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
    on each worker: one column by a Core query, not the whole row through the ORM (issue
    14). Raises SessionNotFound."""
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
) -> tuple[list[SessionRow], int]:
    """Sessions newest first (optionally of one agent, or of ``agents``), and the total count.

    Steps are not sessions here (issue 12, item 4): a step keeps its transcript in a
    session row under its own id, but lists of sessions (API, console, tools) omit it.
    """
    where: list[Any] = [col(SessionRow.id).not_in(select(StepRow.id))]
    if agent is not None:
        where.append(col(SessionRow.agent_slug) == agent)
    if agents is not None:
        where.append(col(SessionRow.agent_slug).in_(agents))
    newest_first = [col(SessionRow.created_at).desc(), col(SessionRow.id)]
    return page(session, SessionRow, where=where, order_by=newest_first, limit=limit, offset=offset)


#: The tables of the hot writes, for Core statements (no ORM machinery per statement).
_SESSIONS: Table = SessionRow.__table__  # type: ignore[attr-defined]
_MESSAGES: Table = MessageRow.__table__  # type: ignore[attr-defined]
_EVENTS: Table = EventRow.__table__  # type: ignore[attr-defined]

#: ``Session.info`` key of the events a PostgreSQL transaction writes at commit.
_PENDING_EVENTS = "baton_pending_events"

# The statements of a turn's writes, built once per process (issue 14). Building a
# statement and generating its cache key cost more CPU than running it; a statement
# object built once keeps its cache key (SQLAlchemy memoizes it), so each execution is a
# compiled-cache hit with new bind values. Closed statuses are spelled out as constants,
# not ``NOT IN (…)``, whose expanding parameter is re-rendered at every execution.
_OPEN = sa_and(*(_SESSIONS.c.status != s for s in CLOSED_STATUSES))
_INSERT_EVENT = sa_insert(_EVENTS)
#: PostgreSQL's events, written at commit, announce themselves (``LISTEN baton_events``).
_INSERT_EVENT_NOTIFY = sa_insert(_EVENTS).returning(notify.notify_returning(_EVENTS.c.session_id))
_INSERT_MESSAGE = sa_insert(_MESSAGES)
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


def _history_statements(tool_calls: Any) -> tuple[Any, Any]:
    """:func:`history`'s two reads (all messages; the newest ``last``), ``tool_calls``
    being the column expression that reads the messages' tool calls."""
    query = sa_select(
        _MESSAGES.c.role,
        _MESSAGES.c.text,
        _MESSAGES.c.tool_name,
        _MESSAGES.c.tool_call_id,
        tool_calls,
        _MESSAGES.c.is_error,
    ).where(_MESSAGES.c.session_id == bindparam("session_id"))
    newest = query.order_by(_MESSAGES.c.position.desc(), _MESSAGES.c.id.desc())
    return query.order_by(_MESSAGES.c.position), newest.limit(bindparam("last"))


#: Most messages carry no tool calls, stored as JSON ``null``. SQLite hands the text back
#: to be decoded row by row, so there ``NULLIF(…, 'null')`` returns SQL NULL, which is
#: never decoded (PostgreSQL's driver decodes JSON itself, and has no ``=`` for json).
_HISTORY = {
    "sqlite": _history_statements(
        sa_type_coerce(
            sa_func.nullif(sa_type_coerce(_MESSAGES.c.tool_calls, Text), "null"), JSON
        ).label("tool_calls")
    ),
    "postgresql": _history_statements(_MESSAGES.c.tool_calls),
}


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
        # Followers in other processes: LISTEN baton_events hears it at commit (issue 14).
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

    Written by the ``record_resume`` activity just before an idle run completes (issue
    12, item 2). A closed session is left as it is: nothing may start it again.
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
    newest = session.execute(
        sa_select(sa_func.max(col(MessageRow.position))).where(
            col(MessageRow.session_id) == session_id
        )
    ).scalar()
    stored_turn = int(str(newest).split(".", 1)[0]) if newest else 0
    if stored_turn > point.input.turn:
        point.input = point.input.model_copy(update={"turn": stored_turn})
    return point, row.name


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
    counter increment, which also checks that the id is new, then the message row; both
    built once per process, run on the transaction's connection, no ORM object built.
    """
    # Core statements on the transaction's connection: the ORM's per-statement machinery
    # (identity lookups, bulk-persistence compile) cost more CPU than the SQL (issue 14).
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
    conn.execute(
        _INSERT_MESSAGE,
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
    )
    event: dict[str, Any] = {"message_id": message_id, "role": role, "text": summarise(text)}
    if tool_name:
        event["tool_name"] = tool_name
    if tool_calls:
        event["tool_calls"] = tool_calls
    if is_error:
        event["is_error"] = True
    append_event(session, session_id=session_id, type="message", data=event)
    session.flush()
    return True


def messages(session: Session, *, session_id: str) -> list[MessageRow]:
    """The transcript in order."""
    return list(
        session.exec(
            select(MessageRow)
            .where(MessageRow.session_id == session_id)
            .order_by(col(MessageRow.position))
        ).all()
    )


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
    bounded read never touches the older rows (issue 14).
    """
    conn = session.connection()
    every, newest_first = _HISTORY[conn.dialect.name]
    if last is None:
        rows = conn.execute(every, {"session_id": session_id}).all()
        return [HistoryItem._make(row) for row in rows]
    newest = conn.execute(newest_first, {"session_id": session_id, "last": last}).all()
    items = [HistoryItem._make(row) for row in reversed(newest)]
    first_user = next((i for i, m in enumerate(items) if m.role == "user"), 0)
    return items[first_user:]


def transcript(
    session: Session, *, session_id: str, limit: int | None = None, cursor: str | None = None
) -> Transcript:
    """Status line and messages, tool I/O summarised (Gamut X-Agent,
    get_agent_session_transcript).

    Without ``limit``: every message. With ``limit``: at most that many, in order, after
    the message ``cursor`` names (a previous page's ``next_cursor``: the id of its last
    message), with ``next_cursor`` set while more follow. One indexed range read per page,
    whatever the transcript's length (issue 14). Raises SessionNotFound, InvalidCursor.
    """
    row = get_session(session, session_id=session_id)
    query = select(MessageRow).where(MessageRow.session_id == session_id)
    if cursor is not None:
        after = session.get(MessageRow, cursor)
        if after is None or after.session_id != session_id:
            raise InvalidCursor(
                f"cursor '{cursor[:160]}' names no message of this session", path="cursor"
            )
        query = query.where(
            sa_tuple(col(MessageRow.position), col(MessageRow.id))
            > sa_tuple(after.position, after.id)
        )
    query = query.order_by(col(MessageRow.position), col(MessageRow.id))
    if limit is not None:
        query = query.limit(limit + 1)  # one more tells whether another page follows
    found = list(session.exec(query).all())
    next_cursor = None
    if limit is not None and len(found) > limit:
        found = found[:limit]
        next_cursor = found[-1].id
    out = []
    for m in found:
        tool_input = None
        if m.tool_args is not None:
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
                at=m.created_at,
            )
        )
    return Transcript(session_id=row.id, status=row.status, messages=out, next_cursor=next_cursor)


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
