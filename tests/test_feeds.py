"""One reader per followed session: N SSE followers of one session cost one read per event
in all, each gets every event in order, and a follower that does not keep up is lagged and
resumes from the database without holding the others back."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy.engine import Engine

from api.feeds import Batch, SessionFeeds, read_log
from baton.contracts.workflow_io import Provenance
from baton.runs import session_store as sessions
from baton.settings import Settings
from baton.storage.db import init_db, make_engine, session_scope
from baton.storage.notify import EventNotifier


def _session(engine: Engine) -> str:
    sid = f"session-{uuid.uuid4()}"
    with session_scope(engine) as s:
        sessions.create_session(
            s, session_id=sid, agent_slug="a", agent_version=1, provenance=Provenance(), name="n"
        )
    return sid


def _append(engine: Engine, sid: str, text: str) -> int:
    """One event of ``sid`` committed; its id."""
    with session_scope(engine) as s:
        sessions.append_event(s, session_id=sid, type="chunk", data={"text": text})
    with session_scope(engine) as s:
        return sessions.events_after(s, session_id=sid, after=0, limit=10_000)[-1].id or 0


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    """A fresh SQLite file with Baton's schema."""
    eng = make_engine(f"sqlite:///{tmp_path / 'feeds.db'}")
    init_db(eng)
    try:
        yield eng
    finally:
        eng.dispose()


class Counted:
    """:func:`read_log` counting its calls (any thread)."""

    def __init__(self) -> None:
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self, engine: Engine, session_id: str, after: int) -> Batch:
        with self._lock:
            self.calls += 1
        return read_log(engine, session_id, after)


async def _collect(
    stream: AsyncIterator[list[tuple[int, str, str, bytes]]], into: list[int], n: int
) -> None:
    async for group in stream:
        for event_id, _, _, _ in group:
            into.append(event_id)
            if len(into) == n:
                return


async def _until(cond: object, what: str) -> None:
    for _ in range(2000):
        if callable(cond) and cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


async def test_n_followers_of_one_session_cost_one_read_per_event(engine: Engine) -> None:
    """50 followers of one session: each of 5 events costs exactly one read for all of them
    (the commit wakes the session's one feed), and every follower gets all 6 in order."""
    notifier = EventNotifier(engine, poll_s=600)  # only the in-process commit wakes
    read = Counted()
    feeds = SessionFeeds(engine, notifier, read=read)
    sid = _session(engine)
    got: list[list[int]] = [[] for _ in range(50)]
    # The first event is in before anyone follows: every follower reads it catching up,
    # and no commit lands while the feed starts (its one wake-up would be a sixth read).
    ids = [await asyncio.to_thread(_append, engine, sid, "first")]
    tasks = [asyncio.create_task(_collect(feeds.stream(sid, 0), g, 6)) for g in got]
    try:
        await _until(lambda: all(len(g) == 1 for g in got), "every follower got the first")
        before, feed_before = read.calls, feeds.reads
        for i in range(5):
            ids.append(await asyncio.to_thread(_append, engine, sid, f"e{i}"))
            await _until(lambda n=i + 2: all(len(g) == n for g in got), f"event {i} to all")
        assert read.calls - before == 5
        assert feeds.reads - feed_before == 5
        assert all(g == ids for g in got)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await notifier.close()


async def test_a_slow_follower_is_lagged_and_resumes_without_holding_others(
    engine: Engine,
) -> None:
    """Queues of 3 events: a follower that stops reading while 10 events commit does not
    delay the 3 others (they get all 10 at once); it is lagged, its queue dropped, and when
    it reads again it gets the 10 from the database in order, none twice."""
    notifier = EventNotifier(engine, poll_s=600)
    feeds = SessionFeeds(engine, notifier, queue_events=3)
    sid = _session(engine)
    first = await asyncio.to_thread(_append, engine, sid, "first")
    slow = feeds.stream(sid, 0)
    assert [e[0] for e in await anext(slow)] == [first]  # joined, then it stops reading
    fast: list[list[int]] = [[] for _ in range(3)]
    tasks = [asyncio.create_task(_collect(feeds.stream(sid, first), g, 10)) for g in fast]
    try:
        await asyncio.sleep(0.2)  # the fast ones caught up and wait on the feed
        ids = [await asyncio.to_thread(_append, engine, sid, f"e{i}") for i in range(10)]
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
        assert all(g == ids for g in fast)
        (feed,) = feeds._feeds.values()
        (me,) = [f for f in feed.followers if f.lagged]  # the slow one, its queue dropped
        assert me.queued == 0 and not me.batches
        rest: list[int] = []
        await asyncio.wait_for(_collect(slow, rest, 10), 60)
        assert rest == ids
    finally:
        await slow.aclose()
        await notifier.close()


async def test_the_queue_bound_holds_at_its_edge(engine: Engine) -> None:
    """A queue of 3 takes batches up to 3 events (ok at the bound) and lags at the 4th."""
    notifier = EventNotifier(engine, poll_s=600)
    feeds = SessionFeeds(engine, notifier, queue_events=3)
    with feeds.join("session-x") as me:
        two = [(1, "chunk", "{}", b""), (2, "chunk", "{}", b"")]
        me.push(Batch(start=0, events=two, status="running", drained=True))
        me.push(Batch(start=2, events=[(3, "chunk", "{}", b"")], status="running", drained=True))
        assert me.queued == 3 and not me.lagged
        me.push(Batch(start=3, events=[(4, "chunk", "{}", b"")], status="running", drained=True))
        assert me.lagged and me.queued == 0 and me.pop_all() == []
    await notifier.close()


async def test_what_a_follower_has_when_it_wakes_comes_as_one_group(engine: Engine) -> None:
    """Three events committed while a follower is not reading (each woke the feed, which
    queued its reads) come to it as ONE group, in order: the stream sends them in one write
    rather than three; the next event alone is a group of one."""
    notifier = EventNotifier(engine, poll_s=600)
    feeds = SessionFeeds(engine, notifier)
    sid = _session(engine)
    first = await asyncio.to_thread(_append, engine, sid, "first")
    stream = feeds.stream(sid, 0)
    try:
        assert [e[0] for e in await anext(stream)] == [first]
        await asyncio.sleep(0.2)  # caught up: its feed runs
        ids = [await asyncio.to_thread(_append, engine, sid, f"e{i}") for i in range(3)]
        (feed,) = feeds._feeds.values()
        (me,) = feed.followers
        await _until(lambda: me.queued == 3, "the feed queued the three")
        assert [e[0] for e in await anext(stream)] == ids
        last = await asyncio.to_thread(_append, engine, sid, "last")
        assert [e[0] for e in await asyncio.wait_for(anext(stream), 60)] == [last]
    finally:
        await stream.aclose()
        await notifier.close()


async def test_commits_right_behind_a_wake_up_share_one_read_and_one_write(
    engine: Engine,
) -> None:
    """Three events committed back to back (each wakes the feed) inside its gathering wait
    cost ONE read for all 20 followers, and each follower gets them as one group, in
    order: one write per follower, not three."""
    notifier = EventNotifier(engine, poll_s=600)
    read = Counted()
    feeds = SessionFeeds(engine, notifier, read=read, gather_s=3.0)
    sid = _session(engine)
    first = await asyncio.to_thread(_append, engine, sid, "first")
    streams = [feeds.stream(sid, 0) for _ in range(20)]
    try:
        for stream in streams:
            assert [e[0] for e in await anext(stream)] == [first]
        await asyncio.sleep(0.2)  # every follower caught up: the feed waits for a commit
        before = feeds.reads

        def three() -> list[int]:
            return [_append(engine, sid, f"e{i}") for i in range(3)]

        ids = await asyncio.to_thread(three)
        groups = await asyncio.wait_for(asyncio.gather(*(anext(s) for s in streams)), 60)
        assert all([e[0] for e in g] == ids for g in groups)
        assert feeds.reads - before == 1
    finally:
        for stream in streams:
            await stream.aclose()
        await notifier.close()


async def test_sse_followers_over_http_share_the_reads(
    settings: Settings, api: httpx.Client, sql_counter: list[int]
) -> None:
    """40 followers of one session over real HTTP, 5 events: every follower gets all of them
    in order with their ids, for far fewer statements than one read per follower per event
    (2 x 40 x 5 = 400 before)."""
    engine = make_engine(settings.database_url)
    sid = _session(engine)
    got: dict[int, list[int]] = {i: [] for i in range(40)}
    texts: dict[int, list[str]] = {i: [] for i in range(40)}
    connected = 0

    async def follow(i: int, client: httpx.AsyncClient) -> None:
        nonlocal connected
        async with client.stream("GET", f"/v1/sessions/{sid}/events") as resp:
            assert resp.status_code == 200
            connected += 1
            async for line in resp.aiter_lines():
                if line.startswith("id:"):
                    got[i].append(int(line[3:]))
                elif line.startswith("data:"):
                    texts[i].append(json.loads(line[5:])["text"])
                    if len(texts[i]) == 5:
                        return

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    try:
        async with httpx.AsyncClient(base_url=str(api.base_url), timeout=60, limits=limits) as c:
            tasks = [asyncio.create_task(follow(i, c)) for i in range(40)]
            await _until(lambda: connected == 40, "40 followers connected")
            await asyncio.sleep(0.5)  # their catch-up reads done
            before = sql_counter[0]
            ids = []
            for i in range(5):
                ids.append(await asyncio.to_thread(_append, engine, sid, f"e{i}"))
                await _until(lambda n=i + 1: all(len(t) == n for t in texts.values()), "to all")
            spent = sql_counter[0] - before
            await asyncio.wait_for(asyncio.gather(*tasks), 30)
        assert all(g == ids for g in got.values())
        assert all(t == [f"e{i}" for i in range(5)] for t in texts.values())
        # 5 writes of 4 statements, the feed's reads and the SQLite poller's: well under 400.
        assert spent <= 100, spent
    finally:
        engine.dispose()
