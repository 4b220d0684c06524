"""Wake SSE followers when their session's events commit, instead of each polling the DB.

``GET /v1/sessions/{id}/events`` used to read the event log every 200 ms per follower:
400 idle followers cost 2,000 queries a second. Now each follower waits on a
:class:`Subscription` of its API process's one :class:`EventNotifier`, which learns of new
events three ways:

* **in this process**: a commit that wrote events wakes their sessions' followers at once
  (an SQLAlchemy ``after_commit`` hook; ``baton dev`` runs worker and API in one process);
* **PostgreSQL, any process**: every event-writing transaction sends ``NOTIFY
  baton_events, '<session id>'`` (delivered at commit, dropped with a rollback), and the
  notifier LISTENs on one connection;
* **SQLite, another process** (``baton worker`` beside ``baton api`` on one file): one
  shared poller per API process reads the newest event ids every ``poll_s`` (one query for
  all followers), and only while someone follows.

A follower re-reads the log on a wake-up, so a spurious wake costs one read and a missed
one (a PostgreSQL listener reconnecting) is covered by :data:`FALLBACK_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import weakref
from collections.abc import Iterable, Iterator

import sqlalchemy as sa
from sqlalchemy import event as sa_event
from sqlalchemy.engine import Engine
from sqlmodel import Session

log = logging.getLogger("baton.notify")

#: The PostgreSQL channel events are announced on; the payload is the session id.
CHANNEL = "baton_events"
#: ``Session.info`` key: sessions whose events this transaction wrote.
_TOUCHED = "baton_event_sessions"
#: Seconds a follower waits without any wake-up before it re-reads the log anyway.
FALLBACK_S = 30.0
#: Seconds between two reads of the SQLite poller (only while someone follows).
POLL_S = 0.2
#: Seconds before a lost PostgreSQL listener connects again.
RECONNECT_S = 1.0

#: Every live notifier of this process: the in-process commit hook wakes them all.
_NOTIFIERS: weakref.WeakSet[EventNotifier] = weakref.WeakSet()
_LOCK = threading.Lock()


def touched(session: Session, session_id: str) -> None:
    """Note that this transaction wrote an event of ``session_id`` (``append_event``)."""
    session.info.setdefault(_TOUCHED, set()).add(session_id)


@sa_event.listens_for(Session, "after_commit")
def _announce(session: Session) -> None:
    ids: set[str] | None = session.info.pop(_TOUCHED, None)
    if ids:
        with _LOCK:
            notifiers = list(_NOTIFIERS)
        for notifier in notifiers:
            notifier.wake_threadsafe(ids)


@sa_event.listens_for(Session, "after_rollback")
def _forget(session: Session) -> None:
    session.info.pop(_TOUCHED, None)


def notify_returning(session_id: sa.ColumnElement[str]) -> sa.ColumnElement[object]:
    """PostgreSQL: ``pg_notify(CHANNEL, session_id)`` for an event INSERT's ``RETURNING``
    clause, so the announcement costs no statement of its own: one per inserted row, which
    the server collapses to one per session (identical payloads in one transaction) and
    sends when the transaction commits (:func:`baton.runs.session_store._write_pending_events`
    writes the events with it)."""
    return sa.func.pg_notify(CHANNEL, session_id)


class Subscription:
    """One follower's wake-up: :meth:`clear` before reading the log, then :meth:`wait`.

    Clearing first means an event committed between the read and the wait still wakes it.
    """

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def set(self) -> None:
        self._event.set()

    def clear(self) -> None:
        self._event.clear()

    async def wait(self, timeout: float = FALLBACK_S) -> bool:
        """Whether a wake-up came within ``timeout`` seconds."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout)
            return True
        return False


class EventNotifier:
    """The followers of one API process, woken per session (see the module docstring).

    Created in the app's lifespan; the PostgreSQL listener or SQLite poller runs only while
    at least one follower is subscribed, on the loop that subscribed first. :meth:`close`
    stops it. ``poll_s`` is the SQLite poller's period (seconds).
    """

    def __init__(self, engine: Engine, *, poll_s: float = POLL_S) -> None:
        self._engine = engine
        self._poll_s = poll_s
        self._subs: dict[str, set[Subscription]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        #: Reads of the event log this notifier made (the SQLite poller): tests, the bench.
        self.polls = 0
        with _LOCK:
            _NOTIFIERS.add(self)

    @contextlib.contextmanager
    def subscribe(self, session_id: str) -> Iterator[Subscription]:
        """A subscription to ``session_id``'s events for the duration of the block."""
        sub = Subscription()
        self._loop = asyncio.get_running_loop()
        self._subs.setdefault(session_id, set()).add(sub)
        if self._task is None or self._task.done():
            self._task = self._loop.create_task(self._watch(), name="baton-event-notifier")
        try:
            yield sub
        finally:
            subs = self._subs.get(session_id)
            if subs is not None:
                subs.discard(sub)
                if not subs:
                    del self._subs[session_id]

    def wake(self, session_ids: Iterable[str] | None) -> None:
        """Wake the followers of ``session_ids`` (None: everyone). On the notifier's loop."""
        if session_ids is None:
            for subs in self._subs.values():
                for sub in subs:
                    sub.set()
            return
        for sid in session_ids:
            for sub in self._subs.get(sid, ()):
                sub.set()

    def wake_threadsafe(self, session_ids: Iterable[str]) -> None:
        """:meth:`wake` from any thread (a committing DB thread)."""
        loop = self._loop
        if loop is None or loop.is_closed() or not self._subs:
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(self.wake, set(session_ids))

    async def close(self) -> None:
        """Stop the listener or poller (the app's lifespan ends)."""
        with _LOCK:
            _NOTIFIERS.discard(self)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # --- the cross-process watchers ------------------------------------------------

    async def _watch(self) -> None:
        if self._engine.dialect.name == "postgresql":
            await self._listen()
        else:
            await self._poll()

    async def _poll(self) -> None:
        """SQLite: one read of the newest event ids per period, while anyone follows."""
        newest = await asyncio.to_thread(self._max_id)
        while self._subs:
            await asyncio.sleep(self._poll_s)
            if not self._subs:
                break
            try:
                found = await asyncio.to_thread(self._after, newest)
            except sa.exc.OperationalError as exc:  # busy or locked: the next round reads
                log.debug("event poll failed: %s", exc)
                continue
            if found:
                newest = max(newest, *found.values())
                self.wake(found)

    def _max_id(self) -> int:
        with self._engine.connect() as conn:
            return int(
                conn.execute(sa.text("SELECT COALESCE(MAX(id), 0) FROM events")).scalar_one()
            )

    def _after(self, newest: int) -> dict[str, int]:
        self.polls += 1
        with self._engine.connect() as conn:
            rows = conn.execute(
                sa.text("SELECT session_id, MAX(id) FROM events WHERE id > :n GROUP BY session_id"),
                {"n": newest},
            ).all()
        return {str(sid): int(top) for sid, top in rows}

    async def _listen(self) -> None:
        """PostgreSQL: LISTEN on one connection; reconnect (waking everyone) if it drops."""
        import psycopg

        dsn = self._engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        while self._subs:
            try:
                async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    self.wake(None)  # anything committed before LISTEN took effect
                    async for note in conn.notifies():
                        self.wake((note.payload,))
                        if not self._subs:
                            break
            except (psycopg.Error, OSError) as exc:
                log.warning("event listener lost its connection (%s); reconnecting", exc)
                self.wake(None)
                await asyncio.sleep(RECONNECT_S)
