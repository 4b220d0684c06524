"""An eval's optional judge model (docs/change-safely.md, The judge) on the real stack:
uvicorn + worker + Temporal dev server + SQLite, the scripted playbook model as the agent
and a local stand-in for the OpenAI Chat Completions API (tests/openai_stub.py) as the
judge: the real model path, no paid model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import select
from temporalio.testing import WorkflowEnvironment

from baton.evals import judge
from baton.storage.db import UsageRow, session_scope
from tests.conftest import serve
from tests.openai_stub import COMPLETION_TOKENS, PROMPT_TOKENS, OpenAIStub
from tests.test_api_agents import assert_problem
from tests.test_api_reviews import Stack, running_stack
from tests.test_eval_steps import LIVE as LIVE_STEP
from tests.test_eval_steps import recorded_step
from tests.test_evals import finished, publish, record, start

JUDGE = "openai-chat:stub-model"
WORSE = '{"verdict": "worse", "reason": "the candidate no longer answers the sum"}'
#: $1 per token of the judge: its cost is its token count in dollars.
PRICES = {"scripted": (0.0, 0.0), JUDGE: (1_000_000.0, 1_000_000.0)}


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> Iterator[OpenAIStub]:
    """The stub judge on a loopback port, the OpenAI provider pointed at it."""
    fake = OpenAIStub(reply=WORSE)
    server, thread, base = serve(fake.app)
    monkeypatch.setenv("OPENAI_BASE_URL", f"{base}/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    try:
        yield fake
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture
def stack(temporal_env: WorkflowEnvironment, tmp_path: Path, stub: OpenAIStub) -> Iterator[Stack]:
    """API + worker on a fresh SQLite file, the judge priced."""
    with running_stack(temporal_env, tmp_path / "judge.db", prices=PRICES) as s:
        yield s


def test_the_judges_verdict_lands_in_the_report_and_a_worse_is_a_regression(
    stack: Stack, stub: OpenAIStub
) -> None:
    """A draft changes the answer to a sum: the judge is asked about that changed session
    only, its {verdict: worse, reason} is the item's final.judge and makes it a
    regression; the unchanged session has no verdict; the judge's call is metered to the
    eval (a usage row of the eval's id) and charged to the balance."""
    http = stack.http
    publish(http, "helper", [{"when": "sum", "reply": "forty-two"}, {"reply": "plain"}])
    sums = record(http, "helper", "sum it")
    hello = record(http, "helper", "hello")
    draft = {"playbook": [{"when": "sum", "reply": "no idea"}, {"reply": "plain"}]}
    assert http.put("/v1/agents/helper/draft", json=draft).status_code == 200
    assert http.put("/v1/balance", json={"balance": 1000.0}).status_code == 200

    summary = start(http, "helper", judge=JUDGE)
    assert summary["options"]["judge"] == JUDGE
    body = finished(http, "helper", summary["id"])
    assert (body["status"], body["changed"], body["regressions"]) == ("completed", 1, 1)
    items = {i["session_id"]: i for i in body["report"]["sessions"]}
    assert items[sums]["final"]["judge"] == {
        "verdict": "worse",
        "reason": "the candidate no longer answers the sum",
    }
    assert items[sums]["regression"] is True
    assert items[hello]["final"]["judge"] is None and items[hello]["regression"] is False
    (asked,) = stub.requests
    said = str(asked["messages"])
    assert "forty-two" in said and "no idea" in said
    with session_scope(stack.engine) as s:
        (row,) = s.exec(select(UsageRow).where(UsageRow.session_id == summary["id"])).all()
        assert (row.model, row.input_tokens, row.output_tokens) == (
            JUDGE,
            PROMPT_TOKENS,
            COMPLETION_TOKENS,
        )
        assert row.cost_usd == PROMPT_TOKENS + COMPLETION_TOKENS
    balance = http.get("/v1/balance").json()["balance"]
    assert balance == 1000.0 - (PROMPT_TOKENS + COMPLETION_TOKENS)


def test_the_judge_compares_a_changed_steps_deliverables(stack: Stack, stub: OpenAIStub) -> None:
    """A draft whose deliverable still passes the schema but says something else: the step
    changed with no schema regression, the judge is sent both deliverables, and its
    "worse" makes the step a regression."""
    http = stack.http
    publish(http, "writer", LIVE_STEP)
    step_id = recorded_step(http, [])
    draft = {"playbook": [{"reply": '{"summary": "meh"}'}]}
    assert http.put("/v1/agents/writer/draft", json=draft).status_code == 200

    body = finished(http, "writer", start(http, "writer", step_ids=[step_id], judge=JUDGE)["id"])
    (item,) = body["report"]["sessions"]
    assert (item["kind"], item["deliverable"]["candidate"]["valid"]) == ("step", True)
    assert item["final"]["judge"]["verdict"] == "worse"
    assert (item["changed"], item["regression"], body["regressions"]) == (True, True, 1)
    (asked,) = stub.requests
    said = str(asked["messages"])
    assert "deliverable (JSON)" in said and '"ok"' in said and '"meh"' in said


def test_a_judge_this_deployment_cannot_build_is_refused_and_starts_nothing(
    stack: Stack, stub: OpenAIStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unknown provider, the scripted model, an Anthropic model with no key: 422
    unknown_judge; an empty or overlong name: 422 validation_error; no eval recorded and no
    judge asked."""
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    http = stack.http
    publish(http, "helper", [{"reply": "hi"}])
    record(http, "helper", "hello")
    cases: list[tuple[dict[str, Any], str]] = [
        ({"judge": "nosuch:model"}, "unknown_judge"),
        ({"judge": "scripted"}, "unknown_judge"),
        ({"judge": "anthropic:claude-sonnet-4-5"}, "unknown_judge"),
        ({"judge": ""}, "validation_error"),
        ({"judge": "openai:" + "x" * 300}, "validation_error"),
        ({"judge": 3}, "validation_error"),
    ]
    for body, code in cases:
        resp = http.post("/v1/agents/helper/evals", json={"candidate": "helper@1", **body})
        assert_problem(resp, 422, code)
    assert http.get("/v1/agents/helper/evals").json()["count"] == 0
    assert stub.requests == []


def test_a_judges_reply_is_parsed_to_a_verdict_or_refused() -> None:
    """The first JSON object of the reply is the verdict (prose around it ignored, a long
    reason cut); no object, another verdict or no verdict at all is a ValueError."""
    found = judge.parse('Sure: {"verdict": "better", "reason": "clearer"} done')
    assert (found.verdict, found.reason) == ("better", "clearer")
    long = judge.parse('{"verdict": "same", "reason": "' + "r" * 5000 + '"}')
    assert len(long.reason) == judge.MAX_REASON_CHARS
    for bad in ("no json here", '{"verdict": "awful"}', '{"reason": "x"}', "{not json}"):
        with pytest.raises(ValueError):
            judge.parse(bad)
