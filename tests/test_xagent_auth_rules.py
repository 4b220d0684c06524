"""X-Agent calls, reviews and auth mode at their edges: whose roles a turn uses, who may
always-allow, what a deleted or recreated agent keeps, the tool-call cap per reply, text a
database cannot store, policy targets and review timeout bounds."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy.engine import Engine
from sqlmodel import select
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.xagent import XAgentActivities
from baton.agents import registry
from baton.contracts.activity_io import SettleInput, ToolMessage
from baton.contracts.values import ToolCall
from baton.contracts.workflow_io import ReviewDecision
from baton.errors import AgentInUse
from baton.runs import launch as launching
from baton.settings import Settings
from baton.storage.db import XAgentPolicy, session_scope
from tests.helpers import TEST_CONFIG, launch, publish, status, transcript, wait_for
from tests.test_api_agents import assert_problem
from tests.test_api_reviews import INVOKE_SYNC, Stack, decide, pending, result_of, settled
from tests.test_api_reviews import launch as api_launch
from tests.test_auth import Users, create_agent, grant
from tests.test_auth import live_auth as live_auth  # the fixture, re-exported for pytest
from tests.xagent_helpers import caller_playbook, open_reviews, reviews_of


def test_a_message_uses_its_senders_roles_not_the_session_creators(
    live_auth: tuple[Users, Stack],
) -> None:
    """bob posting into alice's session cannot use alice's access to another agent."""
    users, st = live_auth
    alice, bob = users["alice"], users["bob"]
    create_agent(alice, "target", [{"reply": "secret"}])
    create_agent(alice, "caller", caller_playbook("invoke_agent", INVOKE_SYNC))
    assert (
        alice.put("/v1/agents/caller/policies", json={"global": {"invoke": "allow"}}).status_code
        == 200
    )
    grant(st.engine, "caller", "bob", "user")
    sid = api_launch(alice, "caller", prompt="hello")
    settled(alice, sid)
    sent = bob.post(f"/v1/sessions/{sid}/messages", json={"prompt": "go", "sync": True})
    assert sent.status_code == 200, sent.text
    result = result_of(bob, sid)
    assert "access_denied" in result["error"] and "'bob'" in result["error"]


def test_always_allow_needs_the_owner_role_in_auth_mode(live_auth: tuple[Users, Stack]) -> None:
    """A user-role holder may allow once, but saving a policy (always_allow) needs owner."""
    users, st = live_auth
    alice, bob = users["alice"], users["bob"]
    create_agent(alice, "target", [{"reply": "hi"}])
    create_agent(alice, "caller", caller_playbook("invoke_agent", INVOKE_SYNC))
    grant(st.engine, "caller", "bob", "user")
    grant(st.engine, "target", "bob", "user")
    sid = api_launch(bob, "caller")
    (review,) = pending(bob)
    assert_problem(decide(bob, review["id"], "always_allow", scope="all"), 403, "forbidden")
    assert decide(bob, review["id"], "allow_once").status_code == 200
    settled(bob, sid)
    with session_scope(st.engine) as s:
        assert s.exec(select(XAgentPolicy)).all() == []


def test_a_slug_with_session_history_cannot_be_recreated_in_auth_mode(
    live_auth: tuple[Users, Stack],
) -> None:
    """After alice deletes an agent with sessions, dave cannot take its slug (and its history)."""
    users, _ = live_auth
    alice, dave = users["alice"], users["dave"]
    create_agent(alice, "secret", [{"reply": "classified"}])
    sid = api_launch(alice, "secret")
    settled(alice, sid)
    assert alice.post(f"/v1/sessions/{sid}/cancel").status_code == 202
    settled(alice, sid, "cancelled")
    assert alice.delete("/v1/agents/secret").status_code == 204
    taken = dave.post("/v1/agents", json={"slug": "secret", "name": "Mine"})
    assert_problem(taken, 409, "agent_exists")
    assert dave.get(f"/v1/sessions/{sid}").status_code in (403, 404)


async def test_an_agent_with_open_sessions_cannot_be_deleted(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """Delete is refused (agent_in_use) while a session of the agent is open; ok once closed."""
    publish(db_engine, "busy", playbook=[{"reply": "hi"}])
    run = await launch(temporal_env.client, db_engine, worker, "busy", "hello")
    with session_scope(db_engine) as s, pytest.raises(AgentInUse, match="still open"):
        registry.delete_agent(s, slug="busy")
    await launching.cancel_session(temporal_env.client, db_engine, session_id=run.session_id)
    await wait_for(lambda: status(db_engine, run.session_id) == "cancelled")
    with session_scope(db_engine) as s:
        registry.delete_agent(s, slug="busy")


async def test_always_allow_for_a_deleted_target_saves_no_policy(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """An always_allow decided after its target was deleted is an allow-once: no row."""
    publish(db_engine, "target", playbook=[{"reply": "hi"}])
    publish(db_engine, "caller", playbook=caller_playbook("invoke_agent", INVOKE_SYNC))
    run = await launch(temporal_env.client, db_engine, worker, "caller", "go", sync=False)
    (review,) = await open_reviews(temporal_env.client, db_engine, run.session_id)
    with session_scope(db_engine) as s:
        registry.delete_agent(s, slug="target")
    await temporal_env.client.get_workflow_handle(run.session_id).signal(
        "review_decision",
        ReviewDecision(review_id=review.id, decision="always_allow", scope="target"),
    )
    await wait_for(lambda: status(db_engine, run.session_id) == "idle")
    with session_scope(db_engine) as s:
        assert s.exec(select(XAgentPolicy)).all() == []
    assert "unknown_agent: no agent 'target'" in transcript(db_engine, run.session_id)[-1][1]


async def test_a_retried_settle_still_releases_the_reviews_its_policy_covers(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """settle_review run twice (a retry after its commit) reports the covered reviews both times."""
    publish(db_engine, "t1", playbook=[{"reply": "1"}])
    publish(db_engine, "t2", playbook=[{"reply": "2"}])
    publish(
        db_engine,
        "caller",
        playbook=caller_playbook(
            "invoke_agent", {"slug": "{last_message}", "prompt": "p"}, when="^t"
        ),
    )
    first = await launch(temporal_env.client, db_engine, worker, "caller", "t1", sync=False)
    second = await launch(temporal_env.client, db_engine, worker, "caller", "t2", sync=False)
    (r1,) = await open_reviews(temporal_env.client, db_engine, first.session_id)
    (r2,) = await open_reviews(temporal_env.client, db_engine, second.session_id)
    acts = XAgentActivities(db_engine, temporal_env.client)
    tool = ToolMessage(
        session_id=first.session_id,
        agent_slug="caller",
        message_id=f"{first.session_id}:manual",
        position="000001.001.2000",
        call=ToolCall(id="c", name="invoke_agent", args={"slug": "t1", "prompt": "p"}),
    )
    settle = SettleInput(
        tool=tool,
        review_id=r1.id,
        operation="invoke",
        target="t1",
        outcome="allowed",
        decision=ReviewDecision(review_id=r1.id, decision="always_allow", scope="all"),
    )
    once = await asyncio.to_thread(acts._settle, settle)
    again = await asyncio.to_thread(acts._settle, settle)
    assert once[1] == again[1] == [(r2.id, second.session_id)]
    for run in (first, second):
        await launching.cancel_session(temporal_env.client, db_engine, session_id=run.session_id)


async def test_tool_calls_of_one_reply_run_up_to_the_cap(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """With a cap of 2, a reply's 2nd call runs and its 3rd gets too_many_tool_calls."""
    calls = [{"tool": "calculator", "args": {"expression": f"{i} + 1"}} for i in range(3)]
    publish(
        db_engine,
        "greedy",
        tools=["calculator"],
        playbook=[{"when": "^calculator: ", "reply": "done"}, {"when": "go", "tool_calls": calls}],
    )
    config = TEST_CONFIG.model_copy(update={"max_tool_calls_per_reply": 2})
    run = await launch(temporal_env.client, db_engine, worker, "greedy", "go", config=config)
    tools = [text for role, text in transcript(db_engine, run.session_id) if role == "tool"]
    assert tools[:2] == ["1", "2"]
    assert tools[2].startswith("too_many_tool_calls")
    assert TEST_CONFIG.max_tool_calls_per_reply == 16


async def test_text_a_database_cannot_store_is_refused_as_bad_arguments(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """invoke_agent with a NUL in its prompt is an invalid_arguments tool error, no review."""
    publish(db_engine, "target", playbook=[{"reply": "hi"}])
    fill = {"slug": "target", "prompt": "{last_message}", "sync": True}
    publish(db_engine, "caller", playbook=caller_playbook("invoke_agent", fill))
    run = await launch(temporal_env.client, db_engine, worker, "caller", "go \u0000 there")
    assert "invalid_arguments" in (run.response or "")
    assert reviews_of(db_engine) == []


def test_policy_targets_must_be_slugs(api: Any) -> None:
    """PUT policies with a target key that is not a slug is a 422, never a 500."""
    for slug in ("a", "b"):
        assert api.post("/v1/agents", json={"slug": slug, "name": slug}).status_code == 201
    for key in ("\\ud800", "tgt\\u0000", "Upper", "x" * 100):
        raw = '{"targets": {"' + key + '": {"invoke": "allow"}}}'
        sent = api.put(
            "/v1/agents/a/policies", content=raw, headers={"content-type": "application/json"}
        )
        assert sent.status_code == 422, (key, sent.text)


@pytest.mark.parametrize("value", ["inf", "nan", str(8 * 86400)])
def test_review_timeout_must_be_finite_and_at_most_a_week(value: str) -> None:
    """BATON_REVIEW_TIMEOUT=inf/nan or over 7 days is refused at startup."""
    with pytest.raises(ValidationError):
        Settings(review_timeout=value)
    assert Settings(review_timeout=7 * 86400).review_timeout == 7 * 86400


async def test_a_repeated_delegation_send_leaves_the_session_idle(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """Re-sending a finished idempotent message (a retried delegation) does not mark it running."""
    publish(db_engine, "echo", playbook=[{"reply": "hi"}])
    run = await launch(temporal_env.client, db_engine, worker, "echo", "one")

    def replied(turns: int) -> bool:
        roles = [r for r, _ in transcript(db_engine, run.session_id)]
        return roles.count("assistant") >= turns

    for _ in range(2):
        await launching.send_message(
            temporal_env.client,
            db_engine,
            session_id=run.session_id,
            prompt="two",
            sync=False,
            update_id="same-delegation",
        )
        # Idle only once the second turn's reply is stored: before it, the stored status is
        # still the first turn's idle, which proves nothing.
        await wait_for(lambda: replied(2) and status(db_engine, run.session_id) == "idle")
    await asyncio.sleep(0.3)
    assert status(db_engine, run.session_id) == "idle"
    assert [r for r, _ in transcript(db_engine, run.session_id)].count("user") == 2
