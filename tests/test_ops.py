"""Operations: `/readyz` (database + Temporal), the worker's graceful drain on SIGTERM,
and Worker Versioning on the dev server."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.engine import Engine
from temporalio.api.enums.v1 import EventType, VersioningBehavior
from temporalio.api.workflowservice.v1 import SetWorkerDeploymentCurrentVersionRequest
from temporalio.client import Client
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from api.app import create_app
from baton.contracts.workflow_io import Provenance
from baton.runs import session_store
from baton.runs.launch import launch_session
from baton.settings import Settings
from baton.storage.db import MessageRow, init_db, make_engine, session_scope
from tests.conftest import migrated, serve
from tests.forwarder import Forwarder
from tests.helpers import READY_TIMEOUT_S, TEST_CONFIG, publish, status, wait_for
from worker.factory import build_worker, deployment_config
from worker.stack import API_GRACEFUL_SHUTDOWN_S, ServicesThread, free_port

BATON = str(Path(sys.executable).parent / "baton")


def _address(env: WorkflowEnvironment) -> str:
    return env.client.service_client.config.target_host


@pytest.fixture
def api_at() -> Iterator[Callable[[Settings], httpx.Client]]:
    """A factory: the real API (uvicorn) for given settings, no shared client; closed after."""
    servers = []

    def start(settings: Settings) -> httpx.Client:
        server, thread, base = serve(create_app(settings))
        servers.append((server, thread))
        return httpx.Client(base_url=base, timeout=30)

    yield start
    for server, thread in servers:
        server.should_exit = True
        thread.join(timeout=10)


def test_readyz_is_ok_when_database_and_temporal_answer(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """/readyz: 200 with both checks ok on a running stack (beside /healthz)."""
    settings = Settings(
        _env_file=None,
        database_url=migrated(f"sqlite:///{tmp_path / 'r.db'}"),
        temporal_address=_address(temporal_env),
        task_queue=f"tq-{uuid.uuid4()}",
    )
    services = ServicesThread(settings, api_port=free_port())
    services.start()
    try:
        resp = httpx.get(f"{services.api_url}/readyz", timeout=30)
    finally:
        services.stop()
    assert resp.status_code == 200
    assert resp.json() == {"status": "ready", "checks": {"database": "ok", "temporal": "ok"}}


def test_readyz_names_temporal_when_it_is_down(
    api_at: Callable[[Settings], httpx.Client], tmp_path: Path
) -> None:
    """Temporal unreachable: 503 problem+json `not_ready`, temporal named, database ok."""
    closed = f"127.0.0.1:{free_port()}"
    settings = Settings(
        _env_file=None,
        database_url=migrated(f"sqlite:///{tmp_path / 'r.db'}"),
        temporal_address=closed,
        temporal_env_config=False,
    )
    with api_at(settings) as http:
        resp = http.get("/readyz")
        assert http.get("/healthz").status_code == 200
    assert resp.status_code == 503
    assert resp.headers["content-type"].startswith("application/problem+json")
    body = resp.json()
    assert body["code"] == "not_ready" and body["checks"]["database"] == "ok"
    assert body["checks"]["temporal"].startswith(f"cannot reach Temporal at {closed}")
    assert body["detail"].startswith("temporal: cannot reach Temporal")


def test_readyz_names_the_database_when_it_goes_away(
    api_at: Callable[[Settings], httpx.Client], pg_url: str, temporal_env: WorkflowEnvironment
) -> None:
    """PostgreSQL reachable, then cut: 200, then 503 naming the database (Temporal still ok)."""
    host = migrated(pg_url).split("@", 1)[1].split("/", 1)[0]
    cable = Forwarder(host).start()
    settings = Settings(
        _env_file=None,
        database_url=pg_url.replace(host, cable.address),
        temporal_address=_address(temporal_env),
    )
    http = api_at(settings)
    try:
        assert http.get("/readyz").status_code == 200
        cable.stop()
        resp = http.get("/readyz")
    finally:
        http.close()
    assert resp.status_code == 503
    checks = resp.json()["checks"]
    assert checks["temporal"] == "ok" and checks["database"].startswith("OperationalError")
    assert "postgresql" not in checks["database"]


# --- graceful drain ------------------------------------------------------------


async def _wait_turn_started(client: Client, session_id: str, timeout: float = 60) -> None:
    """Until the session's model_turn activity is running on a worker."""
    deadline = time.monotonic() + timeout
    handle = client.get_workflow_handle(session_id)
    while time.monotonic() < deadline:
        desc = await handle.describe()
        if any(
            a.activity_type.name == "model_turn" and a.last_started_time.seconds
            for a in desc.raw_description.pending_activities
        ):
            return
        await asyncio.sleep(0.1)
    pytest.fail("the turn never started")


class _Stopped:
    """What a `baton worker` stopped by SIGTERM mid-turn left: exit code, seconds from the
    signal to its exit, its output, and the session's history."""

    def __init__(
        self,
        code: int,
        took: float,
        out: str,
        err: str,
        history: Any,
        messages: list[MessageRow] | None = None,
    ) -> None:
        self.code, self.took, self.out, self.err, self.history = code, took, out, err, history
        #: The session's transcript once another worker ended its turn (``resume``).
        self.messages = messages or []

    def model_turns_completed(self) -> int:
        """How many model_turn activities completed in the session's history."""
        events = self.history.events
        # load_agent (when not pinned in the input) may complete too: only model_turn matters.
        scheduled = {
            e.event_id: e.activity_task_scheduled_event_attributes.activity_type.name
            for e in events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        }
        return sum(
            1
            for e in events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
            and scheduled[e.activity_task_completed_event_attributes.scheduled_event_id]
            == "model_turn"
        )


#: A turn that streams for 4 s.
SLOW_REPLY = [{"reply": "w " * 40, "chunk_delay_ms": 100}]


async def _stop_worker_mid_turn(
    temporal_env: WorkflowEnvironment,
    tmp_path: Path,
    grace_s: int,
    playbook: list[dict[str, Any]] = SLOW_REPLY,
    resume: bool = False,
    tools: tuple[str, ...] = (),
    **extra: str,
) -> _Stopped:
    """Run `baton worker` (environment plus ``extra``), start a turn of ``playbook`` on it,
    SIGTERM it once the turn runs, and wait for it to exit. ``resume``: then a worker in
    this process takes over the session's task queue until the turn has ended."""
    db = f"sqlite:///{tmp_path / 'd.db'}"
    queue = f"tq-{uuid.uuid4()}"
    engine = make_engine(db)
    init_db(engine)
    publish(engine, "slow", playbook=playbook, tools=list(tools))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BATON_", "TEMPORAL_"))}
    env.update(
        BATON_DATABASE_URL=db,
        BATON_TASK_QUEUE=queue,
        BATON_TEMPORAL_ADDRESS=_address(temporal_env),
        BATON_WORKER_GRACEFUL_SHUTDOWN_S=str(grace_s),
        **extra,
    )
    proc = subprocess.Popen(
        [BATON, "worker"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    client = temporal_env.client
    try:
        launched = await launch_session(
            client,
            engine,
            task_queue=queue,
            config=TEST_CONFIG,
            ref="slow",
            prompt="go",
            provenance=Provenance(),
            sync=False,
        )
        await _wait_turn_started(client, launched.session_id)
        stopped = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = await asyncio.to_thread(proc.communicate, timeout=180)
        took = time.monotonic() - stopped
        messages = await _resumed(client, engine, queue, launched.session_id) if resume else []
    finally:
        if proc.poll() is None:
            proc.kill()
        engine.dispose()
    handle = client.get_workflow_handle(launched.session_id)
    history = await handle.fetch_history()
    await handle.terminate("test over")
    return _Stopped(proc.returncode, took, out, err, history, messages)


async def _resumed(client: Client, engine: Engine, queue: str, session_id: str) -> list[MessageRow]:
    """Run a worker on ``queue`` until the session is idle again; its transcript."""
    async with build_worker(client, engine=engine, task_queue=queue):
        await wait_for(lambda: status(engine, session_id) == "idle", timeout=READY_TIMEOUT_S)
    with session_scope(engine) as s:
        return session_store.messages(s, session_id=session_id)


@pytest.mark.parametrize(("grace_s", "drained"), [(30, True), (1, False)])
async def test_sigterm_drains_in_flight_activities_within_the_grace_period(
    grace_s: int, drained: bool, temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """SIGTERM lets a 4 s turn finish under a 30 s grace; a 1 s grace cuts it (exit 0 both)."""
    stopped = await _stop_worker_mid_turn(temporal_env, tmp_path, grace_s)
    assert stopped.code == 0, stopped.err
    # Bounded by the grace, with room for a loaded machine's exit; whether the turn was
    # drained or cut is read from the history below, not from the clock.
    assert stopped.took < grace_s + 60
    assert bool(stopped.model_turns_completed()) is drained


async def test_a_reply_cut_by_a_stopping_worker_is_streamed_again_whole(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """A worker stopped mid-stream past its grace keeps nothing of the reply it was
    streaming: the next worker streams it again whole, runs its tool call and ends the
    turn idle (the cut text was stored as the reply, its tool call lost, the session
    left running for ever)."""
    playbook: list[dict[str, Any]] = [
        {"when": "^calculator: ", "reply": "done: {last_message}"},
        {
            "reply": "w " * 40,
            "chunk_delay_ms": 100,
            "tool_calls": [{"tool": "calculator", "args": {"expression": "6*7"}}],
        },
    ]
    stopped = await _stop_worker_mid_turn(
        temporal_env, tmp_path, 1, playbook, resume=True, tools=("calculator",)
    )
    assert stopped.code == 0, stopped.err
    assert [(m.role, m.text) for m in stopped.messages] == [
        ("user", "go"),
        ("assistant", "w " * 40),
        ("tool", "42"),
        ("assistant", "done: 42"),
    ]
    assert stopped.messages[1].tool_calls == [
        {"id": "call_0_0", "name": "calculator", "args": {"expression": "6*7"}}
    ]


async def test_a_stopped_worker_exports_the_spans_it_still_buffered(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """A worker stopped by SIGTERM (which leaves without finalizing the interpreter) still
    exports the drained turn's spans it had buffered, and exits 0 with no crash or traceback."""
    stopped = await _stop_worker_mid_turn(
        temporal_env,
        tmp_path,
        30,
        OTEL_TRACES_EXPORTER="console",
        # Nothing is exported on the batch schedule in this test: only the stop's flush.
        OTEL_BSP_SCHEDULE_DELAY="600000",
    )
    assert stopped.code == 0, stopped.err
    assert stopped.model_turns_completed() == 1
    assert '"name": "RunActivity:model_turn"' in stopped.out
    assert "Fatal Python error" not in stopped.err and "Traceback" not in stopped.err


# --- the worker's sticky cache ----------------------------------------


def test_worker_cache_size_is_bounded_at_its_edges() -> None:
    """BATON_WORKER_MAX_CACHED_WORKFLOWS: 0..100,000 accepted (default the SDK's 1,000)."""
    from pydantic import ValidationError

    assert Settings(_env_file=None).worker_max_cached_workflows == 1000
    assert Settings(_env_file=None, worker_max_cached_workflows=0).worker_max_cached_workflows == 0
    assert Settings(_env_file=None, worker_max_cached_workflows=100_000).worker_max_cached_workflows
    for bad in (-1, 100_001):
        with pytest.raises(ValidationError):
            Settings(_env_file=None, worker_max_cached_workflows=bad)


async def test_the_worker_keeps_as_many_runs_as_settings_say(
    temporal_env: WorkflowEnvironment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`baton worker`'s services build the worker with BATON_WORKER_MAX_CACHED_WORKFLOWS."""
    import worker.stack as stack

    built: list[Worker] = []

    def spy(*args: Any, **kwargs: Any) -> Worker:
        built.append(build_worker(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(stack, "build_worker", spy)
    settings = Settings(
        _env_file=None,
        database_url=migrated(f"sqlite:///{tmp_path / 'cache.db'}"),
        temporal_address=temporal_env.client.service_client.config.target_host,
        task_queue=f"tq-{uuid.uuid4()}",
        worker_max_cached_workflows=7,
    )
    stop = asyncio.Event()
    stop.set()  # start, then stop at once
    await stack.run_services(settings, stop=stop)
    (worker,) = built
    assert worker.config()["max_cached_workflows"] == 7


# --- worker versioning ---------------------------------------------------------


async def test_a_versioned_worker_runs_sessions_as_auto_upgrade(
    temporal_env: WorkflowEnvironment, db_engine: Engine
) -> None:
    """BATON_WORKER_DEPLOYMENT set: the worker registers deployment+build; sessions auto-upgrade."""
    name = f"baton-test-{uuid.uuid4().hex[:8]}"
    settings = Settings(_env_file=None, worker_deployment=name, build_id="build-7")
    config = deployment_config(settings)
    assert config is not None and config.version.build_id == "build-7"
    assert deployment_config(Settings(_env_file=None)) is None
    client = temporal_env.client
    publish(db_engine, "versioned", playbook=[{"reply": "pinned? no, upgrading"}])
    queue = f"tq-{uuid.uuid4()}"
    worker = build_worker(client, engine=db_engine, task_queue=queue, deployment=config)
    async with worker:
        # The version exists once the worker has polled; then an operator makes it current.
        deadline = time.monotonic() + 30
        while True:
            try:
                await client.workflow_service.set_worker_deployment_current_version(
                    SetWorkerDeploymentCurrentVersionRequest(
                        namespace=client.namespace, deployment_name=name, build_id="build-7"
                    )
                )
                break
            except RPCError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
        launched = await launch_session(
            client,
            db_engine,
            task_queue=queue,
            config=TEST_CONFIG,
            ref="versioned",
            prompt="hi",
            provenance=Provenance(),
            sync=True,
        )
    assert launched.response == "pinned? no, upgrading"
    desc = await client.get_workflow_handle(launched.session_id).describe()
    info = desc.raw_description.workflow_execution_info.versioning_info
    assert info.behavior == VersioningBehavior.VERSIONING_BEHAVIOR_AUTO_UPGRADE
    assert (info.deployment_version.deployment_name, info.deployment_version.build_id) == (
        name,
        "build-7",
    )


def test_baton_api_stops_on_sigterm_with_an_sse_follower_connected(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """SIGTERM ends `baton api` (exit 0, within seconds) even while an SSE stream is open."""
    db = f"sqlite:///{tmp_path / 'a.db'}"
    engine = make_engine(db)
    init_db(engine)
    sid = f"session-{uuid.uuid4()}"
    with session_scope(engine) as s:  # a running session with nothing to say: the stream idles
        session_store.create_session(
            s,
            session_id=sid,
            agent_slug="quiet",
            agent_version=1,
            provenance=Provenance(),
            name="q",
        )
    engine.dispose()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BATON_", "TEMPORAL_"))}
    env.update(BATON_DATABASE_URL=db, BATON_TEMPORAL_ADDRESS=_address(temporal_env))
    proc = subprocess.Popen([BATON, "api", "--port", str(port)], env=env, stdout=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/readyz", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "API did not start"
            time.sleep(0.2)
        with httpx.stream("GET", f"{base}/v1/sessions/{sid}/events", timeout=30) as stream:
            assert stream.status_code == 200
            proc.send_signal(signal.SIGTERM)
            stopped = time.monotonic()
            proc.wait(timeout=180)
            took = time.monotonic() - stopped
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    # An open stream never ends by itself: without the bound the API would never exit. A
    # generous margin over the 3 s grace, for a loaded machine's exit.
    assert took < API_GRACEFUL_SHUTDOWN_S + 60


def test_new_settings_are_bounded_at_their_edges() -> None:
    """Grace 0..3600 s and connect timeout (0, 300] s accepted at the bounds, refused past."""
    from pydantic import ValidationError

    assert Settings(_env_file=None, worker_graceful_shutdown_s=0).worker_graceful_shutdown_s == 0
    assert Settings(_env_file=None, worker_graceful_shutdown_s=3600).worker_graceful_shutdown_s
    assert Settings(_env_file=None, temporal_connect_timeout=300).temporal_connect_timeout == 300
    for bad in (
        {"worker_graceful_shutdown_s": -1},
        {"worker_graceful_shutdown_s": 3601},
        {"temporal_connect_timeout": 0},
        {"temporal_connect_timeout": 301},
        {"worker_deployment": ""},
        {"worker_deployment": "has space"},
        {"build_id": ""},
    ):
        with pytest.raises(ValidationError):
            Settings(_env_file=None, **bad)
    assert Settings(_env_file=None).build_id == version("baton")
