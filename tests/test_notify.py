"""The event notifier: SSE followers wake when their session's events commit, in
this process or another (PostgreSQL LISTEN/NOTIFY, SQLite's one shared poller), and idle
followers cost no query each."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest
from sqlalchemy.engine import Engine

from baton.contracts.workflow_io import Provenance
from baton.runs import session_store as sessions
from baton.settings import Settings
from baton.storage.db import make_engine, session_scope
from baton.storage.notify import EventNotifier

ROOT = Path(__file__).resolve().parents[1]


def _session(engine: Engine) -> str:
    sid = f"session-{uuid.uuid4()}"
    with session_scope(engine) as s:
        sessions.create_session(
            s, session_id=sid, agent_slug="a", agent_version=1, provenance=Provenance(), name="n"
        )
    return sid


def _append(engine: Engine, sid: str, text: str = "hi") -> None:
    with session_scope(engine) as s:
        sessions.append_event(s, session_id=sid, type="chunk", data={"text": text})


def _append_elsewhere(url: str, sid: str) -> None:
    """Write one event of ``sid`` from another OS process, through Baton's own writer."""
    code = (
        "import sys\n"
        "from baton.runs import session_store as sessions\n"
        "from baton.storage.db import make_engine, session_scope\n"
        "e = make_engine(sys.argv[1])\n"
        "with session_scope(e) as s:\n"
        "    sessions.append_event(s, session_id=sys.argv[2], type='chunk', data={'text': 'x'})\n"
        "e.dispose()\n"
    )
    subprocess.run([sys.executable, "-c", code, url, sid], check=True, cwd=ROOT, timeout=120)


async def test_an_event_of_another_process_wakes_only_its_sessions_followers(
    engine: Engine,
) -> None:
    """A commit in another process (the worker beside the API) wakes the followers of its
    session within moments (LISTEN/NOTIFY, or the SQLite poller) and no one else's."""
    notifier = EventNotifier(engine, poll_s=0.05)
    mine, other = _session(engine), _session(engine)
    try:
        with notifier.subscribe(mine) as woken, notifier.subscribe(other) as bystander:
            await asyncio.sleep(0.3)  # the listener / poller is up
            woken.clear()
            bystander.clear()
            url = engine.url.render_as_string(hide_password=False)
            await asyncio.to_thread(_append_elsewhere, url, mine)
            assert await woken.wait(timeout=10)
            assert not await bystander.wait(timeout=0.3)
    finally:
        await notifier.close()


async def test_a_commit_in_this_process_wakes_at_once(engine: Engine) -> None:
    """Without any poll (period 60 s), an event committed here wakes its follower at commit;
    a rolled-back one wakes nobody."""
    notifier = EventNotifier(engine, poll_s=60)
    sid = _session(engine)
    try:
        with notifier.subscribe(sid) as woken:
            await asyncio.sleep(0.2)
            woken.clear()

            def rolled_back() -> None:
                with pytest.raises(RuntimeError), session_scope(engine) as s:
                    sessions.append_event(s, session_id=sid, type="chunk", data={})
                    raise RuntimeError("abort")

            await asyncio.to_thread(rolled_back)
            assert not await woken.wait(timeout=0.3)
            t = time.monotonic()
            await asyncio.to_thread(_append, engine, sid)
            assert await woken.wait(timeout=30)
            # Well inside the 60 s poll period: the commit woke it, not a poll (a margin
            # a loaded machine cannot use up).
            assert time.monotonic() - t < 30
    finally:
        await notifier.close()


async def test_the_sqlite_poller_reads_once_per_period_for_all_followers(tmp_path: Path) -> None:
    """100 idle followers cost one read per period (not one each), and none at all once
    the last one has left."""
    from baton.storage.db import init_db

    engine = make_engine(f"sqlite:///{tmp_path / 'n.db'}")
    init_db(engine)
    notifier = EventNotifier(engine, poll_s=0.1)
    sids = [_session(engine) for _ in range(10)]
    try:
        with contextlib.ExitStack() as stack:
            for i in range(100):
                stack.enter_context(notifier.subscribe(sids[i % 10]))
            await asyncio.sleep(0.2)
            before = notifier.polls
            await asyncio.sleep(1.0)
            during = notifier.polls - before
        assert 5 <= during <= 13, during
        await asyncio.sleep(0.3)  # the poller notices nobody follows and stops
        after = notifier.polls
        await asyncio.sleep(0.5)
        assert notifier.polls == after
    finally:
        await notifier.close()
        engine.dispose()


async def test_idle_sse_followers_run_no_query_each(
    settings: Settings, api: httpx.Client, sql_counter: list[int]
) -> None:
    """40 followers of idle sessions over real HTTP: about one query per poll period in all
    while they wait (it was one per follower every 200 ms), and a new event reaches them."""
    engine = make_engine(settings.database_url)
    sids = [_session(engine) for _ in range(4)]
    base = str(api.base_url)
    got: dict[int, str] = {}
    connected = 0

    async def follow(i: int, client: httpx.AsyncClient) -> None:
        nonlocal connected
        url = f"/v1/sessions/{sids[i % 4]}/events"
        async with client.stream("GET", url, params={"after": 0}) as resp:  # none yet
            assert resp.status_code == 200
            connected += 1
            async for line in resp.aiter_lines():
                if line.startswith("data:"):
                    got[i] = json.loads(line[5:])["text"]
                    return

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    try:
        async with httpx.AsyncClient(base_url=base, timeout=30, limits=limits) as client:
            tasks = [asyncio.create_task(follow(i, client)) for i in range(40)]
            while connected < 40:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)
            before = sql_counter[0]
            await asyncio.sleep(2.0)
            idle = sql_counter[0] - before
            # SQLite's poller: 2 s / 0.2 s = 10 reads for all 40 (before: 40 x 10 x 2).
            assert idle <= 20, idle
            await asyncio.to_thread(_append, engine, sids[0], "wake")
            await asyncio.wait(tasks, timeout=10)
            for task in tasks:
                task.cancel()
        assert sorted(got) == [i for i in range(40) if i % 4 == 0]
        assert set(got.values()) == {"wake"}
    finally:
        engine.dispose()
