"""Timer paths under the time-skipping test server (no Updates there: first message in input)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from baton.contracts.activity_io import (
    LoadAgentInput,
    ModelTurnInput,
    ModelTurnResult,
    ResumePoint,
    StatusChange,
    ToolInput,
    ToolOutcome,
    TurnFailure,
)
from baton.contracts.values import ResolvedAgent
from baton.contracts.workflow_io import SessionConfig, SessionInput, UserMessage
from baton.settings import Settings
from tests.helpers import skip_to_timer_offset
from workflows.session import SessionWorkflow


class FakeActivities:
    """Stand-ins registered under the real activity names (the model is outside our control)."""

    def __init__(self, fail_times: int, non_retryable: bool = False, load_fails: bool = False):
        self.fail_times = fail_times
        self.non_retryable = non_retryable
        self.load_fails = load_fails
        self.model_attempts = 0
        self.failures: list[str] = []
        self.final_statuses: list[str] = []
        self.resume_points: list[ResumePoint] = []

    @activity.defn(name="load_agent")
    async def load_agent(self, inp: LoadAgentInput) -> ResolvedAgent:
        if self.load_fails:
            raise ApplicationError("bot@1 cannot run", type="agent_unavailable", non_retryable=True)
        return ResolvedAgent(slug="bot", version=1, digest="sha256:x")

    @activity.defn(name="model_turn")
    async def model_turn(self, inp: ModelTurnInput) -> ModelTurnResult:
        self.model_attempts += 1
        if self.model_attempts <= self.fail_times:
            raise ApplicationError(
                "provider overloaded (HTTP 529)",
                type="ModelRequestRefused" if self.non_retryable else "ModelHTTPError",
                non_retryable=self.non_retryable,
            )
        return ModelTurnResult(message_id=inp.assistant_message_id, preview="done")

    @activity.defn(name="run_tool")
    async def run_tool(self, inp: ToolInput) -> ToolOutcome:
        return ToolOutcome(message_id=inp.message_id, ok=True)

    @activity.defn(name="record_failure")
    async def record_failure(self, inp: TurnFailure) -> None:
        self.failures.append(inp.error)
        self.final_statuses.append(inp.final_status)

    @activity.defn(name="set_status")
    async def set_status(self, inp: StatusChange) -> None:
        return None

    @activity.defn(name="record_resume")
    async def record_resume(self, point: ResumePoint) -> None:
        self.resume_points.append(point)

    def all(self) -> list[Callable[..., Any]]:
        return [
            self.load_agent,
            self.model_turn,
            self.run_tool,
            self.record_failure,
            self.set_status,
            self.record_resume,
        ]


async def run_session(
    env: WorkflowEnvironment, fakes: FakeActivities, config: SessionConfig | None = None
) -> tuple[WorkflowHandle[SessionWorkflow, str], Worker]:
    queue = f"tq-{uuid.uuid4()}"
    worker = Worker(
        env.client, task_queue=queue, workflows=[SessionWorkflow], activities=fakes.all()
    )
    sid = f"session-{uuid.uuid4()}"
    inp = SessionInput(
        session_id=sid,
        agent_pin="bot@1",
        first_message=UserMessage(prompt="hi"),
        config=config or SessionConfig(),
    )
    await worker.__aenter__()
    handle = await env.client.start_workflow(SessionWorkflow.run, inp, id=sid, task_queue=queue)
    return handle, worker


async def test_transient_model_errors_are_retried_with_backoff(
    skipping_env: WorkflowEnvironment,
) -> None:
    """Two retryable provider failures are retried (1 s, 2 s backoff skipped) and the turn ends."""
    fakes = FakeActivities(fail_times=2)
    handle, worker = await run_session(skipping_env, fakes)
    try:
        for _ in range(50):
            await skipping_env.sleep(timedelta(seconds=5))
            if fakes.model_attempts >= 3 and await handle.query(SessionWorkflow.status) == "idle":
                break
        assert fakes.model_attempts == 3
        assert await handle.query(SessionWorkflow.status) == "idle"
        assert fakes.failures == []
    finally:
        await handle.terminate()
        await worker.__aexit__(None, None, None)


async def test_non_retryable_model_error_ends_the_turn_once(
    skipping_env: WorkflowEnvironment,
) -> None:
    """A non-retryable provider error is recorded once and the session is idle again."""
    fakes = FakeActivities(fail_times=1, non_retryable=True)
    handle, worker = await run_session(skipping_env, fakes)
    try:
        for _ in range(50):
            await skipping_env.sleep(timedelta(seconds=5))
            # The failure is recorded a moment before the workflow ends the turn (idle).
            if fakes.failures and await handle.query(SessionWorkflow.status) == "idle":
                break
        assert fakes.model_attempts == 1
        assert fakes.failures == ["provider overloaded (HTTP 529)"]
        assert await handle.query(SessionWorkflow.status) == "idle"
    finally:
        await handle.terminate()
        await worker.__aexit__(None, None, None)


@pytest.mark.parametrize("turns", [1])
async def test_first_message_in_input_is_answered(
    skipping_env: WorkflowEnvironment, turns: int
) -> None:
    """A session started with its first message in the input answers it without an Update."""
    fakes = FakeActivities(fail_times=0)
    handle, worker = await run_session(skipping_env, fakes)
    try:
        for _ in range(50):
            await skipping_env.sleep(timedelta(seconds=1))
            if fakes.model_attempts >= turns:
                break
        assert fakes.model_attempts == turns
    finally:
        await handle.terminate()
        await worker.__aexit__(None, None, None)


async def test_unloadable_pin_fails_the_session_for_good(skipping_env: WorkflowEnvironment) -> None:
    """A pin that no longer resolves ends the session as `failed` (closed), not idle."""
    fakes = FakeActivities(fail_times=0, load_fails=True)
    handle, worker = await run_session(skipping_env, fakes)
    try:
        assert await handle.result() == "failed"
        assert fakes.final_statuses == ["failed"] and fakes.model_attempts == 0
    finally:
        await worker.__aexit__(None, None, None)


IDLE = timedelta(seconds=600)


async def idle_timer(handle: WorkflowHandle[Any, Any]) -> None:
    """Wait (real time) until the run has started its idle timer: its turn is over."""
    for _ in range(300):
        events = (await handle.fetch_history()).events
        if any(e.event_type == EventType.EVENT_TYPE_TIMER_STARTED for e in events):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{handle.id} started no idle timer")


def test_the_default_idle_timeout_is_600_s(monkeypatch: pytest.MonkeyPatch) -> None:
    """BATON_SESSION_IDLE_TIMEOUT unset: a session's run completes after 600 s idle."""
    monkeypatch.delenv("BATON_SESSION_IDLE_TIMEOUT", raising=False)
    assert Settings().session_config().idle_timeout_s == 600.0
    assert SessionConfig().idle_timeout_s == 600.0


async def test_an_idle_session_completes_at_the_idle_timeout_not_before(
    skipping_env: WorkflowEnvironment,
) -> None:
    """After its turn the run waits 600 s for a message: still running 1 s before the bound,
    completed (result ``idle``, its resume point stored) once the bound has passed."""
    fakes = FakeActivities(fail_times=0)
    handle, worker = await run_session(skipping_env, fakes)
    try:
        await idle_timer(handle)
        await skip_to_timer_offset(skipping_env, handle, IDLE, IDLE - timedelta(seconds=1))
        assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
        assert fakes.resume_points == []
        assert await handle.query(SessionWorkflow.status) == "idle"
        assert await handle.result() == "idle"  # the server skips the last second
        events = (await handle.fetch_history()).events
        (timer,) = [e for e in events if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED]
        waited = events[-1].event_time.ToDatetime() - timer.event_time.ToDatetime()
        assert IDLE <= waited < IDLE + timedelta(seconds=5), waited
        (point,) = fakes.resume_points
        assert (point.input.turn, point.input.agent is not None) == (1, True)
        assert point.input.first_message is None and point.task_queue == worker.task_queue
    finally:
        await worker.__aexit__(None, None, None)


async def test_a_turn_longer_than_the_idle_timeout_is_not_idle_time(
    skipping_env: WorkflowEnvironment,
) -> None:
    """The idle timer starts once the turn has ended: a turn spending 31 s in retry
    backoff (1+2+4+8+16 s) under a 10 s idle timeout still answers, then the run idles."""
    fakes = FakeActivities(fail_times=5)  # backoff 1+2+4+8+16 s, then it answers
    slow = SessionConfig(idle_timeout_s=10.0)
    handle, worker = await run_session(skipping_env, fakes, slow)
    try:
        assert await handle.result() == "idle"
        assert fakes.model_attempts == 6
        events = (await handle.fetch_history()).events
        (timer,) = [e for e in events if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED]
        started = events[0].event_time.ToDatetime()
        assert timer.event_time.ToDatetime() - started >= timedelta(seconds=31)
    finally:
        await worker.__aexit__(None, None, None)


async def test_without_an_idle_timeout_the_session_waits_forever(
    skipping_env: WorkflowEnvironment,
) -> None:
    """``idle_timeout_s=None`` (as runs from before the idle patch behave): no idle timer,
    the run is still open two hours (twelve default idle timeouts) later."""
    fakes = FakeActivities(fail_times=0)
    handle, worker = await run_session(skipping_env, fakes, SessionConfig(idle_timeout_s=None))
    try:
        await skipping_env.sleep(timedelta(hours=2))
        assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
        assert fakes.model_attempts == 1 and fakes.resume_points == []
        events = (await handle.fetch_history()).events
        assert not [e for e in events if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED]
    finally:
        await handle.terminate()
        await worker.__aexit__(None, None, None)
