"""`baton apply` as a user runs it: a real process against a SQLite file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from sqlmodel import Session, select

from baton.storage.db import Agent, AgentRevision, make_engine

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "agents.yaml"
_EXAMPLE = yaml.safe_load(EXAMPLES.read_text())
#: How many agents the examples file defines (counted, so adding one keeps tests honest).
EXAMPLE_COUNT = len(_EXAMPLE["agents"])
#: Rows `baton apply` reports for it: its agents and its teams.
EXAMPLE_ROWS = EXAMPLE_COUNT + len(_EXAMPLE.get("teams") or [])


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'apply.db'}"


def baton(db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "BATON_DATABASE_URL": db_url, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def counts(db_url: str) -> tuple[int, int]:
    engine = make_engine(db_url)
    try:
        with Session(engine) as s:
            return len(s.exec(select(Agent)).all()), len(s.exec(select(AgentRevision)).all())
    finally:
        engine.dispose()


def test_examples_publish_then_a_second_apply_changes_nothing(db_url: str) -> None:
    """A fresh apply of the examples publishes each at version 1; applying again is a no-op."""
    first = baton(db_url, "apply", "-f", str(EXAMPLES))
    assert first.returncode == 0, first.stderr
    assert first.stdout.count("created") == EXAMPLE_ROWS
    before = counts(db_url)
    second = baton(db_url, "apply", "-f", str(EXAMPLES))
    assert second.returncode == 0, second.stderr
    assert second.stdout.count("unchanged") == EXAMPLE_ROWS
    assert counts(db_url) == before == (EXAMPLE_COUNT, EXAMPLE_COUNT)


def test_changed_agent_is_republished_alone(db_url: str, tmp_path: Path) -> None:
    """Editing one agent in the file publishes version 2 of that agent only."""
    baton(db_url, "apply", "-f", str(EXAMPLES))
    edited = tmp_path / "agents.yaml"
    edited.write_text(
        EXAMPLES.read_text().replace("Write clear, well-structured", "Write crisp, well-structured")
    )
    out = baton(db_url, "apply", "-f", str(edited))
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("published") == 1 and out.stdout.count("unchanged") == EXAMPLE_ROWS - 1
    assert counts(db_url) == (EXAMPLE_COUNT, EXAMPLE_COUNT + 1)


def test_bases_are_published_first_whatever_the_file_order(db_url: str, tmp_path: Path) -> None:
    """An agent listed before the base it extends still publishes."""
    f = tmp_path / "agents.yaml"
    f.write_text(
        "agents:\n"
        "  - {slug: child, name: Child, spec: {extends: base, system_prompt: child}}\n"
        "  - {slug: base, name: Base, spec: {system_prompt: base}}\n"
    )
    out = baton(db_url, "apply", "-f", str(f))
    assert out.returncode == 0, out.stderr
    assert counts(db_url) == (2, 2)


def test_a_failing_agent_writes_nothing(db_url: str, tmp_path: Path) -> None:
    """One invalid agent fails the whole apply (exit 1, code printed) and nothing is written."""
    f = tmp_path / "agents.yaml"
    f.write_text(
        "agents:\n"
        "  - {slug: good, name: Good, spec: {system_prompt: fine}}\n"
        "  - {slug: bad, name: Bad, spec: {extends: ghost}}\n"
    )
    out = baton(db_url, "apply", "-f", str(f))
    assert out.returncode == 1
    assert "unknown_agent" in out.stderr and "extends" in out.stderr
    assert counts(db_url) == (0, 0)


def test_removed_and_unknown_fields_are_reported_with_their_path(
    db_url: str, tmp_path: Path
) -> None:
    """maxFanout is refused as removed_field; a misspelt field as invalid_spec; both with paths."""
    f = tmp_path / "agents.yaml"
    f.write_text("agents:\n  - {slug: a, name: A, spec: {limits: {maxFanout: 2}}}\n")
    out = baton(db_url, "apply", "-f", str(f))
    assert out.returncode == 1
    assert "removed_field" in out.stderr and "agents[0].spec.limits.maxFanout" in out.stderr
    f.write_text("agents:\n  - {slug: a, name: A, spec: {system_promt: hi}}\n")
    out = baton(db_url, "apply", "-f", str(f))
    assert out.returncode == 1
    assert "invalid_spec" in out.stderr and "agents[0].spec.system_promt" in out.stderr


def test_metadata_or_draft_change_is_reported_as_updated(db_url: str, tmp_path: Path) -> None:
    """A name-only change is applied and reported as `updated`, not `unchanged`."""
    baton(db_url, "apply", "-f", str(EXAMPLES))
    edited = tmp_path / "agents.yaml"
    edited.write_text(EXAMPLES.read_text().replace("name: Writer", "name: Writer Two"))
    out = baton(db_url, "apply", "-f", str(edited))
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("updated") == 1 and out.stdout.count("unchanged") == EXAMPLE_ROWS - 1
    assert counts(db_url) == (EXAMPLE_COUNT, EXAMPLE_COUNT)


def test_extends_cycle_within_the_file_is_reported_as_a_cycle(db_url: str, tmp_path: Path) -> None:
    """Two agents extending each other in one file fail with inheritance_cycle at the first."""
    f = tmp_path / "agents.yaml"
    f.write_text(
        "agents:\n"
        "  - {slug: a1, name: A1, spec: {extends: a2}}\n"
        "  - {slug: a2, name: A2, spec: {extends: a1}}\n"
    )
    out = baton(db_url, "apply", "-f", str(f))
    assert out.returncode == 1
    assert "inheritance_cycle" in out.stderr and "agents[0].spec.extends" in out.stderr


def test_registry_errors_name_the_agent_in_the_file(db_url: str, tmp_path: Path) -> None:
    """A publish error points at agents[i] and names the slug."""
    f = tmp_path / "agents.yaml"
    f.write_text(
        "agents:\n"
        "  - {slug: good, name: Good}\n"
        "  - {slug: bad, name: Bad, spec: {subagents: [{alias: x, agent: ghost}]}}\n"
    )
    out = baton(db_url, "apply", "-f", str(f))
    assert out.returncode == 1
    assert "agents[1].spec.subagents[0].agent" in out.stderr and "bad:" in out.stderr


def test_a_file_that_is_not_a_mapping_is_refused_clearly(db_url: str, tmp_path: Path) -> None:
    """A YAML list at top level is invalid_apply_file with a plain message."""
    f = tmp_path / "agents.yaml"
    f.write_text("- slug: a\n")
    out = baton(db_url, "apply", "-f", str(f))
    assert out.returncode == 1
    assert "invalid_apply_file" in out.stderr and "mapping" in out.stderr


def test_yaml_aliases_and_bad_encodings_are_refused(db_url: str, tmp_path: Path) -> None:
    """Anchors/aliases and non-UTF-8 files fail as invalid_apply_file without a traceback."""
    f = tmp_path / "agents.yaml"
    f.write_text("x: &a [1, 2]\nagents:\n  - {slug: a, name: *a}\n")
    out = baton(db_url, "apply", "-f", str(f))
    assert out.returncode == 1 and "invalid_apply_file" in out.stderr and "alias" in out.stderr
    f.write_bytes(b"agents:\n  - {slug: a, name: \xff\xfe}\n")
    out = baton(db_url, "apply", "-f", str(f))
    assert out.returncode == 1 and "invalid_apply_file" in out.stderr
    assert "Traceback" not in out.stderr
