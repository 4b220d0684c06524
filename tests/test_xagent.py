"""X-Agent tools, guards, policies and reviews on a real dev server (Gamut X-Agent and
X-Agent Policies)."""

from __future__ import annotations

import asyncio
import json

from sqlalchemy.engine import Engine
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from baton.agents import registry
from baton.contracts.search import SA_INVOKED_BY, SA_PARENT, SA_USER
from baton.runs import session_store
from baton.storage.db import session_scope
from tests.conftest import venv_bin
from tests.helpers import launch, publish, status, transcript, wait_for
from tests.xagent_helpers import (
    audit_rows,
    caller_playbook,
    decide,
    open_reviews,
    reviews_of,
    set_policy,
    setup_pair,
    tool_result,
)

INVOKE_SYNC = {"slug": "target", "prompt": "hello target", "sync": True}


async def test_allowed_sync_invoke_returns_the_targets_reply(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """With an allow policy, a sync invoke_agent returns the target's final message inline."""
    setup_pair(db_engine, "invoke_agent", INVOKE_SYNC)
    set_policy(db_engine, "invoke", "allow", target="target")
    launched = await launch(temporal_env.client, db_engine, worker, "caller", "go")
    result = tool_result(launched.response or "")
    assert result["status"] == "completed"
    assert result["response"] == "target says hi"
    with session_scope(db_engine) as s:
        target = session_store.get_session(s, session_id=result["session_id"])
    assert target.invoked_by_agent == "caller"
    assert target.name == "Invoked by caller"
    assert target.parent_session_id == launched.session_id
    assert reviews_of(db_engine) == []
    described = await temporal_env.client.get_workflow_handle(result["session_id"]).describe()
    attrs = described.typed_search_attributes
    assert attrs.get(SA_INVOKED_BY) == "caller"
    assert attrs.get(SA_PARENT) == launched.session_id
    assert attrs.get(SA_USER) == "local"


async def test_review_allow_once_proceeds_and_saves_nothing(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """No policy = review; allow_once lets this call through and stores no policy row."""
    setup_pair(db_engine, "invoke_agent", INVOKE_SYNC)
    launched = await launch(temporal_env.client, db_engine, worker, "caller", "go", sync=False)
    (review,) = await open_reviews(temporal_env.client, db_engine, launched.session_id)
    assert review.operation == "invoke" and review.target_agent_slug == "target"
    assert review.preview == "hello target"
    assert status(db_engine, launched.session_id) == "awaiting_input"
    handle = temporal_env.client.get_workflow_handle(launched.session_id)
    assert await handle.query("status") == "awaiting_input"
    await decide(temporal_env.client, review, "allow_once", decided_by="alice")
    await wait_for(lambda: status(db_engine, launched.session_id) == "idle")
    final = transcript(db_engine, launched.session_id)[-1][1]
    assert tool_result(final)["response"] == "target says hi"
    (row,) = reviews_of(db_engine)
    assert (row.status, row.decided_by) == ("allowed", "alice")
    (entry,) = audit_rows(db_engine)
    assert (entry.outcome, entry.decided_by, entry.operation) == ("allow", "alice", "invoke")


async def test_decision_sent_with_the_temporal_cli_binary(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """`temporal workflow signal --name review_decision` decides a review (recorded as
    unverified: a raw Signal carries no proof)."""
    setup_pair(db_engine, "invoke_agent", INVOKE_SYNC)
    launched = await launch(temporal_env.client, db_engine, worker, "caller", "go", sync=False)
    (review,) = await open_reviews(temporal_env.client, db_engine, launched.session_id)
    address = temporal_env.client.service_client.config.target_host
    proc = await asyncio.create_subprocess_exec(
        venv_bin("temporal"),
        "workflow",
        "signal",
        "--address",
        address,
        "--namespace",
        "default",
        "--workflow-id",
        launched.session_id,
        "--name",
        "review_decision",
        "--input",
        json.dumps({"review_id": review.id, "decision": "allow_once"}),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, (out, err)
    await wait_for(lambda: status(db_engine, launched.session_id) == "idle")
    (row,) = reviews_of(db_engine)
    unverified = "temporal (unverified)"
    assert (row.status, row.decided_by, row.decision) == ("allowed", unverified, "allow_once")
    (entry,) = audit_rows(db_engine)
    assert (entry.outcome, entry.decided_by, entry.review_id) == ("allow", unverified, row.id)
    final = transcript(db_engine, launched.session_id)[-1][1]
    assert tool_result(final)["response"] == "target says hi"


async def test_malformed_signal_leaves_the_review_waiting(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """A review_decision Signal with a bad payload is dropped; the session stays healthy."""
    setup_pair(db_engine, "invoke_agent", INVOKE_SYNC)
    launched = await launch(temporal_env.client, db_engine, worker, "caller", "go", sync=False)
    (review,) = await open_reviews(temporal_env.client, db_engine, launched.session_id)
    handle = temporal_env.client.get_workflow_handle(launched.session_id)
    await handle.signal("review_decision", {"review_id": review.id, "decision": "maybe"})
    await handle.signal("review_decision", "not even an object")
    assert await handle.query("status") == "awaiting_input"
    assert [r["review_id"] for r in await handle.query("pending_reviews")] == [review.id]
    await decide(temporal_env.client, review, "deny")
    await wait_for(lambda: status(db_engine, launched.session_id) == "idle")
    assert reviews_of(db_engine)[0].status == "denied"
    assert "denied by temporal-cli" in transcript(db_engine, launched.session_id)[-2][1]


async def test_invoking_a_retired_agent_is_refused_before_any_review(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """invoke_agent on a retired target is a tool error at once: no review waits for nothing."""
    setup_pair(db_engine, "invoke_agent", INVOKE_SYNC)
    with session_scope(db_engine) as s:
        registry.retire(s, slug="target")
    launched = await launch(temporal_env.client, db_engine, worker, "caller", "go")
    assert "agent 'target' is retired and cannot be invoked" in (launched.response or "")
    assert reviews_of(db_engine) == []


async def test_a_failed_target_turn_is_the_callers_tool_error(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """A sync invoke whose target turn fails returns a tool error; the caller's turn goes on."""
    publish(db_engine, "target", model="nosuchprovider:model")
    publish(db_engine, "caller", playbook=caller_playbook("invoke_agent", INVOKE_SYNC))
    set_policy(db_engine, "invoke", "allow")
    launched = await launch(temporal_env.client, db_engine, worker, "caller", "go")
    assert "invoke_agent failed (turn_failed)" in (launched.response or "")
    assert status(db_engine, launched.session_id) == "idle"
