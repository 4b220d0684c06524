"""Evals replay an agent's recorded workflow-agent steps too (docs/change-safely.md, Step
replays) on the real stack: uvicorn + worker + Temporal dev server + SQLite, the scripted
playbook model standing in for a paid one."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.console import Console
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError
from temporalio.testing import WorkflowEnvironment

from baton.evals.replay import Side, replay_step_id
from baton.storage.db import StepRow, session_scope
from cli.evals import report_table, totals_line
from tests.test_api_agents import assert_problem
from tests.test_api_reviews import Stack, poll, running_stack
from tests.test_evals import finished, publish, start

SUMMARY = {
    "type": "object",
    "properties": {"summary": {"type": "string"}},
    "required": ["summary"],
    "additionalProperties": False,
}
#: The live agent answers every attempt with a deliverable that validates.
LIVE = [{"reply": '{"summary": "ok"}'}]
#: The draft breaks the schema on every attempt.
DRAFT = [{"reply": '{"headline": "wrong shape"}'}]
FAST = {"max_attempts": 2, "initial_interval_s": 0.01, "backoff_coefficient": 1}
CLOSED = ("completed", "failed", "rejected")
SIDES: tuple[Side, Side] = ("baseline", "candidate")


@pytest.fixture
def stack(temporal_env: WorkflowEnvironment, tmp_path: Path) -> Iterator[Stack]:
    """API + worker on a fresh SQLite file, metering at a price so usage shows."""
    with running_stack(
        temporal_env, tmp_path / "eval-steps.db", prices={"scripted": (1000.0, 1000.0)}
    ) as s:
        yield s


def status(http: httpx.Client, step_id: str) -> dict[str, Any]:
    """GET the step."""
    body: dict[str, Any] = http.get(f"/v1/steps/{step_id}").json()
    return body


def wait_for(http: httpx.Client, step_id: str, *states: str) -> dict[str, Any]:
    """The step once its status is one of ``states``."""

    def reached() -> dict[str, Any] | None:
        body = status(http, step_id)
        return body if body["status"] in states else None

    found: dict[str, Any] = poll(reached, f"{step_id} to be {states}", timeout=60)
    return found


def recorded_step(http: httpx.Client, decisions: list[str], **body: Any) -> str:
    """A recorded step of ``writer`` (its output schema, handoff when ``decisions`` are
    given), each decision sent once it awaits one; its id once it has ended."""
    resp = http.post(
        "/v1/steps",
        json={
            "agent": "writer",
            "input": "Summarise the report.",
            "output_schema": SUMMARY,
            "retry": FAST,
            "handoff": bool(decisions),
            **body,
        },
    )
    assert resp.status_code == 202, resp.text
    step_id: str = resp.json()["step_id"]
    for decision in decisions:
        wait_for(http, step_id, "awaiting_handoff")
        extra = {"feedback": "shorter"} if decision == "revise" else {}
        sent = http.post(f"/v1/steps/{step_id}/handoff", json={"decision": decision, **extra})
        assert sent.status_code == 202, sent.text
    wait_for(http, step_id, *CLOSED)
    return step_id


def test_an_eval_replays_recorded_steps_and_flags_a_draft_that_breaks_the_schema(
    stack: Stack,
) -> None:
    """Four recorded steps (no handoff, approved, revised then rejected, revised then timed
    out): the eval of a draft that breaks the output schema reports for each the schema
    pass and attempts per side, the baseline's deliverable, the recorded handoff outcome
    (none, approved, rejected, revised), each a changed regression; the pass rates are 1.0
    and 0.0, the replays' usage is the report's, GET /v1/steps and the console list only
    the four, and the console's eval page shows the steps."""
    http = stack.http
    publish(http, "writer", LIVE)
    steps = [
        recorded_step(http, []),
        recorded_step(http, ["approve"]),
        recorded_step(http, ["revise", "reject"]),
        recorded_step(http, ["revise"], handoff_timeout_s=3),
    ]
    assert status(http, steps[3])["status"] == "failed"
    assert http.put("/v1/agents/writer/draft", json={"playbook": DRAFT}).status_code == 200

    summary = start(http, "writer", steps=4)
    assert (summary["total"], summary["options"]["step_ids"]) == (4, steps)
    body = finished(http, "writer", summary["id"])
    assert (body["status"], body["done"], body["changed"], body["regressions"]) == (
        "completed",
        4,
        4,
        4,
    )
    items = body["report"]["sessions"]
    assert [i["step_id"] for i in items] == steps
    assert [i["deliverable"]["recorded_handoff"] for i in items] == [
        "none",
        "approved",
        "rejected",
        "revised",
    ]
    for item in items:
        assert item["kind"] == "step"
        deliverable = item["deliverable"]
        assert deliverable["baseline"] == {
            "valid": True,
            "attempts": 1,
            "value": {"summary": "ok"},
        }
        assert deliverable["candidate"] == {"valid": False, "attempts": 2, "value": None}
        assert (deliverable["baseline_valid"], deliverable["candidate_valid"]) == (True, False)
        assert deliverable["same"] is False
        assert json.loads(item["final"]["baseline"]) == {"summary": "ok"}
        assert "wrong shape" in item["final"]["candidate"]
        assert item["errors"]["baseline"] is None
        assert item["errors"]["candidate"].startswith("invalid_deliverable")
        assert (item["changed"], item["regression"]) == (True, True)
        assert item["usage"]["baseline"]["tokens"] > 0
        assert item["usage"]["candidate"]["tokens"] > 0
    totals = body["report"]["totals"]
    assert totals["deliverable_pass_rate"] == {"baseline": 1.0, "candidate": 0.0}
    assert (totals["sessions"], totals["steps"]) == (4, 4)
    assert totals["cost_usd"]["baseline"] > 0 and totals["cost_usd"]["candidate"] > 0

    # The step replays are the eval's: ordinary lists show only the recordings, and a
    # second eval still finds four recorded steps.
    listed = http.get("/v1/steps", params={"agent": "writer"}).json()
    assert (listed["count"], sorted(s["step_id"] for s in listed["data"])) == (4, sorted(steps))
    assert http.get("/v1/steps").json()["count"] == 4
    replayed = items[0]["baseline_step_id"]
    assert http.get(f"/v1/steps/{replayed}").json()["handoff"] is False
    console_steps = http.get("/ui/steps").text
    assert steps[0] in console_steps and replayed not in console_steps

    # The console's eval page shows each step with its deliverables and recorded handoff.
    page = http.get(f"/ui/agents/writer/evals/{summary['id']}").text
    assert page.count('data-kind="step"') == 4
    assert "pass (1) → fail (2) · recorded approved" in page
    assert "Deliverable failed its schema after 2 attempts" in page


def test_an_unchanged_candidate_replays_steps_alike_beside_sessions(stack: Stack) -> None:
    """Against the live revision itself, a recorded step and a recorded session replay
    alike: nothing changed or regressed, the step item is kind "step" after the session's
    kind "session", pass rates 1.0 on both sides; step_ids picks exactly the step."""
    http = stack.http
    publish(http, "writer", LIVE)
    step_id = recorded_step(http, [])
    resp = http.post("/v1/sessions", json={"agent": "writer", "prompt": "hello"})
    assert resp.status_code == 201, resp.text
    sid = resp.json()["session_id"]
    poll(lambda: status_of(http, sid) == "idle", f"{sid} to answer", timeout=60)

    summary = start(http, "writer", candidate="writer@1", step_ids=[step_id])
    assert summary["total"] == 2
    body = finished(http, "writer", summary["id"])
    assert (body["status"], body["changed"], body["regressions"]) == ("completed", 0, 0)
    kinds = [(i["kind"], i["session_id"]) for i in body["report"]["sessions"]]
    assert kinds == [("session", sid), ("step", step_id)]
    step_item = body["report"]["sessions"][1]
    assert step_item["deliverable"]["same"] is True
    assert body["report"]["totals"]["deliverable_pass_rate"] == {
        "baseline": 1.0,
        "candidate": 1.0,
    }


def status_of(http: httpx.Client, session_id: str) -> str:
    """A session's status."""
    found: str = http.get(f"/v1/sessions/{session_id}").json()["status"]
    return found


def test_bad_step_selections_are_refused_with_codes_and_start_nothing(stack: Stack) -> None:
    """steps past its bounds (ok at 0 and 100, refused at -1 and 101), step_ids of 101 or
    with steps, an unknown step id: each a 422 problem with its code and no eval recorded;
    steps: 100 of an agent with one recorded step replays that one."""
    http = stack.http
    publish(http, "writer", LIVE)
    unknown = f"step-{'0' * 8}-0000-0000-0000-{'0' * 12}"
    # No recorded session and no recorded step: nothing to replay.
    assert_problem(http.post("/v1/agents/writer/evals", json={"steps": 5}), 422, "no_sessions")
    step_id = recorded_step(http, [])
    cases = [
        ({"steps": -1}, "validation_error"),
        ({"steps": 101}, "validation_error"),
        ({"steps": "3"}, "validation_error"),
        ({"step_ids": [step_id] * 101}, "validation_error"),
        ({"step_ids": [step_id], "steps": 1}, "validation_error"),
        ({"step_ids": ["session-x"]}, "validation_error"),
        ({"step_ids": [unknown]}, "unknown_steps"),
        ({"steps": 0}, "no_sessions"),
    ]
    for body, code in cases:
        assert_problem(http.post("/v1/agents/writer/evals", json=body), 422, code)
    assert http.get("/v1/agents/writer/evals").json()["count"] == 0
    summary = start(http, "writer", candidate="writer@1", steps=100)
    assert (summary["total"], summary["options"]["step_ids"]) == (1, [step_id])
    assert finished(http, "writer", summary["id"])["status"] == "completed"


def test_the_cli_table_shows_a_steps_deliverables_and_the_totals_its_pass_rates() -> None:
    """``baton eval``'s table gives a step row its schema pass and attempts per side and
    the recorded handoff, a session row "-"; the totals line counts the steps and their
    pass rates."""
    usage = {"tokens": 10, "cost_usd": 0.0}
    common = {
        "final": {"similarity": 0.5},
        "tools": {"diff": []},
        "decisions": {"same": True, "candidate": []},
        "usage": {"baseline": usage, "candidate": usage},
    }
    step_item = {
        **common,
        "kind": "step",
        "session_id": "step-1",
        "regression": True,
        "changed": True,
        "deliverable": {
            "baseline": {"valid": True, "attempts": 1, "value": {}},
            "candidate": {"valid": False, "attempts": 3, "value": None},
            "recorded_handoff": "revised",
        },
    }
    session_item = {**common, "kind": "session", "session_id": "session-1"}
    session_item |= {"regression": False, "changed": False}
    body = {"id": "eval-x", "candidate": "draft", "baseline": "live", "status": "completed"}
    out = io.StringIO()
    report = {"sessions": [session_item, step_item]}
    Console(file=out, width=250).print(report_table({**body, "report": report}))
    rows = [line for line in out.getvalue().splitlines() if "step-1" in line or "session-1" in line]
    assert "pass (1) → fail (3) · revised" in rows[1] and "│ -" in rows[0]
    totals = {
        "sessions": 2,
        "steps": 1,
        "changed": 1,
        "regressions": 1,
        "tools_changed": 0,
        "decisions_changed": 0,
        "deliverable_pass_rate": {"baseline": 1.0, "candidate": 0.0},
        "tokens": {"baseline": 20, "candidate": 20},
        "cost_usd": {"baseline": 0.0, "candidate": 0.0},
        "errors": {"baseline": 0, "candidate": 1},
    }
    line = totals_line({**body, "report": {"totals": totals}})
    assert line.startswith("completed: 2 sessions · 1 steps, deliverables pass 100% → 0%")


async def test_a_cancel_sent_to_the_eval_workflow_itself_ends_the_eval_cancelled(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """A cancel of the Eval workflow from outside the API (as the Temporal UI sends it)
    while its step replays run takes the eval's cancel path: the eval is ``cancelled``
    (not ``failed``), its workflow and each replay's AgentStep run end CANCELED."""
    slow = [{"reply": "w " * 40, "chunk_delay_ms": 100}]
    with running_stack(temporal_env, tmp_path / "cancel.db") as stack:
        http = stack.http
        publish(http, "writer", slow)
        step_id = recorded_step(http, [], output_schema=None)
        summary = start(http, "writer", candidate="writer@1", step_ids=[step_id])
        replays = [replay_step_id(summary["id"], step_id, side) for side in SIDES]

        def replay_statuses() -> list[str | None]:
            with session_scope(stack.engine) as s:
                return [(row.status if (row := s.get(StepRow, r)) else None) for r in replays]

        poll(lambda: None not in replay_statuses(), "both step replays to start", timeout=60)
        handle = temporal_env.client.get_workflow_handle(summary["workflow_id"])
        await handle.cancel()
        with pytest.raises(WorkflowFailureError):
            await handle.result()
        assert (await handle.describe()).status == WorkflowExecutionStatus.CANCELED
        got = http.get(f"/v1/agents/writer/evals/{summary['id']}").json()
        assert (got["status"], got["error"]) == ("cancelled", None)
        for r in replays:  # cancel_replays ran: each replay's AgentStep run is cancelled
            step = temporal_env.client.get_workflow_handle(r)
            with pytest.raises(WorkflowFailureError):
                await step.result()
            assert (await step.describe()).status == WorkflowExecutionStatus.CANCELED
