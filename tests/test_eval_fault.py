"""An eval whose worker process is killed (SIGKILL) mid-eval: a new worker finishes it
without running a finished replay again (docs/change-safely.md, Replay against a
candidate)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.activity import ActivityCancellationDetails
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment

from activities.outcomes import cancel_requested
from baton.evals import replay
from baton.runs import session_store
from baton.storage.db import EvalRow, init_db, make_engine, session_scope
from tests.test_fault import ROOT, start_worker, worker_env
from worker.stack import free_port

#: A slow streamed reply (40 chunks, 50 ms apart): a replay takes about two seconds.
REPLY = " ".join(f"word{i}" for i in range(40))


def wait(predicate: Any, what: str, timeout: float = 240) -> Any:
    """Poll ``predicate()`` every 0.2 s until it is truthy; its value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def start_api(env: dict[str, str], port: int) -> subprocess.Popen[bytes]:
    """`baton api` as a real child process."""
    return subprocess.Popen(
        [sys.executable, "-m", "cli", "api", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def messages_of(engine: Any, session_id: str) -> list[tuple[str, str]]:
    """``(id, created_at)`` of a session's messages: rewritten or added ones would show."""
    with session_scope(engine) as s:
        return [
            (m.id, m.created_at.isoformat())
            for m in session_store.messages(s, session_id=session_id)
        ]


def test_a_killed_worker_mid_eval_resumes_without_rerunning_finished_replays(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """Four recorded sessions, one replay at a time; the worker is killed once two sessions
    are done. A new worker completes the eval: eight replay sessions in all, each with one
    user turn and one reply, and the replays finished before the kill untouched (the same
    messages, none added)."""
    db_url = f"sqlite:///{tmp_path / 'evalfault.db'}"
    engine = make_engine(db_url)
    init_db(engine)
    queue = f"tq-{uuid.uuid4()}"
    env = worker_env(
        db_url,
        temporal_env,
        queue,
        BATON_EVAL_CONCURRENCY="1",
        BATON_HEARTBEAT_TIMEOUT="2",
        BATON_WORKER_STICKY_TIMEOUT="1",
    )
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = [start_api(env, port), start_worker(env)]
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            wait(lambda: _up(http), "the API")
            spec = {"playbook": [{"reply": REPLY, "chunk_delay_ms": 50}]}
            body = {"slug": "streamer", "name": "Streamer", "spec": spec}
            assert http.post("/v1/agents", json=body).status_code == 201
            assert http.post("/v1/agents/streamer/publish").status_code == 201
            for i in range(4):
                sent = {"agent": "streamer", "prompt": f"talk {i}", "sync": True}
                assert http.post("/v1/sessions", json=sent).status_code == 201
            started = http.post("/v1/agents/streamer/evals", json={"candidate": "streamer@1"})
            assert started.status_code == 202, started.text
            eval_id = started.json()["id"]

            def done() -> int:
                with session_scope(engine) as s:
                    row = s.get(EvalRow, eval_id)
                    return row.done if row is not None else 0

            wait(lambda: done() >= 2, "two sessions replayed")
            procs[1].send_signal(signal.SIGKILL)
            procs[1].wait(timeout=10)
            with session_scope(engine) as s:
                row = s.get(EvalRow, eval_id)
                assert row is not None and row.status == "running"
                finished = [
                    sid
                    for item in (row.report or {})["sessions"]
                    for sid in (item["baseline_session_id"], item["candidate_session_id"])
                ]
            assert len(finished) >= 4
            before = {sid: messages_of(engine, sid) for sid in finished}

            procs.append(start_worker(env))
            result = wait(
                lambda: (
                    (b := http.get(f"/v1/agents/streamer/evals/{eval_id}").json())["status"]
                    != "running"
                    and b
                ),
                "the eval to end",
            )
            assert (result["status"], result["done"], result["total"]) == ("completed", 4, 4)
            assert result["changed"] == 0, result["report"]
            with session_scope(engine) as s:
                replays = replay.eval_sessions(s, eval_id=eval_id)
            assert len(replays) == 8
            for r in replays:
                roles = [m for m in messages_of(engine, r.id)]
                assert len(roles) == 2, r.id  # one user turn, one reply: nothing sent twice
            for sid, msgs in before.items():
                assert messages_of(engine, sid) == msgs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=15)
        engine.dispose()


def _up(http: httpx.Client) -> bool:
    try:
        return http.get("/healthz").status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.parametrize(
    ("details", "cancels_the_run"),
    [
        (ActivityCancellationDetails(cancel_requested=True), True),
        (ActivityCancellationDetails(timed_out=True), False),
        (ActivityCancellationDetails(worker_shutdown=True), False),
        (ActivityCancellationDetails(not_found=True), False),
    ],
)
async def test_only_a_cancel_the_workflow_asked_for_counts_as_cancelled(
    details: ActivityCancellationDetails, cancels_the_run: bool
) -> None:
    """An attempt cancelled because its workflow asked (a cancelled eval: its replay's run
    is cancelled; an interrupt: the streamed text is kept) counts as cancelled; one that
    timed out (a missed heartbeat under load), lost its worker or is unknown does not,
    and leaves its work for the retried attempt."""
    env = ActivityEnvironment()
    seen: list[bool] = []

    async def attempt() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            seen.append(cancel_requested())
            raise

    task = asyncio.ensure_future(env.run(attempt))
    await asyncio.sleep(0.05)
    env.cancel(details)
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == [cancels_the_run]
