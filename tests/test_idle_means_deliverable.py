"""What the API calls idle it does not refuse as busy: a worker killed right after a turn
stored its reply (status ``idle``) leaves the task that ends the turn on its sticky queue,
and a message sent meanwhile is delivered once the workflow can take it, not 409."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from temporalio.testing import WorkflowEnvironment

from api.app import create_app
from baton.settings import Settings
from baton.storage.db import init_db, make_engine
from tests.conftest import serve
from tests.helpers import publish
from tests.test_fault import start_worker, worker_env
from tests.test_review_crash import crash_worker
from worker.stack import stop_process


@pytest.fixture
def crash_stack(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> Iterator[tuple[httpx.Client, dict[str, str], Path]]:
    """The API in this process and a real worker process that SIGKILLs itself right after
    its first ``model_turn`` committed; yields the HTTP client, the worker environment (to
    start the next worker) and the crash marker."""
    url = f"sqlite:///{tmp_path / 'sticky.db'}"
    engine = make_engine(url)
    init_db(engine)
    publish(engine, "echo", playbook=[{"reply": "pong"}])
    engine.dispose()
    queue = f"tq-{uuid.uuid4()}"
    env = worker_env(url, temporal_env, queue)
    marker = tmp_path / "killed"
    crashing = crash_worker("model_turn", marker, env)
    # A short heartbeat timeout: the killed worker's turn is retried elsewhere soon.
    settings = Settings(database_url=url, task_queue=queue, heartbeat_timeout=2.0)
    server, thread, base = serve(create_app(settings, temporal=temporal_env.client))
    try:
        with httpx.Client(base_url=base, timeout=120) as http:
            yield http, env, marker
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        stop_process(crashing)


def _wait(predicate: object, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what}: not in {timeout} s"
        time.sleep(0.05)


def test_a_message_to_an_idle_session_of_a_killed_worker_is_delivered(
    crash_stack: tuple[httpx.Client, dict[str, str], Path],
) -> None:
    """The worker dies after storing turn 1's reply; GET says idle; the next message is
    answered 200 (not 409 session_busy) and runs exactly once on the next worker."""
    http, env, marker = crash_stack
    launched = http.post("/v1/sessions", json={"agent": "echo", "prompt": "one"})
    assert launched.status_code == 201, launched.text
    sid = launched.json()["session_id"]
    _wait(marker.exists, "the first worker ran model_turn")
    _wait(lambda: http.get(f"/v1/sessions/{sid}").json()["status"] == "idle", "idle")
    survivor: subprocess.Popen[bytes] = start_worker(env)
    try:
        sent = http.post(f"/v1/sessions/{sid}/messages", json={"prompt": "two"})
        assert sent.status_code == 200, sent.text
        _wait(lambda: http.get(f"/v1/sessions/{sid}").json()["status"] == "idle", "turn 2")
        messages = http.get(f"/v1/sessions/{sid}/transcript").json()["messages"]
        assert [(m["role"], m["text"]) for m in messages] == [
            ("user", "one"),
            ("assistant", "pong"),
            ("user", "two"),
            ("assistant", "pong"),
        ]
    finally:
        stop_process(survivor)
