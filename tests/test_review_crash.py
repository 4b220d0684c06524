"""A worker killed between `authorize` committing a review and Temporal recording it:
the retried activity returns the review it already opened, even
though the policy changed meanwhile, so no review is left pending with nobody waiting."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import select
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from baton.contracts.workflow_io import Provenance, ReviewDecision, SessionConfig
from baton.runs import session_store
from baton.runs.launch import launch_session
from baton.storage.db import AuditRow, MessageRow, ReviewRow, SessionRow, session_scope
from tests.helpers import publish, status, wait_for
from tests.test_fault import ROOT, start_worker, worker_env
from tests.xagent_helpers import caller_playbook, set_policy
from worker.stack import stop_process


def crash_worker(stage: str, marker: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """A worker (tests/crash_worker.py) that SIGKILLs itself right after ``stage`` ran,
    touching ``marker`` first."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.crash_worker", stage, str(marker)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def test_a_retried_authorize_keeps_the_review_it_opened(
    temporal_env: WorkflowEnvironment, engine: Engine, tmp_path: Path
) -> None:
    """SIGKILL right after authorize opened a review; the policy becomes allow; the new
    worker's retry still waits on that review, which is then decided exactly once. On
    SQLite and PostgreSQL."""
    db_url = engine.url.render_as_string(hide_password=False)
    publish(engine, "target", playbook=[{"reply": "TARGET RAN"}])
    invoke = {"slug": "target", "prompt": "hi", "sync": True}
    publish(engine, "caller", playbook=caller_playbook("invoke_agent", invoke))
    queue = f"tq-{uuid.uuid4()}"
    env = worker_env(db_url, temporal_env, queue)
    marker = tmp_path / "killed"
    crashing = crash_worker("authorize", marker, env)
    second: subprocess.Popen[bytes] | None = None
    try:
        launched = await launch_session(
            temporal_env.client,
            engine,
            task_queue=queue,
            config=SessionConfig(review_timeout_s=120),
            ref="caller",
            prompt="go",
            provenance=Provenance(),
            sync=False,
        )
        sid = launched.session_id
        await asyncio.to_thread(crashing.wait, 60)
        assert marker.exists() and crashing.returncode == -9
        with session_scope(engine) as s:
            (review,) = s.exec(select(ReviewRow)).all()
            assert review.status == "pending"
        # The human's policy changes while the worker is dead: a re-evaluation would allow.
        set_policy(engine, "invoke", "allow")

        second = start_worker(env)
        handle = temporal_env.client.get_workflow_handle(sid)

        async def waiting() -> bool:
            try:
                pending = await handle.query("pending_reviews")
            except RPCError:  # "no poller seen": the new worker is still starting
                return False
            return [p["review_id"] for p in pending] == [review.id]

        deadline = asyncio.get_running_loop().time() + 90
        while not await waiting():
            assert asyncio.get_running_loop().time() < deadline, "the retry never waited"
            await asyncio.sleep(0.25)
        await handle.signal(
            "review_decision", ReviewDecision(review_id=review.id, decision="allow_once")
        )
        await wait_for(lambda: status(engine, sid) == "idle", timeout=60)
        with session_scope(engine) as s:
            (row,) = s.exec(select(ReviewRow)).all()
            assert row.status == "allowed"
            audits = s.exec(select(AuditRow)).all()
            assert [(a.review_id, a.outcome) for a in audits] == [(review.id, "allow")]
            ran = s.exec(select(SessionRow).where(SessionRow.agent_slug == "target")).all()
            assert len(ran) == 1
    finally:
        for proc in (crashing, second):
            stop_process(proc)


@pytest.mark.slow
async def test_a_worker_killed_after_a_reviewed_list_ran_records_it_once(
    temporal_env: WorkflowEnvironment, engine: Engine, tmp_path: Path
) -> None:
    """SIGKILL right after the local settle_review settled an allowed list_agents and ran
    it, before its workflow task completed: the next worker re-runs the local
    activity on replay and the session ends with one audit row, one tool result and the
    list in the reply; no xagent_tool activity is scheduled. On SQLite and PostgreSQL."""
    db_url = engine.url.render_as_string(hide_password=False)
    publish(engine, "target", playbook=[{"reply": "hi"}])
    publish(engine, "caller", playbook=caller_playbook("list_agents", {}))
    queue = f"tq-{uuid.uuid4()}"
    env = worker_env(db_url, temporal_env, queue)
    marker = tmp_path / "killed"
    crashing = crash_worker("settle_review", marker, env)
    second: subprocess.Popen[bytes] | None = None
    try:
        launched = await launch_session(
            temporal_env.client,
            engine,
            task_queue=queue,
            config=SessionConfig(review_timeout_s=120),
            ref="caller",
            prompt="go",
            provenance=Provenance(),
            sync=False,
        )
        sid = launched.session_id
        await wait_for(lambda: bool(_pending(engine)), timeout=60)
        (review,) = _pending(engine)
        await temporal_env.client.get_workflow_handle(sid).signal(
            "review_decision", ReviewDecision(review_id=review.id, decision="allow_once")
        )
        await asyncio.to_thread(crashing.wait, 60)
        assert marker.exists() and crashing.returncode == -9
        second = start_worker(env)
        await wait_for(lambda: status(engine, sid) == "idle", timeout=90)
        with session_scope(engine) as s:
            audits = s.exec(select(AuditRow)).all()
            assert [(a.review_id, a.outcome, a.operation) for a in audits] == [
                (review.id, "allow", "list")
            ]
        (tool,) = [m for m in transcript_rows(engine, sid) if m.role == "tool"]
        assert [a["slug"] for a in json.loads(tool.text)["agents"]] == ["target"]
        assert transcript_rows(engine, sid)[-1].text.startswith("RESULT ")
        history = await temporal_env.client.get_workflow_handle(sid).fetch_history()
        scheduled = [
            e.activity_task_scheduled_event_attributes.activity_type.name
            for e in history.events
            if e.HasField("activity_task_scheduled_event_attributes")
        ]
        assert "xagent_tool" not in scheduled
    finally:
        for proc in (crashing, second):
            stop_process(proc)


def _pending(engine: Engine) -> list[ReviewRow]:
    with session_scope(engine) as s:
        return list(s.exec(select(ReviewRow).where(ReviewRow.status == "pending")).all())


def transcript_rows(engine: Engine, session_id: str) -> list[MessageRow]:
    """The stored messages of ``session_id``, in order."""
    with session_scope(engine) as s:
        return list(session_store.messages(s, session_id=session_id))
