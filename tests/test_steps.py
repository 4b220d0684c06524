"""Workflow-agent steps, usage metering and the balance ceiling."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import select
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from baton.contracts.workflow_io import HandoffDecision, SessionConfig, StepInput, StepRetry
from baton.errors import TurnFailed
from baton.runs import metering
from baton.runs.launch import launch_step
from baton.storage.db import StepRow, UsageRow, session_scope
from tests.helpers import TEST_CONFIG, launch, publish, transcript, wait_for
from worker.factory import build_worker

SCHEMA = {
    "type": "object",
    "properties": {"summary": {"type": "string"}},
    "required": ["summary"],
    "additionalProperties": False,
}
VALID = '{"summary": "all good"}'
FIX_ON_FEEDBACK = [
    {"when": "does not validate", "reply": VALID},
    {"when": "Revise", "reply": '{"summary": "revised"}'},
    {"reply": '{"wrong": 1}'},
]


def step_row(engine: Engine, step_id: str) -> StepRow:
    with session_scope(engine) as s:
        row = s.get(StepRow, step_id)
        assert row is not None
        return row


async def run_step(
    client: Client,
    engine: Engine,
    queue: str,
    ref: str,
    *,
    schema: dict[str, Any] | None = SCHEMA,
    retry: StepRetry | None = None,
    handoff: bool = False,
    handoff_timeout_s: float = 86_400.0,
    config: SessionConfig = TEST_CONFIG,
) -> str:
    """Launch a step as the API does; returns its id."""
    step_id = f"step-{uuid.uuid4()}"
    await launch_step(
        client,
        engine,
        task_queue=queue,
        ref=ref,
        inp=StepInput(
            step_id=step_id,
            agent_pin=ref,
            input="Summarise the report.",
            output_schema=schema,
            retry=retry or StepRetry(initial_interval_s=0.01),
            handoff=handoff,
            handoff_timeout_s=handoff_timeout_s,
            config=config,
        ),
    )
    return step_id


async def finished(engine: Engine, step_id: str, status: str) -> StepRow:
    await wait_for(lambda: step_row(engine, step_id).status == status)
    return step_row(engine, step_id)


async def test_a_valid_deliverable_completes_the_step(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """A reply that validates against the schema is the deliverable after one attempt."""
    publish(db_engine, "summariser", playbook=[{"reply": VALID}])
    sid = await run_step(temporal_env.client, db_engine, worker.task_queue, "summariser")
    row = await finished(db_engine, sid, "completed")
    assert (row.deliverable, row.attempts, row.error) == ({"summary": "all good"}, 1, None)
    assert row.agent_version == 1


async def test_an_invalid_deliverable_is_retried_with_the_errors_fed_back(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """The first reply fails the schema; the model sees the errors and the second one passes."""
    publish(db_engine, "summariser", playbook=FIX_ON_FEEDBACK)
    sid = await run_step(temporal_env.client, db_engine, worker.task_queue, "summariser")
    row = await finished(db_engine, sid, "completed")
    assert (row.deliverable, row.attempts) == ({"summary": "all good"}, 2)
    feedback = [t for role, t in transcript(db_engine, sid) if role == "user"][1]
    assert "does not validate" in feedback and "summary" in feedback


async def test_attempts_end_at_max_attempts_with_invalid_deliverable(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """Always invalid: exactly max_attempts attempts, then failed with invalid_deliverable."""
    publish(db_engine, "stubborn", playbook=[{"reply": "not json at all"}])
    retry = StepRetry(max_attempts=2, initial_interval_s=0.01)
    sid = await run_step(temporal_env.client, db_engine, worker.task_queue, "stubborn", retry=retry)
    row = await finished(db_engine, sid, "failed")
    assert row.attempts == 2
    assert row.error is not None and row.error.startswith("invalid_deliverable")
    assert [r for r, _ in transcript(db_engine, sid)].count("assistant") == 2


async def test_handoff_approve_revise_reject(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """Handoff waits; revise runs another attempt with the feedback; approve/reject end it."""
    publish(
        db_engine,
        "summariser",
        playbook=[{"when": "Revise", "reply": '{"summary": "v2"}'}, {"reply": VALID}],
    )
    client, queue = temporal_env.client, worker.task_queue
    approved = await run_step(client, db_engine, queue, "summariser", handoff=True)
    rejected = await run_step(client, db_engine, queue, "summariser", handoff=True)
    for sid in (approved, rejected):
        row = await finished(db_engine, sid, "awaiting_handoff")
        assert row.deliverable == {"summary": "all good"}
    await client.get_workflow_handle(approved).signal(
        "handoff", HandoffDecision(decision="revise", feedback="shorter please")
    )
    await wait_for(lambda: step_row(db_engine, approved).attempts == 2)
    row = await finished(db_engine, approved, "awaiting_handoff")
    assert row.deliverable == {"summary": "v2"}
    await client.get_workflow_handle(approved).signal(
        "handoff", HandoffDecision(decision="approve")
    )
    assert (await finished(db_engine, approved, "completed")).deliverable == {"summary": "v2"}
    await client.get_workflow_handle(rejected).signal(
        "handoff", HandoffDecision(decision="reject", feedback="off topic")
    )
    assert (await finished(db_engine, rejected, "rejected")).error == "off topic"


async def test_a_pinned_step_keeps_its_revision_after_a_newer_publish(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """A bare slug is pinned at launch: a publish while the step waits does not change it."""
    publish(
        db_engine, "summariser", playbook=[{"when": "Revise", "reply": VALID}, {"reply": VALID}]
    )
    sid = await run_step(
        temporal_env.client, db_engine, worker.task_queue, "summariser", handoff=True
    )
    await finished(db_engine, sid, "awaiting_handoff")
    assert publish(db_engine, "summariser", playbook=[{"reply": '{"summary": "v2 speaking"}'}]) == 2
    await temporal_env.client.get_workflow_handle(sid).signal(
        "handoff", HandoffDecision(decision="revise", feedback="again")
    )
    row = await finished(db_engine, sid, "awaiting_handoff")
    await wait_for(lambda: step_row(db_engine, sid).attempts == 2)
    assert (row.agent_version, step_row(db_engine, sid).deliverable) == (1, {"summary": "all good"})


async def test_each_model_call_is_metered_and_charged_to_the_balance(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """A model call is one usage row (tokens, cost from BATON_PRICES) deducted from the balance."""
    publish(db_engine, "echo", playbook=[{"reply": "four words right here"}])
    config = TEST_CONFIG.model_copy(update={"prices": {"scripted": (1_000_000.0, 1_000_000.0)}})
    with session_scope(db_engine) as s:
        metering.set_balance(s, amount=1000.0)
    await launch(temporal_env.client, db_engine, worker, "echo", "hi", config=config)
    with session_scope(db_engine) as s:
        (row,) = s.exec(select(UsageRow)).all()
        balance = metering.get_balance(s)
        by_agent = metering.usage(s, group_by="agent")
        by_day = metering.usage(s, group_by="day")
    assert row.cost_usd == row.input_tokens + row.output_tokens > 0  # $1 per token here
    assert balance == 1000.0 - row.cost_usd
    assert (by_agent[0].key, by_agent[0].requests, by_agent[0].cost_usd) == (
        "echo",
        1,
        row.cost_usd,
    )
    assert by_day[0].key == row.day


async def test_a_spent_balance_refuses_the_call_before_the_model(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """At a balance of 0 the turn fails with balance_exhausted and nothing is metered."""
    publish(db_engine, "echo", playbook=[{"reply": "hello"}])
    with session_scope(db_engine) as s:
        metering.set_balance(s, amount=0.0)
    with pytest.raises(TurnFailed, match="balance_exhausted"):
        await launch(temporal_env.client, db_engine, worker, "echo", "hi")
    with session_scope(db_engine) as s:
        assert s.exec(select(UsageRow)).all() == []
    with session_scope(db_engine) as s:
        metering.set_balance(s, amount=0.01)  # one cent above zero: the call goes through
    run = await launch(temporal_env.client, db_engine, worker, "echo", "hi")
    assert run.response == "hello"


async def test_a_stream_is_cut_when_the_balance_runs_out_mid_reply(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """With $20 and $1 per output token, a 200-word reply is cancelled part way."""
    publish(db_engine, "chatty", playbook=[{"reply": "word " * 200, "chunk_delay_ms": 1}])
    config = TEST_CONFIG.model_copy(update={"prices": {"scripted": (0.0, 1_000_000.0)}})
    with session_scope(db_engine) as s:
        metering.set_balance(s, amount=20.0)
    with pytest.raises(TurnFailed, match="stream was cancelled"):
        await launch(temporal_env.client, db_engine, worker, "chatty", "talk", config=config)
    with session_scope(db_engine) as s:
        (row,) = s.exec(select(UsageRow)).all()
        balance = metering.get_balance(s)
    assert 20 <= row.output_tokens < 200 / 2  # cut well before the 200 words (≈250 tokens)
    assert balance is not None and balance <= 0


async def skip_until(env: WorkflowEnvironment, engine: Engine, step_id: str, status: str) -> None:
    """Skip time a minute at a time until the step's row reaches ``status``."""
    for _ in range(200):
        if step_row(engine, step_id).status == status:
            return
        await env.sleep(timedelta(seconds=60))
    raise AssertionError(f"{step_id} never became {status}")


async def test_retry_backoff_follows_the_steps_policy(
    skipping_env: WorkflowEnvironment, db_engine: Engine
) -> None:
    """Backoff timers between attempts are initial_interval x coefficient^(n-1): 60 s, 120 s."""
    publish(db_engine, "stubborn", playbook=[{"reply": "nope"}])
    queue = f"tq-{uuid.uuid4()}"
    async with build_worker(skipping_env.client, engine=db_engine, task_queue=queue):
        retry = StepRetry(max_attempts=3, initial_interval_s=60, backoff_coefficient=2)
        sid = await run_step(skipping_env.client, db_engine, queue, "stubborn", retry=retry)
        handle = skipping_env.client.get_workflow_handle(sid)
        await skip_until(skipping_env, db_engine, sid, "failed")
        history = await handle.fetch_history()
    timers = [
        e.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta()
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED
    ]
    assert timers == [timedelta(seconds=60), timedelta(seconds=120)]
    assert step_row(db_engine, sid).attempts == 3


async def test_handoff_times_out(skipping_env: WorkflowEnvironment, db_engine: Engine) -> None:
    """No handoff decision within handoff_timeout_s: the step fails with handoff_timeout."""
    publish(db_engine, "summariser", playbook=[{"reply": VALID}])
    queue = f"tq-{uuid.uuid4()}"
    async with build_worker(skipping_env.client, engine=db_engine, task_queue=queue):
        sid = await run_step(
            skipping_env.client,
            db_engine,
            queue,
            "summariser",
            handoff=True,
            handoff_timeout_s=3600,
        )
        await skip_until(skipping_env, db_engine, sid, "failed")
    row = step_row(db_engine, sid)
    assert row.error is not None and row.error.startswith("handoff_timeout")
    assert row.deliverable == {"summary": "all good"}
