"""A reviewer allows a create with an edited name or instructions (docs/xagent.md, Reviews),
over real HTTP: uvicorn + a real worker + the dev server + SQLite. The new agent gets the
edits, the audit keeps both, the caller is told; the edits are bounded as create_agent's own
arguments, signed, and go only with an allowed create.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from baton.contracts.workflow_io import ReviewDecision
from baton.permissions import reviews as reviews_api
from baton.settings import DEV_REVIEW_KEY
from tests.test_api_agents import assert_problem
from tests.test_api_reviews import Stack, agent, launch, pending, running_stack
from tests.test_cli_reviews import Run, cli  # noqa: F401 (the fixture)
from tests.test_edited_approvals import decide, final_reply, send_tampered, signal_review
from tests.xagent_helpers import audit_rows, caller_playbook

CREATE = {"name": "Helper Bot", "instructions": "be brief"}


@pytest.fixture
def stack(temporal_env: WorkflowEnvironment, tmp_path: Path) -> Iterator[Stack]:
    """API + worker with ``maker``, which creates an agent and echoes the tool's result."""
    with running_stack(temporal_env, tmp_path / "creates.db") as s:
        agent(s.http, "maker", caller_playbook("create_agent", CREATE))
        yield s


def created(stack: Stack, sid: str) -> dict[str, Any]:
    """The maker's create_agent result, once its turn echoed it."""
    result: dict[str, Any] = json.loads(final_reply(stack.http, sid).removeprefix("RESULT "))
    return result


def live_spec(stack: Stack, slug: str) -> dict[str, Any]:
    """The agent's name and live revision's spec."""
    body = stack.http.get(f"/v1/agents/{slug}").json()
    revision = stack.http.get(f"/v1/agents/{slug}/revisions/{body['live_version']}").json()
    return {"name": body["name"], "system_prompt": revision["spec"]["system_prompt"]}


def audit_reason(stack: Stack, review_id: str) -> str:
    (row,) = [a for a in audit_rows(stack.engine) if a.review_id == review_id]
    return str(row.reason)


def test_an_edited_create_makes_the_agent_the_reviewer_wrote(stack: Stack) -> None:
    """allow_once with an edited name and instructions: the new agent has both, the
    caller's result says the reviewer edited its request, the audit names both versions."""
    sid = launch(stack.http, "maker")
    (review,) = pending(stack.http)
    resp = decide(
        stack.http,
        review["id"],
        decision="allow_once",
        edited_name="Fact Checker",
        edited_instructions="check every figure",
    )
    assert resp.status_code == 200, resp.text
    result = created(stack, sid)
    assert (result["slug"], result["name"]) == ("fact-checker", "Fact Checker")
    assert "the reviewer (local) edited your request" in result["note"]
    assert result["instructions"] == "check every figure"
    spec = live_spec(stack, "fact-checker")
    assert spec == {"name": "Fact Checker", "system_prompt": "check every figure"}
    reason = audit_reason(stack, review["id"])
    assert "name edited by local: original 'Helper Bot' → edited 'Fact Checker'" in reason
    assert "instructions edited by local: original 'be brief'" in reason
    assert "'check every figure'" in reason


def test_an_edited_name_keeps_the_callers_instructions(stack: Stack) -> None:
    """Only the name edited: the new agent keeps the caller's instructions, and the caller
    is told only its name was edited."""
    sid = launch(stack.http, "maker")
    (review,) = pending(stack.http)
    assert decide(stack.http, review["id"], decision="allow_once", edited_name="Other").is_success
    result = created(stack, sid)
    assert result["note"].endswith("created with the edited name") and "instructions" not in result
    assert live_spec(stack, "other") == {"name": "Other", "system_prompt": "be brief"}


def test_edits_are_bounded_as_create_agents_arguments(stack: Stack) -> None:
    """An edited name of 201 characters, instructions of 100,001 or a blank name are 422
    validation_error (the review stays pending); 200 and 100,000, the tool's own bounds,
    create the agent."""
    sid = launch(stack.http, "maker")
    (review,) = pending(stack.http)
    rid = review["id"]
    for edit in (
        {"edited_name": "n" * 201},
        {"edited_instructions": "i" * 100_001},
        {"edited_name": " "},
    ):
        assert_problem(
            decide(stack.http, rid, decision="allow_once", **edit), 422, "validation_error"
        )
    assert stack.http.get(f"/v1/reviews/{rid}").json()["status"] == "pending"
    name, instructions = "n" * 200, "i" * 100_000
    resp = decide(
        stack.http, rid, decision="allow_once", edited_name=name, edited_instructions=instructions
    )
    assert resp.status_code == 200, resp.text
    result = created(stack, sid)
    assert result["name"] == name and result["instructions"].endswith("… (cut)")
    assert live_spec(stack, result["slug"]) == {"name": name, "system_prompt": instructions}


@pytest.mark.parametrize(
    ("tool", "args", "body", "path"),
    [
        ("create_agent", CREATE, {"decision": "deny", "edited_name": "x"}, "edited_name"),
        ("create_agent", CREATE, {"decision": "allow_once", "edited_prompt": "x"}, "edited_prompt"),
        (
            "invoke_agent",
            {"slug": "maker", "prompt": "hi"},
            {"decision": "allow_once", "edited_name": "x"},
            "edited_name",
        ),
        (
            "list_agents",
            {},
            {"decision": "allow_once", "edited_instructions": "x"},
            "edited_instructions",
        ),
    ],
    ids=["deny-of-create", "prompt-on-create", "name-on-invoke", "instructions-on-list"],
)
def test_a_create_edit_goes_only_with_an_allowed_create(
    stack: Stack, tool: str, args: dict[str, Any], body: dict[str, Any], path: str
) -> None:
    """An edit its decision cannot carry is 422 edit_not_allowed naming the field (a deny
    takes none, a create no prompt, an invoke or a list no name or instructions); the
    review stays pending for a plain decision."""
    agent(stack.http, "asker", caller_playbook(tool, args))
    launch(stack.http, "asker")
    (review,) = pending(stack.http)
    refused = decide(stack.http, review["id"], **body)
    assert_problem(refused, 422, "edit_not_allowed")
    assert refused.json()["path"] == path
    assert stack.http.get(f"/v1/reviews/{review['id']}").json()["status"] == "pending"
    assert decide(stack.http, review["id"], decision="deny").status_code == 200


def test_the_proof_signs_a_creates_edits() -> None:
    """The decision proof covers edited_name and edited_instructions: changing either after
    signing breaks it, and a name edit never verifies as the same text as a prompt edit."""
    plain = ReviewDecision(review_id="review-1", decision="allow_once")
    signed = reviews_api.prove(DEV_REVIEW_KEY, plain.model_copy(update={"edited_name": "A"}))
    assert reviews_api.is_proven(DEV_REVIEW_KEY, signed)
    for change in ({"edited_name": "B"}, {"edited_instructions": "x"}, {"edited_name": None}):
        assert not reviews_api.is_proven(DEV_REVIEW_KEY, signed.model_copy(update=change))
    moved = signed.model_copy(update={"edited_name": None, "edited_prompt": "A"})
    assert not reviews_api.is_proven(DEV_REVIEW_KEY, moved)
    both = plain.model_copy(update={"edited_name": "A", "edited_instructions": "B"})
    swapped = both.model_copy(update={"edited_name": "B", "edited_instructions": "A"})
    proof = reviews_api.decision_proof(DEV_REVIEW_KEY, both)
    assert proof != reviews_api.decision_proof(DEV_REVIEW_KEY, swapped)


def test_a_create_edit_altered_after_signing_is_not_applied(
    stack: Stack, temporal_env: WorkflowEnvironment
) -> None:
    """A decision whose edited name was changed after the proof was made is credited as
    unverified: the agent gets the caller's name and the audit says the edit was ignored."""
    sid = launch(stack.http, "maker")
    (review,) = pending(stack.http)
    send_tampered(temporal_env, sid, review["id"], "edited_name", "Fine", "Root Access")
    result = created(stack, sid)
    assert result["name"] == "Helper Bot" and "note" not in result
    reason = audit_reason(stack, review["id"])
    assert "an edit of the name without a valid proof was ignored" in reason


def test_a_raw_signal_with_a_bad_edit_changes_nothing(
    stack: Stack, temporal_env: WorkflowEnvironment
) -> None:
    """A raw Signal whose edited name breaks create_agent's bound is kept as an
    invalid_decision, the session's workflow task does not fail, the review stays pending,
    and an API decision afterwards applies its edit."""
    sid = launch(stack.http, "maker")
    (review,) = pending(stack.http)
    raw = {"review_id": review["id"], "decision": "allow_once", "edited_name": "n" * 201}
    address = temporal_env.client.service_client.config.target_host
    late = asyncio.run(signal_review(address, sid, raw))
    assert [(d["review_id"], d["reason"]) for d in late] == [(review["id"], "invalid_decision")]
    assert stack.http.get(f"/v1/reviews/{review['id']}").json()["status"] == "pending"
    resp = decide(stack.http, review["id"], decision="allow_once", edited_name="Second Try")
    assert resp.status_code == 200, resp.text
    assert created(stack, sid)["name"] == "Second Try"


def test_cli_approve_with_an_edited_name_and_instructions(
    stack: Stack,
    cli: Callable[[dict[str, str]], Run],  # noqa: F811  (the fixture imported above)
) -> None:
    """`baton reviews approve ID --edited-name X --edited-instructions Y` sends both edits:
    the new agent has them."""
    run = cli({"BATON_API_URL": stack.url, "BATON_DATABASE_URL": stack.settings.database_url})
    sid = launch(stack.http, "maker")
    (review,) = pending(stack.http)
    done = run(
        "reviews",
        "approve",
        review["id"],
        "--edited-name",
        "Cli Made",
        "--edited-instructions",
        "from the terminal",
    )
    assert done.exit_code == 0, done.output
    assert f"{review['id']}: allowed (by local)" in done.stdout
    assert created(stack, sid)["slug"] == "cli-made"
    assert live_spec(stack, "cli-made") == {
        "name": "Cli Made",
        "system_prompt": "from the terminal",
    }
