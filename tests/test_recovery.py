"""Recovery after a worker loss: timeouts are settings carried in
SessionConfig, tools heartbeat, and a model call's provider failures are counted apart
from worker losses. The SIGKILL test on a real ``baton worker`` is in test_fault.py."""

from __future__ import annotations

import dataclasses
import time
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy.engine import Engine
from temporalio.api.enums.v1 import EventType
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment
from temporalio.worker import Worker

from activities.outcomes import heartbeating_thread
from activities.turns import MODEL_PROVIDER_FAILED, SessionActivities, provider_failures
from baton.contracts.activity_io import LoadAgentInput
from baton.errors import TurnFailed
from baton.settings import Settings
from tests.helpers import TEST_CONFIG, launch, publish
from tests.openai_stub import OpenAIStub
from tests.test_activities import new_session, turn_input
from tests.test_openai_provider import stub  # noqa: F401  (the stub server fixture)


def test_recovery_timeouts_are_settings_carried_to_sessions() -> None:
    """BATON_* timeout and retry-budget settings reach SessionConfig (workflows read only
    their input); the defaults are the short ones recovery needs."""
    assert Settings().session_config().model_dump(
        include={
            "heartbeat_timeout_s",
            "store_timeout_s",
            "tool_timeout_s",
            "model_turn_timeout_s",
            "model_attempts",
            "model_provider_failures",
        }
    ) == {
        "heartbeat_timeout_s": 5.0,
        "store_timeout_s": 10.0,
        "tool_timeout_s": 60.0,
        "model_turn_timeout_s": 600.0,
        "model_attempts": 20,
        "model_provider_failures": 6,
    }
    custom = Settings(
        heartbeat_timeout=2, store_timeout=3, tool_timeout=4, model_attempts=9
    ).session_config()
    assert (custom.heartbeat_timeout_s, custom.store_timeout_s, custom.tool_timeout_s) == (
        2.0,
        3.0,
        4.0,
    )
    assert custom.model_attempts == 9


async def test_activities_are_scheduled_with_the_sessions_timeouts(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """A tool call (run_tool) is scheduled with a heartbeat timeout, model calls with the
    attempt budget, all from the session's config; no load_agent runs at all, neither
    scheduled nor local (the launch's agent snapshot is in the input)."""
    publish(
        db_engine,
        "calc",
        tools=["calculator"],
        playbook=[
            {"when": "^calculator: ", "reply": "done"},
            {"tool_calls": [{"tool": "calculator", "args": {"expression": "1+1"}}]},
        ],
    )
    config = TEST_CONFIG.model_copy(
        update={
            "heartbeat_timeout_s": 4.0,
            "store_timeout_s": 7.0,
            "tool_timeout_s": 9.0,
            "model_attempts": 13,
        }
    )
    done = await launch(temporal_env.client, db_engine, worker, "calc", "add", config=config)
    history = await temporal_env.client.get_workflow_handle(done.session_id).fetch_history()
    scheduled: dict[str, Any] = {}
    markers: list[str] = []
    for e in history.events:
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = e.activity_task_scheduled_event_attributes
            scheduled.setdefault(attrs.activity_type.name, attrs)
        elif e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            markers.append(e.marker_recorded_event_attributes.marker_name)
    tool = scheduled["run_tool"]
    assert tool.heartbeat_timeout.ToTimedelta() == timedelta(seconds=4)
    assert tool.start_to_close_timeout.ToTimedelta() == timedelta(seconds=9)
    assert "load_agent" not in scheduled and "core_local_activity" not in markers
    model = scheduled["model_turn"]
    assert model.heartbeat_timeout.ToTimedelta() == timedelta(seconds=4)
    assert model.retry_policy.maximum_attempts == 13


def test_a_sync_tool_call_heartbeats_while_it_runs() -> None:
    """heartbeating_thread (around run_tool's tool) beats at half the heartbeat timeout
    from its own thread while the blocking body runs, and stops with it."""
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, heartbeat_timeout=timedelta(seconds=0.2))
    beats: list[Any] = []
    env.on_heartbeat = lambda *details: beats.append(details)

    def slow_tool() -> None:
        with heartbeating_thread():
            time.sleep(0.55)

    env.run(slow_tool)
    after = len(beats)
    time.sleep(0.25)
    assert after >= 4 and len(beats) == after


async def test_provider_failures_end_a_model_call_after_the_configured_count(
    temporal_env: WorkflowEnvironment,
    db_engine: Engine,
    worker: Worker,
    stub: OpenAIStub,  # noqa: F811  (the fixture imported above)
) -> None:
    """With model_provider_failures 3 (and 20 attempts), three HTTP 500s in a row end the
    call for good (non-retryable ModelProviderFailed): the provider saw three requests."""
    stub.failures.extend([500] * 10)
    publish(db_engine, "flaky", model="openai-chat:stub-model")
    config = TEST_CONFIG.model_copy(update={"model_provider_failures": 3, "model_attempts": 20})
    with pytest.raises(TurnFailed, match="the model provider failed 3 times for this call"):
        await launch(temporal_env.client, db_engine, worker, "flaky", "hi", config=config)
    assert len(stub.requests) == 3


def model_turn_env(engine: Engine, details: list[Any]) -> tuple[ActivityEnvironment, Any]:
    """An ActivityEnvironment as a retried model_turn attempt sees it: ``details`` are the
    previous attempt's last heartbeat details."""
    sid = new_session(engine, "flaky")
    acts = SessionActivities(engine)
    env = ActivityEnvironment()
    env.run(acts.load_agent, LoadAgentInput(session_id=sid, agent_pin="flaky@1"))
    env.info = dataclasses.replace(
        env.info, attempt=len(details) + 2, heartbeat_details=details, heartbeat_timeout=None
    )
    return env, acts


async def test_provider_failures_are_counted_across_attempts_in_heartbeat_details(
    db_engine: Engine,
    stub: OpenAIStub,  # noqa: F811  (the fixture imported above)
) -> None:
    """An attempt reads the failures earlier attempts counted (heartbeat details): after 2,
    a third 500 is final; after none, a 500 stays retryable and records a count of 1. An
    attempt lost with its worker records no failure, so only provider errors count."""
    publish(db_engine, "flaky", model="openai-chat:stub-model")
    stub.failures.extend([500, 500])
    env, acts = model_turn_env(db_engine, [2])
    inp = turn_input("session-test").model_copy(update={"provider_failures": 3})
    with pytest.raises(ApplicationError) as final:
        await env.run(acts.model_turn, inp)
    assert final.value.type == MODEL_PROVIDER_FAILED and final.value.non_retryable

    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, heartbeat_details=[], heartbeat_timeout=None)
    beats: list[Any] = []
    env.on_heartbeat = lambda *details: beats.append(details)
    with pytest.raises(Exception) as retryable:
        await env.run(acts.model_turn, inp)
    assert not isinstance(retryable.value, ApplicationError) or not retryable.value.non_retryable
    assert beats[-1] == (1,)
    assert [provider_failures(d) for d in ([], [0], [4], ["x"], [True])] == [0, 0, 4, 0, 0]
