"""`baton apply` as a user runs it: a real process against a real API (uvicorn on a
loopback port, its own SQLite file), like `kubectl apply`; and `--direct-db`, the
bootstrap that writes the database in one transaction."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from sqlmodel import Session, select

from api.app import create_app
from baton.grants import auth
from baton.settings import Settings
from baton.storage.db import Agent, AgentRevision, init_db, make_engine, session_scope
from tests.conftest import serve
from worker.stack import free_port

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "agents.yaml"
_EXAMPLE = yaml.safe_load(EXAMPLES.read_text())
#: How many agents the examples file defines (counted, so adding one keeps tests honest).
EXAMPLE_COUNT = len(_EXAMPLE["agents"])
#: Rows `baton apply` reports for it: its agents and its teams.
EXAMPLE_ROWS = EXAMPLE_COUNT + len(_EXAMPLE.get("teams") or [])


@dataclass
class Api:
    """A running API: its base URL and the URL of the database behind it."""

    url: str
    db_url: str


def _serve_api(tmp_path: Path, **settings: Any) -> Iterator[Api]:
    db_url = f"sqlite:///{tmp_path / 'apply.db'}"
    # No Temporal: apply touches only the registry routes (a closed port, never dialled).
    config = Settings(database_url=db_url, temporal_address=f"127.0.0.1:{free_port()}", **settings)
    engine = make_engine(db_url)
    init_db(engine)
    engine.dispose()
    server, thread, base = serve(create_app(config))
    try:
        yield Api(base, db_url)
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    """The real API (auth off) on a loopback port, with its own SQLite file."""
    yield from _serve_api(tmp_path)


def baton(
    api: Api | str, *args: str, cwd: Path | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    """``baton ARGS`` as a real process, pointed at ``api`` by BATON_API_URL only (a
    database URL string instead: BATON_DATABASE_URL, for ``--direct-db``)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("BATON_")}
    base |= {"COLUMNS": "200", "BATON_REVIEW_SECRET": os.environ["BATON_REVIEW_SECRET"]}
    if isinstance(api, Api):
        base["BATON_API_URL"] = api.url
    else:
        base["BATON_DATABASE_URL"] = api
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        env=base | env,
        capture_output=True,
        text=True,
        timeout=300,  # only stops a hang: a start under a second suite's load is slow
        check=False,
        cwd=cwd,
    )


def counts(db_url: str) -> tuple[int, int]:
    engine = make_engine(db_url)
    try:
        with Session(engine) as s:
            return len(s.exec(select(Agent)).all()), len(s.exec(select(AgentRevision)).all())
    finally:
        engine.dispose()


def test_examples_publish_then_a_second_apply_changes_nothing(api: Api) -> None:
    """A fresh apply of the examples publishes each at version 1; applying again is a no-op."""
    first = baton(api, "apply", "-f", str(EXAMPLES))
    assert first.returncode == 0, first.stderr
    assert first.stdout.count("created") == EXAMPLE_ROWS
    before = counts(api.db_url)
    second = baton(api, "apply", "-f", str(EXAMPLES))
    assert second.returncode == 0, second.stderr
    assert second.stdout.count("unchanged") == EXAMPLE_ROWS
    assert counts(api.db_url) == before == (EXAMPLE_COUNT, EXAMPLE_COUNT)


def test_changed_agent_is_republished_alone(api: Api, tmp_path: Path) -> None:
    """Editing one agent in the file publishes version 2 of that agent only."""
    baton(api, "apply", "-f", str(EXAMPLES))
    edited = tmp_path / "agents.yaml"
    edited.write_text(
        EXAMPLES.read_text().replace("Write clear, well-structured", "Write crisp, well-structured")
    )
    out = baton(api, "apply", "-f", str(edited))
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("published") == 1 and out.stdout.count("unchanged") == EXAMPLE_ROWS - 1
    assert counts(api.db_url) == (EXAMPLE_COUNT, EXAMPLE_COUNT + 1)


def test_bases_are_published_first_whatever_the_file_order(api: Api, tmp_path: Path) -> None:
    """An agent listed before the base it extends still publishes."""
    f = tmp_path / "agents.yaml"
    f.write_text(
        "agents:\n"
        "  - {slug: child, name: Child, spec: {extends: base, system_prompt: child}}\n"
        "  - {slug: base, name: Base, spec: {system_prompt: base}}\n"
    )
    out = baton(api, "apply", "-f", str(f))
    assert out.returncode == 0, out.stderr
    assert counts(api.db_url) == (2, 2)


def test_a_refused_agent_stops_the_apply_and_the_fixed_file_converges(
    api: Api, tmp_path: Path
) -> None:
    """The API's refusal of one agent is one located line and exit 1; nothing of the
    refused agent goes live, and applying the fixed file again publishes it."""
    f = tmp_path / "agents.yaml"
    f.write_text(
        "agents:\n"
        "  - {slug: good, name: Good, spec: {system_prompt: fine}}\n"
        "  - {slug: bad, name: Bad, spec: {extends: ghost}}\n"
    )
    out = baton(api, "apply", "-f", str(f))
    assert out.returncode == 1
    (line,) = [x for x in out.stderr.splitlines() if x.strip()]
    assert "[unknown_agent] at agents[1].spec.extends: bad:" in line
    with httpx.Client(base_url=api.url) as http:
        assert http.get("/v1/agents/bad").json()["live_version"] is None
    f.write_text(f.read_text().replace("extends: ghost", "extends: good"))
    fixed = baton(api, "apply", "-f", str(f))
    assert fixed.returncode == 0, fixed.stderr
    with httpx.Client(base_url=api.url) as http:
        assert http.get("/v1/agents/bad").json()["live_version"] == 1


def test_a_file_error_sends_nothing(api: Api, tmp_path: Path) -> None:
    """A slug listed twice is refused from the file alone: exit 1 and no agent exists."""
    f = tmp_path / "agents.yaml"
    f.write_text(
        "agents:\n"
        "  - {slug: twice, name: One, spec: {system_prompt: one}}\n"
        "  - {slug: twice, name: Two, spec: {system_prompt: two}}\n"
    )
    out = baton(api, "apply", "-f", str(f))
    assert out.returncode == 1
    assert "invalid_apply_file" in out.stderr and "agents[1].slug" in out.stderr
    assert counts(api.db_url) == (0, 0)


def test_apply_reaches_the_api_and_creates_no_local_database(api: Api, tmp_path: Path) -> None:
    """With only BATON_API_URL set, the agents reach the API's database and no
    ./.baton/baton.db appears in the current folder."""
    out = baton(api, "apply", "-f", str(EXAMPLES), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    with httpx.Client(base_url=api.url) as http:
        assert http.get("/v1/agents/researcher").json()["live_version"] == 1
    assert not (tmp_path / ".baton").exists()


def test_an_unreachable_api_is_one_line(tmp_path: Path) -> None:
    """No API at BATON_API_URL: one line naming it, exit 1, no traceback."""
    out = baton(Api(f"http://127.0.0.1:{free_port()}", ""), "apply", "-f", str(EXAMPLES))
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    (line,) = [x for x in out.stderr.splitlines() if x.strip()]
    assert "cannot reach" in line and "BATON_API_URL" in line


def test_teams_are_listed_with_their_members_live_versions(api: Api, tmp_path: Path) -> None:
    """A team's row names the revisions its run would pin (member@live), not a version 0."""
    first = baton(api, "apply", "-f", str(EXAMPLES))
    assert first.returncode == 0, first.stderr
    edited = tmp_path / "agents.yaml"
    edited.write_text(
        EXAMPLES.read_text().replace("Write clear, well-structured", "Write crisp, well-structured")
    )
    out = baton(api, "apply", "-f", str(edited))
    assert out.returncode == 0, out.stderr
    (row,) = [x for x in out.stdout.splitlines() if "team:research-desk" in x]
    assert "lead@1, fact-checker@1, writer@2" in row and "unchanged" in row


@pytest.fixture
def auth_api(tmp_path: Path) -> Iterator[tuple[Api, str]]:
    """The real API in auth mode, with user alice and her token."""
    for api in _serve_api(tmp_path, auth="on"):
        engine = make_engine(api.db_url)
        try:
            with session_scope(engine) as s:
                auth.create_user(s, user_id="alice")
                _, token = auth.issue_token(s, user_id="alice")
        finally:
            engine.dispose()
        yield api, token


def test_apply_goes_through_the_apis_auth(auth_api: tuple[Api, str]) -> None:
    """In auth mode an apply without a token is refused (401, one line, nothing written);
    with BATON_TOKEN the caller's agents are created and she owns them."""
    api, token = auth_api
    refused = baton(api, "apply", "-f", str(EXAMPLES))
    assert refused.returncode == 1
    assert "[unauthorized]" in refused.stderr or "401" in refused.stderr, refused.stderr
    assert counts(api.db_url) == (0, 0)
    out = baton(api, "apply", "-f", str(EXAMPLES), BATON_TOKEN=token)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("created") == EXAMPLE_ROWS
    engine = make_engine(api.db_url)
    try:
        with session_scope(engine) as s:
            assert auth.acl(s, agent="researcher") == {"alice": "owner"}
    finally:
        engine.dispose()


def test_direct_db_applies_in_one_transaction(tmp_path: Path) -> None:
    """`--direct-db` writes BATON_DATABASE_URL without an API: the examples publish, and a
    file with one failing agent writes nothing at all."""
    db_url = f"sqlite:///{tmp_path / 'direct.db'}"
    out = baton(db_url, "apply", "--direct-db", "-f", str(EXAMPLES))
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("created") == EXAMPLE_ROWS
    assert "lead@1, fact-checker@1, writer@1" in out.stdout
    f = tmp_path / "agents.yaml"
    f.write_text(
        "agents:\n"
        "  - {slug: good, name: Good, spec: {system_prompt: fine}}\n"
        "  - {slug: bad, name: Bad, spec: {extends: ghost}}\n"
    )
    other = f"sqlite:///{tmp_path / 'other.db'}"
    failed = baton(other, "apply", "--direct-db", "-f", str(f))
    assert failed.returncode == 1
    assert "unknown_agent" in failed.stderr and "agents[1].spec.extends" in failed.stderr
    assert counts(other) == (0, 0)


def test_removed_and_unknown_fields_are_reported_with_their_path(api: Api, tmp_path: Path) -> None:
    """maxFanout is refused as removed_field; a misspelt field as invalid_spec; both with paths."""
    f = tmp_path / "agents.yaml"
    f.write_text("agents:\n  - {slug: a, name: A, spec: {limits: {maxFanout: 2}}}\n")
    out = baton(api, "apply", "-f", str(f))
    assert out.returncode == 1
    assert "removed_field" in out.stderr and "agents[0].spec.limits.maxFanout" in out.stderr
    f.write_text("agents:\n  - {slug: a, name: A, spec: {system_promt: hi}}\n")
    out = baton(api, "apply", "-f", str(f))
    assert out.returncode == 1
    assert "invalid_spec" in out.stderr and "agents[0].spec.system_promt" in out.stderr


def test_metadata_or_draft_change_is_reported_as_updated(api: Api, tmp_path: Path) -> None:
    """A name-only change is applied and reported as `updated`, not `unchanged`."""
    baton(api, "apply", "-f", str(EXAMPLES))
    edited = tmp_path / "agents.yaml"
    edited.write_text(EXAMPLES.read_text().replace("name: Writer", "name: Writer Two"))
    out = baton(api, "apply", "-f", str(edited))
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("updated") == 1 and out.stdout.count("unchanged") == EXAMPLE_ROWS - 1
    assert counts(api.db_url) == (EXAMPLE_COUNT, EXAMPLE_COUNT)


def test_extends_cycle_within_the_file_is_reported_as_a_cycle(api: Api, tmp_path: Path) -> None:
    """Two agents extending each other in one file fail with inheritance_cycle at the first."""
    f = tmp_path / "agents.yaml"
    f.write_text(
        "agents:\n"
        "  - {slug: a1, name: A1, spec: {extends: a2}}\n"
        "  - {slug: a2, name: A2, spec: {extends: a1}}\n"
    )
    out = baton(api, "apply", "-f", str(f))
    assert out.returncode == 1
    assert "inheritance_cycle" in out.stderr and "agents[0].spec.extends" in out.stderr


def test_registry_errors_name_the_agent_in_the_file(api: Api, tmp_path: Path) -> None:
    """A publish error points at agents[i] and names the slug."""
    f = tmp_path / "agents.yaml"
    f.write_text(
        "agents:\n"
        "  - {slug: good, name: Good}\n"
        "  - {slug: bad, name: Bad, spec: {subagents: [{alias: x, agent: ghost}]}}\n"
    )
    out = baton(api, "apply", "-f", str(f))
    assert out.returncode == 1
    assert "agents[1].spec.subagents[0].agent" in out.stderr and "bad:" in out.stderr


def test_a_file_that_is_not_a_mapping_is_refused_clearly(api: Api, tmp_path: Path) -> None:
    """A YAML list at top level is invalid_apply_file with a plain message."""
    f = tmp_path / "agents.yaml"
    f.write_text("- slug: a\n")
    out = baton(api, "apply", "-f", str(f))
    assert out.returncode == 1
    assert "invalid_apply_file" in out.stderr and "mapping" in out.stderr


def test_yaml_aliases_and_bad_encodings_are_refused(api: Api, tmp_path: Path) -> None:
    """Anchors/aliases and non-UTF-8 files fail as invalid_apply_file without a traceback."""
    f = tmp_path / "agents.yaml"
    f.write_text("x: &a [1, 2]\nagents:\n  - {slug: a, name: *a}\n")
    out = baton(api, "apply", "-f", str(f))
    assert out.returncode == 1 and "invalid_apply_file" in out.stderr and "alias" in out.stderr
    f.write_bytes(b"agents:\n  - {slug: a, name: \xff\xfe}\n")
    out = baton(api, "apply", "-f", str(f))
    assert out.returncode == 1 and "invalid_apply_file" in out.stderr
    assert "Traceback" not in out.stderr
