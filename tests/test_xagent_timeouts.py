"""The 300 s default review timeout under the time-skipping test server (Gamut X-Agent
Policies, docs/development.md).

The Java test server has no Updates: sessions start with their first message in
``SessionInput.first_message`` and decisions are Signals. Activities are Baton's
real ones (scripted model, SQLite); only the review's timer is skipped.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy.engine import Engine
from temporalio.client import WorkflowExecutionStatus, WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from baton.agents import registry
from baton.contracts.workflow_io import Provenance, SessionConfig, SessionInput, UserMessage
from baton.runs import session_store
from baton.settings import Settings
from baton.storage.db import ReviewRow, session_scope
from tests.helpers import TEST_CONFIG, skip_to_timer_offset, status, wait_for
from tests.xagent_helpers import (
    audit_rows,
    decide,
    echoed,
    open_reviews,
    reviews_of,
    settled,
    setup_pair,
    tool_messages,
)
from worker.factory import build_worker

INVOKE = {"slug": "target", "prompt": "hello target", "sync": True}


def skipping_worker(env: WorkflowEnvironment, engine: Engine, queue: str) -> Worker:
    """Baton's real worker (workflows + activities) on the time-skipping server."""
    return build_worker(env.client, engine=engine, task_queue=queue)


async def start_caller(
    env: WorkflowEnvironment,
    engine: Engine,
    queue: str,
    prompt: str = "go",
    config: SessionConfig = TEST_CONFIG,
) -> WorkflowHandle[Any, Any]:
    """Record a session of ``caller`` and start it with its first message in the input."""
    sid = f"session-{uuid.uuid4()}"
    with session_scope(engine) as s:
        version = registry.resolve_ref(s, ref="caller")[1].version
        session_store.create_session(
            s,
            session_id=sid,
            agent_slug="caller",
            agent_version=version,
            provenance=Provenance(),
            name=prompt,
        )
    inp = SessionInput(
        session_id=sid,
        agent_pin=f"caller@{version}",
        provenance=Provenance(),
        config=config,
        first_message=UserMessage(prompt=prompt),
    )
    return await env.client.start_workflow("Session", inp, id=sid, task_queue=queue)


def test_the_default_review_timeout_is_300_s(monkeypatch: pytest.MonkeyPatch) -> None:
    """BATON_REVIEW_TIMEOUT unset: sessions (and the tests below) wait 300 s for a decision."""
    monkeypatch.delenv("BATON_REVIEW_TIMEOUT", raising=False)
    assert Settings().session_config().review_timeout_s == 300.0
    assert TEST_CONFIG.review_timeout_s == 300.0


async def test_review_times_out_after_the_default_300_s(
    skipping_env: WorkflowEnvironment, db_engine: Engine
) -> None:
    """No decision: still pending at 290 s, timed_out after 300 s, audited, tool error."""
    setup_pair(db_engine, "invoke_agent", INVOKE)
    queue = f"tq-{uuid.uuid4()}"
    async with skipping_worker(skipping_env, db_engine, queue):
        handle = await start_caller(skipping_env, db_engine, queue)
        try:
            (review,) = await open_reviews(skipping_env.client, db_engine, handle.id)
            await skip_to_timer_offset(
                skipping_env, handle, timedelta(seconds=300), timedelta(seconds=290)
            )
            assert [r.status for r in reviews_of(db_engine)] == ["pending"]
            assert await handle.query("status") == "awaiting_input"
            await skipping_env.sleep(timedelta(seconds=15))
            row = await settled(db_engine, review.id)
            assert (row.status, row.decided_by, row.decision) == ("timed_out", "timeout", None)
            await wait_for(lambda: status(db_engine, handle.id) == "idle")
            (msg,) = tool_messages(db_engine, handle.id)
            assert msg.is_error and "timed out after 300 s" in msg.text, msg.text
            final = sessions_messages(db_engine, handle.id)[-1]
            assert echoed(final, msg)
            (entry,) = audit_rows(db_engine)
            assert (entry.outcome, entry.decided_by, entry.review_id) == (
                "review_timeout",
                "timeout",
                review.id,
            )
            assert await handle.query("pending_reviews") == []
            # A decision after the timeout is reported as too late and changes nothing.
            await decide(skipping_env.client, review, "allow_once", decided_by="late")
            await wait_for_query(handle, "late_decisions")
            assert await handle.query("late_decisions") == [
                {"review_id": review.id, "decision": "allow_once", "reason": "too_late"}
            ]
            assert (await settled(db_engine, review.id)).status == "timed_out"
            assert len(audit_rows(db_engine)) == 1
        finally:
            await handle.terminate()


async def test_a_review_longer_than_the_idle_timeout_is_not_idle(
    skipping_env: WorkflowEnvironment, db_engine: Engine
) -> None:
    """RUNNING means work in flight: a review waiting 290 s under a 60 s idle timeout keeps
    the run open; once it has timed out and the turn ended, the run completes 60 s later
    (not at 59 s), its resume point on the session row."""
    setup_pair(db_engine, "invoke_agent", INVOKE)
    queue = f"tq-{uuid.uuid4()}"
    config = TEST_CONFIG.model_copy(update={"idle_timeout_s": 60.0})
    async with skipping_worker(skipping_env, db_engine, queue):
        handle = await start_caller(skipping_env, db_engine, queue, config=config)
        (review,) = await open_reviews(skipping_env.client, db_engine, handle.id)
        await skip_to_timer_offset(
            skipping_env, handle, timedelta(seconds=300), timedelta(seconds=290)
        )
        assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
        assert await handle.query("status") == "awaiting_input"
        await skipping_env.sleep(timedelta(seconds=15))
        assert (await settled(db_engine, review.id)).status == "timed_out"
        await wait_for(lambda: status(db_engine, handle.id) == "idle")
        idle = timedelta(seconds=60)
        for _ in range(300):  # the idle timer starts once the workflow has ended the turn
            if any(
                e.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta() == idle
                for e in (await handle.fetch_history()).events
            ):
                break
            await asyncio.sleep(0.05)
        await skip_to_timer_offset(skipping_env, handle, idle, timedelta(seconds=59))
        assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
        assert await handle.result() == "idle"
        with session_scope(db_engine) as s:
            stored = session_store.get_session(s, session_id=handle.id).resume_input
        assert stored is not None and stored["input"]["turn"] == 1
        assert status(db_engine, handle.id) == "idle"


DECIDED_IN_TIME = [
    ("invoke_agent", INVOKE, "deny", "denied", 250),
    ("list_agents", {}, "allow_once", "allowed", 299),
]


@pytest.mark.parametrize(
    ("tool", "args", "decision", "expected", "after_s"),
    DECIDED_IN_TIME,
    ids=[f"{c[0]}-{c[2]}-at_{c[4]}s" for c in DECIDED_IN_TIME],
)
async def test_a_decision_before_the_default_timeout_wins(
    skipping_env: WorkflowEnvironment,
    db_engine: Engine,
    tool: str,
    args: dict[str, Any],
    decision: str,
    expected: str,
    after_s: int,
) -> None:
    """A decision Signal at 250 s / 299 s settles the review; passing 300 s changes nothing."""
    setup_pair(db_engine, tool, args)
    queue = f"tq-{uuid.uuid4()}"
    async with skipping_worker(skipping_env, db_engine, queue):
        handle = await start_caller(skipping_env, db_engine, queue)
        try:
            (review,) = await open_reviews(skipping_env.client, db_engine, handle.id)
            # after_s on the review's own timer (the clock runs on while the review is found).
            await skip_to_timer_offset(
                skipping_env, handle, timedelta(seconds=300), timedelta(seconds=after_s)
            )
            await decide(skipping_env.client, review, decision, decided_by="bob")
            row = await settled(db_engine, review.id)
            assert (row.status, row.decided_by) == (expected, "bob")
            await wait_for(lambda: status(db_engine, handle.id) == "idle")
            await skipping_env.sleep(timedelta(seconds=120))  # well past the 300 s timer
            assert (await settled(db_engine, review.id)).status == expected
            (entry,) = audit_rows(db_engine)
            outcome = "allow" if expected == "allowed" else "denied_by_user"
            assert (entry.outcome, entry.decided_by, entry.review_id) == (
                outcome,
                "bob",
                review.id,
            )
            (msg,) = tool_messages(db_engine, handle.id)
            if expected == "allowed":
                assert not msg.is_error and '"slug": "target"' in msg.text, msg.text
            else:
                assert msg.is_error and "denied by bob" in msg.text, msg.text
            assert await handle.query("late_decisions") == []
        finally:
            await handle.terminate()


def sessions_messages(engine: Engine, session_id: str) -> list[str]:
    """Texts of the stored messages of a session, in order."""
    with session_scope(engine) as s:
        return [m.text for m in session_store.messages(s, session_id=session_id)]


async def wait_for_query(handle: WorkflowHandle[Any, Any], query: str) -> None:
    """Poll a list-valued Query until it is non-empty."""
    for _ in range(200):
        if await handle.query(query):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"query {query} stayed empty")


def _aware(at: datetime) -> datetime:
    """A stored timestamp as UTC (SQLite keeps them naive)."""
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


async def _past_the_deadline(
    env: WorkflowEnvironment, handle: WorkflowHandle[Any, Any], review: ReviewRow
) -> datetime:
    """Skip until 2 s past the review's ``expires_at`` and wait until the workflow has
    handled everything so far (no workflow task pending); returns the deadline."""
    expires = _aware(review.expires_at) if review.expires_at else None
    assert expires is not None
    remaining = expires + timedelta(seconds=2) - await env.get_current_time()
    if remaining > timedelta(0):
        await env.sleep(remaining)
    for _ in range(600):
        described = await handle.describe()
        if not described.raw_description.HasField("pending_workflow_task"):
            return expires
        await asyncio.sleep(0.05)
    raise AssertionError(f"{handle.id} kept a workflow task pending")


#: Short heartbeats and the review delivery grace at its default (TEST_CONFIG has none).
GRACE_CONFIG = SessionConfig(heartbeat_timeout_s=3.0, model_turn_timeout_s=60.0)


async def test_a_decision_received_in_time_but_delivered_late_still_counts(
    skipping_env: WorkflowEnvironment, db_engine: Engine
) -> None:
    """A proven decision received before the deadline whose Signal reaches the workflow
    after it (the review's timeout passed) is applied: allowed, audited once."""
    setup_pair(db_engine, "invoke_agent", INVOKE)
    queue = f"tq-{uuid.uuid4()}"
    async with skipping_worker(skipping_env, db_engine, queue):
        handle = await start_caller(skipping_env, db_engine, queue, config=GRACE_CONFIG)
        try:
            (review,) = await open_reviews(skipping_env.client, db_engine, handle.id)
            expires = await _past_the_deadline(skipping_env, handle, review)
            in_time = expires - timedelta(seconds=1)
            await decide(
                skipping_env.client, review, "allow_once", decided_by="bob", received_at=in_time
            )
            row = await settled(db_engine, review.id)
            assert (row.status, row.decided_by) == ("allowed", "bob")
            await wait_for(lambda: status(db_engine, handle.id) == "idle")
            (entry,) = audit_rows(db_engine)
            assert (entry.outcome, entry.review_id) == ("allow", review.id)
            assert await handle.query("late_decisions") == []
        finally:
            await handle.terminate()


async def test_a_decision_received_past_the_deadline_is_too_late(
    skipping_env: WorkflowEnvironment, db_engine: Engine
) -> None:
    """A proven decision received a microsecond past the deadline is refused ``too_late``
    and the review times out: timed_out, one audit row."""
    setup_pair(db_engine, "invoke_agent", INVOKE)
    queue = f"tq-{uuid.uuid4()}"
    async with skipping_worker(skipping_env, db_engine, queue):
        handle = await start_caller(skipping_env, db_engine, queue, config=GRACE_CONFIG)
        try:
            (review,) = await open_reviews(skipping_env.client, db_engine, handle.id)
            expires = await _past_the_deadline(skipping_env, handle, review)
            late = expires + timedelta(microseconds=1)
            await decide(skipping_env.client, review, "allow_once", received_at=late)
            await wait_for_query(handle, "late_decisions")
            assert await handle.query("late_decisions") == [
                {"review_id": review.id, "decision": "allow_once", "reason": "too_late"}
            ]
            await skipping_env.sleep(timedelta(seconds=120))  # past any grace
            row = await settled(db_engine, review.id)
            assert (row.status, row.decided_by) == ("timed_out", "timeout")
            (entry,) = audit_rows(db_engine)
            assert (entry.outcome, entry.review_id) == ("review_timeout", review.id)
        finally:
            await handle.terminate()
