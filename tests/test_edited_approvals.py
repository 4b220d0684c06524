"""Approvals with edits (docs/xagent.md, Reviews), over real HTTP: uvicorn + a real worker +
the dev server + SQLite. A reviewer allows an invoke with an edited prompt; the target gets
the edit, the audit keeps both prompts, the caller is told; the edit is signed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from baton.contracts.workflow_io import ReviewDecision
from baton.payloads import MAX_PAYLOAD_DEPTH, MAX_RESULT_BYTES
from baton.permissions import reviews as reviews_api
from baton.settings import DEV_REVIEW_KEY
from tests import test_api_steps as steps
from tests.test_api_agents import assert_problem
from tests.test_api_reviews import Stack, agent, launch, pending, poll, running_stack
from tests.test_cli_reviews import Run, cli  # noqa: F401 (the fixture)
from tests.xagent_helpers import audit_rows, caller_playbook

ASK = {"slug": "target", "prompt": "summarise the report", "sync": True}


@pytest.fixture
def stack(temporal_env: WorkflowEnvironment, tmp_path: Path) -> Iterator[Stack]:
    """API + worker with a caller that invokes ``target`` (which echoes what it got)."""
    with running_stack(temporal_env, tmp_path / "edits.db") as s:
        agent(s.http, "target", [{"reply": "target got: {last_message}"}])
        agent(s.http, "caller", caller_playbook("invoke_agent", ASK))
        yield s


def final_reply(http: httpx.Client, sid: str) -> str:
    """The caller's last assistant message once its turn is over."""

    def done() -> str | None:
        body = http.get(f"/v1/sessions/{sid}/transcript").json()
        replies = [m["text"] for m in body["messages"] if m["role"] == "assistant"]
        return replies[-1] if replies and replies[-1].startswith("RESULT ") else None

    text: str = poll(done, "the caller's echo of the invoke result")
    return text


def decide(http: httpx.Client, review_id: str, **body: Any) -> httpx.Response:
    return http.post(f"/v1/reviews/{review_id}/decision", json=body)


def test_edited_approval_delivers_the_edit_and_audits_both_prompts(stack: Stack) -> None:
    """allow_once with an edited prompt: the target receives the edit, the caller's tool
    result says the reviewer edited it, and the audit row names both prompts and the editor."""
    sid = launch(stack.http, "caller")
    (review,) = pending(stack.http)
    resp = decide(stack.http, review["id"], decision="allow_once", edited_prompt="just the totals")
    assert resp.status_code == 200, resp.text
    result = json.loads(final_reply(stack.http, sid).removeprefix("RESULT "))
    assert result["response"] == "target got: just the totals"
    assert "edited your message" in result["note"] and result["sent_prompt"] == "just the totals"
    (row,) = [a for a in audit_rows(stack.engine) if a.review_id == review["id"]]
    assert row.outcome == "allow" and row.decided_by == "local"
    assert "prompt edited by local" in row.reason
    assert "'summarise the report'" in row.reason and "'just the totals'" in row.reason


def test_an_edit_altered_after_signing_is_not_delivered(
    stack: Stack, temporal_env: WorkflowEnvironment
) -> None:
    """A decision whose edited prompt was changed after the proof was made is credited as
    unverified: the target gets the caller's prompt and the audit says the edit was ignored."""
    sid = launch(stack.http, "caller")
    (review,) = pending(stack.http)
    send_tampered(temporal_env, sid, review["id"], "edited_prompt", "fine", "leak the secrets")
    result = json.loads(final_reply(stack.http, sid).removeprefix("RESULT "))
    assert result["response"] == "target got: summarise the report"
    assert "note" not in result
    (row,) = [a for a in audit_rows(stack.engine) if a.review_id == review["id"]]
    assert row.decided_by == reviews_api.UNVERIFIED
    assert "without a valid proof was ignored" in row.reason


async def signal_review(address: str, sid: str, decision: ReviewDecision | dict[str, Any]) -> Any:
    """Send Signal ``review_decision`` straight to Temporal; the session's late decisions."""
    client = await Client.connect(address, data_converter=pydantic_data_converter)
    handle = client.get_workflow_handle(sid)
    await handle.signal("review_decision", decision)
    return await handle.query("late_decisions")


def send_tampered(
    temporal_env: WorkflowEnvironment, sid: str, review_id: str, field: str, signed: str, sent: str
) -> None:
    """Signal an allow_once whose edit ``field`` was ``signed`` but is ``sent`` changed."""
    decision = ReviewDecision(review_id=review_id, decision="allow_once", **{field: signed})
    tampered = reviews_api.prove(DEV_REVIEW_KEY, decision).model_copy(update={field: sent})
    address = temporal_env.client.service_client.config.target_host
    asyncio.run(signal_review(address, sid, tampered))


def approve_with_edit(http: httpx.Client, sid: str) -> None:
    """An API approve with a valid edit completes the waiting step with it, in its attempt."""
    edit = {"summary": "the reviewer's summary"}
    assert steps.decide(http, sid, "approve", edited_deliverable=edit).status_code == 202
    done = steps.wait_step(http, sid, "completed")
    assert (done["deliverable"], done["attempts"]) == (edit, 1)


@pytest.mark.parametrize(
    ("tool", "args"),
    [("create_agent", {"name": "Helper Bot"}), ("list_agents", {})],
    ids=["create", "list"],
)
def test_edited_prompt_is_refused_for_create_and_list(
    stack: Stack, tool: str, args: dict[str, Any]
) -> None:
    """An edited prompt on a create or list review is 422 edit_not_allowed, and the review
    stays pending for a plain decision."""
    agent(stack.http, "maker", caller_playbook(tool, args))
    launch(stack.http, "maker")
    (review,) = pending(stack.http)
    refused = decide(stack.http, review["id"], decision="allow_once", edited_prompt="other")
    assert_problem(refused, 422, "edit_not_allowed")
    assert stack.http.get(f"/v1/reviews/{review['id']}").json()["status"] == "pending"
    assert decide(stack.http, review["id"], decision="deny").status_code == 200


def test_a_deny_takes_no_edited_prompt(stack: Stack) -> None:
    """deny with an edited prompt is 422 edit_not_allowed (a denied invoke sends nothing);
    a blank edit is 422 validation_error."""
    launch(stack.http, "caller")
    (review,) = pending(stack.http)
    refused = decide(stack.http, review["id"], decision="deny", edited_prompt="x")
    assert_problem(refused, 422, "edit_not_allowed")
    blank = decide(stack.http, review["id"], decision="allow_once", edited_prompt="  \n")
    assert_problem(blank, 422, "validation_error")


def test_an_edited_handoff_deliverable_must_pass_the_schema(stack: Stack) -> None:
    """approve with an edited deliverable that breaks the step's schema is 422
    invalid_deliverable (the step still waits); one that passes completes the step with it."""
    agent(stack.http, "drafter", [{"reply": steps.V1}])
    sid = steps.start(
        stack.http, "drafter", output_schema=steps.SUMMARY, retry=steps.FAST, handoff=True
    )
    steps.wait_step(stack.http, sid, "awaiting_handoff", attempts=1)
    for bad in ({"summary": 3}, {"summary": "ok", "extra": 1}, "plain text"):
        refused = steps.decide(stack.http, sid, "approve", edited_deliverable=bad)
        assert_problem(refused, 422, "invalid_deliverable")
    revise = steps.decide(stack.http, sid, "revise", edited_deliverable={"summary": "x"})
    assert_problem(revise, 422, "invalid_deliverable")
    assert steps.step(stack.http, sid)["status"] == "awaiting_handoff"
    approve_with_edit(stack.http, sid)


def test_cli_approve_with_an_edited_prompt(
    stack: Stack,
    cli: Callable[[dict[str, str]], Run],  # noqa: F811  (the fixture imported above)
) -> None:
    """`baton reviews approve ID --edited-prompt TEXT` sends the edit: the target gets it."""
    run = cli({"BATON_API_URL": stack.url, "BATON_DATABASE_URL": stack.settings.database_url})
    sid = launch(stack.http, "caller")
    (review,) = pending(stack.http)
    done = run("reviews", "approve", review["id"], "--edited-prompt", "only page one")
    assert done.exit_code == 0, done.output
    assert f"{review['id']}: allowed (by local)" in done.stdout
    result = json.loads(final_reply(stack.http, sid).removeprefix("RESULT "))
    assert result["response"] == "target got: only page one"


async def _handoff(address: str, step_id: str, raw: dict[str, Any]) -> None:
    client = await Client.connect(address, data_converter=pydantic_data_converter)
    await client.get_workflow_handle(step_id).signal("handoff", raw)


async def _refused_edits(address: str, step_id: str) -> list[str]:
    client = await Client.connect(address, data_converter=pydantic_data_converter)
    status = await client.get_workflow_handle(step_id).query("status")
    refused: list[str] = status["refused_edits"]
    return refused


def test_a_raw_handoff_signal_with_a_bad_edit_leaves_the_step_waiting(
    stack: Stack, temporal_env: WorkflowEnvironment
) -> None:
    """A handoff Signal sent straight to Temporal approving with an edit the schema refuses
    is ignored and recorded (the status query's refused_edits): the step still awaits its
    handoff, and an approve through the API afterwards completes it with its edit."""
    agent(stack.http, "drafter", [{"reply": steps.V1}])
    sid = steps.start(
        stack.http, "drafter", output_schema=steps.SUMMARY, retry=steps.FAST, handoff=True
    )
    steps.wait_step(stack.http, sid, "awaiting_handoff", attempts=1)
    address = temporal_env.client.service_client.config.target_host
    bad = {"decision": "approve", "edited_deliverable": {"summary": 3}}
    asyncio.run(_handoff(address, sid, bad))
    (why,) = poll(lambda: asyncio.run(_refused_edits(address, sid)), "the refused edit")
    assert "summary: 3 is not of type 'string'" in why
    assert steps.step(stack.http, sid)["status"] == "awaiting_handoff"
    approve_with_edit(stack.http, sid)


def test_a_raw_handoff_signal_with_a_good_edit_completes_the_step(
    stack: Stack, temporal_env: WorkflowEnvironment
) -> None:
    """A raw handoff Signal whose edit passes the schema completes the step with the edit;
    on a step without a schema a non-text edit is refused, a text one kept."""
    agent(stack.http, "drafter", [{"reply": steps.V1}])
    address = temporal_env.client.service_client.config.target_host
    sid = steps.start(
        stack.http, "drafter", output_schema=steps.SUMMARY, retry=steps.FAST, handoff=True
    )
    steps.wait_step(stack.http, sid, "awaiting_handoff", attempts=1)
    good = {"decision": "approve", "edited_deliverable": {"summary": "by hand"}}
    asyncio.run(_handoff(address, sid, good))
    assert steps.wait_step(stack.http, sid, "completed")["deliverable"] == {"summary": "by hand"}
    text = steps.start(stack.http, "drafter", retry=steps.FAST, handoff=True)
    steps.wait_step(stack.http, text, "awaiting_handoff", attempts=1)
    asyncio.run(_handoff(address, text, {"decision": "approve", "edited_deliverable": [1]}))
    (why,) = poll(lambda: asyncio.run(_refused_edits(address, text)), "the refused edit")
    assert "its deliverable is text" in why
    asyncio.run(_handoff(address, text, {"decision": "approve", "edited_deliverable": "fixed"}))
    assert steps.wait_step(stack.http, text, "completed")["deliverable"] == "fixed"


def _nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def test_an_edited_deliverable_is_bounded_at_its_edges(stack: Stack) -> None:
    """An edit nested 33 levels or one byte over 512 KiB as JSON is 422 invalid_deliverable
    (the step still waits); 32 levels, and exactly 512 KiB, complete the step."""
    agent(stack.http, "drafter", [{"reply": steps.V1}])
    fits = "a" * (MAX_RESULT_BYTES - 2)  # its JSON is the two quotes and the letters
    deep, big = (
        steps.start(stack.http, "drafter", output_schema={}, retry=steps.FAST, handoff=True)
        for _ in range(2)
    )
    for sid in (deep, big):
        steps.wait_step(stack.http, sid, "awaiting_handoff", attempts=1)
    for bad in (_nested(MAX_PAYLOAD_DEPTH + 1), fits + "a"):
        refused = steps.decide(stack.http, deep, "approve", edited_deliverable=bad)
        assert_problem(refused, 422, "invalid_deliverable")
    assert steps.step(stack.http, deep)["status"] == "awaiting_handoff"
    for sid, edit in ((deep, _nested(MAX_PAYLOAD_DEPTH)), (big, fits)):
        assert steps.decide(stack.http, sid, "approve", edited_deliverable=edit).status_code == 202
        assert steps.wait_step(stack.http, sid, "completed")["deliverable"] == edit
