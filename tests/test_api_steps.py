"""Workflow-agent steps, usage and the balance over real HTTP: uvicorn + worker + dev server.

Xema Agent Concepts ('One Agent, two execution experiences', 'What bounds a tree': spend);
docs/steps.md, docs/metering.md. ``POST|GET /v1/steps``, ``GET /v1/steps/{id}``,
``POST /v1/steps/{id}/handoff``, ``GET /v1/usage``, ``GET|PUT /v1/balance``.
Workflow-level behaviour (backoff timers, handoff timeout, the stream cut) is in
tests/test_steps.py; these tests drive the same engine through the API.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from typer.testing import CliRunner

from activities.steps import StepActivities
from baton.contracts.activity_io import StepUpdate
from baton.settings import get_settings
from cli import app as cli_app
from tests.test_api_agents import assert_problem
from tests.test_api_reviews import Stack, agent, poll, running_stack

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
STEP_ID = re.compile(r"^step-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
UNKNOWN_STEP = "step-00000000-0000-0000-0000-000000000000"
#: $1 per output token, input free: costs are whole dollars, equal to output tokens.
PRICES = {"scripted": (0.0, 1_000_000.0)}
SUMMARY = {
    "type": "object",
    "properties": {"summary": {"type": "string"}},
    "required": ["summary"],
    "additionalProperties": False,
}
V1 = '{"summary": "first draft"}'
V2 = '{"summary": "shorter"}'
#: Wrong shape first; corrected when the validation errors come back; revised on feedback.
SELF_CORRECTING = [
    {"when": "shorter please", "reply": V2},
    {"when": "does not validate", "reply": V1},
    {"reply": '{"headline": "wrong shape"}'},
]
FAST = {"max_attempts": 3, "initial_interval_s": 0.01, "backoff_coefficient": 1}
CLOSED = ("completed", "failed", "rejected")


# --- one stack for the module; the balance is unlimited again after every test ---------


@pytest.fixture(scope="module")
def stack(
    temporal_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """API + worker on one SQLite file, metering at $1 per output token."""
    with running_stack(
        temporal_env, tmp_path_factory.mktemp("steps") / "steps.db", prices=PRICES
    ) as s:
        yield s


@pytest.fixture
def http(stack: Stack) -> Iterator[httpx.Client]:
    """The stack's client, with the balance unlimited before and after the test."""
    assert stack.http.put("/v1/balance", json={"balance": None}).status_code == 200
    yield stack.http
    assert stack.http.put("/v1/balance", json={"balance": None}).status_code == 200


def start(http: httpx.Client, slug: str, text: Any = "Summarise the report.", **body: Any) -> str:
    """POST a step (202 expected); returns its id."""
    resp = http.post("/v1/steps", json={"agent": slug, "input": text, **body})
    assert resp.status_code == 202, resp.text
    step_id: str = resp.json()["step_id"]
    return step_id


def step(http: httpx.Client, step_id: str) -> dict[str, Any]:
    """GET the step."""
    resp = http.get(f"/v1/steps/{step_id}")
    assert resp.status_code == 200, resp.text
    body: dict[str, Any] = resp.json()
    return body


def wait_step(
    http: httpx.Client, step_id: str, status: str, *, attempts: int | None = None
) -> dict[str, Any]:
    """Wait until the step has ``status`` (and ``attempts``); fails early on another end."""

    def check() -> dict[str, Any] | None:
        body = step(http, step_id)
        if body["status"] in CLOSED and body["status"] != status:
            raise AssertionError(f"{step_id} ended {body['status']}, not {status}: {body}")
        if body["status"] == status and (attempts is None or body["attempts"] == attempts):
            return body
        return None

    found: dict[str, Any] = poll(check, f"{step_id} to be {status}", timeout=20)
    return found


def usage(http: httpx.Client, **params: Any) -> list[dict[str, Any]]:
    """GET /v1/usage (200 expected); the groups."""
    resp = http.get("/v1/usage", params=params)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["count"] == len(body["data"])
    data: list[dict[str, Any]] = body["data"]
    return data


def decide(http: httpx.Client, step_id: str, decision: str, **extra: Any) -> httpx.Response:
    """POST a handoff decision."""
    return http.post(f"/v1/steps/{step_id}/handoff", json={"decision": decision, **extra})


def raw_post(http: httpx.Client, path: str, text: str, method: str = "POST") -> httpx.Response:
    """Send ``text`` as a JSON body verbatim (``Infinity``/``NaN`` literals included)."""
    return http.request(method, path, content=text, headers={"content-type": "application/json"})


# --- POST /v1/steps -----------------------------------------------------------------------


def test_a_bare_slug_is_pinned_to_the_live_revision_and_slug_at_v_to_that_one(
    http: httpx.Client,
) -> None:
    """202 {step_id, agent, version, status: running}; a slug takes the live pin, slug@2 v2."""
    agent(http, "pinned", [{"reply": "from v1"}])
    assert http.put("/v1/agents/pinned/draft", json={"playbook": [{"reply": "from v2"}]}).is_success
    assert http.post("/v1/agents/pinned/publish").json()["version"] == 2
    rolled = http.post("/v1/agents/pinned/rollback", json={"version": 1})
    assert rolled.status_code == 200, rolled.text

    live = http.post("/v1/steps", json={"agent": "pinned", "input": "go"})
    assert live.status_code == 202, live.text
    body = live.json()
    assert STEP_ID.match(body["step_id"]), body
    assert {k: body[k] for k in ("agent", "version", "status")} == {
        "agent": "pinned",
        "version": 1,
        "status": "running",
    }
    explicit = http.post("/v1/steps", json={"agent": "pinned@2", "input": "go"})
    assert explicit.status_code == 202, explicit.text
    assert (explicit.json()["agent"], explicit.json()["version"]) == ("pinned", 2)

    first = wait_step(http, body["step_id"], "completed")
    second = wait_step(http, explicit.json()["step_id"], "completed")
    assert (first["version"], first["deliverable"]) == (1, "from v1")
    assert (second["version"], second["deliverable"]) == (2, "from v2")


def test_unknown_unpublished_and_retired_agents_are_refused(http: httpx.Client) -> None:
    """Unknown slug/version 404; no published revision or retired 409; no step row is left."""
    assert_problem(
        http.post("/v1/steps", json={"agent": "ghost", "input": "x"}), 404, "agent_not_found"
    )
    agent(http, "gone", [{"reply": "hi"}])
    assert_problem(
        http.post("/v1/steps", json={"agent": "gone@2", "input": "x"}), 404, "revision_not_found"
    )
    assert http.post("/v1/agents", json={"slug": "draft-only", "name": "Draft"}).status_code == 201
    assert_problem(
        http.post("/v1/steps", json={"agent": "draft-only", "input": "x"}),
        409,
        "agent_not_published",
    )
    assert http.post("/v1/agents/gone/retire").status_code == 200
    assert_problem(
        http.post("/v1/steps", json={"agent": "gone", "input": "x"}), 409, "agent_retired"
    )
    for slug in ("ghost", "gone", "draft-only"):
        assert http.get("/v1/steps", params={"agent": slug}).json()["count"] == 0


@pytest.mark.parametrize(
    ("patch", "status"),
    [
        ({"bogus": 1}, 422),
        ({"retry": {"max_attempts": 2, "jitter": True}}, 422),
        ({"retry": {"max_attempts": 1}}, 202),
        ({"retry": {"max_attempts": 0}}, 422),
        ({"retry": {"max_attempts": 20}}, 202),
        ({"retry": {"max_attempts": 21}}, 422),
        ({"retry": {"backoff_coefficient": 1}}, 202),
        ({"retry": {"backoff_coefficient": 0.5}}, 422),
        ({"retry": {"backoff_coefficient": 10}}, 202),
        ({"retry": {"backoff_coefficient": 10.5}}, 422),
        ({"retry": {"initial_interval_s": 0}}, 202),
        ({"retry": {"initial_interval_s": -0.01}}, 422),
        ({"retry": {"initial_interval_s": 3600}}, 202),
        ({"retry": {"initial_interval_s": 3600.5}}, 422),
        ({"timeout_s": 0}, 422),
        ({"timeout_s": 7 * 86400}, 202),
        ({"timeout_s": 7 * 86400 + 1}, 422),
        ({"handoff_timeout_s": 0}, 422),
        ({"handoff_timeout_s": 30 * 86400}, 202),
        ({"handoff_timeout_s": 30 * 86400 + 1}, 422),
        ({"handoff": "maybe"}, 422),
        ({"agent": "Not A Slug"}, 422),
        ({"agent": "bounds@0"}, 422),
        ({"input": None}, 422),
        ({"input": 42}, 422),
        ({"output_schema": ["not", "an", "object"]}, 422),
    ],
    ids=lambda v: json.dumps(v) if isinstance(v, dict) else str(v),
)
def test_step_bodies_are_checked_at_their_bounds(
    http: httpx.Client, patch: dict[str, Any], status: int
) -> None:
    """Each bound is accepted at its value and refused one past it (422 validation_error)."""
    if http.get("/v1/agents/bounds").status_code == 404:
        agent(http, "bounds", [{"reply": "fine"}])
    resp = http.post("/v1/steps", json={"agent": "bounds", "input": "go", **patch})
    if status == 422:
        assert_problem(resp, 422, "validation_error")
    else:
        assert resp.status_code == 202, resp.text
        assert wait_step(http, resp.json()["step_id"], "completed")["deliverable"] == "fine"


def test_non_finite_timeouts_are_refused(http: httpx.Client) -> None:
    """timeout_s Infinity / NaN → 422 (a step cannot wait forever by accident)."""
    for literal in ("Infinity", "NaN"):
        body = f'{{"agent": "bounds", "input": "go", "timeout_s": {literal}}}'
        assert_problem(raw_post(http, "/v1/steps", body), 422, "validation_error")


def test_an_output_schema_that_is_not_a_json_schema_is_refused(http: httpx.Client) -> None:
    """output_schema failing the 2020-12 metaschema → 422 invalid_schema naming output_schema."""
    agent(http, "schematic", [{"reply": '"a string"'}])
    for bad in ({"type": "nonsense"}, {"type": "object", "required": "summary"}, {"minimum": "x"}):
        body = assert_problem(
            http.post(
                "/v1/steps", json={"agent": "schematic", "input": "go", "output_schema": bad}
            ),
            422,
            "invalid_schema",
        )
        assert body["path"] == "output_schema"
    good = {"$defs": {"s": {"type": "string"}}, "$ref": "#/$defs/s"}
    sid = start(http, "schematic", "go", output_schema=good)
    assert wait_step(http, sid, "completed")["deliverable"] == "a string"


def test_an_output_schema_with_an_unresolvable_ref_is_refused(http: httpx.Client) -> None:
    """A $ref that resolves nowhere passes the metaschema but can never validate: 422."""
    agent(http, "dangling", [{"reply": '"a string"'}])
    for ref in ("#/$defs/missing", "https://schemas.example.invalid/summary.json"):
        resp = http.post(
            "/v1/steps", json={"agent": "dangling", "input": "go", "output_schema": {"$ref": ref}}
        )
        assert_problem(resp, 422, "invalid_schema")


def test_the_output_schema_size_bound(http: httpx.Client) -> None:
    """A schema of exactly 64,000 bytes of JSON is accepted; one byte more is refused."""
    if http.get("/v1/agents/bounds").status_code == 404:
        agent(http, "bounds", [{"reply": "fine"}])
    envelope = len(json.dumps({"description": ""}))
    at_bound = {"description": "x" * (64_000 - envelope)}
    past = {"description": "x" * (64_000 - envelope + 1)}
    assert len(json.dumps(at_bound)) == 64_000
    sid = start(http, "bounds", "go", output_schema=at_bound, retry={"max_attempts": 1})
    assert wait_step(http, sid, "failed")["error"].startswith("invalid_deliverable")  # "fine"
    resp = http.post("/v1/steps", json={"agent": "bounds", "input": "go", "output_schema": past})
    assert_problem(resp, 422, "validation_error")


def test_json_input_reaches_the_model_as_json_text(http: httpx.Client) -> None:
    """An object or a list as input is accepted and sent to the model as its JSON text."""
    agent(
        http,
        "jsonin",
        [
            {"when": '^\\{"doc": "Q3", "pages": 4\\}$', "reply": "object seen"},
            {"when": '^\\[1, "two"\\]$', "reply": "list seen"},
            {"reply": "text seen"},
        ],
    )
    obj = start(http, "jsonin", {"doc": "Q3", "pages": 4})
    arr = start(http, "jsonin", [1, "two"])
    assert wait_step(http, obj, "completed")["deliverable"] == "object seen"
    assert wait_step(http, arr, "completed")["deliverable"] == "list seen"


def test_blank_and_oversized_input_is_refused_as_a_malformed_request(http: httpx.Client) -> None:
    """Empty or blank input, or over 64,000 characters, → 422 validation_error at input."""
    agent(http, "inputs", [{"reply": "ok"}])
    for text in ("", "   \n\t", "x" * 64_001, {"k": "x" * 64_000}):
        body = assert_problem(
            http.post("/v1/steps", json={"agent": "inputs", "input": text}),
            422,
            "validation_error",
        )
        assert body["path"] == "input"
    sid = start(http, "inputs", "x" * 64_000)
    assert wait_step(http, sid, "completed")["deliverable"] == "ok"


# --- GET /v1/steps ---------------------------------------------------------------------------


def test_get_step_reports_status_pin_deliverable_attempts_and_error(http: httpx.Client) -> None:
    """A corrected deliverable completes after 2 attempts; exhaustion fails invalid_deliverable."""
    agent(http, "corrects", SELF_CORRECTING)
    agent(http, "refuses", [{"reply": "no JSON today"}])
    ok = start(http, "corrects", output_schema=SUMMARY, retry=FAST)
    bad = start(http, "refuses", output_schema=SUMMARY, retry=FAST | {"max_attempts": 2})
    done = wait_step(http, ok, "completed")
    assert {k: done[k] for k in ("step_id", "agent", "version", "attempts", "error")} == {
        "step_id": ok,
        "agent": "corrects",
        "version": 1,
        "attempts": 2,
        "error": None,
    }
    assert done["deliverable"] == json.loads(V1) and done["handoff"] is False
    assert datetime.fromisoformat(done["updated_at"]) >= datetime.fromisoformat(done["created_at"])
    failed = wait_step(http, bad, "failed")
    assert (failed["attempts"], failed["deliverable"]) == (2, None)
    assert failed["error"].startswith("invalid_deliverable") and "not JSON" in failed["error"]


def test_unknown_and_malformed_step_ids(http: httpx.Client) -> None:
    """An unknown step id → 404 step_not_found; a malformed one → 422 on GET and handoff."""
    assert_problem(http.get(f"/v1/steps/{UNKNOWN_STEP}"), 404, "step_not_found")
    assert_problem(decide(http, UNKNOWN_STEP, "approve"), 404, "step_not_found")
    session_like = UNKNOWN_STEP.replace("step-", "session-")
    upper = "step-ABCDEF00-0000-0000-0000-000000000000"
    for bad in ("abc", upper, session_like, UNKNOWN_STEP + "0"):
        assert_problem(http.get(f"/v1/steps/{bad}"), 422, "validation_error")
        assert_problem(decide(http, bad, "approve"), 422, "validation_error")


def test_list_steps_filters_by_agent_newest_first(http: httpx.Client) -> None:
    """GET /v1/steps?agent= lists only that agent's steps, newest first, paged by limit."""
    agent(http, "lister-a", [{"reply": "a"}])
    agent(http, "lister-b", [{"reply": "b"}])
    a1 = start(http, "lister-a")
    b1 = start(http, "lister-b")
    a2 = start(http, "lister-a")
    listed = http.get("/v1/steps", params={"agent": "lister-a"}).json()
    assert listed["count"] == 2 and [s["step_id"] for s in listed["data"]] == [a2, a1]
    only_b = http.get("/v1/steps", params={"agent": "lister-b"}).json()
    assert (only_b["count"], only_b["data"][0]["step_id"]) == (1, b1)
    page = http.get("/v1/steps", params={"agent": "lister-a", "limit": 1, "offset": 1}).json()
    assert page["count"] == 2 and [s["step_id"] for s in page["data"]] == [a1]
    everything = http.get("/v1/steps", params={"limit": 200}).json()
    assert {a1, a2, b1} <= {s["step_id"] for s in everything["data"]}
    assert http.get("/v1/steps", params={"agent": "nobody"}).json() == {"data": [], "count": 0}
    for params in ({"agent": "Bad!"}, {"limit": 0}, {"limit": 201}, {"offset": -1}):
        assert_problem(http.get("/v1/steps", params=params), 422, "validation_error")
    for sid in (a1, a2, b1):
        wait_step(http, sid, "completed")


def test_the_readme_step_example_runs_end_to_end(
    http: httpx.Client, stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """apply examples/agents.yaml, then summariser on the example input and schema: 2 attempts."""
    monkeypatch.setenv("BATON_API_URL", stack.url)
    get_settings.cache_clear()
    try:
        applied = CliRunner().invoke(cli_app, ["apply", "-f", str(EXAMPLES / "agents.yaml")])
    finally:
        get_settings.cache_clear()
    assert applied.exit_code == 0, applied.output
    schema = json.loads((EXAMPLES / "summary.schema.json").read_text(encoding="utf-8"))
    text = (EXAMPLES / "step-input.txt").read_text(encoding="utf-8")
    resp = http.post(
        "/v1/steps", json={"agent": "summariser", "input": text, "output_schema": schema}
    )
    assert resp.status_code == 202, resp.text
    live = http.get("/v1/agents/summariser").json()["live_version"]
    assert (resp.json()["agent"], resp.json()["version"]) == ("summariser", live)
    done = wait_step(http, resp.json()["step_id"], "completed")
    assert (done["attempts"], done["error"]) == (2, None)
    jsonschema.validate(done["deliverable"], schema)
    assert done["deliverable"]["title"] == "Q3 report"


class SlowAwaitingWrite(StepActivities):
    """Step activities whose ``update_step`` returns 1.5 s after committing awaiting_handoff."""

    @activity.defn(name="update_step")
    def update_step(self, inp: StepUpdate) -> None:
        """Commit (the API sees the status at once), then answer the workflow late."""
        super().update_step(inp)
        if inp.status == "awaiting_handoff":
            time.sleep(1.5)


# --- POST /v1/steps/{id}/handoff ----------------------------------------------------------------


def test_handoff_over_http_revise_then_approve(http: httpx.Client) -> None:
    """409 while running; revise runs another attempt with the feedback; approve completes."""
    agent(http, "handed", SELF_CORRECTING)
    # The 3 s backoff keeps the step running (attempts 1) long enough to see it and be refused.
    slow = {"max_attempts": 3, "initial_interval_s": 3, "backoff_coefficient": 1}
    sid = start(http, "handed", output_schema=SUMMARY, retry=slow, handoff=True)
    # Attempt 1 was invalid: the step is running, in its backoff before attempt 2.
    wait_step(http, sid, "running", attempts=1)
    busy = assert_problem(decide(http, sid, "approve"), 409, "step_not_awaiting_handoff")
    assert busy["step_status"] == "running"

    first = wait_step(http, sid, "awaiting_handoff", attempts=2)
    assert (first["deliverable"], first["handoff"]) == (json.loads(V1), True)
    revised = decide(http, sid, "revise", feedback="shorter please")
    assert revised.status_code == 202, revised.text
    again = wait_step(http, sid, "awaiting_handoff", attempts=3)
    assert again["deliverable"] == json.loads(V2)
    assert decide(http, sid, "approve").status_code == 202
    done = wait_step(http, sid, "completed")
    assert (done["deliverable"], done["attempts"], done["error"]) == (json.loads(V2), 3, None)
    late = assert_problem(decide(http, sid, "reject"), 409, "step_not_awaiting_handoff")
    assert late["step_status"] == "completed"


def test_handoff_reject_and_malformed_decisions(http: httpx.Client) -> None:
    """Reject ends the step rejected with the feedback; bad decisions → 422; a plain step 409."""
    agent(http, "judged", [{"reply": V1}])
    sid = start(http, "judged", output_schema=SUMMARY, retry=FAST, handoff=True)
    wait_step(http, sid, "awaiting_handoff", attempts=1)
    for bad in (
        {"decision": "maybe"},
        {},
        {"decision": "approve", "extra": 1},
        {"decision": "revise", "feedback": "x" * 64_001},
    ):
        assert_problem(http.post(f"/v1/steps/{sid}/handoff", json=bad), 422, "validation_error")
    assert step(http, sid)["status"] == "awaiting_handoff"
    feedback = "off topic " + "x" * (64_000 - len("off topic "))
    assert decide(http, sid, "reject", feedback=feedback).status_code == 202
    rejected = wait_step(http, sid, "rejected")
    assert (rejected["error"], rejected["deliverable"]) == (feedback, json.loads(V1))
    assert_problem(decide(http, sid, "approve"), 409, "step_not_awaiting_handoff")

    plain = start(http, "judged", output_schema=SUMMARY, retry=FAST)
    wait_step(http, plain, "completed")
    assert_problem(decide(http, plain, "approve"), 409, "step_not_awaiting_handoff")


def test_a_step_over_its_timeout_fails(http: httpx.Client) -> None:
    """timeout_s bounds the whole step: a reply still streaming after 1 s fails it."""
    agent(http, "dawdler", [{"reply": "one two", "chunk_delay_ms": 1000}])
    began = time.monotonic()
    sid = start(http, "dawdler", timeout_s=1)
    failed = wait_step(http, sid, "failed")
    assert failed["error"].startswith("timeout") and failed["deliverable"] is None
    # The abandoned model call runs on until its next heartbeat (past its 2 s reply):
    # let it end here rather than charge a later test's balance.
    time.sleep(max(0.0, began + 2.5 - time.monotonic()))


def test_a_decision_sent_while_the_awaiting_state_is_written_is_kept(
    temporal_env: WorkflowEnvironment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An approve POSTed as soon as GET shows awaiting_handoff is kept and completes the step."""
    monkeypatch.setattr("worker.factory.StepActivities", SlowAwaitingWrite)
    with running_stack(temporal_env, tmp_path / "race.db") as s:
        agent(s.http, "racer", [{"reply": V1}])
        sid = start(s.http, "racer", output_schema=SUMMARY, handoff=True, handoff_timeout_s=4)
        wait_step(s.http, sid, "awaiting_handoff")
        assert decide(s.http, sid, "approve").status_code == 202

        def ended() -> dict[str, Any] | None:
            body = step(s.http, sid)
            return body if body["status"] in CLOSED else None

        final = poll(ended, f"{sid} to end", timeout=15)
    assert (final["status"], final["error"]) == ("completed", None), final


# --- GET /v1/usage ---------------------------------------------------------------------------


def test_usage_is_grouped_and_filtered(http: httpx.Client) -> None:
    """Sessions and steps are metered per agent, session, step, day and model, and filtered."""
    agent(http, "meter-a", [{"reply": "three words here"}])
    agent(http, "meter-b", SELF_CORRECTING)
    session = http.post("/v1/sessions", json={"agent": "meter-a", "prompt": "hi", "sync": True})
    assert session.status_code == 201, session.text
    session_id = session.json()["session_id"]
    sid = start(http, "meter-b", output_schema=SUMMARY, retry=FAST)
    wait_step(http, sid, "completed")

    (a,) = usage(http, group_by="agent", agent="meter-a")
    assert (a["key"], a["requests"]) == ("meter-a", 1)
    assert a["output_tokens"] == 3 and a["input_tokens"] > 0
    assert a["cost_usd"] == pytest.approx(3.0)  # $1 per output token, input free
    (b,) = usage(http, group_by="agent", agent="meter-b")
    assert (b["key"], b["requests"]) == ("meter-b", 2)

    (by_step,) = usage(http, group_by="step", step_id=sid)
    assert (by_step["key"], by_step["requests"]) == (sid, 2)
    assert by_step["cost_usd"] == pytest.approx(b["cost_usd"])
    steps = usage(http, group_by="step")
    assert sid in {g["key"] for g in steps}
    assert all(g["key"].startswith("step-") for g in steps)  # sessions are not steps
    (by_session,) = usage(http, group_by="session", session_id=session_id)
    assert (by_session["key"], by_session["requests"]) == (session_id, 1)
    assert usage(http, group_by="step", session_id=session_id) == []

    today = datetime.now(UTC).date().isoformat()
    (day,) = usage(http, group_by="day", agent="meter-b")
    assert (day["key"], day["requests"]) == (today, 2)
    (model,) = usage(http, group_by="model", agent="meter-a")
    assert (model["key"], model["requests"]) == ("scripted", 1)

    now = datetime.now(UTC)
    assert usage(http, agent="meter-a", since=(now + timedelta(hours=1)).isoformat()) == []
    assert usage(http, agent="meter-a", until=(now - timedelta(hours=1)).isoformat()) == []
    in_window = {
        "since": (now - timedelta(hours=1)).isoformat(),
        "until": (now + timedelta(hours=1)).isoformat(),
    }
    assert [g["key"] for g in usage(http, agent="meter-a", **in_window)] == ["meter-a"]
    # The same instant written with a +05:00 offset selects the same rows.
    plus5 = (now - timedelta(hours=1)).astimezone(timezone(timedelta(hours=5)))
    assert [g["key"] for g in usage(http, agent="meter-a", since=plus5.isoformat())] == ["meter-a"]
    assert usage(http, agent="meter-a", session_id="x" * 80) == []


def test_malformed_usage_queries_are_refused(http: httpx.Client) -> None:
    """Unknown group_by, bad agent, over-long ids or unparsable times → 422 validation_error."""
    for params in (
        {"group_by": "team"},
        {"agent": "Bad!"},
        {"session_id": "x" * 81},
        {"step_id": "x" * 81},
        {"since": "yesterday"},
        {"until": "2026-13-01T00:00:00Z"},
    ):
        assert_problem(http.get("/v1/usage", params=params), 422, "validation_error")


def test_a_zoneless_usage_time_is_not_a_server_error(stack: Stack) -> None:
    """since/until without a UTC offset → 422 validation_error, never a 500."""
    for params in ({"since": "2026-01-01T00:00:00"}, {"until": "2026-01-01T00:00:00"}):
        with stack.client() as fresh:  # a 500 drops the connection: keep the shared one
            resp = fresh.get("/v1/usage", params=params)
        assert resp.status_code == 422, f"{params}: {resp.status_code} {resp.text}"


# --- GET|PUT /v1/balance ---------------------------------------------------------------------


def test_balance_get_and_put(http: httpx.Client) -> None:
    """Unlimited (null) by default; PUT a number or null; bounds 0..1e12; junk, a negative
    amount and inf → 422 (a negative balance would stop every call)."""
    assert http.get("/v1/balance").json() == {"balance": None}
    put = http.put("/v1/balance", json={"balance": 12.5})
    assert (put.status_code, put.json()) == (200, {"balance": 12.5})
    assert http.get("/v1/balance").json() == {"balance": 12.5}
    for edge in (1e12, 0):
        assert http.put("/v1/balance", json={"balance": edge}).json() == {"balance": edge}
    assert http.put("/v1/balance", json={"balance": None}).json() == {"balance": None}
    assert http.get("/v1/balance").json() == {"balance": None}
    http.put("/v1/balance", json={"balance": 3})
    for bad in (
        {"balance": "abc"},
        {"balance": 1.000001e12},
        {"balance": -1.000001e12},
        {"balance": -1e12},
        {"balance": -0.01},
        {"balance": 3, "currency": "EUR"},
    ):
        assert_problem(http.put("/v1/balance", json=bad), 422, "validation_error")
    for literal in ("Infinity", "-Infinity", "NaN"):
        assert_problem(
            raw_post(http, "/v1/balance", f'{{"balance": {literal}}}', method="PUT"),
            422,
            "validation_error",
        )
    assert http.get("/v1/balance").json() == {"balance": 3}  # refused PUTs changed nothing


def test_a_spent_balance_refuses_session_turns_and_steps(http: httpx.Client) -> None:
    """Balance 0: turns (502) and steps fail balance_exhausted, unmetered; $0.01 goes through."""
    agent(http, "broke", [{"reply": "hi"}])  # 2 characters: no cut at $0.01, then $1
    assert http.put("/v1/balance", json={"balance": 0}).status_code == 200
    refused = assert_problem(
        http.post("/v1/sessions", json={"agent": "broke", "prompt": "hi", "sync": True}),
        502,
        "turn_failed",
    )
    assert "balance_exhausted" in refused["detail"]
    sid = start(http, "broke", retry=FAST)
    failed = wait_step(http, sid, "failed")
    assert "balance_exhausted" in failed["error"] and failed["attempts"] == 1
    assert usage(http, agent="broke") == []

    assert http.put("/v1/balance", json={"balance": 0.01}).status_code == 200
    allowed = http.post("/v1/sessions", json={"agent": "broke", "prompt": "hi", "sync": True})
    assert allowed.status_code == 201, allowed.text
    assert allowed.json()["response"] == "hi"
    (metered,) = usage(http, agent="broke")
    assert metered["requests"] == 1
    assert http.get("/v1/balance").json()["balance"] == pytest.approx(0.01 - metered["cost_usd"])


def test_a_retry_never_spends_past_the_ceiling(http: httpx.Client) -> None:
    """The call that spends the balance is the last: retries are refused, usage rows unchanged."""
    # Ten words: $10 at $1/token, above the $5 balance once the provider counts them
    # (the stream's chars/4 estimate, $4, stays under it, so the call is not cut).
    agent(http, "spender", [{"reply": "a b c d e f g h i j"}])
    assert http.put("/v1/balance", json={"balance": 5}).status_code == 200
    sid = start(http, "spender", output_schema={"type": "object"}, retry=FAST)
    failed = wait_step(http, sid, "failed")
    assert failed["attempts"] == 2 and "balance_exhausted" in failed["error"]
    (spent,) = usage(http, agent="spender")
    assert (spent["requests"], spent["cost_usd"]) == (1, pytest.approx(10.0))
    assert http.get("/v1/balance").json()["balance"] == pytest.approx(-5.0)

    again = start(http, "spender", output_schema={"type": "object"}, retry=FAST)
    assert "balance_exhausted" in wait_step(http, again, "failed")["error"]
    assert usage(http, agent="spender") == [spent]
    assert http.get("/v1/balance").json()["balance"] == pytest.approx(-5.0)


def _signals(temporal_env: WorkflowEnvironment, workflow_id: str) -> list[str]:
    """The names of the Signals in a workflow's history, in order."""

    async def run() -> list[str]:
        target_host = temporal_env.client.service_client.config.target_host
        client = await Client.connect(target_host)
        handle = client.get_workflow_handle(workflow_id)
        return [
            e.workflow_execution_signaled_event_attributes.signal_name
            async for e in handle.fetch_history_events()
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
        ]

    return asyncio.run(run())


def test_a_handoff_with_an_idempotency_key_replays_its_first_answer(
    http: httpx.Client, temporal_env: WorkflowEnvironment
) -> None:
    """A handoff POST repeated with its Idempotency-Key answers the first answer again
    (``Idempotent-Replayed: true``) and the step is signalled once; without the key the
    repeat is 409 ``step_not_awaiting_handoff``."""
    agent(http, "keyed", [{"reply": V1}])
    sid = start(http, "keyed", output_schema=SUMMARY, retry=FAST, handoff=True)
    wait_step(http, sid, "awaiting_handoff", attempts=1)
    key = {"Idempotency-Key": str(uuid.uuid4())}
    url = f"/v1/steps/{sid}/handoff"
    first = http.post(url, json={"decision": "approve"}, headers=key)
    assert first.status_code == 202, first.text
    assert "idempotent-replayed" not in first.headers
    wait_step(http, sid, "completed")
    again = http.post(url, json={"decision": "approve"}, headers=key)
    assert again.status_code == 202, again.text
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json() == first.json()
    assert _signals(temporal_env, sid) == ["handoff"]
    assert_problem(http.post(url, json={"decision": "approve"}), 409, "step_not_awaiting_handoff")
