"""Alembic migrations: models and revisions agree, upgrades keep data, a
``create_all`` database is adopted, and ``baton api`` / ``baton worker`` refuse a
database behind the code."""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import os
import subprocess
import sys
import threading
import time
import tomllib
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url
from sqlmodel import SQLModel, select
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.testing import WorkflowEnvironment
from typer.testing import CliRunner, Result

from baton.settings import get_settings
from baton.storage import migrate
from baton.storage.db import Agent, MessageRow, SessionRow, init_db, make_engine, session_scope
from cli import app
from tests.helpers import READY_TIMEOUT_S
from tests.test_fault import worker_env
from worker.stack import free_port, stop_process

ROOT = Path(__file__).resolve().parent.parent
BATON = [sys.executable, "-m", "cli"]


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of a database with nothing in it: a new SQLite file, or a new PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'm.db'}"
        return
    server = make_url(request.getfixturevalue("pg_url"))
    name = f"mig_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        yield server.set(database=name).render_as_string(hide_password=False)
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


@pytest.fixture
def empty_engine(empty_url: str) -> Iterator[Engine]:
    """An engine on :func:`empty_url`."""
    engine = make_engine(empty_url)
    try:
        yield engine
    finally:
        engine.dispose()


def add_rows(engine: Engine) -> None:
    """An agent, a session and one message: rows an upgrade must keep.

    Written through the tables as the database has them (reflected), with the models'
    defaults: a database at an older revision lacks the columns added since (e.g.
    ``sessions.resume_input``), which an ORM insert would name.
    """
    rows_ = [
        Agent(slug="keeper", name="Keeper"),
        SessionRow(id="session-keep", agent_slug="keeper", agent_version=1),
        MessageRow(id="m1", session_id="session-keep", position="0001", role="user", text="hi"),
    ]
    with engine.begin() as conn:
        for row in rows_:
            table = sa.Table(str(row.__tablename__), sa.MetaData(), autoload_with=conn)
            values = {c.name: getattr(row, c.name, None) for c in table.columns}
            # None: the column's own default (an autoincrement id, NULL).
            values = {k: v for k, v in values.items() if v is not None}
            conn.execute(table.insert().values(**values))


def rows(engine: Engine) -> tuple[list[str], list[str]]:
    with session_scope(engine) as s:
        agents = [a.slug for a in s.exec(select(Agent)).all()]
        texts = [m.text for m in s.exec(select(MessageRow)).all()]
    return agents, texts


def test_models_and_migrations_agree(empty_engine: Engine) -> None:
    """An empty database upgraded to head has exactly the models' schema (autogenerate: no diff)."""
    migrate.upgrade(empty_engine)
    assert migrate.model_diff(empty_engine) == []
    assert migrate.schema_state(empty_engine).up_to_date


def test_model_diff_sees_a_missing_column(empty_engine: Engine) -> None:
    """The agreement check can fail: a column the models have and the database lacks is a diff."""
    migrate.upgrade(empty_engine)
    with empty_engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE teams DROP COLUMN shared_channel"))
    diff = migrate.model_diff(empty_engine)
    assert [d[0] for d in diff if isinstance(d, tuple)] == ["add_column"]


def test_upgrade_from_each_revision_keeps_data(empty_engine: Engine) -> None:
    """A database at every earlier revision, with rows in it, upgrades to head keeping its rows."""
    revisions = [s.revision for s in reversed(migrate.history())]
    assert revisions[0] == migrate.BASELINE
    for start in revisions:
        migrate.downgrade(empty_engine, "base")
        migrate.upgrade(empty_engine, start)
        add_rows(empty_engine)
        before, after = migrate.upgrade(empty_engine)
        assert (before, after) == (start, migrate.head_revision())
        assert rows(empty_engine) == (["keeper"], ["hi"])
        assert migrate.model_diff(empty_engine) == []


def pre_migration_database(engine: Engine) -> None:
    """What Baton's start-up create_all made before migrations existed: revision 0001's
    schema (equal to the models' while 0001 was head, see the agreement test) with no
    revision stamp. Built from 0001, so the test stays true after later revisions."""
    migrate.upgrade(engine, migrate.BASELINE)
    with engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE alembic_version"))


def test_create_all_database_is_adopted(empty_engine: Engine) -> None:
    """A database made by create_all before migrations, with data, is stamped and upgraded."""
    pre_migration_database(empty_engine)
    add_rows(empty_engine)
    state = migrate.schema_state(empty_engine)
    assert state.legacy
    with pytest.raises(migrate.SchemaOutOfDate, match="run 'baton db upgrade'"):
        migrate.require_current(empty_engine)
    assert migrate.upgrade(empty_engine) == (None, migrate.head_revision())
    assert rows(empty_engine) == (["keeper"], ["hi"])
    assert migrate.require_current(empty_engine).up_to_date


def test_legacy_database_that_differs_is_not_adopted(tmp_path: Path) -> None:
    """A create_all database missing a baseline column is refused, named, and left unstamped."""
    engine = make_engine(f"sqlite:///{tmp_path / 'old.db'}")
    SQLModel.metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE steps DROP COLUMN attempts"))
    with pytest.raises(migrate.SchemaOutOfDate, match=r"missing steps\.attempts"):
        migrate.upgrade(engine)
    assert migrate.schema_state(engine).legacy
    engine.dispose()


def test_init_db_never_migrates_an_existing_database(tmp_path: Path) -> None:
    """init_db (CLI database commands, tests) builds an empty database but refuses a legacy one."""
    engine = make_engine(f"sqlite:///{tmp_path / 'i.db'}")
    init_db(engine)
    assert migrate.schema_state(engine).up_to_date
    init_db(engine)  # current: accepted, nothing to do
    legacy = make_engine(f"sqlite:///{tmp_path / 'legacy.db'}")
    SQLModel.metadata.create_all(legacy)
    with pytest.raises(migrate.SchemaOutOfDate):
        init_db(legacy)
    assert migrate.schema_state(legacy).current is None
    engine.dispose()
    legacy.dispose()


def test_unknown_revision_starts_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A revision this code does not ship (a newer Baton migrated) is allowed, with a warning."""
    engine = make_engine(f"sqlite:///{tmp_path / 'ahead.db'}")
    migrate.upgrade(engine)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = '9999'"))
    with caplog.at_level(logging.WARNING, logger="baton.migrate"):
        state = migrate.require_current(engine)
    assert state.unknown
    assert "unknown to this Baton" in caplog.text
    engine.dispose()


def test_concurrent_upgrades_on_postgresql_run_one_after_the_other(pg_url: str) -> None:
    """Two migration jobs started at once on PostgreSQL both succeed; the schema is made once."""
    server = make_url(pg_url)
    name = f"mig_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    engine = make_engine(server.set(database=name).render_as_string(hide_password=False))
    results: list[tuple[str | None, str | None]] = []
    errors: list[BaseException] = []

    def job() -> None:
        try:
            results.append(migrate.upgrade(engine))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=job) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    engine.dispose()
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE "{name}" WITH (FORCE)'))
    admin.dispose()
    assert errors == []
    head = migrate.head_revision()
    assert sorted(results, key=str) == sorted([(None, head), (head, head)], key=str)


def test_migrations_ship_as_package_data() -> None:
    """Every non-Python file Alembic needs and every revision are in the package data globs."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "migrations*" in config["packages"]["find"]["include"]
    globs = config["package-data"]["migrations"]
    needed = [
        p.relative_to(migrate.MIGRATIONS_DIR).as_posix()
        for p in migrate.MIGRATIONS_DIR.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.name not in {"__init__.py", "env.py"}
    ]
    assert "script.py.mako" in needed
    assert any(n.startswith("versions/") for n in needed)
    uncovered = [n for n in needed if not any(fnmatch.fnmatch(n, g) for g in globs)]
    assert uncovered == []


# --- the real commands, as processes -------------------------------------------------


def baton(
    db_url: str, *args: str, cwd: Path = ROOT, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``baton ARGS`` on ``db_url`` as a real process; ``timeout`` only stops a hang."""
    env = {**os.environ, "BATON_DATABASE_URL": db_url, "COLUMNS": "200"}
    return subprocess.run(
        [*BATON, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_db_commands_report_and_upgrade(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`baton db current/upgrade/history`: state, idempotent upgrade, one-line bad revision."""
    monkeypatch.setenv("BATON_DATABASE_URL", f"sqlite:///{tmp_path / 'cli.db'}")
    runner = CliRunner()

    def run(*args: str) -> Result:
        get_settings.cache_clear()
        return runner.invoke(app, ["db", *args], catch_exceptions=False)

    try:
        head = migrate.head_revision()
        assert "has no Baton schema: run 'baton db upgrade'" in run("current").stdout
        assert f"upgraded to {head}" in run("upgrade").stdout
        assert "nothing to do" in run("upgrade").stdout
        assert f"at revision {head} (head)" in run("current").stdout
        assert migrate.BASELINE in run("history").stdout
        bad = run("upgrade", "nope")
        assert bad.exit_code == 1
        assert "[migration_failed]" in bad.stderr
        assert "base (no schema)" in run("downgrade", "base").stdout
        assert "has no Baton schema" in run("current").stdout
    finally:
        get_settings.cache_clear()


def test_db_upgrade_works_from_any_folder(tmp_path: Path) -> None:
    """`baton db upgrade` run outside the repository finds the revisions shipped with Baton."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    db_url = f"sqlite:///{tmp_path / 'cli.db'}"
    up = baton(db_url, "db", "upgrade", cwd=elsewhere)
    assert up.returncode == 0, up.stderr
    assert f"upgraded to {migrate.head_revision()}" in up.stdout


def unmigrated(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(label, URL) of databases behind the code: empty, create_all-made, each older revision."""
    yield "empty", f"sqlite:///{tmp_path / 'empty.db'}"
    legacy = f"sqlite:///{tmp_path / 'legacy.db'}"
    engine = make_engine(legacy)
    SQLModel.metadata.create_all(engine)
    engine.dispose()
    yield "create_all", legacy
    revisions = [s.revision for s in reversed(migrate.history())][:-1]
    for rev in revisions:
        url = f"sqlite:///{tmp_path / f'at-{rev}.db'}"
        engine = make_engine(url)
        migrate.upgrade(engine, rev)
        engine.dispose()
        yield rev, url


@pytest.mark.parametrize("command", ["api", "worker"])
# One real process per revision behind the head (16 now), each a few seconds to start on
# a loaded machine: more than the suite's default 180 s.
@pytest.mark.timeout(900)
def test_api_and_worker_refuse_a_database_behind_the_code(command: str, tmp_path: Path) -> None:
    """`baton api` / `baton worker` on a database behind the code: one line, the fix, exit 1."""
    for label, url in unmigrated(tmp_path):
        args = ["api", "--port", str(free_port())] if command == "api" else ["worker"]
        out = baton(url, *args)
        assert out.returncode == 1, (label, out.stdout, out.stderr)
        assert "[schema_out_of_date]" in out.stderr, label
        assert "run 'baton db upgrade'" in out.stderr, label
        assert "Traceback" not in out.stderr, label
        assert len(out.stderr.strip().splitlines()) == 1, (label, out.stderr)


def wait_until(check: Callable[[], bool], timeout: float = READY_TIMEOUT_S) -> None:
    """Poll ``check`` every 0.1 s until true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    pytest.fail("timed out")


def test_api_starts_on_a_migrated_database(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """After `baton db upgrade`, `baton api` starts and answers /healthz (the refusal can pass)."""
    db_url = f"sqlite:///{tmp_path / 'ok.db'}"
    assert baton(db_url, "db", "upgrade").returncode == 0
    port = free_port()
    address = temporal_env.client.service_client.config.target_host
    env = {**os.environ, "BATON_DATABASE_URL": db_url, "BATON_TEMPORAL_ADDRESS": address}
    proc = subprocess.Popen(
        [*BATON, "api", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )

    def healthy() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"baton api exited: {proc.stderr.read() if proc.stderr else ''!r}")
        try:
            return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(healthy)
    finally:
        stop_process(proc, timeout=60)


async def test_worker_starts_on_a_migrated_database(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """After `baton db upgrade`, `baton worker` starts and polls its task queue."""
    db_url = f"sqlite:///{tmp_path / 'okw.db'}"
    assert baton(db_url, "db", "upgrade").returncode == 0
    queue = f"tq-{uuid.uuid4()}"
    env = worker_env(db_url, temporal_env, queue)
    proc = subprocess.Popen(
        [*BATON, "worker"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    request = DescribeTaskQueueRequest(
        namespace=temporal_env.client.namespace,
        task_queue=TaskQueue(name=queue),
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
    )
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else b""
            described = await temporal_env.client.workflow_service.describe_task_queue(request)
            if described.pollers:
                break
            assert time.monotonic() < deadline, "the worker never polled"
            await asyncio.sleep(0.2)
    finally:
        stop_process(proc, timeout=60)
