"""One reader per followed session: its SSE followers share each read of the event log.

``GET /v1/sessions/{id}/events`` streams a session's durable log (docs/sessions.md,
Events). With one read per follower per wake-up, 300 followers of one session turned each
of its events (every streamed chunk is one) into 300 thread hand-offs and 600 queries in
the API process. Now each API process keeps one :class:`SessionFeed` per followed
session: woken by the :class:`~baton.storage.notify.EventNotifier`, it waits :data:`GATHER_S` for
the commits right behind the first, reads the log once and hands the batch to every
follower's bounded queue (:class:`Follower`), so the work per woken follower is a queue
hand-off and one write.

A follower reads the log itself only to catch up: when it connects (everything after its
``Last-Event-ID``), when a batch starts past what it has (the feed started after it, or
its queue overflowed), and as the :data:`~baton.storage.notify.FALLBACK_S` safety net. A
follower that does not keep up (its client reads slower than the session writes) never
holds the others back: once :data:`QUEUE_EVENTS` events wait in its queue they are
dropped and it is marked lagged, and it resumes from the database after the last event
it sent, exactly as a client reconnecting with ``Last-Event-ID`` would, on the same
stream. Event ids grow within a session in the order they become visible, so resuming
after an id never skips or repeats an event.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from collections.abc import AsyncGenerator, Callable, Iterator
from dataclasses import dataclass, field

from sqlalchemy.engine import Engine
from sse_starlette import ServerSentEvent

from baton.runs import session_store
from baton.storage.db import session_scope
from baton.storage.notify import FALLBACK_S, EventNotifier

#: One event: ``(id, type, JSON data, the SSE frame that sends it)``. The frame is encoded
#: once per read, not once per follower.
Event = tuple[int, str, str, bytes]
#: Events one read returns at most (``session_store.events_after``'s page).
READ_EVENTS = 500
#: Seconds a woken feed waits before it reads: what the session commits meanwhile (a turn's
#: user message, its status, its reply) reaches each follower in the same read and write.
#: The followers' fan-out then runs after a quick turn rather than inside it; a follower
#: sees an event at most this much later (streamed text is flushed every 100 ms anyway).
GATHER_S = 0.1
#: Events that may wait in one follower's queue; past it the follower is lagged and resumes
#: from the database (see the module docstring).
QUEUE_EVENTS = 2000


@dataclass(frozen=True)
class Batch:
    """One read of the log: the events after ``start`` (ascending ids), the session's
    status read in the same transaction, and whether the read reached the log's end."""

    start: int
    events: list[Event]
    status: str
    drained: bool


def _event(event_id: int, kind: str, data: str) -> Event:
    frame = ServerSentEvent(id=str(event_id), event=kind, data=data).encode()
    return event_id, kind, data, frame


def read_log(engine: Engine, session_id: str, after: int) -> Batch:
    """The session's status, then its events after ``after`` (at most :data:`READ_EVENTS`).

    Status first: a SQLite SELECT runs outside any snapshot, and a status read after the
    events could see a cancel whose event the read missed. Raises SessionNotFound.
    """
    with session_scope(engine) as s:
        state = session_store.get_session(s, session_id=session_id).status
        rows = session_store.events_after(s, session_id=session_id, after=after, limit=READ_EVENTS)
        events = [_event(r.id or 0, r.type, json.dumps(r.data)) for r in rows]
    return Batch(start=after, events=events, status=state, drained=len(events) < READ_EVENTS)


@dataclass(eq=False)
class Follower:
    """One stream's queue of batches from its session's feed (bounded: :data:`QUEUE_EVENTS`)."""

    feed: SessionFeed
    limit: int = QUEUE_EVENTS
    batches: deque[Batch] = field(default_factory=deque)
    queued: int = 0
    #: Events were dropped: the follower must read the log itself before the next batch.
    lagged: bool = False
    ready: asyncio.Event = field(default_factory=asyncio.Event)

    def push(self, batch: Batch) -> None:
        """Queue ``batch``; past the bound drop everything queued and mark the follower
        lagged; a lagged follower takes nothing more until it has read the log itself. Never
        blocks: a slow follower costs the feed nothing."""
        if self.lagged:
            return
        if self.queued + len(batch.events) > self.limit:
            self.batches.clear()
            self.queued = 0
            self.lagged = True
        else:
            self.batches.append(batch)
            self.queued += len(batch.events)
        self.ready.set()

    def pop_all(self) -> list[Batch]:
        """Every queued batch, oldest first, or none (nothing queued, or lagged)."""
        if self.lagged:
            return []
        batches = list(self.batches)
        self.batches.clear()
        self.queued = 0
        return batches


class SessionFeed:
    """The one reader of a session's log for this API process's followers of it."""

    def __init__(self, feeds: SessionFeeds, session_id: str) -> None:
        self._feeds = feeds
        self.session_id = session_id
        self.followers: set[Follower] = set()
        self.task: asyncio.Task[None] | None = None

    def begin(self, after: int) -> None:
        """Start reading after event ``after``, once: a follower has read the log itself up
        to there (so nothing at or before it is left to anyone's feed)."""
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(
                self._run(after), name=f"baton-feed-{self.session_id}"
            )

    async def _run(self, cursor: int) -> None:
        feeds = self._feeds
        with feeds.notifier.subscribe(self.session_id) as woken:
            while self.followers:
                woken.clear()  # before the read: an event committed after it still wakes
                feeds.reads += 1  # counted as it starts, as ``read`` counts its calls
                try:
                    batch = await asyncio.to_thread(
                        feeds.read, feeds.engine, self.session_id, cursor
                    )
                except Exception:  # a failed read (busy, gone): each follower reads itself
                    batch = None
                if batch is None:
                    for f in self.followers:
                        f.lagged = True
                        f.ready.set()
                elif batch.events:
                    cursor = batch.events[-1][0]
                    for f in self.followers:
                        f.push(batch)
                if batch is not None and not batch.drained:
                    continue
                await woken.wait()
                await asyncio.sleep(feeds.gather_s)  # the commits right behind it too


class SessionFeeds:
    """Every :class:`SessionFeed` of one API process (created in the app's lifespan).

    ``read`` is the one log read (:func:`read_log`; a test may count its calls); ``reads``
    counts the feeds' reads, for tests and the bench.
    """

    def __init__(
        self,
        engine: Engine,
        notifier: EventNotifier,
        *,
        read: Callable[[Engine, str, int], Batch] = read_log,
        queue_events: int = QUEUE_EVENTS,
        gather_s: float = GATHER_S,
    ) -> None:
        self.engine = engine
        self.notifier = notifier
        self.read = read
        self.reads = 0
        self.queue_events = queue_events
        self.gather_s = gather_s
        self._feeds: dict[str, SessionFeed] = {}

    @contextlib.contextmanager
    def join(self, session_id: str) -> Iterator[Follower]:
        """A follower of ``session_id`` for the block (its feed started by the first one
        and stopped with the last)."""
        feed = self._feeds.get(session_id)
        if feed is None:
            feed = self._feeds[session_id] = SessionFeed(self, session_id)
        follower = Follower(feed, limit=self.queue_events)
        feed.followers.add(follower)
        try:
            yield follower
        finally:
            feed.followers.discard(follower)
            if not feed.followers:
                self._feeds.pop(session_id, None)
                if feed.task is not None:
                    feed.task.cancel()

    async def stream(
        self, session_id: str, after: int, *, until: tuple[str, ...] | None = None
    ) -> AsyncGenerator[list[Event], None]:
        """Every event of ``session_id`` after id ``after``, in order, for as long as the
        caller iterates, in groups: each group is everything this follower had when it woke
        (one or more reads), so a stream sends it in one write rather than one per event;
        with ``until``, ending after a ``status`` event (or, caught up, a status) in it.
        Catch-up reads are the follower's own; the rest come from the feed. Raises
        SessionNotFound (the first read)."""
        cursor = after
        with self.join(session_id) as me:
            behind = True  # catch up from the database first
            while True:
                if behind or me.lagged:
                    me.lagged, behind = False, False
                    me.batches.clear()
                    me.queued = 0
                    batch = await asyncio.to_thread(self.read, self.engine, session_id, cursor)
                    behind = not batch.drained
                    if batch.drained:
                        me.feed.begin(batch.events[-1][0] if batch.events else cursor)
                    batches = [batch]
                else:
                    me.ready.clear()
                    batches = me.pop_all()
                    if not batches:
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(me.ready.wait(), FALLBACK_S)
                            continue
                        behind = True  # the safety net: no wake-up for FALLBACK_S
                        continue
                group: list[Event] = []
                ended = False
                for batch in batches:
                    if batch.start > cursor:
                        behind = True  # it starts past what this follower has: read the gap
                        break
                    for event in batch.events:
                        event_id, kind, data, _ = event
                        if event_id <= cursor:
                            continue
                        cursor = event_id
                        group.append(event)
                        if until and kind == "status" and json.loads(data)["status"] in until:
                            ended = True
                            break
                    if ended:
                        break
                    if until and batch.drained and batch.status in until and not behind:
                        ended = True
                        break
                if group:
                    yield group
                if ended:
                    return
