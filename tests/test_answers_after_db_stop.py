"""A launch or a message the engine has taken, with PostgreSQL really stopped right after
the delivery (``pg_ctl stop -m immediate`` from the API's Temporal client the moment the
Update call returns): the client is answered from what the delivery returned, or, when
the database is needed for the answer, its retry with the same ``Idempotency-Key`` on a
database that is back converges on the one session and the one message.

The worker is a real ``baton worker`` process on the same PostgreSQL: its activities fail
while the server is down and are retried once it is back.
"""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
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
from baton.storage.db import MessageRow, SessionRow, make_engine
from tests.conftest import PgCluster, migrated, pg_cluster, serve
from tests.helpers import count_rows, publish
from tests.test_fault import start_worker, worker_env
from worker.stack import stop_process

#: Generous: a loaded machine runs the worker's retries after the restart slowly.
SETTLE_S = 120.0


class StopAfterUpdate(Interceptor):
    """Once armed, stops PostgreSQL for real the moment an Update (or update-with-start)
    call returns, before the API answers."""

    def __init__(self, pg: PgCluster) -> None:
        self.pg = pg
        self.armed = threading.Event()
        self.stopped = threading.Event()

    def intercept_client(self, next: OutboundInterceptor) -> OutboundInterceptor:
        return _Outbound(next, self)

    async def after_update(self) -> None:
        if self.armed.is_set():
            self.armed.clear()
            await asyncio.to_thread(self.pg.stop)
            self.stopped.set()


class _Outbound(OutboundInterceptor):
    def __init__(self, nxt: OutboundInterceptor, fault: StopAfterUpdate) -> None:
        super().__init__(nxt)
        self._fault = fault

    async def start_workflow_update(
        self, input: StartWorkflowUpdateInput
    ) -> WorkflowUpdateHandle[Any]:
        handle = await super().start_workflow_update(input)
        await self._fault.after_update()
        return handle

    async def start_update_with_start_workflow(
        self, input: StartWorkflowUpdateWithStartInput
    ) -> WorkflowUpdateHandle[Any]:
        handle = await super().start_update_with_start_workflow(input)
        await self._fault.after_update()
        return handle


@dataclass
class Stack:
    """The API (in this process, its client stopping PostgreSQL), a real worker, and an
    engine of the test's own for counting rows."""

    http: httpx.Client
    fault: StopAfterUpdate
    pg: PgCluster
    engine: Engine


@pytest.fixture
def stack(temporal_env: WorkflowEnvironment) -> Iterator[Stack]:
    """A throwaway PostgreSQL, a real ``baton worker`` process on it, the API in process."""
    with pg_cluster() as pg:
        url = migrated(pg.url)
        engine = make_engine(url)
        publish(engine, "echo", playbook=[{"reply": "pong"}])
        queue = f"tq-{uuid.uuid4()}"
        worker: subprocess.Popen[bytes] = start_worker(worker_env(url, temporal_env, queue))
        fault = StopAfterUpdate(pg)
        config = temporal_env.client.config()
        config["interceptors"] = [fault]
        app = create_app(Settings(database_url=url, task_queue=queue), temporal=Client(**config))
        server, thread, base = serve(app)
        try:
            with httpx.Client(base_url=base, timeout=60) as http:
                yield Stack(http=http, fault=fault, pg=pg, engine=engine)
        finally:
            server.should_exit = True
            thread.join(timeout=10)
            stop_process(worker)
            engine.dispose()


def _post(http: httpx.Client, url: str, body: dict[str, Any], key: str) -> httpx.Response:
    """POST with an Idempotency-Key, retried with the same key as a client does: after a
    503 (the database just came back) and after 409 ``idempotency_key_in_flight`` ("retry
    later": a first request that could not keep its answer holds the key until its lease
    lapses, then the retry takes it over)."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        resp = http.post(url, json=body, headers={"Idempotency-Key": key})
        in_flight = resp.status_code == 409 and resp.json()["code"] == "idempotency_key_in_flight"
        if not (resp.status_code == 503 or in_flight) or time.monotonic() > deadline:
            return resp
        time.sleep(0.2)


def _idle(http: httpx.Client, session_id: str) -> None:
    """Poll until the session is idle (its worker retried what failed while PostgreSQL was
    down)."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        resp = http.get(f"/v1/sessions/{session_id}")
        if resp.status_code == 200 and resp.json()["status"] == "idle":
            return
        assert time.monotonic() < deadline, f"{session_id} never became idle: {resp.text}"
        time.sleep(0.2)


def test_a_launch_with_postgresql_stopped_after_it_makes_one_session(stack: Stack) -> None:
    """POST /v1/sessions with PostgreSQL stopped once the first message was delivered: the
    answer is 201, and the client's retry with the same Idempotency-Key (PostgreSQL back)
    answers the same session; exactly one session and one user message exist."""
    key = str(uuid.uuid4())
    stack.fault.armed.set()
    first = stack.http.post(
        "/v1/sessions",
        json={"agent": "echo", "prompt": "ping"},
        headers={"Idempotency-Key": key},
    )
    assert stack.fault.stopped.is_set()
    assert first.status_code == 201, first.text  # answered from the launch, no read
    assert first.json()["status"] == "running"
    stack.pg.start()
    again = _post(stack.http, "/v1/sessions", {"agent": "echo", "prompt": "ping"}, key)
    assert again.status_code == 201, again.text
    assert first.json()["session_id"] == again.json()["session_id"]
    session_id = again.json()["session_id"]
    _idle(stack.http, session_id)
    assert count_rows(stack.engine, SessionRow) == 1
    assert count_rows(stack.engine, MessageRow, session_id=session_id, role="user") == 1


def test_a_message_with_postgresql_stopped_after_it_is_stored_once(stack: Stack) -> None:
    """POST /v1/sessions/{id}/messages with PostgreSQL stopped once the Update was
    delivered: the answer is 200, and so is the client's retry with the same
    Idempotency-Key (PostgreSQL back); the message is stored once and answered once."""
    made = stack.http.post("/v1/sessions", json={"agent": "echo", "prompt": "one", "sync": True})
    assert made.status_code == 201, made.text
    session_id = made.json()["session_id"]
    url = f"/v1/sessions/{session_id}/messages"
    key = str(uuid.uuid4())
    stack.fault.armed.set()
    first = stack.http.post(url, json={"prompt": "two"}, headers={"Idempotency-Key": key})
    assert stack.fault.stopped.is_set()
    assert first.status_code == 200, first.text  # answered from the delivery, no read
    stack.pg.start()
    again = _post(stack.http, url, {"prompt": "two"}, key)
    assert again.status_code == 200, again.text
    _idle(stack.http, session_id)
    messages = stack.http.get(f"/v1/sessions/{session_id}/transcript").json()["messages"]
    assert [m["text"] for m in messages if m["role"] == "user"] == ["one", "two"]
    assert [m["text"] for m in messages if m["role"] == "assistant"] == ["pong", "pong"]
    assert count_rows(stack.engine, MessageRow, session_id=session_id, role="user") == 2
