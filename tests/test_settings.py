"""Settings: BATON_ prefix, defaults, validation, redaction, nothing read at import."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from baton.contracts.workflow_io import SessionConfig
from baton.settings import Settings

ROOT = Path(__file__).resolve().parent.parent


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """Defaults: SQLite under ./.baton, 300 s reviews, depth 3, auth off, scripted model."""
    for var in ("BATON_DATABASE_URL", "BATON_REVIEW_TIMEOUT", "BATON_MODEL", "BATON_AUTH"):
        monkeypatch.delenv(var, raising=False)
    s = Settings(_env_file=None)
    assert s.database_url == "sqlite:///./.baton/baton.db"
    assert s.sqlite_path() == Path(".baton/baton.db")
    assert (s.review_timeout, s.max_delegation_depth, s.auth, s.model) == (300.0, 3, "off", None)
    assert (s.temporal_address, s.temporal_namespace, s.task_queue) == (
        "localhost:7233",
        "default",
        "baton",
    )


def test_a_session_runs_with_the_settings_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no BATON_* variable set, a session's config equals SessionConfig's own defaults
    (each default is written once: a literal added to Settings alone would differ here)."""
    for var in list(os.environ):
        if var.startswith("BATON_"):
            monkeypatch.delenv(var)
    assert Settings(_env_file=None).session_config() == SessionConfig()


def test_env_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    """BATON_* variables set the fields."""
    monkeypatch.setenv("BATON_REVIEW_TIMEOUT", "2.5")
    monkeypatch.setenv("BATON_AUTH", "on")
    monkeypatch.setenv("BATON_TASK_QUEUE", "q1")
    s = Settings(_env_file=None)
    assert (s.review_timeout, s.auth, s.task_queue) == (2.5, "on", "q1")


def test_depth_cannot_exceed_the_runtime_ceiling() -> None:
    """max_delegation_depth equal to the ceiling is fine; one past it is refused."""
    assert Settings(max_delegation_depth=5, runtime_depth_ceiling=5).max_delegation_depth == 5
    with pytest.raises(ValidationError):
        Settings(max_delegation_depth=6, runtime_depth_ceiling=5)


def test_bad_values_are_refused() -> None:
    """A non-positive review timeout or an unknown auth mode is a validation error."""
    with pytest.raises(ValidationError):
        Settings(review_timeout=0)
    with pytest.raises(ValidationError):
        Settings(auth="maybe")


@pytest.mark.parametrize("value", ["0", "-1", "inf", "nan", str(7 * 86400 + 1)])
def test_session_idle_timeout_is_positive_finite_and_at_most_a_week(value: str) -> None:
    """BATON_SESSION_IDLE_TIMEOUT: 0, negative, inf/nan or over 7 days is refused; a week
    and a fraction of a second are taken, and reach the sessions' config."""
    with pytest.raises(ValidationError):
        Settings(session_idle_timeout=value)
    assert Settings(session_idle_timeout=7 * 86400).session_config().idle_timeout_s == 7 * 86400
    assert Settings(session_idle_timeout=0.5).session_config().idle_timeout_s == 0.5


def test_repr_hides_the_database_password() -> None:
    """The database password never appears in repr/str of the settings."""
    s = Settings(database_url="postgresql+psycopg://baton:s3cret-pw@db:5432/baton")
    assert "s3cret-pw" not in repr(s) and "s3cret-pw" not in str(s)
    assert "***" in s.database_url_redacted


def test_importing_reads_no_settings_and_touches_no_disk(tmp_path: Path) -> None:
    """Importing the app, CLI and registry neither loads settings nor creates ./.baton."""
    code = (
        "import api.app, cli, baton.agents.registry, baton.agents.apply\n"
        "from baton.settings import get_settings\n"
        "assert get_settings.cache_info().currsize == 0\n"
        "import os; assert not os.path.exists('.baton')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
