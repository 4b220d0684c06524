"""`baton step` and `baton usage`, run in-process against a live API + worker."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from temporalio.testing import WorkflowEnvironment
from typer.testing import CliRunner, Result

from baton.settings import get_settings
from baton.storage.db import StepRow, session_scope
from cli import app
from tests.test_api_reviews import Stack, agent, poll, running_stack
from worker.stack import free_port

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
INPUT = str(EXAMPLES / "step-input.txt")
SCHEMA_FILE = EXAMPLES / "summary.schema.json"
SCHEMA = str(SCHEMA_FILE)
STEP_ID = re.compile(r"step-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
Run = Callable[..., Result]


def invoke(*args: str) -> Result:
    """``baton …`` in-process with fresh settings from the environment."""
    get_settings.cache_clear()
    try:
        return CliRunner().invoke(app, list(args), catch_exceptions=False)
    finally:
        get_settings.cache_clear()


@pytest.fixture(scope="module")
def stack(
    temporal_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """API + worker with examples/agents.yaml applied through `baton apply`."""
    db = tmp_path_factory.mktemp("cli-steps") / "cli-steps.db"
    with running_stack(temporal_env, db, prices={"scripted": (0.0, 1_000_000.0)}) as s:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("BATON_DATABASE_URL", s.settings.database_url)
            mp.setenv("BATON_API_URL", s.url)  # `baton apply` goes through the API
            applied = invoke("apply", "-f", str(EXAMPLES / "agents.yaml"))
        assert applied.exit_code == 0, applied.output
        yield s


@pytest.fixture
def run(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Iterator[Run]:
    """A runner of ``baton …`` pointed at the stack (BATON_API_URL, BATON_DATABASE_URL)."""
    monkeypatch.setenv("BATON_API_URL", stack.url)
    monkeypatch.setenv("BATON_DATABASE_URL", stack.settings.database_url)
    monkeypatch.delenv("BATON_TOKEN", raising=False)
    yield invoke
    stack.http.put("/v1/balance", json={"balance": None})


def squashed(text: str) -> str:
    """``text`` without whitespace (Rich wraps stdout at 80 columns)."""
    return re.sub(r"\s+", "", text)


def step_id_of(result: Result) -> str:
    """The step id `baton step` prints first."""
    found = STEP_ID.search(result.stdout)
    assert found, result.output
    return found.group(0)


def deliverable_of(result: Result) -> Any:
    """The deliverable `baton step` pretty-prints as JSON."""
    out = result.stdout
    start, end = out.index("\n{"), out.rindex("\n}")
    return json.loads(out[start : end + 2])


def test_step_runs_the_readme_example_and_prints_the_deliverable(run: Run, stack: Stack) -> None:
    """`baton step summariser --input … --schema …`: completed after 2 attempts, exit 0."""
    result = run("step", "summariser", "--input", INPUT, "--schema", SCHEMA)
    assert result.exit_code == 0, result.output
    sid = step_id_of(result)
    assert f"{sid} · summariser@1" in result.stdout
    assert "status: completed after 2 attempt(s)" in result.stdout
    deliverable = deliverable_of(result)
    jsonschema.validate(deliverable, json.loads(SCHEMA_FILE.read_text(encoding="utf-8")))
    assert deliverable == stack.http.get(f"/v1/steps/{sid}").json()["deliverable"]
    assert "decide:" not in result.stdout and result.stderr == ""


def test_step_pins_a_version_and_sends_a_json_file_as_json(
    run: Run, stack: Stack, tmp_path: Path
) -> None:
    """`summariser@1` with a .json input: the object is sent as JSON; the deliverable is text."""
    doc = tmp_path / "doc.json"
    doc.write_text('{"report": "Q3", "growth": 0.04}', encoding="utf-8")
    result = run("step", "summariser@1", "--input", str(doc))
    assert result.exit_code == 0, result.output
    sid = step_id_of(result)
    assert f"{sid} · summariser@1" in result.stdout
    assert "status: completed after 1 attempt(s)" in result.stdout
    with session_scope(stack.engine) as s:
        row = s.get(StepRow, sid)
        assert row is not None and json.loads(row.input) == {"report": "Q3", "growth": 0.04}
    assert '"{\\"headline\\": \\"Q3 report\\"}"' in result.stdout  # printed as a JSON string


def test_a_failed_step_exits_1_with_its_error(run: Run, stack: Stack, tmp_path: Path) -> None:
    """A deliverable that never validates: failed, invalid_deliverable printed, exit 1."""
    agent(stack.http, "cli-stubborn", [{"reply": "not JSON"}])
    result = run(
        "step", "cli-stubborn", "--input", INPUT, "--schema", SCHEMA, "--max-attempts", "1"
    )
    assert result.exit_code == 1, result.output
    assert "status: failed after 1 attempt(s)" in result.stdout
    assert "invalid_deliverable" in result.stdout
    sid = step_id_of(result)
    assert stack.http.get(f"/v1/steps/{sid}").json()["status"] == "failed"


def test_handoff_stops_at_awaiting_handoff_with_the_hint(run: Run, stack: Stack) -> None:
    """`--handoff` returns at awaiting_handoff (exit 0) with the hint; revise, approve follow."""
    result = run("step", "summariser", "--input", INPUT, "--schema", SCHEMA, "--handoff")
    assert result.exit_code == 0, result.output
    sid = step_id_of(result)
    assert "status: awaiting_handoff after 2 attempt(s)" in result.stdout
    assert deliverable_of(result)["title"] == "Q3 report"
    assert f"decide:POST/v1/steps/{sid}/handoff" in squashed(result.stdout)
    assert '"approve"|"revise"|"reject"' in squashed(result.stdout)
    # The docs' next step (docs/steps.md): revise with feedback (another attempt), then approve.
    revise = {"decision": "revise", "feedback": "Mention the new region."}
    assert stack.http.post(f"/v1/steps/{sid}/handoff", json=revise).status_code == 202

    def state(status: str, attempts: int) -> dict[str, Any] | None:
        body: dict[str, Any] = stack.http.get(f"/v1/steps/{sid}").json()
        return body if (body["status"], body["attempts"]) == (status, attempts) else None

    revised = poll(lambda: state("awaiting_handoff", 3), f"{sid} to await again")
    assert revised["deliverable"]["confidence"] == 0.9
    approve = {"decision": "approve"}
    assert stack.http.post(f"/v1/steps/{sid}/handoff", json=approve).status_code == 202
    done = poll(lambda: state("completed", 3), f"{sid} to complete")
    assert done["deliverable"] == revised["deliverable"]


def test_usage_by_agent_prints_a_table_and_the_balance(run: Run, stack: Stack) -> None:
    """`baton usage --by agent` lists metered agents and the balance; a bad --by exits 1."""
    agent(stack.http, "cli-metered", [{"reply": "four words right here"}])
    resp = stack.http.post(
        "/v1/sessions", json={"agent": "cli-metered", "prompt": "hi", "sync": True}
    )
    assert resp.status_code == 201, resp.text
    result = run("usage", "--by", "agent")
    assert result.exit_code == 0, result.output
    assert "Usage" in result.stdout and "cost (USD)" in result.stdout
    (row,) = [line for line in result.stdout.splitlines() if "cli-metered" in line]
    assert re.search(r"cli-metered\s*│\s*1\s*│\s*\d+\s*│\s*4\s*│\s*4\.000000", row), row
    assert "balance: unlimited" in result.stdout

    assert stack.http.put("/v1/balance", json={"balance": 7.25}).status_code == 200
    with_balance = run("usage")
    assert with_balance.exit_code == 0 and "balance: $7.2500" in with_balance.stdout
    by_day = run("usage", "--by", "day")
    assert by_day.exit_code == 0 and re.search(r"\d{4}-\d{2}-\d{2}", by_day.stdout)
    bad = run("usage", "--by", "team")
    assert bad.exit_code == 1 and "[validation_error]" in bad.stderr


def test_unreadable_input_or_schema_is_a_clear_error(run: Run, tmp_path: Path) -> None:
    """Missing, directory or non-UTF-8 input, or a schema that is not JSON: exit 1, one line."""
    missing = tmp_path / "nope.txt"
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"\xff\xfe\x00 not utf-8")
    not_json = tmp_path / "schema.json"
    not_json.write_text("{type: object", encoding="utf-8")
    for args in (
        ("--input", str(missing)),
        ("--input", str(tmp_path)),
        ("--input", str(binary)),
        ("--input", INPUT, "--schema", str(not_json)),
        ("--input", INPUT, "--schema", str(missing)),
    ):
        result = run("step", "summariser", *args)
        assert result.exit_code == 1, (args, result.output)
        assert "error cannot read the input or schema" in result.stderr, result.stderr
        assert result.stdout == ""


def test_input_the_api_refuses_is_reported_with_its_code(run: Run, tmp_path: Path) -> None:
    """Blank input, unknown agent, attempts past 20, bad schema: the API's problem, exit 1."""
    blank = tmp_path / "blank.txt"
    blank.write_text("  \n", encoding="utf-8")
    bad_schema = tmp_path / "bad.schema.json"
    bad_schema.write_text('{"type": "nonsense"}', encoding="utf-8")
    cases = (
        (("summariser", "--input", str(blank)), "input"),
        (("ghost", "--input", INPUT), "[agent_not_found]"),
        (("summariser", "--input", INPUT, "--max-attempts", "21"), "[validation_error]"),
        (("summariser", "--input", INPUT, "--schema", str(bad_schema)), "[invalid_schema]"),
    )
    for args, message in cases:
        result = run("step", *args)
        assert result.exit_code == 1, (args, result.output)
        assert result.stderr.startswith("error [") and message in result.stderr, result.stderr
        assert not STEP_ID.search(result.stdout)


def test_an_unreachable_api_is_a_clear_error(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    """With nothing listening at BATON_API_URL, step and usage exit 1 naming the URL."""
    url = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("BATON_API_URL", url)
    for args in (("step", "summariser", "--input", INPUT), ("usage",)):
        result = run(*args)
        assert result.exit_code == 1, result.output
        assert f"cannot reach {url}" in result.stderr


def test_balance_set_and_show_on_the_database(run: Run, stack: Stack) -> None:
    """`baton balance set` writes the balance the API reports; bad amounts are refused."""
    shown = run("balance", "set", "2.5")
    assert shown.exit_code == 0 and "$2.5000" in shown.stdout
    assert stack.http.get("/v1/balance").json() == {"balance": 2.5}
    assert "unlimited" in run("balance", "set", "unlimited").stdout
    assert stack.http.get("/v1/balance").json() == {"balance": None}
    for bad in ("lots", "nan", "1e13", "-1"):
        refused = run("balance", "set", "--", bad)  # `--`: "-1" is not an option
        assert refused.exit_code == 1 and "invalid_balance" in refused.output, refused.output
    assert "unlimited" in run("balance", "show").stdout
