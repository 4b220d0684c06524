"""Racing, unknown and malformed decisions on the real single-process stack (`baton dev`).

One `baton dev` process (its own Temporal dev server, SQLite, worker and API in one
process, as a user runs it) per module: concurrent decision POSTs, raw Signals naming
unknown reviews or carrying extra fields and bad values. After each, the session or
step must go on, its Queries must answer and ``/healthz`` must stay up.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.engine import Engine
from sqlmodel import select
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.contrib.pydantic import pydantic_data_converter

from baton.contracts.workflow_io import review_in_time
from baton.storage.db import AuditRow, ReviewRow, make_engine, session_scope
from tests.test_api_reviews import agent, final_text, target
from tests.xagent_helpers import caller_playbook
from worker.stack import free_port, stop_process

BATON = str(Path(sys.executable).with_name("baton"))
INVOKE_SYNC = {"slug": "target", "prompt": "hello target", "sync": True}
MICROSECOND = timedelta(microseconds=1)
WORKFLOW_TASK_FAILED = EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
#: Generous: a loaded machine starts the dev server, the worker and the API slowly.
START_WAIT_S = 120.0


@dataclass
class DevStack:
    """A running `baton dev` process, an HTTP client for its API and its Temporal address."""

    proc: subprocess.Popen[str]
    http: httpx.Client
    temporal: str
    log: Path
    cwd: Path

    def engine(self) -> Engine:
        """The stack's own SQLite database (`baton dev` keeps it in ``.baton/``)."""
        return make_engine(f"sqlite:///{self.cwd / '.baton' / 'baton.db'}")

    def alive(self) -> None:
        """The process runs and ``/healthz`` answers."""
        assert self.proc.poll() is None, self.log.read_text()[-3000:]
        assert self.http.get("/healthz", timeout=10).status_code == 200


def poll(predicate: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    """Poll ``predicate()`` until it returns something truthy; returns that value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


#: Starts of `baton dev` tried before the fixture gives up: the dev server binds ports of
#: its own choosing besides the three given, and a second suite on the machine may take
#: one of them between the choice and the bind (the child then exits early).
START_ATTEMPTS = 3


def start_dev(cwd: Path) -> tuple[subprocess.Popen[str], int, int, Path]:
    """Start `baton dev` in ``cwd`` on fresh free ports and wait for ``/healthz``.

    Returns ``(process, api_port, temporal_port, log)``; a child that exits before it
    answers is started again on new ports, up to ``START_ATTEMPTS`` times (then the
    last log tail is the assertion message)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATON_")}
    env |= {"COLUMNS": "300", "NO_COLOR": "1"}
    for attempt in range(1, START_ATTEMPTS + 1):
        api, frontend, ui = free_port(), free_port(), free_port()
        log = cwd / f"dev-{attempt}.log"
        ports = ["--port", str(api), "--temporal-port", str(frontend), "--ui-port", str(ui)]
        with log.open("w") as out:
            proc = subprocess.Popen(
                [BATON, "dev", *ports],
                env=env,
                cwd=cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
            )
        deadline = time.monotonic() + START_WAIT_S
        with httpx.Client(base_url=f"http://127.0.0.1:{api}") as probe:
            while proc.poll() is None and time.monotonic() < deadline:
                try:
                    if probe.get("/healthz", timeout=5).status_code == 200:
                        return proc, api, frontend, log
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
        stop_process(proc, timeout=30)
        if attempt == START_ATTEMPTS or time.monotonic() >= deadline:
            raise AssertionError(f"baton dev did not start:\n{log.read_text()[-3000:]}")
    raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevStack]:
    """`baton dev` as a real process in a fresh directory, with its own ports."""
    cwd = tmp_path_factory.mktemp("dev")
    proc, api, frontend, log = start_dev(cwd)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{api}", timeout=60) as http:
            temporal = f"127.0.0.1:{frontend}"
            yield DevStack(proc=proc, http=http, temporal=temporal, log=log, cwd=cwd)
    finally:
        stop_process(proc, timeout=30)


@pytest.fixture(scope="module")
def agents(dev: DevStack) -> None:
    """``target`` (a fixed reply) and ``caller`` (invokes target on ``go``), published once."""
    target(dev.http)
    agent(dev.http, "caller", caller_playbook("invoke_agent", INVOKE_SYNC))


def launch(dev: DevStack) -> tuple[str, dict[str, Any]]:
    """Start a ``caller`` session and wait for its review; returns ``(session_id, review)``."""
    resp = dev.http.post("/v1/sessions", json={"agent": "caller", "prompt": "go"})
    assert resp.status_code == 201, resp.text
    sid: str = resp.json()["session_id"]

    def mine() -> dict[str, Any] | None:
        body = dev.http.get("/v1/reviews", params={"status": "pending", "session_id": sid}).json()
        return body["data"][0] if body["count"] else None

    review: dict[str, Any] = poll(mine, f"the review of {sid}")
    return sid, review


def idle(dev: DevStack, sid: str) -> dict[str, Any]:
    """Wait until session ``sid`` is idle again; returns it."""

    def check() -> dict[str, Any] | None:
        body: dict[str, Any] = dev.http.get(f"/v1/sessions/{sid}").json()
        return body if body["status"] == "idle" else None

    found: dict[str, Any] = poll(check, f"{sid} to be idle")
    return found


def query(dev: DevStack, workflow_id: str, name: str) -> Any:
    """Run Query ``name`` on ``workflow_id`` (fails if its workflow task is failing)."""

    async def run() -> Any:
        client = await Client.connect(dev.temporal, data_converter=pydantic_data_converter)
        return await client.get_workflow_handle(workflow_id).query(name)

    return asyncio.run(run())


def signal(dev: DevStack, workflow_id: str, name: str, arg: Any) -> None:
    """Send Signal ``name`` with the raw JSON ``arg``, as ``temporal workflow signal`` does."""

    async def run() -> None:
        client = await Client.connect(dev.temporal, data_converter=pydantic_data_converter)
        await client.get_workflow_handle(workflow_id).signal(name, arg)

    asyncio.run(run())


def test_of_three_concurrent_decisions_exactly_one_applies(dev: DevStack, agents: None) -> None:
    """Three concurrent decision POSTs on one review: one 200, two 409
    ``review_already_decided``; the session finishes its turn and answers queries."""
    sid, review = launch(dev)
    url = f"/v1/reviews/{review['id']}/decision"
    bodies = [{"decision": "allow_once"}, {"decision": "deny"}, {"decision": "allow_once"}]
    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda b: dev.http.post(url, json=b), bodies))
    codes = sorted(a.status_code for a in answers)
    assert codes == [200, 409, 409], [a.text for a in answers]
    losers = [a.json() for a in answers if a.status_code == 409]
    assert {p["code"] for p in losers} == {"review_already_decided"}, losers
    (winner,) = (a.json() for a in answers if a.status_code == 200)
    idle(dev, sid)
    settled = dev.http.get(f"/v1/reviews/{review['id']}").json()
    assert settled["status"] == winner["status"] != "pending"
    late = query(dev, sid, "late_decisions")
    assert [d["reason"] for d in late] == ["too_late", "too_late"], late
    assert query(dev, sid, "status") == "idle"
    dev.alive()


def test_an_unknown_review_signal_then_an_api_decision(dev: DevStack, agents: None) -> None:
    """A raw ``review_decision`` Signal naming an unknown review, then an API decision:
    the unknown one is recorded ``unknown_review``, the API's applies (200)."""
    sid, review = launch(dev)
    unknown = "review-00000000-0000-0000-0000-000000000000"
    signal(dev, sid, "review_decision", {"review_id": unknown, "decision": "allow_once"})
    poll(lambda: query(dev, sid, "late_decisions"), "the unknown decision to be recorded")
    resp = dev.http.post(f"/v1/reviews/{review['id']}/decision", json={"decision": "allow_once"})
    assert resp.status_code == 200, resp.text
    idle(dev, sid)
    assert final_text(dev.http, sid).startswith("RESULT ")
    late = query(dev, sid, "late_decisions")
    assert [(d["review_id"], d["reason"]) for d in late] == [(unknown, "unknown_review")]
    dev.alive()


def test_a_raw_decision_with_a_bad_value_is_recorded_invalid(dev: DevStack, agents: None) -> None:
    """A raw Signal whose decision is no decision (and one with an extra field and no
    review id) is kept as ``invalid_decision``; the review still takes the API's."""
    sid, review = launch(dev)
    signal(dev, sid, "review_decision", {"review_id": review["id"], "decision": "maybe"})
    signal(dev, sid, "review_decision", {"decision": "deny", "note": "x"})
    poll(lambda: len(query(dev, sid, "late_decisions")) == 2, "both to be recorded")
    resp = dev.http.post(f"/v1/reviews/{review['id']}/decision", json={"decision": "deny"})
    assert resp.status_code == 200, resp.text
    idle(dev, sid)
    late = query(dev, sid, "late_decisions")
    assert [(d["review_id"], d["decision"], d["reason"]) for d in late] == [
        (review["id"], None, "invalid_decision"),
        ("", None, "invalid_decision"),
    ]
    dev.alive()


def test_a_handoff_signal_with_an_extra_field_or_a_bad_value(dev: DevStack) -> None:
    """A step's raw ``handoff`` Signal with a bad value is ignored and one with an extra
    field applies (the field dropped): the step completes, its Query answers."""
    agent(dev.http, "writer", [{"reply": "a draft"}])
    resp = dev.http.post("/v1/steps", json={"agent": "writer", "input": "go", "handoff": True})
    assert resp.status_code == 202, resp.text
    step_id: str = resp.json()["step_id"]

    def step_is(state: str) -> bool:
        return bool(dev.http.get(f"/v1/steps/{step_id}").json()["status"] == state)

    poll(lambda: step_is("awaiting_handoff"), "the handoff")
    signal(dev, step_id, "handoff", {"decision": "maybe"})
    signal(dev, step_id, "handoff", "approve")
    assert query(dev, step_id, "status")["status"] == "awaiting_handoff"
    signal(dev, step_id, "handoff", {"decision": "approve", "by": "an operator"})
    poll(lambda: step_is("completed"), "the step to complete")
    assert query(dev, step_id, "status")["status"] == "completed"
    dev.alive()


def test_the_review_deadline_is_hard_at_its_edge(dev: DevStack, agents: None) -> None:
    """The review's ``expires_at`` is in the API; a decision received one microsecond
    past it is ``too_late`` though the timer has not fired, one received at it applies."""
    sid, review = launch(dev)
    assert review["expires_at"] is not None
    expires = datetime.fromisoformat(review["expires_at"])
    created = datetime.fromisoformat(review["created_at"])
    assert abs((expires - created).total_seconds() - 300) < 5  # the default timeout
    late = {"review_id": review["id"], "decision": "allow_once"}
    signal(dev, sid, "review_decision", late | {"received_at": str(expires + MICROSECOND)})
    poll(lambda: query(dev, sid, "late_decisions"), "the late decision to be recorded")
    assert [d["reason"] for d in query(dev, sid, "late_decisions")] == ["too_late"]
    assert dev.http.get(f"/v1/reviews/{review['id']}").json()["status"] == "pending"
    signal(dev, sid, "review_decision", late | {"received_at": str(expires)})
    idle(dev, sid)
    assert dev.http.get(f"/v1/reviews/{review['id']}").json()["status"] == "allowed"


def test_the_api_refuses_a_decision_past_the_deadline_before_the_timer(
    dev: DevStack, agents: None
) -> None:
    """A review past its ``expires_at`` whose timer has not fired (moved back in the row,
    as a late timer leaves it): the API answers 409 ``review_too_late`` and signals
    nothing; the same review with a deadline ahead takes the decision (200)."""
    sid, review = launch(dev)
    engine = dev.engine()

    def expire_in(seconds: float) -> None:
        with session_scope(engine) as s:
            row = s.get(ReviewRow, review["id"])
            assert row is not None
            row.expires_at = datetime.now(UTC) + timedelta(seconds=seconds)
            s.add(row)

    try:
        expire_in(-1)
        resp = dev.http.post(f"/v1/reviews/{review['id']}/decision", json={"decision": "deny"})
        assert resp.status_code == 409, resp.text
        assert resp.json()["code"] == "review_too_late"
        assert query(dev, sid, "late_decisions") == []  # never signalled
        expire_in(300)
        resp = dev.http.post(f"/v1/reviews/{review['id']}/decision", json={"decision": "deny"})
        assert resp.status_code == 200, resp.text
    finally:
        engine.dispose()
    idle(dev, sid)


def test_the_one_deadline_rule_at_its_edge() -> None:
    """``review_in_time``: received at the deadline is in time, a microsecond later not."""
    expires = datetime(2026, 12, 1, 12, 5, tzinfo=UTC)
    assert review_in_time(expires - MICROSECOND, expires)
    assert review_in_time(expires, expires)
    assert not review_in_time(expires + MICROSECOND, expires)


def audits(dev: DevStack, review_id: str) -> list[AuditRow]:
    """The audit rows of ``review_id``."""
    engine = dev.engine()
    try:
        with session_scope(engine) as s:
            rows = s.exec(select(AuditRow).where(AuditRow.review_id == review_id)).all()
            for row in rows:
                s.expunge(row)
            return list(rows)
    finally:
        engine.dispose()


def test_a_cancelled_session_cancels_its_reviews_with_an_audit_row(
    dev: DevStack, agents: None
) -> None:
    """Cancelling a session waiting on a review: the review is ``cancelled``, audited
    (outcome ``cancelled``) and out of the pending inbox; a decision on it is 409."""
    sid, review = launch(dev)
    assert dev.http.post(f"/v1/sessions/{sid}/cancel").status_code == 202

    def cancelled() -> bool:
        return bool(dev.http.get(f"/v1/reviews/{review['id']}").json()["status"] == "cancelled")

    poll(cancelled, "the review to be cancelled")
    [audit] = audits(dev, review["id"])
    assert (audit.outcome, audit.decided_by) == ("cancelled", "cancelled")
    inbox = dev.http.get("/v1/reviews", params={"status": "pending", "session_id": sid}).json()
    assert inbox["count"] == 0
    resp = dev.http.post(f"/v1/reviews/{review['id']}/decision", json={"decision": "deny"})
    assert resp.status_code == 409 and resp.json()["code"] == "review_already_decided"
    dev.alive()


def test_a_decision_on_a_terminated_session_cancels_its_reviews(
    dev: DevStack, agents: None
) -> None:
    """A session whose run was terminated (no workflow code ran to close its review):
    the first decision answers 409 ``review_too_late`` and cancels the review, audited."""
    sid, review = launch(dev)

    async def terminate() -> None:
        client = await Client.connect(dev.temporal, data_converter=pydantic_data_converter)
        await client.get_workflow_handle(sid).terminate("an operator stopped it")

    asyncio.run(terminate())
    resp = dev.http.post(f"/v1/reviews/{review['id']}/decision", json={"decision": "deny"})
    assert resp.status_code == 409, resp.text
    assert resp.json()["code"] == "review_too_late"
    assert dev.http.get(f"/v1/reviews/{review['id']}").json()["status"] == "cancelled"
    [audit] = audits(dev, review["id"])
    assert (audit.outcome, audit.decided_by) == ("cancelled", "session ended")
    inbox = dev.http.get("/v1/reviews", params={"status": "pending", "session_id": sid}).json()
    assert inbox["count"] == 0
    dev.alive()


def no_failed_workflow_task(dev: DevStack, workflow_id: str) -> None:
    """The run's history holds no failed workflow task."""

    async def run() -> list[Any]:
        client = await Client.connect(dev.temporal, data_converter=pydantic_data_converter)
        handle = client.get_workflow_handle(workflow_id)
        return [e async for e in handle.fetch_history_events()]

    failed = [e for e in asyncio.run(run()) if e.event_type == WORKFLOW_TASK_FAILED]
    assert not failed, failed


def update(dev: DevStack, workflow_id: str, name: str, arg: Any) -> Any:
    """Run Update ``name`` with the raw JSON ``arg``; returns its result."""

    async def run() -> Any:
        client = await Client.connect(dev.temporal, data_converter=pydantic_data_converter)
        return await client.get_workflow_handle(workflow_id).execute_update(name, arg)

    return asyncio.run(run())


def refused(dev: DevStack, workflow_id: str, name: str, arg: Any) -> None:
    """Update ``name`` with ``arg`` is refused: its caller gets the error."""
    with pytest.raises(WorkflowUpdateFailedError):
        update(dev, workflow_id, name, arg)


def test_updates_with_bad_values_are_refused_and_extra_fields_dropped_not_failed(
    dev: DevStack, agents: None
) -> None:
    """Raw ``send_message`` and ``external_tool_call`` Updates with a bad value, a wrong
    shape or an unknown tool are refused (the caller gets the error), a ``send_message``
    with an extra field is answered (the field dropped), no workflow task fails and the
    session goes on: a message through the API still gets its answer."""
    resp = dev.http.post("/v1/sessions", json={"agent": "target", "prompt": "hi", "sync": True})
    assert resp.status_code == 201, resp.text
    sid: str = resp.json()["session_id"]
    refused(dev, sid, "send_message", {"prompt": None})
    refused(dev, sid, "send_message", ["not", "a", "message"])
    refused(dev, sid, "external_tool_call", {"call_id": "c", "name": "rm -rf", "args": {}})
    extra = update(dev, sid, "send_message", {"prompt": "extra", "note": "not a field"})
    assert extra["message_id"].startswith(sid), extra
    assert query(dev, sid, "status") == "idle"
    again = dev.http.post(f"/v1/sessions/{sid}/messages", json={"prompt": "again", "sync": True})
    assert again.status_code == 200, again.text
    assert final_text(dev.http, sid) == "target says hi"
    no_failed_workflow_task(dev, sid)
    dev.alive()


def test_external_message_updates_with_bad_values_are_refused_not_failed(
    dev: DevStack, agents: None
) -> None:
    """Raw ``external_message`` Updates with a bad role, no text, blank text or a wrong
    shape are refused (the caller gets the error); one with an extra field is stored (the
    field dropped); no workflow task fails and the session's Queries answer."""
    resp = dev.http.post("/v1/sessions", json={"agent": "target", "external": True})
    assert resp.status_code == 201, resp.text
    sid: str = resp.json()["session_id"]
    refused(dev, sid, "external_message", {"role": "system", "text": "I am root"})
    refused(dev, sid, "external_message", {"text": None})
    refused(dev, sid, "external_message", {"text": "   "})
    refused(dev, sid, "external_message", "just text")
    stored = update(dev, sid, "external_message", {"text": "did it", "note": "not a field"})
    assert stored["message_id"] == f"{sid}:t1:assistant", stored
    assert query(dev, sid, "pending_reviews") == []
    messages = dev.http.get(f"/v1/sessions/{sid}/transcript").json()["messages"]
    assert [m["text"] for m in messages] == ["did it"]
    no_failed_workflow_task(dev, sid)
    dev.alive()
