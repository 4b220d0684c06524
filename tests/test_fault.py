"""A worker process killed mid-turn (SIGKILL): the session completes on a new worker."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import select
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from baton.contracts.workflow_io import Provenance, SessionConfig
from baton.runs.launch import launch_session
from baton.storage.db import EventRow, TokenReservationRow, init_db, make_engine, session_scope
from tests.helpers import publish, status, transcript, wait_for

ROOT = Path(__file__).resolve().parent.parent
REPLY = " ".join(f"word{i}" for i in range(40))
BUDGET = 1000


def worker_env(
    db_url: str, temporal_env: WorkflowEnvironment, queue: str, **extra: str
) -> dict[str, str]:
    """The environment of a real `baton` child process: this one's, pointed at ``db_url``,
    the test's Temporal server and ``queue``."""
    return {
        **os.environ,
        "BATON_DATABASE_URL": db_url,
        "BATON_TEMPORAL_ADDRESS": temporal_env.client.service_client.config.target_host,
        "BATON_TASK_QUEUE": queue,
        **extra,
    }


def start_worker(env: dict[str, str]) -> subprocess.Popen[bytes]:
    """`baton worker` as a real child process."""
    return subprocess.Popen(
        [sys.executable, "-m", "cli", "worker"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def chunk_count(engine: Engine, session_id: str) -> int:
    with session_scope(engine) as s:
        rows = s.exec(
            select(EventRow).where(EventRow.session_id == session_id, EventRow.type == "chunk")
        ).all()
        return len(rows)


async def test_killed_worker_mid_turn_loses_and_duplicates_nothing(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """SIGKILL during a streamed turn; a new worker finishes it with exactly one reply."""
    db_url = f"sqlite:///{tmp_path / 'fault.db'}"
    engine = make_engine(db_url)
    init_db(engine)
    publish(engine, "streamer", playbook=[{"reply": REPLY, "chunk_delay_ms": 60}])
    queue = f"tq-{uuid.uuid4()}"
    env = worker_env(db_url, temporal_env, queue)
    first = start_worker(env)
    second: subprocess.Popen[bytes] | None = None
    try:
        launched = await launch_session(
            temporal_env.client,
            engine,
            task_queue=queue,
            config=SessionConfig(heartbeat_timeout_s=2.0),
            ref="streamer",
            prompt="talk to me",
            provenance=Provenance(),
            sync=False,
        )
        sid = launched.session_id
        await wait_for(lambda: chunk_count(engine, sid) >= 3, timeout=60)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        assert status(engine, sid) == "running"
        assert [r for r, _ in transcript(engine, sid)] == ["user"]

        second = start_worker(env)
        await wait_for(lambda: status(engine, sid) == "idle", timeout=90)
        assert transcript(engine, sid) == [("user", "talk to me"), ("assistant", REPLY)]
        handle = temporal_env.client.get_workflow_handle(sid)
        assert await handle.query("status") == "idle"
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=15)
        engine.dispose()
        await asyncio.sleep(0)


def chunk_attempts(engine: Engine, session_id: str) -> list[tuple[int, datetime]]:
    """``(attempt, created_at)`` of the session's chunk events."""
    with session_scope(engine) as s:
        rows = s.exec(
            select(EventRow).where(EventRow.session_id == session_id, EventRow.type == "chunk")
        ).all()
        return [(int(r.data.get("attempt", 1)), r.created_at) for r in rows]


async def running_worker_pid(handle: WorkflowHandle[Any, Any]) -> int | None:
    """The pid of the worker running the session's activity (identity ``<pid>@<host>``)."""
    described = await handle.describe()
    for pending in described.raw_description.pending_activities:
        identity = pending.last_worker_identity
        if identity and "@" in identity:
            return int(identity.split("@", 1)[0])
    return None


async def test_a_killed_workers_turn_resumes_on_another_worker_within_seconds(
    temporal_env: WorkflowEnvironment, engine: Engine
) -> None:
    """With the default timeouts (heartbeat 5 s), SIGKILL of the worker streaming a turn:
    the turn resumes on the other running worker well within the old 30 s heartbeat
    timeout (< 20 s) and completes with exactly one reply. Under a token_budget the
    retried call gets back its reservation (which took the whole budget) and settles it.
    On SQLite and PostgreSQL."""
    db_url = engine.url.render_as_string(hide_password=False)
    reply = " ".join(f"w{i}" for i in range(60))
    publish(
        engine,
        "streamer",
        playbook=[{"reply": reply, "chunk_delay_ms": 100}],
        limits={"token_budget": BUDGET},
    )
    queue = f"tq-{uuid.uuid4()}"
    env = worker_env(db_url, temporal_env, queue)
    # Two workers, as a deployment runs them: whichever streams the turn is killed.
    workers = {p.pid: p for p in (start_worker(env), start_worker(env))}
    try:
        launched = await launch_session(
            temporal_env.client,
            engine,
            task_queue=queue,
            config=SessionConfig(),
            ref="streamer",
            prompt="talk to me",
            provenance=Provenance(),
            sync=False,
        )
        sid = launched.session_id
        handle = temporal_env.client.get_workflow_handle(sid)
        await wait_for(lambda: chunk_count(engine, sid) >= 3, timeout=90)
        pid = await running_worker_pid(handle)
        assert pid in workers
        killed_at = datetime.now(UTC)
        workers[pid].send_signal(signal.SIGKILL)
        workers[pid].wait(timeout=10)

        def resumed() -> bool:
            return any(attempt >= 2 for attempt, _ in chunk_attempts(engine, sid))

        await wait_for(resumed, timeout=60)
        first_retry = min(at for attempt, at in chunk_attempts(engine, sid) if attempt >= 2)
        assert (first_retry - killed_at).total_seconds() < 20
        await wait_for(lambda: status(engine, sid) == "idle", timeout=60)
        assert transcript(engine, sid) == [("user", "talk to me"), ("assistant", reply)]
        with session_scope(engine) as s:
            (held,) = s.exec(select(TokenReservationRow)).all()
        assert held.reserved == BUDGET and held.settled_at is not None
        assert held.actual_tokens is not None and held.actual_tokens <= BUDGET
    finally:
        for proc in workers.values():
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=15)
        engine.dispose()
        await asyncio.sleep(0)
