"""The publish gate end to end on the real stack (uvicorn + worker + Temporal dev server +
SQLite, the scripted model): a real eval of the draft, then publishing through the gate."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from tests.test_api_agents import assert_problem
from tests.test_api_reviews import Stack, running_stack
from tests.test_evals import finished, record, start

GATE = {"eval_sessions": 2, "max_changed": 1, "max_regressions": 0}
LIVE = [{"when": "hello", "reply": "hi there"}, {"reply": "plain: {last_message}"}]
#: One rule changed: the greeting.
DRAFT = [{"when": "hello", "reply": "HELLO THERE"}, LIVE[1]]


@pytest.fixture
def stack(temporal_env: WorkflowEnvironment, tmp_path: Path) -> Iterator[Stack]:
    """API + worker on a fresh SQLite file."""
    with running_stack(temporal_env, tmp_path / "gate-e2e.db") as s:
        yield s


def test_an_eval_of_the_draft_lets_it_through_the_gate(stack: Stack) -> None:
    """A gated agent's edited draft is refused ``eval_required``; an eval of it over two
    recorded sessions (one changed by the edited rule) completes within the gate, and
    publishing then makes the next revision, recording that eval."""
    http = stack.http
    spec = {"playbook": LIVE, "publish_gate": GATE}
    assert http.post("/v1/agents", json={"slug": "greeter", "name": "G", "spec": spec}).is_success
    assert http.post("/v1/agents/greeter/publish").status_code == 201
    for prompt in ("hello you", "what time"):
        record(http, "greeter", prompt)
    draft = {"playbook": DRAFT, "publish_gate": GATE}
    assert http.put("/v1/agents/greeter/draft", json=draft).status_code == 200
    assert_problem(http.post("/v1/agents/greeter/publish"), 409, "eval_required")

    began = start(http, "greeter", candidate="draft", baseline="live", sessions=2)
    done = finished(http, "greeter", began["id"])
    assert done["status"] == "completed", done
    assert (done["total"], done["changed"], done["regressions"]) == (2, 1, 0)

    published = http.post("/v1/agents/greeter/publish")
    assert published.status_code == 201, published.text
    assert published.json()["version"] == 2 and published.json()["eval_id"] == began["id"]


def test_an_eval_over_the_gate_keeps_the_draft_out(stack: Stack) -> None:
    """A draft that changes both recorded sessions gets a completed eval with 2 changed,
    one past the gate's ``max_changed``: publishing is ``eval_failed`` naming that eval and
    that limit, and the live revision stays 1."""
    http = stack.http
    spec = {"playbook": LIVE, "publish_gate": GATE}
    assert http.post("/v1/agents", json={"slug": "greeter", "name": "G", "spec": spec}).is_success
    assert http.post("/v1/agents/greeter/publish").status_code == 201
    for prompt in ("hello you", "what time"):
        record(http, "greeter", prompt)
    everything = [{"reply": "something else"}]
    draft = {"playbook": everything, "publish_gate": GATE}
    assert http.put("/v1/agents/greeter/draft", json=draft).status_code == 200

    began = start(http, "greeter", candidate="draft", baseline="live", sessions=2)
    done = finished(http, "greeter", began["id"])
    assert (done["status"], done["total"], done["changed"]) == ("completed", 2, 2), done

    refused = assert_problem(http.post("/v1/agents/greeter/publish"), 409, "eval_failed")
    assert refused["eval_id"] == began["id"] and refused["failed"] == "max_changed"
    assert http.get("/v1/agents/greeter").json()["live_version"] == 1
