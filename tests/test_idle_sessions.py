"""Idle sessions complete and the next message starts them again.

Real dev server, real worker, SQLite; the idle timeout is cut to about a second. The
timeout's exact edge is tested on the time-skipping server (tests/test_time_skipping.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from sqlalchemy.engine import Engine
from temporalio import activity, workflow
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import (
    ExecuteWorkflowInput,
    Interceptor,
    UnsandboxedWorkflowRunner,
    Worker,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)

from activities.turns import SessionActivities
from baton.contracts.activity_io import ResumePoint
from baton.errors import SessionBusy, SessionClosed
from baton.runs import launch as launching
from baton.runs import session_store as sessions
from baton.storage.db import session_scope
from tests.helpers import TEST_CONFIG, launch, publish, status, transcript
from tests.test_api_reviews import Stack, agent, messages, running_stack
from tests.test_delegation import all_sessions, delegating
from tests.xagent_helpers import set_policy, setup_pair, tool_messages
from worker.factory import WORKFLOWS, activities_for

#: Idle timeout of these tests (s): short, so a test waits it out.
IDLE_S = 1.0
IDLE_CONFIG = TEST_CONFIG.model_copy(update={"idle_timeout_s": IDLE_S})


async def completed(client: Client, session_id: str, timeout: float = 60.0) -> None:
    """Wait until the session's latest run has completed (idle); fail on any other end."""
    handle = client.get_workflow_handle(session_id)
    deadline = time.monotonic() + timeout
    while True:
        found = (await handle.describe()).status
        if found == WorkflowExecutionStatus.COMPLETED:
            return
        assert found == WorkflowExecutionStatus.RUNNING, found
        assert time.monotonic() < deadline, f"{session_id} did not complete idle"
        await asyncio.sleep(0.1)


async def cancelled(client: Client, session_id: str) -> None:
    """Wait until the session's latest run has ended CANCELED."""
    handle = client.get_workflow_handle(session_id)
    deadline = time.monotonic() + 30
    while (await handle.describe()).status != WorkflowExecutionStatus.CANCELED:
        assert time.monotonic() < deadline, f"{session_id} was not cancelled"
        await asyncio.sleep(0.1)


async def runs(client: Client, session_id: str) -> list[WorkflowExecutionStatus | None]:
    """Statuses of every run of ``session_id``, oldest first."""
    found = [w async for w in client.list_workflows(f"WorkflowId = '{session_id}'")]
    return [w.status for w in sorted(found, key=lambda w: w.start_time)]


async def run_count(client: Client, session_id: str, expected: int) -> None:
    """Wait until visibility lists ``expected`` runs of ``session_id`` (it lags a little)."""
    deadline = time.monotonic() + 30
    while len(await runs(client, session_id)) != expected:
        assert time.monotonic() < deadline, await runs(client, session_id)
        await asyncio.sleep(0.1)


async def runs_become(
    client: Client, session_id: str, expected: list[WorkflowExecutionStatus]
) -> None:
    """Wait until visibility lists exactly the runs ``expected`` (statuses, oldest first)."""
    deadline = time.monotonic() + 30
    while (found := await runs(client, session_id)) != expected:
        assert time.monotonic() < deadline, found
        await asyncio.sleep(0.1)


def resume_point(engine: Engine, session_id: str) -> ResumePoint | None:
    with session_scope(engine) as s:
        stored = sessions.get_session(s, session_id=session_id).resume_input
        return None if stored is None else ResumePoint.model_validate(stored)


def message_ids(engine: Engine, session_id: str) -> list[str]:
    with session_scope(engine) as s:
        return [m.id.removeprefix(session_id) for m in sessions.messages(s, session_id=session_id)]


# --- the workflow and the client, straight ------------------------------------------------


async def test_an_idle_session_completes_and_its_next_message_starts_it_again(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """After the idle timeout the run completes (result ``idle``, nothing left in the
    worker) with its state on the session row; the next message starts the next run
    under the same id, and the turn numbering and transcript carry on."""
    client = temporal_env.client
    publish(db_engine, "echo", playbook=[{"reply": "you said {last_message}"}])
    first = await launch(client, db_engine, worker, "echo", "one", config=IDLE_CONFIG)
    sid = first.session_id
    await completed(client, sid)
    assert await client.get_workflow_handle(sid).result() == "idle"
    # No worker memory: the completed run is gone from the worker's cache of live runs
    # (the SDK's own table; its sticky cache evicts a run once it completes).
    live = worker._workflow_worker._running_workflows  # type: ignore[union-attr]
    deadline = time.monotonic() + 10
    while any(w.workflow_id == sid for w in live.values()):
        assert time.monotonic() < deadline, "the completed run is still cached"
        await asyncio.sleep(0.05)
    point = resume_point(db_engine, sid)
    assert point is not None and point.task_queue == worker.task_queue
    assert (point.input.turn, point.input.agent is not None) == (1, True)
    assert point.input.config.idle_timeout_s == IDLE_S
    assert status(db_engine, sid) == "idle"  # what the API shows does not change

    outcome, text = await launching.send_message(
        client, db_engine, session_id=sid, prompt="two", sync=True
    )
    assert text == "you said two" and outcome is not None
    assert outcome.message_id == f"{sid}:t2:s1:assistant"
    await run_count(client, sid, 2)
    assert (await runs(client, sid))[0] == WorkflowExecutionStatus.COMPLETED
    assert message_ids(db_engine, sid) == [
        ":t1:user",
        ":t1:s1:assistant",
        ":t2:user",
        ":t2:s1:assistant",
    ]
    # The restarted run completes idle again, carrying turn 2.
    await completed(client, sid)
    point = resume_point(db_engine, sid)
    assert point is not None and point.input.turn == 2


async def test_an_async_message_and_concurrent_messages_restart_one_run(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """Two messages racing to restart a completed session land in one new run: one is
    answered, the other refused ``session_busy`` as for any running turn."""
    client = temporal_env.client
    publish(db_engine, "slowpoke", playbook=[{"reply": "w " * 20, "chunk_delay_ms": 50}])
    sid = (
        await launch(client, db_engine, worker, "slowpoke", "one", config=IDLE_CONFIG)
    ).session_id
    await completed(client, sid)

    async def send(prompt: str) -> str:
        try:
            await launching.send_message(
                client, db_engine, session_id=sid, prompt=prompt, sync=True
            )
        except SessionBusy:
            return "busy"
        return "answered"

    results = await asyncio.gather(send("a"), send("b"))
    assert sorted(results) == ["answered", "busy"], results
    await run_count(client, sid, 2)


async def test_a_cancelled_session_stays_closed(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """Cancelling a session whose run completed idle takes the workflow's cancel path
    (its next run starts only to be cancelled) and the session stays closed: a message
    is refused ``session_closed`` and starts no run."""
    client = temporal_env.client
    publish(db_engine, "echo", playbook=[{"reply": "ok"}])
    sid = (await launch(client, db_engine, worker, "echo", "one", config=IDLE_CONFIG)).session_id
    await completed(client, sid)
    await launching.cancel_session(client, db_engine, session_id=sid)
    await cancelled(client, sid)
    assert status(db_engine, sid) == "cancelled"
    with pytest.raises(SessionClosed):
        await launching.send_message(client, db_engine, session_id=sid, prompt="two", sync=True)
    with pytest.raises(SessionClosed):
        await launching.send_message(client, db_engine, session_id=sid, prompt="two", sync=False)
    await runs_become(
        client, sid, [WorkflowExecutionStatus.COMPLETED, WorkflowExecutionStatus.CANCELED]
    )
    await launching.cancel_session(client, db_engine, session_id=sid)  # idempotent
    await asyncio.sleep(0.5)
    assert len(await runs(client, sid)) == 2


async def test_a_session_without_a_resume_point_is_not_restarted(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """A run that ended without completing idle (terminated by an operator) leaves no
    resume point: the next message is ``session_closed``, as before, and starts nothing."""
    client = temporal_env.client
    publish(db_engine, "echo", playbook=[{"reply": "ok"}])
    sid = (await launch(client, db_engine, worker, "echo", "one")).session_id
    await client.get_workflow_handle(sid).terminate("operator")
    with pytest.raises(SessionClosed, match="no longer running"):
        await launching.send_message(client, db_engine, session_id=sid, prompt="two", sync=True)
    assert status(db_engine, sid) == "idle"
    assert len(await runs(client, sid)) == 1


async def test_a_stale_resume_point_never_reuses_a_turn_number(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """A restarted run terminated before it completed idle left the older resume point
    (turn 1) behind; the next run still numbers its turn after the transcript's newest."""
    client = temporal_env.client
    publish(db_engine, "echo", playbook=[{"reply": "you said {last_message}"}])
    sid = (await launch(client, db_engine, worker, "echo", "one", config=IDLE_CONFIG)).session_id
    await completed(client, sid)
    long_idle = IDLE_CONFIG.model_copy(update={"idle_timeout_s": 3600.0})
    point = resume_point(db_engine, sid)
    assert point is not None
    point.input.config = long_idle  # the restarted run stays up until terminated
    with session_scope(db_engine) as s:
        sessions.set_resume_input(s, point=point)
    await launching.send_message(client, db_engine, session_id=sid, prompt="two", sync=True)
    await client.get_workflow_handle(sid).terminate("operator")
    _, text = await launching.send_message(
        client, db_engine, session_id=sid, prompt="three", sync=True
    )
    assert text == "you said three"
    assert message_ids(db_engine, sid)[-2:] == [":t3:user", ":t3:s1:assistant"]


# --- the race: a message arrives as the run decides to complete ------------------------


#: How long the completing workflow task is held: under the SDK's 2 s deadlock detector.
HOLD_S = 1.2


class Gate:
    """Where the test holds the run: the ``record_resume`` write, or the completion."""

    def __init__(self) -> None:
        self.writing = threading.Event()
        self.release_write = threading.Event()
        self.release_write.set()
        self.completing = threading.Event()
        self.hold_completion_s = 0.0
        self.completion_sent_at = 0.0


class HoldingInterceptor(Interceptor):
    """Holds the workflow task that completes an idle run (not on replay) for
    ``gate.hold_completion_s``, so a message can reach the server while it is in flight."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor]:
        gate = self.gate

        class Inbound(WorkflowInboundInterceptor):
            async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
                result = await super().execute_workflow(input)
                if result == "idle" and not workflow.unsafe.is_replaying():
                    hold, gate.hold_completion_s = gate.hold_completion_s, 0.0  # once
                    gate.completing.set()
                    time.sleep(hold)  # the task's thread, not the test's loop
                    gate.completion_sent_at = time.monotonic()
                return result

        return Inbound


@pytest_asyncio.fixture
async def gated(
    temporal_env: WorkflowEnvironment, db_engine: Engine
) -> AsyncIterator[tuple[Worker, Gate]]:
    """A Baton worker whose ``record_resume`` and idle completion the test can hold."""
    gate = Gate()
    real = SessionActivities(db_engine)

    @activity.defn(name="record_resume")
    async def record_resume(point: ResumePoint) -> None:
        gate.writing.set()
        await asyncio.to_thread(gate.release_write.wait)
        await asyncio.to_thread(real.record_resume, point)

    client = temporal_env.client
    acts = [a for a in activities_for(db_engine, client) if a.__name__ != "record_resume"]
    w = Worker(
        client,
        task_queue=f"tq-{uuid.uuid4()}",
        workflows=WORKFLOWS,
        activities=[*acts, record_resume],
        activity_executor=concurrent.futures.ThreadPoolExecutor(8),
        interceptors=[HoldingInterceptor(gate)],
        # Unsandboxed: the interceptor shares `gate` with the test. (Not debug_mode: that
        # runs activations on the event loop, which the hold would block.)
        workflow_runner=UnsandboxedWorkflowRunner(),
    )
    async with w:
        yield w, gate


async def test_a_message_during_the_resume_write_keeps_the_run(
    temporal_env: WorkflowEnvironment, db_engine: Engine, gated: tuple[Worker, Gate]
) -> None:
    """A message that arrives while the run stores its resume point is answered by that
    run, which then does not complete on the stale point: it waits another idle spell
    and stores the newer state (turn 2) before it completes."""
    worker, gate = gated
    client = temporal_env.client
    publish(db_engine, "echo", playbook=[{"reply": "you said {last_message}"}])
    gate.release_write.clear()
    sid = (await launch(client, db_engine, worker, "echo", "one", config=IDLE_CONFIG)).session_id
    await asyncio.wait_for(asyncio.to_thread(gate.writing.wait), 30)
    _, text = await launching.send_message(
        client, db_engine, session_id=sid, prompt="two", sync=True
    )
    assert text == "you said two"
    gate.release_write.set()
    await completed(client, sid)
    assert len(await runs(client, sid)) == 1  # one run answered both messages
    point = resume_point(db_engine, sid)
    assert point is not None and point.input.turn == 2


async def test_a_message_while_the_completion_is_in_flight_starts_the_next_run(
    temporal_env: WorkflowEnvironment, db_engine: Engine, gated: tuple[Worker, Gate]
) -> None:
    """A message that reaches the server while the workflow task completing the idle run
    is in flight is aborted by Temporal as the run closes ("workflow update was aborted
    by closing workflow", never accepted); the client then starts the next run with it
    (update-with-start): the message is answered exactly once, nothing is lost."""
    worker, gate = gated
    client = temporal_env.client
    publish(db_engine, "echo", playbook=[{"reply": "you said {last_message}"}])
    gate.hold_completion_s = HOLD_S
    sid = (await launch(client, db_engine, worker, "echo", "one", config=IDLE_CONFIG)).session_id
    await asyncio.wait_for(asyncio.to_thread(gate.completing.wait), 30)
    sent_at = time.monotonic()
    _, text = await launching.send_message(
        client, db_engine, session_id=sid, prompt="two", sync=True
    )
    assert sent_at < gate.completion_sent_at  # it was sent while the completion was held
    assert text == "you said two"
    await run_count(client, sid, 2)  # the second run may have completed idle already
    assert (await runs(client, sid))[0] == WorkflowExecutionStatus.COMPLETED
    assert message_ids(db_engine, sid) == [
        ":t1:user",
        ":t1:s1:assistant",
        ":t2:user",
        ":t2:s1:assistant",
    ]


# --- every road a session is sent something by ------------------------------------------


@pytest.fixture
def idle_api(
    monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> Iterator[httpx.Client]:
    """``live_api`` with ``BATON_SESSION_IDLE_TIMEOUT=1`` (read from the environment as a
    deployment would)."""
    monkeypatch.setenv("BATON_SESSION_IDLE_TIMEOUT", str(IDLE_S))
    yield request.getfixturevalue("live_api")


def until(check: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return value


def workflow_status(env: WorkflowEnvironment, session_id: str) -> WorkflowExecutionStatus | None:
    async def describe() -> WorkflowExecutionStatus | None:
        client = await Client.connect(
            env.client.service_client.config.target_host, namespace=env.client.namespace
        )
        return (await client.get_workflow_handle(session_id).describe()).status

    return asyncio.run(describe())


def test_the_api_restarts_an_idle_completed_session(
    idle_api: httpx.Client, temporal_env: WorkflowEnvironment
) -> None:
    """Through the real API: the session's workflow completes idle while the API still
    shows it ``idle``; sync and async messages start it again and are answered."""
    http = idle_api
    agent(http, "echo", [{"reply": "you said {last_message}"}])
    created = http.post("/v1/sessions", json={"agent": "echo", "prompt": "one", "sync": True})
    assert created.status_code == 201, created.text
    sid = created.json()["session_id"]
    until(lambda: workflow_status(temporal_env, sid) == WorkflowExecutionStatus.COMPLETED, "idle")
    shown = http.get(f"/v1/sessions/{sid}").json()
    assert (shown["status"], shown["running"]) == ("idle", False)

    sent = http.post(f"/v1/sessions/{sid}/messages", json={"prompt": "two", "sync": True})
    assert sent.status_code == 200, sent.text
    assert sent.json()["response"] == "you said two"
    until(lambda: workflow_status(temporal_env, sid) == WorkflowExecutionStatus.COMPLETED, "idle")

    sent = http.post(f"/v1/sessions/{sid}/messages", json={"prompt": "three"})
    assert sent.status_code == 200, sent.text
    until(lambda: len(messages(http, sid)) == 6, "the async reply")
    assert [m["text"] for m in messages(http, sid) if m["role"] == "assistant"] == [
        "you said one",
        "you said two",
        "you said three",
    ]
    cancelled = http.post(f"/v1/sessions/{sid}/cancel")
    assert cancelled.status_code == 202, cancelled.text
    until(lambda: http.get(f"/v1/sessions/{sid}").json()["status"] == "cancelled", "cancelled")
    closed = http.post(f"/v1/sessions/{sid}/messages", json={"prompt": "four"})
    assert (closed.status_code, closed.json()["code"]) == (409, "session_closed")


@pytest.fixture
def idle_stack(temporal_env: WorkflowEnvironment, tmp_path: Path) -> Iterator[Stack]:
    """API + worker with a 1 s idle timeout."""
    with running_stack(temporal_env, tmp_path / "idle.db", session_idle_timeout=IDLE_S) as s:
        yield s


def test_an_external_session_is_restarted_by_its_next_message(
    idle_stack: Stack, temporal_env: WorkflowEnvironment
) -> None:
    """An external session's run completes idle too; its process's next message (proxy
    token, Update ``external_message``) starts it again and is stored."""
    http = idle_stack.http
    agent(http, "outside")
    opened = http.post("/v1/sessions", json={"agent": "outside", "external": True}).json()
    sid = opened["session_id"]
    until(lambda: workflow_status(temporal_env, sid) == WorkflowExecutionStatus.COMPLETED, "idle")
    auth = {"Authorization": f"Bearer {opened['proxy_token']}"}
    body = {"prompt": "I refactored the parser.", "role": "assistant"}
    resp = http.post(f"/v1/sessions/{sid}/messages", json=body, headers=auth)
    assert resp.status_code == 200, resp.text
    assert [(m["role"], m["text"]) for m in messages(http, sid)] == [
        ("assistant", "I refactored the parser.")
    ]
    assert workflow_status(temporal_env, sid) == WorkflowExecutionStatus.RUNNING


async def test_a_delegation_continuing_an_idle_completed_session_restarts_it(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """invoke_agent with the ``session_id`` of a session whose run completed idle starts
    that session again: the caller gets the target's reply, in the target's transcript."""
    client = temporal_env.client
    publish(db_engine, "target", playbook=[{"reply": "target says hi"}])
    target = await launch(client, db_engine, worker, "target", "first", config=IDLE_CONFIG)
    await completed(client, target.session_id)
    args = {"slug": "target", "prompt": "more", "session_id": target.session_id, "sync": True}
    setup_pair(db_engine, "invoke_agent", args)
    set_policy(db_engine, "invoke", "allow")
    caller = await launch(client, db_engine, worker, "caller", "go")
    (msg,) = tool_messages(db_engine, caller.session_id)
    assert not msg.is_error, msg.text
    assert "target says hi" in msg.text
    assert [t for r, t in transcript(db_engine, target.session_id) if r == "user"] == [
        "first",
        "more",
    ]
    await run_count(client, target.session_id, 2)


async def test_the_cancel_cascade_reaches_delegated_sessions_that_completed_idle(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """A run tree whose runs all completed idle: cancelling the root cancels the root and
    its delegated session (each started again to take its cancel path), both closed."""
    client = temporal_env.client
    publish(db_engine, "leaf", playbook=[{"reply": "leaf done"}])
    tree = [{"alias": "leaf", "agent": "leaf"}]
    publish(db_engine, "top", playbook=delegating("leaf", tool="task"), subagents=tree)
    root = await launch(client, db_engine, worker, "top", "go", config=IDLE_CONFIG)
    ids = {s.agent_slug: s.id for s in all_sessions(db_engine)}
    assert set(ids) == {"top", "leaf"}
    for sid in ids.values():
        await completed(client, sid)
    await launching.cancel_session(client, db_engine, session_id=root.session_id)
    deadline = time.monotonic() + 60
    while {status(db_engine, sid) for sid in ids.values()} != {"cancelled"}:
        assert time.monotonic() < deadline, {a: status(db_engine, i) for a, i in ids.items()}
        await asyncio.sleep(0.1)
    for sid in ids.values():
        await cancelled(client, sid)
        await run_count(client, sid, 2)


def test_every_update_and_cancel_of_a_session_goes_through_baton_runs_launch() -> None:
    """No module but baton.runs.launch sends a session an Update or a cancel, so no road
    forgets to start an idle-completed session's next run (deliver_update, cancel_session)."""
    root = Path(__file__).resolve().parent.parent
    calls = re.compile(
        r"\.(start_update|execute_update|start_update_with_start_workflow|"
        r"execute_update_with_start_workflow)\(|\bhandle\.cancel\(|get_workflow_handle\([^)]*\)\.cancel\("
    )
    found = {
        str(path.relative_to(root))
        for package in ("api", "activities", "baton", "worker", "workflows")
        for path in (root / package).rglob("*.py")
        if calls.search(path.read_text())
    }
    assert found == {"baton/runs/launch.py"}
