"""What an operator reads in Temporal about a run, on the real dev
server: search attributes (BatonRoot, BatonKind, a step's BatonStatus), the markdown user
metadata that links a run's tree, a step's current details, previews first in activity
results, failed steps as failed workflows, and the Temporal UI links of the trace.
The browser side is tests/test_temporal_ui.py."""

from __future__ import annotations

import asyncio
import functools
import json
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import Engine
from temporalio.api.enums.v1 import EventType
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from baton import temporal_ui
from baton.contracts.activity_io import ModelTurnResult, ToolOutcome
from baton.contracts.search import (
    SA_AGENT,
    SA_KIND,
    SA_PARENT,
    SA_ROOT,
    SA_STATUS,
    SA_USER,
    SA_VERSION,
)
from baton.contracts.workflow_io import HandoffDecision, StepRetry, TurnOutcome
from baton.runs import run_tree
from baton.settings import Settings
from baton.storage.db import session_scope
from tests.helpers import launch, publish
from tests.test_steps import FIX_ON_FEEDBACK, VALID, finished, run_step, step_row
from tests.test_teams import make_team, team_run


async def eventually(read: Callable[[], Awaitable[Any]], want: Any, timeout: float = 30) -> None:
    """Poll ``await read()`` until it equals ``want`` (visibility lags a moment)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while (got := await read()) != want:
        assert asyncio.get_running_loop().time() < deadline, f"{got!r} != {want!r}"
        await asyncio.sleep(0.1)


async def _tree(env: WorkflowEnvironment, engine: Engine, worker: Worker) -> run_tree.TraceNode:
    make_team(engine)
    run = await team_run(env, engine, worker, "go")
    with session_scope(engine) as s:
        return run_tree.trace(s, session_id=run.session_id)


async def test_every_session_of_a_run_carries_its_root_and_kind(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """A team run and its members: BatonKind session, BatonRoot the run's root session
    (the root's own id), so ``BatonRoot = "<root>"`` lists the whole tree."""
    tree = await _tree(temporal_env, db_engine, worker)
    root = tree.session_id
    client = temporal_env.client
    for sid in (root, *(c.session_id for c in tree.children)):
        attrs = (await client.get_workflow_handle(sid).describe()).typed_search_attributes
        assert (attrs.get(SA_KIND), attrs.get(SA_ROOT)) == ("session", root)
        assert attrs.get(SA_PARENT) == (None if sid == root else root)
    expected = sorted([root, *(c.session_id for c in tree.children)])

    async def listed() -> list[str]:
        return sorted([w.id async for w in client.list_workflows(temporal_ui.tree_query(root))])

    await eventually(listed, expected)  # visibility is eventually consistent


async def test_static_details_link_parent_children_and_run_tree(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """A member's static details link its parent's page and the run tree's list; the
    root's link the list of sessions it delegated to (relative links, the UI's markdown)."""
    tree = await _tree(temporal_env, db_engine, worker)
    root, ns = tree.session_id, temporal_env.client.namespace
    member = tree.children[0].session_id
    desc = await temporal_env.client.get_workflow_handle(member).describe()
    details = await desc.static_details() or ""
    assert f"[{root}]({temporal_ui.workflow_path(ns, root)})" in details
    assert "delegate_to by `lead`, depth 1" in details
    tree_link = temporal_ui.workflows_path(ns, temporal_ui.tree_query(root))
    assert f"({tree_link})" in details
    assert tree_link == f"namespaces/{ns}/workflows?query=BatonRoot%20%3D%20%22{root}%22"
    top = await (await temporal_env.client.get_workflow_handle(root).describe()).static_details()
    children = temporal_ui.workflows_path(ns, temporal_ui.children_query(root))
    assert f"[sessions this one started]({children})" in (top or "")
    assert "**Parent**" not in (top or "")


async def test_a_delegations_summary_names_the_child_session(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """Each `delegate` activity of the caller's history is summarised with the child's
    workflow id, so the caller's timeline shows where every delegation went."""
    tree = await _tree(temporal_env, db_engine, worker)
    history = await temporal_env.client.get_workflow_handle(tree.session_id).fetch_history()
    converter = pydantic_data_converter.payload_converter
    summaries = [
        converter.from_payload(e.user_metadata.summary, str)
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == "delegate"
    ]
    assert len(summaries) == 2
    for child in tree.children:
        agent = child.agent
        assert any(
            s.startswith(f"delegate_to → {agent} (sync)") and s.endswith(child.session_id)
            for s in summaries
        ), summaries


async def test_activity_and_update_results_start_with_the_preview(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """The history reads like the conversation: model_turn, run_tool and send_message
    results start with the preview, the ids come last."""
    publish(
        db_engine,
        "adder",
        tools=["calculator"],
        playbook=[
            {"when": "^calculator: ", "reply": "It is {last_message}."},
            {"when": "add", "tool_calls": [{"tool": "calculator", "args": {"expression": "2+3"}}]},
        ],
    )
    run = await launch(temporal_env.client, db_engine, worker, "adder", "add please")
    history = await temporal_env.client.get_workflow_handle(run.session_id).fetch_history()
    results = [
        json.loads(e.activity_task_completed_event_attributes.result.payloads[0].data)
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
        and e.activity_task_completed_event_attributes.result.payloads
    ]
    turns = [r for r in results if set(r) == set(ModelTurnResult.model_fields)]
    tools = [r for r in results if set(r) == set(ToolOutcome.model_fields)]
    assert len(turns) == 2 and len(tools) == 1
    for result in (*turns, *tools):
        keys = list(result)
        assert keys[0] == "preview" and keys[-1] == "message_id", keys
    assert tools[0]["preview"] == "5"
    assert turns[-1]["preview"] == "It is 5."
    updates = [
        json.loads(
            e.workflow_execution_update_completed_event_attributes.outcome.success.payloads[0].data
        )
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED
    ]
    (outcome,) = updates
    keys = list(outcome)
    assert keys[0] == "preview" and keys[-1] == "message_id", keys
    assert set(outcome) == set(TurnOutcome.model_fields)


async def _failure(env: WorkflowEnvironment, step_id: str) -> ApplicationError:
    with pytest.raises(WorkflowFailureError) as failed:
        await env.client.get_workflow_handle(step_id).result()
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError)
    return cause


async def test_a_failed_step_fails_its_workflow_with_the_steps_code(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """Invalid deliverables up to max_attempts: the row says failed with the same error as
    before, and the workflow FAILED with a non-retryable ``invalid_deliverable`` carrying
    the step's status; BatonStatus is failed, BatonKind step, BatonRoot the step."""
    publish(db_engine, "stubborn", playbook=[{"reply": "not json at all"}])
    retry = StepRetry(max_attempts=2, initial_interval_s=0.01)
    sid = await run_step(temporal_env.client, db_engine, worker.task_queue, "stubborn", retry=retry)
    cause = await _failure(temporal_env, sid)
    assert (cause.type, cause.non_retryable) == ("invalid_deliverable", True)
    assert cause.message.startswith("invalid_deliverable: after 2 attempts")
    assert cause.details == ({"step_id": sid, "status": "failed", "attempts": 2},)
    row = step_row(db_engine, sid)
    assert (row.status, row.attempts) == ("failed", 2)
    assert row.error == cause.message
    desc = await temporal_env.client.get_workflow_handle(sid).describe()
    assert desc.status == WorkflowExecutionStatus.FAILED
    attrs = desc.typed_search_attributes
    assert (attrs.get(SA_KIND), attrs.get(SA_STATUS), attrs.get(SA_ROOT)) == ("step", "failed", sid)
    assert (attrs.get(SA_AGENT), attrs.get(SA_VERSION), attrs.get(SA_USER)) == (
        "stubborn",
        "1",
        "local",
    )


async def test_a_rejected_step_fails_and_a_completed_one_completes(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """Reject at handoff: FAILED with ``step_rejected`` (the row: rejected, the feedback as
    error); approve: COMPLETED with "completed", BatonStatus following each change."""
    publish(db_engine, "summariser", playbook=[{"reply": VALID}])
    client, queue = temporal_env.client, worker.task_queue
    rejected = await run_step(client, db_engine, queue, "summariser", handoff=True)
    approved = await run_step(client, db_engine, queue, "summariser", handoff=True)
    for sid in (rejected, approved):
        await finished(db_engine, sid, "awaiting_handoff")
        await eventually(
            functools.partial(_status_attribute, temporal_env, sid), "awaiting_handoff"
        )
    await client.get_workflow_handle(rejected).signal(
        "handoff", HandoffDecision(decision="reject", feedback="off topic")
    )
    await client.get_workflow_handle(approved).signal(
        "handoff", HandoffDecision(decision="approve")
    )
    cause = await _failure(temporal_env, rejected)
    assert (cause.type, cause.message) == ("step_rejected", "off topic")
    assert (step_row(db_engine, rejected).status, step_row(db_engine, rejected).error) == (
        "rejected",
        "off topic",
    )
    assert await client.get_workflow_handle(approved).result() == "completed"
    for sid, status in ((rejected, "rejected"), (approved, "completed")):
        attrs = (await client.get_workflow_handle(sid).describe()).typed_search_attributes
        assert attrs.get(SA_STATUS) == status


async def _status_attribute(env: WorkflowEnvironment, step_id: str) -> str | None:
    desc = await env.client.get_workflow_handle(step_id).describe()
    return desc.typed_search_attributes.get(SA_STATUS)


async def _current_details(env: WorkflowEnvironment, workflow_id: str) -> str:
    meta = await env.client.get_workflow_handle(workflow_id).query(
        "__temporal_workflow_metadata", result_type=WorkflowMetadata
    )
    assert isinstance(meta, WorkflowMetadata)
    return meta.current_details


async def test_a_steps_current_details_show_status_output_and_pending_handoff(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """While a handoff waits, the step's current details (the UI's Current Details) give
    the status and attempt, the last output's preview, the deadline and how to approve."""
    publish(db_engine, "summariser", playbook=FIX_ON_FEEDBACK)
    sid = await run_step(
        temporal_env.client, db_engine, worker.task_queue, "summariser", handoff=True
    )
    await finished(db_engine, sid, "awaiting_handoff")
    details = await _current_details(temporal_env, sid)
    assert details.startswith("**awaiting_handoff** · attempt 2 of 3 · `summariser@1`"), details
    assert (
        "**Awaiting handoff** until 20" in details and " UTC: approve, revise or reject" in details
    )
    assert f"`baton step approve {sid}`" in details
    assert 'Last output: \\{"summary": "all good"\\}' in details


def test_markdown_text_is_escaped_and_queries_are_quoted() -> None:
    """Model text in markdown never becomes a link, emphasis or HTML; query values are
    quoted and URL-encoded whole."""
    text = "*bold* [x](http://evil) <b>hi</b> `code` _u_\nnext line"
    assert temporal_ui.md_text(text) == (
        "\\*bold\\* \\[x\\]\\(http://evil\\) \\<b\\>hi\\</b\\> \\`code\\` \\_u\\_ next line"
    )
    assert temporal_ui.equals("BatonAgent", 'a"b') == 'BatonAgent = "a\\"b"'
    path = temporal_ui.workflows_path("my ns", temporal_ui.FAILED_STEPS_QUERY)
    assert path == (
        "namespaces/my%20ns/workflows?query=BatonKind%20%3D%20%22step%22%20AND%20"
        "ExecutionStatus%20%3D%20%22Failed%22"
    )


def test_ui_links_use_the_ui_url_and_the_namespace_baton_connects_to(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Links follow BATON_TEMPORAL_UI_URL and the namespace the clients use: an explicit
    BATON_TEMPORAL_NAMESPACE, else the Temporal profile's (TEMPORAL_NAMESPACE)."""
    monkeypatch.setenv("TEMPORAL_NAMESPACE", "team-a")
    monkeypatch.delenv("BATON_TEMPORAL_NAMESPACE", raising=False)
    profiled = Settings(temporal_ui_url="https://temporal.example.com/ui/")
    assert profiled.workflow_url("session-1") == (
        "https://temporal.example.com/ui/namespaces/team-a/workflows/session-1"
    )
    explicit = Settings(temporal_namespace="prod")
    assert explicit.workflows_url(temporal_ui.tree_query("session-1")) == (
        "http://localhost:8233/namespaces/prod/workflows?query=BatonRoot%20%3D%20%22session-1%22"
    )
    unprofiled = Settings(temporal_env_config=False)
    assert unprofiled.workflow_url("x").startswith("http://localhost:8233/namespaces/default/")
    from worker.factory import temporal_connect_config

    assert temporal_connect_config(profiled)["namespace"] == "team-a"
    assert temporal_connect_config(explicit)["namespace"] == "prod"


async def test_the_trace_gives_each_nodes_temporal_ui_link(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """The trace with links: every node's workflow page, and on the root the run tree's
    list (what `GET /v1/sessions/{id}/trace` and `baton trace` show)."""
    tree = await _tree(temporal_env, db_engine, worker)
    settings = Settings(temporal_namespace="default", temporal_ui_url="http://ui:8080")
    with session_scope(db_engine) as s:
        linked = run_tree.trace(s, session_id=tree.session_id, links=settings)
        member = run_tree.trace(s, session_id=tree.children[0].session_id, links=settings)
    nodes: list[Any] = [linked, *linked.children]
    for node in nodes:
        assert node.workflow_url == f"http://ui:8080/namespaces/default/workflows/{node.session_id}"
    assert linked.run_tree_url == settings.workflows_url(temporal_ui.tree_query(tree.session_id))
    assert all(child.run_tree_url is None for child in linked.children)
    # Traced from a member, the run tree is still the whole run's.
    assert member.run_tree_url == linked.run_tree_url


OPERATIONS = Path(__file__).resolve().parents[1] / "docs" / "operations.md"
#: A row of the "Queries an operator uses" table (docs/operations.md): query and ready URL.
QUERY_ROW = re.compile(r"^\| [^|]+ \| `([^`]+)` \| <(http://localhost:8233/[^>]+)> \|$", re.M)


async def test_the_docs_operator_queries_run_and_match_their_urls(
    temporal_env: WorkflowEnvironment,
) -> None:
    """Every query of the operator table in docs/operations.md is valid on the dev server
    (with Baton's search attributes) and its URL is Settings.workflows_url of that query."""
    found = QUERY_ROW.findall(OPERATIONS.read_text(encoding="utf-8"))
    assert len(found) >= 4, "the operator queries table of docs/operations.md is missing"
    settings = Settings(temporal_env_config=False)
    for query, url in found:
        assert url == settings.workflows_url(query), query
        await temporal_env.client.count_workflows(query.replace("SESSION_ID", "session-x"))
