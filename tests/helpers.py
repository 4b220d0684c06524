"""Small helpers shared by the Temporal-backed tests."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from datetime import UTC, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.engine import Engine
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from baton.agents import registry
from baton.agents.spec import AgentSpec
from baton.contracts.workflow_io import Provenance, SessionConfig
from baton.errors import AgentNotFound
from baton.runs import session_store
from baton.runs.launch import Launched, launch_session
from baton.storage.db import session_scope

#: Short timeouts so a killed worker's activity is retried quickly in tests; no review
#: delivery grace, so a review left undecided times out at its timeout (tests that wait
#: one out wait no more).
TEST_CONFIG = SessionConfig(
    heartbeat_timeout_s=3.0, model_turn_timeout_s=60.0, review_delivery_grace_s=0.0
)

#: For tests that kill no worker and count what ran: a heartbeat timeout no load can
#: miss. A loaded machine can delay a heartbeat past 3 s; Temporal then retries the
#: activity (a delegation, a turn), which doubles the model calls the test counts.
STEADY_CONFIG = TEST_CONFIG.model_copy(
    update={"heartbeat_timeout_s": 120.0, "model_turn_timeout_s": 600.0}
)

#: Seconds a test polls for a process to become ready (serve, poll its queue). Generous:
#: the poll ends as soon as the process is ready, so only a broken start waits this
#: long, and a second `make test` beside this one can slow a start tenfold.
READY_TIMEOUT_S = 150.0


def publish(engine: Engine, slug: str, **spec: Any) -> int:
    """Create (or update) and publish ``slug``; returns the live version."""
    with session_scope(engine) as s:
        parsed = AgentSpec.model_validate(spec)
        try:
            registry.get_agent(s, slug=slug)
            registry.save_draft(s, slug=slug, spec=parsed)
        except AgentNotFound:
            registry.create_agent(s, slug=slug, name=slug.title(), spec=parsed)
        rev, _ = registry.publish(s, slug=slug)
        return rev.version


async def launch(
    client: Client,
    engine: Engine,
    worker: Worker,
    ref: str,
    prompt: str,
    *,
    sync: bool = True,
    config: SessionConfig = TEST_CONFIG,
) -> Launched:
    """Start a session on ``worker``'s task queue as a local user would."""
    return await launch_session(
        client,
        engine,
        task_queue=worker.task_queue,
        config=config,
        ref=ref,
        prompt=prompt,
        provenance=Provenance(),
        sync=sync,
    )


def count_rows(engine: Engine, model: Any, **where: str) -> int:
    """Rows of the table ``model`` whose columns equal ``where`` (``session_id="s1"``)."""
    with session_scope(engine) as s:
        query = select(func.count()).select_from(model)
        for column, value in where.items():
            query = query.where(getattr(model, column) == value)
        return int(s.execute(query).scalar_one())


def transcript(engine: Engine, session_id: str) -> list[tuple[str, str]]:
    """``(role, text)`` pairs of the stored transcript, in order."""
    with session_scope(engine) as s:
        return [(m.role, m.text) for m in session_store.messages(s, session_id=session_id)]


def status(engine: Engine, session_id: str) -> str:
    with session_scope(engine) as s:
        return session_store.get_session(s, session_id=session_id).status


async def wait_for(predicate: Any, timeout: float = READY_TIMEOUT_S) -> None:
    """Poll ``predicate()`` until true or fail after ``timeout`` seconds (far by default:
    the wait ends as soon as the predicate holds; a loaded machine stretches turns)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


async def skip_to_timer_offset(
    env: WorkflowEnvironment,
    handle: WorkflowHandle[Any, Any],
    timer: timedelta,
    offset: timedelta,
) -> None:
    """Skip time until ``offset`` after the workflow started its (last) ``timer``-long timer.

    The time-skipping server's clock runs in real time between skips: sleeping ``offset``
    after noticing the timer would also count the (load-dependent) time it took to notice.
    """
    started = [
        e.event_time.ToDatetime(tzinfo=UTC)
        for e in (await handle.fetch_history()).events
        if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED
        and e.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta() == timer
    ]
    if not started:
        raise AssertionError(f"{handle.id} started no {timer} timer")
    remaining = started[-1] + offset - await env.get_current_time()
    if remaining > timedelta(0):
        await env.sleep(remaining)


def refused_start_line(tmp_path: Path, argv: list[str], env: dict[str, str]) -> str:
    """Run ``baton ARGV`` with ``env`` (a scratch SQLite file, an unreachable Temporal) and
    assert it stops at start with exit 1 and one line on stderr; that line."""
    done = subprocess.run(
        [sys.executable, "-m", "cli", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={
            "PATH": str(Path(sys.executable).parent),
            "HOME": str(tmp_path),
            "BATON_DATABASE_URL": f"sqlite:///{tmp_path / 'x.db'}",
            "BATON_TEMPORAL_ADDRESS": "127.0.0.1:1",
            **env,
        },
        check=False,
    )
    assert done.returncode == 1, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]
