"""A launch or a message the engine has taken is answered as a success even when the
database drops right after: the answer comes from what the delivery returned, never from
a read after it (a 503 there made clients retry and duplicate sessions and messages).

The database failure is real and injected at the exact moment: the API's Temporal client
carries an interceptor that, once the Update call returns, makes every later query of the
API's engine on ``sessions`` fail as a dropped connection does (OperationalError). The
worker is a real ``baton worker`` process with its own connection, untouched.
"""

from __future__ import annotations

import sqlite3
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import event
from sqlalchemy.engine import Engine
from temporalio.client import (
    Client,
    Interceptor,
    OutboundInterceptor,
    StartWorkflowUpdateInput,
    StartWorkflowUpdateWithStartInput,
    WorkflowUpdateHandle,
)
from temporalio.testing import WorkflowEnvironment

from api.app import create_app
from baton.settings import Settings
from baton.storage.db import MessageRow, SessionRow, init_db, make_engine
from tests.conftest import serve
from tests.helpers import count_rows, publish
from tests.test_fault import start_worker, worker_env
from worker.stack import stop_process


class DropAfterUpdate:
    """Once armed, fails every statement of one engine that touches ``sessions``."""

    def __init__(self) -> None:
        self.armed = threading.Event()
        self.failed = 0

    def install(self, engine: Engine) -> None:
        event.listen(engine, "before_cursor_execute", self._before)

    def _before(self, _conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if self.armed.is_set() and "sessions" in statement:
            self.failed += 1
            raise sqlite3.OperationalError("injected: the database went away")


class _Outbound(OutboundInterceptor):
    def __init__(self, nxt: OutboundInterceptor, fault: DropAfterUpdate) -> None:
        super().__init__(nxt)
        self._fault = fault

    async def start_workflow_update(
        self, input: StartWorkflowUpdateInput
    ) -> WorkflowUpdateHandle[Any]:
        handle = await super().start_workflow_update(input)
        self._fault.armed.set()
        return handle

    async def start_update_with_start_workflow(
        self, input: StartWorkflowUpdateWithStartInput
    ) -> WorkflowUpdateHandle[Any]:
        handle = await super().start_update_with_start_workflow(input)
        self._fault.armed.set()
        return handle


class ArmOnUpdate(Interceptor):
    """Arms ``fault`` the moment an Update (or update-with-start) call returns."""

    def __init__(self, fault: DropAfterUpdate) -> None:
        self._fault = fault

    def intercept_client(self, next: OutboundInterceptor) -> OutboundInterceptor:
        return _Outbound(next, self._fault)


@pytest.fixture
def stack(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> Iterator[tuple[httpx.Client, DropAfterUpdate, Engine]]:
    """The API in this process (its client armed by :class:`ArmOnUpdate`), a real
    ``baton worker`` process, one SQLite file; yields the HTTP client, the fault and an
    engine of the test's own for checking rows."""
    url = f"sqlite:///{tmp_path / 'drop.db'}"
    engine = make_engine(url)
    init_db(engine)
    publish(engine, "echo", playbook=[{"reply": "pong"}])
    queue = f"tq-{uuid.uuid4()}"
    worker: subprocess.Popen[bytes] = start_worker(worker_env(url, temporal_env, queue))
    fault = DropAfterUpdate()
    config = temporal_env.client.config()
    config["interceptors"] = [ArmOnUpdate(fault)]
    client = Client(**config)
    app = create_app(Settings(database_url=url, task_queue=queue), temporal=client)
    server, thread, base = serve(app)
    try:
        fault.install(app.state.engine)
        with httpx.Client(base_url=base, timeout=60) as http:
            yield http, fault, engine
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        stop_process(worker)
        engine.dispose()


@pytest.mark.parametrize("sync", [False, True])
def test_a_launch_is_answered_201_when_the_database_drops_after_it(
    stack: tuple[httpx.Client, DropAfterUpdate, Engine], sync: bool
) -> None:
    """POST /v1/sessions answers 201 (status from the launch) although every sessions
    query fails once the first message was delivered; exactly one session exists."""
    http, fault, engine = stack
    resp = http.post("/v1/sessions", json={"agent": "echo", "prompt": "ping", "sync": sync})
    assert fault.armed.is_set()
    assert resp.status_code == 201, resp.text
    body = resp.json()
    assert body["status"] == ("idle" if sync else "running")
    assert (body["agent"], body["version"]) == ("echo", 1)
    assert count_rows(engine, SessionRow) == 1


@pytest.mark.parametrize("sync", [False, True])
def test_a_message_is_answered_200_when_the_database_drops_after_it(
    stack: tuple[httpx.Client, DropAfterUpdate, Engine], sync: bool
) -> None:
    """POST /v1/sessions/{id}/messages answers 200 although every sessions query fails
    once the Update was delivered; the message is stored once."""
    http, fault, engine = stack
    sid = http.post("/v1/sessions", json={"agent": "echo", "prompt": "one", "sync": True})
    assert sid.status_code == 201, sid.text
    session_id = sid.json()["session_id"]
    fault.armed.clear()
    resp = http.post(f"/v1/sessions/{session_id}/messages", json={"prompt": "two", "sync": sync})
    assert fault.armed.is_set()
    assert resp.status_code == 200, resp.text
    assert resp.json()["status"] == ("idle" if sync else "running")
    assert resp.json()["agent"] == "echo"
    fault.armed.clear()
    deadline = time.monotonic() + 60
    while http.get(f"/v1/sessions/{session_id}").json()["status"] != "idle":
        assert time.monotonic() < deadline, "the second turn never ended"
        time.sleep(0.05)
    messages = http.get(f"/v1/sessions/{session_id}/transcript").json()["messages"]
    assert [m["text"] for m in messages if m["role"] == "user"] == ["one", "two"]
    assert count_rows(engine, MessageRow, session_id=session_id, role="user") == 2
