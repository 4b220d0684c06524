"""A retry after an ambiguous failure runs once: two real ``baton api`` processes on one
PostgreSQL database, the first SIGKILLed in the middle of a request, the retry (same
``Idempotency-Key``) sent to the other replica. Exactly one session, one message."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator

import httpx
import psycopg
import pytest
from sqlalchemy.engine import Engine
from sqlmodel import col, select
from temporalio.testing import WorkflowEnvironment

from baton.storage.db import EventRow, MessageRow, SessionRow, init_db, make_engine, session_scope
from tests.helpers import publish
from tests.test_fault import ROOT, start_worker, worker_env
from worker.stack import free_port, stop_process

REPLY = " ".join(f"w{i}" for i in range(40))
#: The replicas' lease: a killed replica's key is taken over this soon after its last renewal.
LEASE_S = "1.5"


@pytest.fixture
def own_db(pg_url: str) -> Iterator[str]:
    """A database of its own in the throwaway PostgreSQL cluster, with Baton's schema."""
    name = f"idem_{uuid.uuid4().hex[:8]}"
    admin = pg_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = pg_url.rsplit("/", 1)[0] + f"/{name}"
    engine = make_engine(url)
    init_db(engine)
    engine.dispose()
    yield url


class Replica:
    """A real ``baton api`` process on a free loopback port."""

    def __init__(self, env: dict[str, str]) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cli", "api", "--host", "127.0.0.1", "--port", str(self.port)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "baton api exited"
            try:
                if httpx.get(f"{self.base}/readyz", timeout=10).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        pytest.fail(f"{self.base} never became ready")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)


def _sessions(engine: Engine) -> int:
    with session_scope(engine) as s:
        return len(s.exec(select(SessionRow)).all())


def _chunks(engine: Engine) -> int:
    with session_scope(engine) as s:
        return len(s.exec(select(EventRow).where(col(EventRow.type) == "chunk")).all())


def _messages(engine: Engine, role: str) -> list[str]:
    with session_scope(engine) as s:
        rows = s.exec(
            select(MessageRow)
            .where(col(MessageRow.role) == role)
            .order_by(col(MessageRow.created_at), col(MessageRow.id))
        ).all()
        return [r.text for r in rows]


def _wait(predicate: object, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what}: not in {timeout} s"
        time.sleep(0.05)


def _in_background(url: str, path: str, body: dict[str, object], key: str) -> threading.Thread:
    """POST from a thread whose answer never comes: its replica is killed meanwhile."""

    def post() -> None:
        # The replica is killed mid-request: the client cannot know what ran.
        with contextlib.suppress(httpx.TransportError):
            httpx.post(url + path, json=body, headers={"Idempotency-Key": key}, timeout=120)

    thread = threading.Thread(target=post, daemon=True)
    thread.start()
    return thread


def _retry(url: str, path: str, body: dict[str, object], key: str) -> httpx.Response:
    """POST with ``key`` until its first request's lease lapses (409 in flight meanwhile)."""
    deadline = time.monotonic() + 120
    while True:
        resp = httpx.post(url + path, json=body, headers={"Idempotency-Key": key}, timeout=120)
        if resp.status_code != 409 or resp.json()["code"] != "idempotency_key_in_flight":
            return resp
        assert time.monotonic() < deadline, "the killed replica's key was never taken over"
        time.sleep(0.2)


@pytest.mark.timeout(600)  # four real processes on a shared two-core machine
def test_a_retry_on_another_replica_after_a_kill_creates_one_session_and_one_message(
    temporal_env: WorkflowEnvironment, own_db: str
) -> None:
    """Replica A is SIGKILLed while a keyed sync POST /v1/sessions waits for its turn; the
    same request to replica B answers 201 with the reply, and one session exists. Then B is
    SIGKILLed during a keyed sync message, and its retry on replica C answers 200: the
    transcript holds that message and its reply once."""
    engine = make_engine(own_db)
    publish(engine, "slow", playbook=[{"reply": REPLY, "chunk_delay_ms": 60}])
    env = worker_env(own_db, temporal_env, f"tq-{uuid.uuid4()}", BATON_IDEMPOTENCY_LEASE=LEASE_S)
    worker = start_worker(env)
    replicas = [Replica(env), Replica(env)]
    try:
        for replica in replicas:
            replica.wait_ready()
        a, b = replicas
        session = {"agent": "slow", "prompt": "go", "sync": True}
        _in_background(a.base, "/v1/sessions", session, "launch-1")
        _wait(lambda: _chunks(engine) > 0, "the first turn streams")
        a.kill()
        created = _retry(b.base, "/v1/sessions", session, "launch-1")
        assert created.status_code == 201, created.text
        assert created.json()["response"] == REPLY
        assert _sessions(engine) == 1

        replicas.append(c := Replica(env))
        c.wait_ready()
        sid = created.json()["session_id"]
        path = f"/v1/sessions/{sid}/messages"
        message = {"prompt": "more", "sync": True}
        streamed = _chunks(engine)
        _in_background(b.base, path, message, "message-1")
        _wait(lambda: _chunks(engine) > streamed, "the second turn streams")
        b.kill()
        sent = _retry(c.base, path, message, "message-1")
        assert sent.status_code == 200, sent.text
        assert sent.json()["response"] == REPLY
        assert _messages(engine, "user") == ["go", "more"]
        assert _messages(engine, "assistant") == [REPLY, REPLY]
    finally:
        for replica in replicas:
            stop_process(replica.proc)
        stop_process(worker)
        engine.dispose()
