"""X-Agent policies, reviews, guards and tools end to end on the dev server (Gamut X-Agent
and X-Agent Policies).

Callers are scripted: on a trigger message they call one X-Agent tool and then echo
its result (``RESULT <tool output>``). Reviews use the Signal ``review_decision``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import pytest_asyncio
from sqlalchemy.engine import Engine
from temporalio import activity
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.xagent import XAgentActivities
from baton.agents import registry
from baton.contracts.activity_io import AuthorizeInput, AuthorizeResult
from baton.contracts.values import OPERATION_OF, position
from baton.errors import AgentNotFound
from baton.grants import policies
from baton.runs import session_store
from baton.runs.launch import send_message
from baton.storage.db import session_scope
from tests.helpers import TEST_CONFIG, launch, publish, status, transcript, wait_for
from tests.xagent_helpers import (
    add_session,
    audit_rows,
    decide,
    echoed,
    open_reviews,
    pending_review,
    playbook,
    policy_rows,
    reviews_of,
    session_row,
    set_policy,
    settled,
    setup_pair,
    tool_messages,
    tool_result,
)
from worker.factory import WORKFLOWS, activities_for, build_worker, workflow_runner

INVOKE_SYNC = {"slug": "target", "prompt": "hello target", "sync": True}
INVOKE_ASYNC = {"slug": "target", "prompt": "hello target"}
READ_SESSIONS = {"slug": "target"}
#: A stored (workflow-less) session of ``target`` for transcript reads.
TARGET_SESSION = "session-00000000-0000-4000-8000-000000000001"
READ_TRANSCRIPT = {"slug": "target", "session_id": TARGET_SESSION}
SHORT_TIMEOUT = TEST_CONFIG.model_copy(update={"review_timeout_s": 1.0})


def target_of(tool: str) -> str | None:
    """The target a call of ``tool`` names in these tests (list has none)."""
    return None if tool == "list_agents" else "target"


async def until_idle(client: Client, engine: Engine, session_id: str) -> None:
    """Wait until the session's turn is over: stored idle, and the workflow idle too.

    The stored status turns idle a moment before the workflow's turn ends; a message
    sent in between is refused as session_busy, so wait for the ``status`` Query too.
    """
    await wait_for(lambda: status(engine, session_id) == "idle")
    handle = client.get_workflow_handle(session_id)
    for _ in range(600):
        if await handle.query("status") == "idle":
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{session_id} never became idle")


def sessions_of(engine: Engine, agent: str) -> list[str]:
    """Ids of ``agent``'s sessions."""
    with session_scope(engine) as s:
        rows, _ = session_store.list_sessions(s, agent=agent, limit=200)
        return [r.id for r in rows]


# --- 1. The precedence matrix ---------------------------------------------------------

RULES = ("allow", "block", None)
MATRIX = [("list", None, g) for g in RULES] + [
    (op, t, g) for op in ("read", "invoke") for t in RULES for g in RULES
]


@pytest.mark.parametrize(
    ("operation", "per_target", "global_"),
    MATRIX,
    ids=[f"{op}-target_{t or 'none'}-global_{g or 'none'}" for op, t, g in MATRIX],
)
def test_precedence_matrix(
    db_engine: Engine, operation: str, per_target: str | None, global_: str | None
) -> None:
    """decide(): the per-target row wins, else the caller's global row, else review."""
    if per_target:
        set_policy(db_engine, operation, per_target, target="target")
    if global_:
        set_policy(db_engine, operation, global_)
    # Noise that must not count: another target's row, another caller's global row.
    set_policy(db_engine, operation, "block" if per_target == "allow" else "allow", target="other")
    set_policy(db_engine, operation, "block" if global_ == "allow" else "allow", caller="someone")
    target = None if operation == "list" else "target"
    with session_scope(db_engine) as s:
        verdict = policies.decide(s, caller="caller", operation=operation, target=target)
    assert verdict == (per_target or global_ or "review")


def test_operations_are_evaluated_independently(db_engine: Engine) -> None:
    """An invoke allow does not allow read, a read allow does not allow invoke or list."""
    set_policy(db_engine, "invoke", "allow")
    set_policy(db_engine, "read", "allow", target="target")
    with session_scope(db_engine) as s:
        assert policies.decide(s, caller="caller", operation="read", target="other") == "review"
        assert policies.decide(s, caller="caller", operation="read", target="target") == "allow"
        assert policies.decide(s, caller="caller", operation="invoke", target="x") == "allow"
        assert policies.decide(s, caller="caller", operation="list", target=None) == "review"


def test_create_always_reviews_and_can_never_be_stored(db_engine: Engine) -> None:
    """create reviews whatever the stored policies, and no create row can be saved."""
    for op in ("list", "read", "invoke"):
        set_policy(db_engine, op, "allow")
    with session_scope(db_engine) as s:
        assert policies.decide(s, caller="caller", operation="create", target=None) == "review"
        with pytest.raises(policies.InvalidPolicy):
            policies.save_policy(
                s, caller="caller", operation="create", target=None, decision="allow"
            )


E2E = [
    ("list_agents", {}, None, "allow", "allow"),
    ("list_agents", {}, None, "block", "block"),
    ("list_agents", {}, None, None, "review"),
    ("get_agent_sessions", READ_SESSIONS, "allow", "block", "allow"),
    ("get_agent_sessions", READ_SESSIONS, "block", "allow", "block"),
    ("get_agent_sessions", READ_SESSIONS, None, "allow", "allow"),
    ("get_agent_sessions", READ_SESSIONS, None, "block", "block"),
    ("get_agent_sessions", READ_SESSIONS, None, None, "review"),
    ("get_agent_session_transcript", READ_TRANSCRIPT, "allow", "block", "allow"),
    ("get_agent_session_transcript", READ_TRANSCRIPT, "block", "allow", "block"),
    ("get_agent_session_transcript", READ_TRANSCRIPT, None, None, "review"),
    ("invoke_agent", INVOKE_SYNC, "allow", "block", "allow"),
    ("invoke_agent", INVOKE_SYNC, "block", "allow", "block"),
    ("invoke_agent", INVOKE_SYNC, None, "allow", "allow"),
    ("invoke_agent", INVOKE_SYNC, None, "block", "block"),
    ("invoke_agent", INVOKE_SYNC, None, None, "review"),
]


@pytest.mark.parametrize(
    ("tool", "args", "per_target", "global_", "expected"),
    E2E,
    ids=[f"{c[0]}-target_{c[2] or 'none'}-global_{c[3] or 'none'}" for c in E2E],
)
async def test_precedence_end_to_end(
    temporal_env: WorkflowEnvironment,
    db_engine: Engine,
    worker: Worker,
    tool: str,
    args: dict[str, Any],
    per_target: str | None,
    global_: str | None,
    expected: str,
) -> None:
    """A real call is allowed, blocked (audited, tool error) or reviewed as the matrix says."""
    setup_pair(db_engine, tool, args)
    add_session(db_engine, "target", session_id=TARGET_SESSION)
    operation = OPERATION_OF[tool]
    if per_target:
        set_policy(db_engine, operation, per_target, target="target")
    if global_:
        set_policy(db_engine, operation, global_)
    client = temporal_env.client
    launched = await launch(client, db_engine, worker, "caller", "go", sync=expected != "review")
    sid = launched.session_id
    if expected == "review":
        (review,) = await open_reviews(client, db_engine, sid)
        assert (review.operation, review.target_agent_slug) == (operation, target_of(tool))
        assert audit_rows(db_engine) == []
        await decide(client, review, "deny")
        await until_idle(client, db_engine, sid)
        return
    (msg,) = tool_messages(db_engine, sid)
    assert echoed(launched.response, msg)
    assert reviews_of(db_engine) == []
    if expected == "allow":
        assert not msg.is_error, msg.text
        assert audit_rows(db_engine) == []
        return
    assert msg.is_error
    assert msg.text.startswith("blocked_by_policy: "), msg.text
    (entry,) = audit_rows(db_engine)
    assert (entry.session_id, entry.caller_agent_slug, entry.operation) == (
        sid,
        "caller",
        operation,
    )
    assert (entry.target_agent_slug, entry.outcome, entry.decided_by) == (
        target_of(tool),
        "block",
        "policy",
    )
    assert entry.review_id is None


# --- 2. Each decision kind ----------------------------------------------------------------


async def test_deny_is_a_tool_error_and_audited_as_denied_by_user(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """deny: tool error "denied by <who>", audit denied_by_user, events, target never runs."""
    setup_pair(db_engine, "invoke_agent", INVOKE_SYNC)
    client = temporal_env.client
    launched = await launch(client, db_engine, worker, "caller", "go", sync=False)
    (review,) = await open_reviews(client, db_engine, launched.session_id)
    assert await client.get_workflow_handle(launched.session_id).query("pending_reviews") == [
        {
            "review_id": review.id,
            "operation": "invoke",
            "target": "target",
            "preview": "hello target",
        }
    ]
    await decide(client, review, "deny", decided_by="bob")
    await until_idle(client, db_engine, launched.session_id)
    (msg,) = tool_messages(db_engine, launched.session_id)
    assert msg.is_error and "denied by bob" in msg.text
    assert echoed(transcript(db_engine, launched.session_id)[-1][1], msg)
    row = await settled(db_engine, review.id)
    assert (row.status, row.decision, row.decided_by) == ("denied", "deny", "bob")
    (entry,) = audit_rows(db_engine)
    assert (entry.outcome, entry.decided_by, entry.review_id) == (
        "denied_by_user",
        "bob",
        review.id,
    )
    assert (entry.operation, entry.target_agent_slug) == ("invoke", "target")
    assert policy_rows(db_engine) == []
    assert sessions_of(db_engine, "target") == []
    with session_scope(db_engine) as s:
        events = session_store.events_after(s, session_id=launched.session_id)
        flow = [(e.type, e.data) for e in events if e.type.startswith("review_")]
    assert flow == [
        (
            "review_requested",
            {
                "review_id": review.id,
                "caller": "caller",
                "operation": "invoke",
                "target": "target",
                "preview": "hello target",
            },
        ),
        ("review_resolved", {"review_id": review.id, "status": "denied", "decided_by": "bob"}),
    ]


async def test_allow_once_saves_nothing_and_the_next_identical_call_reviews_again(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """allow_once: the call proceeds, no policy row is stored, the same call reviews again."""
    setup_pair(db_engine, "invoke_agent", INVOKE_SYNC)
    client = temporal_env.client
    launched = await launch(client, db_engine, worker, "caller", "go", sync=False)
    sid = launched.session_id
    (first,) = await open_reviews(client, db_engine, sid)
    await decide(client, first, "allow_once", decided_by="alice")
    await until_idle(client, db_engine, sid)
    assert tool_result(transcript(db_engine, sid)[-1][1])["response"] == "target says hi"
    assert policy_rows(db_engine) == []
    await send_message(client, db_engine, session_id=sid, prompt="go", sync=False)
    (second,) = await open_reviews(client, db_engine, sid)
    assert second.id != first.id
    await decide(client, second, "deny")
    await until_idle(client, db_engine, sid)
    assert [r.status for r in reviews_of(db_engine, sid)] == ["allowed", "denied"]
    assert [e.outcome for e in audit_rows(db_engine)] == ["allow", "denied_by_user"]


ALWAYS = [
    ("invoke_agent", INVOKE_SYNC, "target", "target", "target"),
    ("invoke_agent", INVOKE_SYNC, "all", None, "all"),
    ("get_agent_sessions", READ_SESSIONS, "target", "target", "target"),
    ("get_agent_sessions", READ_SESSIONS, "all", None, "all"),
    ("list_agents", {}, "target", None, "all"),
    ("list_agents", {}, "all", None, "all"),
]


@pytest.mark.parametrize(
    ("tool", "args", "scope", "saved_target", "saved_scope"),
    ALWAYS,
    ids=[f"{c[0]}-scope_{c[2]}" for c in ALWAYS],
)
async def test_always_allow_saves_the_policy_and_the_next_call_needs_no_review(
    temporal_env: WorkflowEnvironment,
    db_engine: Engine,
    worker: Worker,
    tool: str,
    args: dict[str, Any],
    scope: str,
    saved_target: str | None,
    saved_scope: str,
) -> None:
    """always_allow saves a per-target (scope target) or global row; list is always global."""
    setup_pair(db_engine, tool, args)
    client = temporal_env.client
    launched = await launch(client, db_engine, worker, "caller", "go", sync=False)
    sid = launched.session_id
    (review,) = await open_reviews(client, db_engine, sid)
    await decide(client, review, "always_allow", scope=scope, decided_by="alice")
    await until_idle(client, db_engine, sid)
    operation = OPERATION_OF[tool]
    assert policy_rows(db_engine) == [("caller", saved_target, operation, "allow")]
    row = await settled(db_engine, review.id)
    assert (row.status, row.decision, row.scope) == ("allowed", "always_allow", saved_scope)
    (entry,) = audit_rows(db_engine)
    assert (entry.outcome, entry.decided_by, entry.review_id) == ("allow", "alice", review.id)
    _, reply = await send_message(client, db_engine, session_id=sid, prompt="go", sync=True)
    assert len(reviews_of(db_engine)) == 1
    assert [m.is_error for m in tool_messages(db_engine, sid)] == [False, False]
    assert (reply or "").startswith("RESULT ")


# --- 3. A saved global allow resolves the other pending reviews it covers -----------------


def two_target_caller(engine: Engine, *callers: str) -> None:
    """``target`` and ``target2``; each caller invokes target on "one", target2 on "two"."""
    publish(engine, "target", playbook=[{"reply": "target says hi"}])
    publish(engine, "target2", playbook=[{"reply": "target2 says hi"}])
    rules = playbook(
        ("^one$", "invoke_agent", INVOKE_SYNC),
        ("^two$", "invoke_agent", {"slug": "target2", "prompt": "hello target2", "sync": True}),
    )
    for caller in callers:
        publish(engine, caller, playbook=rules)


async def test_global_always_allow_resolves_the_other_pending_reviews(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """always_allow scope=all on one invoke review allows another session's invoke review."""
    two_target_caller(db_engine, "caller")
    client = temporal_env.client
    a = await launch(client, db_engine, worker, "caller", "one", sync=False)
    b = await launch(client, db_engine, worker, "caller", "two", sync=False)
    (ra,) = await open_reviews(client, db_engine, a.session_id)
    (rb,) = await open_reviews(client, db_engine, b.session_id)
    await decide(client, ra, "always_allow", scope="all", decided_by="alice")
    await until_idle(client, db_engine, a.session_id)
    await until_idle(client, db_engine, b.session_id)
    row_a, row_b = await settled(db_engine, ra.id), await settled(db_engine, rb.id)
    assert (row_a.status, row_a.decided_by) == ("allowed", "alice")
    assert row_b.status == "allowed"
    assert (row_b.decided_by or "").startswith("policy"), row_b.decided_by
    assert tool_result(transcript(db_engine, b.session_id)[-1][1])["response"] == (
        "target2 says hi"
    )
    assert policy_rows(db_engine) == [("caller", None, "invoke", "allow")]
    audit = {e.review_id: e for e in audit_rows(db_engine)}
    assert set(audit) == {ra.id, rb.id}
    assert audit[ra.id].outcome == audit[rb.id].outcome == "allow"
    assert audit[rb.id].decided_by.startswith("policy")


async def test_global_always_allow_resolves_a_parallel_review_in_the_same_session(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """Two invoke calls in one model response: always_allow scope=all on one allows both."""
    two_target_caller(db_engine)
    both = [
        {"tool": "invoke_agent", "args": INVOKE_SYNC},
        {"tool": "invoke_agent", "args": {"slug": "target2", "prompt": "hi 2", "sync": True}},
    ]
    publish(
        db_engine,
        "caller",
        playbook=[
            {"when": "^invoke_agent: ", "reply": "RESULT {last_message}"},
            {"when": "^go$", "reply": "Calling both.", "tool_calls": both},
        ],
    )
    client = temporal_env.client
    launched = await launch(client, db_engine, worker, "caller", "go", sync=False)
    sid = launched.session_id
    first, second = await open_reviews(client, db_engine, sid, count=2)
    await decide(client, first, "always_allow", scope="all", decided_by="alice")
    await until_idle(client, db_engine, sid)
    assert [r.status for r in reviews_of(db_engine, sid)] == ["allowed", "allowed"]
    assert (await settled(db_engine, second.id)).decided_by != "alice"
    replies = sorted(json.loads(m.text)["response"] for m in tool_messages(db_engine, sid))
    assert replies == ["target says hi", "target2 says hi"]


async def test_always_allow_leaves_reviews_it_does_not_cover_pending(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """A per-target allow does not resolve another target's review, nor another caller's."""
    two_target_caller(db_engine, "caller", "caller2")
    client = temporal_env.client
    a = await launch(client, db_engine, worker, "caller", "one", sync=False)
    b = await launch(client, db_engine, worker, "caller", "two", sync=False)
    c = await launch(client, db_engine, worker, "caller2", "one", sync=False)
    (ra,) = await open_reviews(client, db_engine, a.session_id)
    (rb,) = await open_reviews(client, db_engine, b.session_id)
    (rc,) = await open_reviews(client, db_engine, c.session_id)
    await decide(client, ra, "always_allow", scope="target", decided_by="alice")
    await until_idle(client, db_engine, a.session_id)
    await asyncio.sleep(0.5)  # a wrongly covered review would be signalled by now
    assert [(await settled(db_engine, ra.id)).status] == ["allowed"]
    for review, sid in ((rb, b.session_id), (rc, c.session_id)):
        assert [r.status for r in reviews_of(db_engine, sid)] == ["pending"]
        listed = await client.get_workflow_handle(sid).query("pending_reviews")
        assert [r["review_id"] for r in listed] == [review.id]
        await decide(client, review, "deny")
        await until_idle(client, db_engine, sid)
    assert policy_rows(db_engine) == [("caller", "target", "invoke", "allow")]


# --- 4. Timeout, races and late decisions ---------------------------------------------------


async def test_review_timeout_denies_once_and_a_late_decision_changes_nothing(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """No decision within review_timeout_s: timed_out, one audit row; a later decision is late."""
    setup_pair(db_engine, "invoke_agent", INVOKE_SYNC)
    client = temporal_env.client
    launched = await launch(
        client, db_engine, worker, "caller", "go", sync=False, config=SHORT_TIMEOUT
    )
    sid = launched.session_id
    (review,) = await open_reviews(client, db_engine, sid)
    row = await settled(db_engine, review.id, timeout=15)
    assert (row.status, row.decision, row.decided_by) == ("timed_out", None, "timeout")
    await until_idle(client, db_engine, sid)
    (msg,) = tool_messages(db_engine, sid)
    assert msg.is_error and "timed out" in msg.text
    assert "timed out" in transcript(db_engine, sid)[-1][1]
    (entry,) = audit_rows(db_engine)
    assert (entry.outcome, entry.decided_by, entry.review_id) == (
        "review_timeout",
        "timeout",
        review.id,
    )

    await decide(client, review, "allow_once", decided_by="late-alice")
    handle = client.get_workflow_handle(sid)
    late: list[dict[str, Any]] = []

    async def reported() -> bool:
        late[:] = await handle.query("late_decisions")
        return bool(late)

    for _ in range(200):
        if await reported():
            break
        await asyncio.sleep(0.05)
    assert late == [{"review_id": review.id, "decision": "allow_once", "reason": "too_late"}]
    again = await settled(db_engine, review.id)
    assert (again.status, again.decision, again.decided_by, again.decided_at) == (
        "timed_out",
        None,
        "timeout",
        row.decided_at,
    )
    assert len(audit_rows(db_engine)) == 1
    assert len(tool_messages(db_engine, sid)) == 1
    assert policy_rows(db_engine) == []
    assert sessions_of(db_engine, "target") == []


async def test_a_second_decision_for_the_same_review_is_too_late(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """Two decisions back to back: the first wins, the second is reported late and ignored."""
    setup_pair(db_engine, "invoke_agent", INVOKE_SYNC)
    client = temporal_env.client
    launched = await launch(client, db_engine, worker, "caller", "go", sync=False)
    (review,) = await open_reviews(client, db_engine, launched.session_id)
    await decide(client, review, "deny", decided_by="bob")
    await decide(client, review, "always_allow", scope="all", decided_by="carol")
    await until_idle(client, db_engine, launched.session_id)
    row = await settled(db_engine, review.id)
    assert (row.status, row.decided_by) == ("denied", "bob")
    late = await client.get_workflow_handle(launched.session_id).query("late_decisions")
    assert late == [{"review_id": review.id, "decision": "always_allow", "reason": "too_late"}]
    assert [e.outcome for e in audit_rows(db_engine)] == ["denied_by_user"]
    assert policy_rows(db_engine) == []


async def test_decisions_racing_the_timeout_settle_the_review_exactly_once(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """Decisions sent around a 1 s timeout: one outcome; every other decision is reported late."""
    setup_pair(db_engine, "invoke_agent", INVOKE_SYNC)
    client = temporal_env.client
    launched = await launch(
        client, db_engine, worker, "caller", "go", sync=False, config=SHORT_TIMEOUT
    )
    sid = launched.session_id
    (review,) = await open_reviews(client, db_engine, sid)
    await asyncio.sleep(0.97)  # the 1 s timer started just before open_reviews returned
    racers = 10
    for i in range(racers):
        await decide(client, review, "deny", decided_by=f"racer-{i}")
        await asyncio.sleep(0.04)
    row = await settled(db_engine, review.id, timeout=15)
    await until_idle(client, db_engine, sid)
    handle = client.get_workflow_handle(sid)
    await asyncio.sleep(0.3)  # let the last signals be processed
    late = await handle.query("late_decisions")
    (entry,) = audit_rows(db_engine)
    (msg,) = tool_messages(db_engine, sid)
    assert msg.is_error
    assert entry.review_id == review.id
    if row.status == "denied":
        assert row.decided_by == "racer-0"  # signals arrive in order: the first one wins
        assert (entry.outcome, entry.decided_by) == ("denied_by_user", "racer-0")
        assert "denied by racer-0" in msg.text
        assert len(late) == racers - 1
    else:
        assert row.status == "timed_out"
        assert (entry.outcome, entry.decided_by) == ("review_timeout", "timeout")
        assert "timed out" in msg.text
        assert len(late) == racers  # none applied: every one is reported as too late
    assert all(d["review_id"] == review.id and d["reason"] == "too_late" for d in late)


@pytest.mark.parametrize("signal_first", [True, False], ids=["signal_first", "timer_first"])
async def test_a_decision_meeting_the_timeout_in_one_workflow_task_is_never_lost(
    temporal_env: WorkflowEnvironment, db_engine: Engine, signal_first: bool
) -> None:
    """Decision and fired timer in one workflow task: it wins or is reported late, never lost."""
    setup_pair(db_engine, "invoke_agent", INVOKE_SYNC)
    client = temporal_env.client
    queue = f"tq-{uuid.uuid4()}"
    async with build_worker(client, engine=db_engine, task_queue=queue) as worker:
        launched = await launch(
            client, db_engine, worker, "caller", "go", sync=False, config=SHORT_TIMEOUT
        )
        (review,) = await open_reviews(client, db_engine, launched.session_id)
    # No worker now: the Signal and the fired 1 s timer wait for the same workflow task.
    if signal_first:
        await decide(client, review, "deny", decided_by="bob")
    await asyncio.sleep(1.5)
    if not signal_first:
        await decide(client, review, "deny", decided_by="bob")
    async with build_worker(client, engine=db_engine, task_queue=queue):
        row = await settled(db_engine, review.id)
        await until_idle(client, db_engine, launched.session_id)
        late = await client.get_workflow_handle(launched.session_id).query("late_decisions")
    assert len(audit_rows(db_engine)) == 1
    if row.status == "denied":
        assert (row.decided_by, late) == ("bob", [])
    else:
        assert row.status == "timed_out"
        assert late == [{"review_id": review.id, "decision": "deny", "reason": "too_late"}]


class SlowAuthorize(XAgentActivities):
    """``authorize`` that, once it opened a review, holds its result until released."""

    def __init__(self, engine: Engine, client: Client) -> None:
        super().__init__(engine, client)
        self.opened = threading.Event()
        self.release = threading.Event()

    @activity.defn(name="authorize")
    def authorize(self, inp: AuthorizeInput) -> AuthorizeResult:
        result = super().authorize(inp)
        if result.decision == "review":
            self.opened.set()
            self.release.wait(20)
        return result


@pytest_asyncio.fixture
async def slow_worker(
    temporal_env: WorkflowEnvironment, db_engine: Engine
) -> AsyncIterator[tuple[Worker, SlowAuthorize]]:
    """Baton's worker with the ``authorize`` of :class:`SlowAuthorize`."""
    client = temporal_env.client
    slow = SlowAuthorize(db_engine, client)
    acts = [
        slow.authorize if getattr(a, "__name__", "") == "authorize" else a
        for a in activities_for(db_engine, client)
    ]
    w = Worker(
        client,
        task_queue=f"tq-{uuid.uuid4()}",
        workflows=WORKFLOWS,
        activities=acts,
        activity_executor=ThreadPoolExecutor(max_workers=16),
        workflow_runner=workflow_runner(),
    )
    try:
        async with w:
            yield w, slow
    finally:
        slow.release.set()


async def test_decision_sent_as_soon_as_the_review_row_is_visible_is_applied(
    temporal_env: WorkflowEnvironment,
    db_engine: Engine,
    slow_worker: tuple[Worker, SlowAuthorize],
) -> None:
    """A decision sent once the review row is pending, before the workflow saw it, still wins."""
    worker, slow = slow_worker
    setup_pair(db_engine, "invoke_agent", INVOKE_SYNC)
    client = temporal_env.client
    # The deadline is far: what decides here is the order (the decision before the workflow
    # saw its review), not the clock, which a loaded machine (two suites at once) stretches.
    config = TEST_CONFIG.model_copy(update={"review_timeout_s": 30.0})
    launched = await launch(client, db_engine, worker, "caller", "go", sync=False, config=config)
    assert await asyncio.to_thread(slow.opened.wait, 20)
    (review,) = await pending_review(db_engine, launched.session_id)  # visible to API and CLI
    await decide(client, review, "allow_once", decided_by="alice")
    slow.release.set()
    row = await settled(db_engine, review.id, timeout=90)
    late = await client.get_workflow_handle(launched.session_id).query("late_decisions")
    assert (row.status, row.decided_by, late) == ("allowed", "alice", [])


# --- 5. Guards: one hop and self-invocation -------------------------------------------------


def one_hop_agents(engine: Engine, target_trigger: str) -> None:
    """``third`` answers; ``target`` invokes ``third`` on ``target_trigger``; policies allow."""
    publish(engine, "third", playbook=[{"reply": "third says hi"}])
    third = {"slug": "third", "prompt": "hop", "sync": True}
    publish(engine, "target", playbook=playbook((target_trigger, "invoke_agent", third)))
    set_policy(engine, "invoke", "allow")
    set_policy(engine, "invoke", "allow", caller="target")


def assert_one_hop_refusal(engine: Engine, target_session: str) -> None:
    """The target's invoke was refused by the guard, audited, and nothing reached ``third``."""
    (msg,) = [m for m in tool_messages(engine, target_session) if m.is_error]
    assert msg.text.startswith("one_hop_violation: "), msg.text
    assert "one hop" in msg.text
    guard = [e for e in audit_rows(engine) if e.caller_agent_slug == "target"]
    assert [
        (e.operation, e.target_agent_slug, e.outcome, e.decided_by, e.reason) for e in guard
    ] == [("invoke", "third", "block", "guard", "one_hop_violation")]
    assert reviews_of(engine) == []


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
async def test_an_invoked_session_cannot_invoke(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker, sync: bool
) -> None:
    """A session started by invoke_agent (sync or async) gets one_hop_violation when it invokes."""
    one_hop_agents(db_engine, "hello target")
    args = {"slug": "target", "prompt": "hello target", "sync": sync}
    publish(db_engine, "caller", playbook=playbook(("^go$", "invoke_agent", args)))
    client = temporal_env.client
    launched = await launch(client, db_engine, worker, "caller", "go")
    result = tool_result(launched.response or "")
    target_session = result["session_id"]
    await until_idle(client, db_engine, target_session)
    if sync:
        assert "one_hop_violation" in result["response"]
    assert_one_hop_refusal(db_engine, target_session)
    assert sessions_of(db_engine, "third") == []


async def test_continuing_a_user_session_by_invoke_marks_that_turn_invoked(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """invoke_agent with session_id: that turn cannot invoke; the user's own turns still can."""
    one_hop_agents(db_engine, "delegate")
    client = temporal_env.client
    user_session = (await launch(client, db_engine, worker, "target", "warm up")).session_id
    args = {"slug": "target", "prompt": "delegate this", "session_id": user_session, "sync": True}
    publish(db_engine, "caller", playbook=playbook(("^go$", "invoke_agent", args)))
    launched = await launch(client, db_engine, worker, "caller", "go")
    result = tool_result(launched.response or "")
    assert result["session_id"] == user_session
    assert "one_hop_violation" in result["response"]
    assert_one_hop_refusal(db_engine, user_session)
    assert session_row(db_engine, user_session).invoked_by_agent is None
    # The next turn comes from the user again: full X-Agent capabilities.
    _, reply = await send_message(
        client, db_engine, session_id=user_session, prompt="delegate now", sync=True
    )
    assert tool_result(reply or "")["response"] == "third says hi"
    assert [m.is_error for m in tool_messages(db_engine, user_session)] == [True, False]


@pytest.mark.parametrize("global_", [None, "allow"], ids=["no_policy", "global_allow"])
async def test_self_invocation_is_refused_by_the_guard_without_review(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker, global_: str | None
) -> None:
    """invoke_agent on the caller's own slug: self_invocation, audited block by guard, no review."""
    args = {"slug": "caller", "prompt": "me again", "sync": True}
    publish(db_engine, "caller", playbook=playbook(("^go$", "invoke_agent", args)))
    if global_:
        set_policy(db_engine, "invoke", global_)
    launched = await launch(temporal_env.client, db_engine, worker, "caller", "go")
    (msg,) = tool_messages(db_engine, launched.session_id)
    assert msg.is_error and msg.text.startswith("self_invocation: "), msg.text
    assert echoed(launched.response, msg)
    (entry,) = audit_rows(db_engine)
    assert (entry.caller_agent_slug, entry.operation, entry.target_agent_slug) == (
        "caller",
        "invoke",
        "caller",
    )
    assert (entry.outcome, entry.decided_by, entry.reason, entry.review_id) == (
        "block",
        "guard",
        "self_invocation",
        None,
    )
    assert reviews_of(db_engine) == []
    assert sessions_of(db_engine, "caller") == [launched.session_id]


# --- 6. create_agent ---------------------------------------------------------------------

CREATE = {"name": "New Helper", "description": "Helps out", "instructions": "Be brief."}


async def test_create_agent_reviews_despite_global_allows_and_the_new_slug_is_invokable(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """create_agent reviews with every op allowed; allow_once publishes an invokable agent."""
    use_it = {"slug": "new-helper", "prompt": "hi helper", "sync": True}
    publish(
        db_engine,
        "caller",
        playbook=playbook(("^go$", "create_agent", CREATE), ("^use it$", "invoke_agent", use_it)),
    )
    for op in ("list", "read", "invoke"):
        set_policy(db_engine, op, "allow")
    client = temporal_env.client
    launched = await launch(client, db_engine, worker, "caller", "go", sync=False)
    sid = launched.session_id
    (review,) = await open_reviews(client, db_engine, sid)
    assert (review.operation, review.target_agent_slug) == ("create", None)
    assert review.preview == "create agent 'New Helper'"
    await decide(client, review, "allow_once", decided_by="alice")
    await until_idle(client, db_engine, sid)
    created = tool_result(transcript(db_engine, sid)[-1][1])
    assert created["slug"] == "new-helper"
    with session_scope(db_engine) as s:
        agent, rev = registry.resolve_ref(s, ref="new-helper")
        assert (agent.name, agent.description, rev.version) == ("New Helper", "Helps out", 1)
    _, reply = await send_message(client, db_engine, session_id=sid, prompt="use it", sync=True)
    assert tool_result(reply or "")["response"] == "[new-helper] received: hi helper"
    assert len(reviews_of(db_engine)) == 1  # the invoke was allowed by the global policy
    (entry,) = audit_rows(db_engine)
    assert (entry.operation, entry.target_agent_slug, entry.outcome, entry.decided_by) == (
        "create",
        None,
        "allow",
        "alice",
    )
    assert entry.review_id == review.id
    assert all(op != "create" for _, _, op, _ in policy_rows(db_engine))


async def test_always_allow_on_create_saves_no_policy_and_the_next_create_reviews(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """always_allow on create_agent acts once: no policy row, the next create reviews again."""
    publish(db_engine, "caller", playbook=playbook(("^go$", "create_agent", CREATE)))
    client = temporal_env.client
    launched = await launch(client, db_engine, worker, "caller", "go", sync=False)
    sid = launched.session_id
    (first,) = await open_reviews(client, db_engine, sid)
    await decide(client, first, "always_allow", scope="all", decided_by="alice")
    await until_idle(client, db_engine, sid)
    row = await settled(db_engine, first.id)
    assert (row.status, row.scope) == ("allowed", None)
    assert policy_rows(db_engine) == []
    await send_message(client, db_engine, session_id=sid, prompt="go", sync=False)
    (second,) = await open_reviews(client, db_engine, sid)
    assert second.id != first.id and second.operation == "create"
    await decide(client, second, "deny")
    await until_idle(client, db_engine, sid)
    with session_scope(db_engine) as s:
        registry.get_agent(s, slug="new-helper")  # the allowed create made it
        with pytest.raises(AgentNotFound):
            registry.get_agent(s, slug="new-helper-2")  # the denied one did not
    assert policy_rows(db_engine) == []


# --- 7. Audit rows ---------------------------------------------------------------------------


async def test_audit_rows_record_blocks_and_every_review_outcome(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """Audit: block (policy), allow, denied_by_user, review_timeout with who decided and review."""
    two_target_caller(db_engine)
    publish(
        db_engine,
        "caller",
        playbook=playbook(
            ("^list$", "list_agents", {}),
            ("^one$", "invoke_agent", INVOKE_SYNC),
            ("^two$", "invoke_agent", {"slug": "target2", "prompt": "x", "sync": True}),
            ("^read$", "get_agent_sessions", READ_SESSIONS),
        ),
    )
    set_policy(db_engine, "list", "block")
    client = temporal_env.client
    # Long enough for two decisions on a loaded machine; the third review is left to time out.
    config = TEST_CONFIG.model_copy(update={"review_timeout_s": 10.0})
    sid = (await launch(client, db_engine, worker, "caller", "list", config=config)).session_id
    decided: list[str] = []
    for prompt, decision, who in (("one", "allow_once", "alice"), ("two", "deny", "bob")):
        await send_message(client, db_engine, session_id=sid, prompt=prompt, sync=False)
        (review,) = await open_reviews(client, db_engine, sid)
        await decide(client, review, decision, decided_by=who)
        await until_idle(client, db_engine, sid)
        decided.append(review.id)
    await send_message(client, db_engine, session_id=sid, prompt="read", sync=False)
    (review,) = await open_reviews(client, db_engine, sid)
    await settled(db_engine, review.id, timeout=60)
    await until_idle(client, db_engine, sid)
    decided.append(review.id)
    rows = audit_rows(db_engine)
    assert [
        (
            e.session_id,
            e.caller_agent_slug,
            e.operation,
            e.target_agent_slug,
            e.outcome,
            e.decided_by,
            e.review_id,
        )
        for e in rows
    ] == [
        (sid, "caller", "list", None, "block", "policy", None),
        (sid, "caller", "invoke", "target", "allow", "alice", decided[0]),
        (sid, "caller", "invoke", "target2", "denied_by_user", "bob", decided[1]),
        (sid, "caller", "read", "target", "review_timeout", "timeout", decided[2]),
    ]
    assert [e.at for e in rows] == sorted(e.at for e in rows)
    assert all(e.reason for e in rows)


# --- 8. get_agent_sessions and get_agent_session_transcript ----------------------------------

BASE = datetime(2026, 1, 1, tzinfo=UTC)


async def test_get_agent_sessions_pages_newest_first_with_every_field(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """Default limit 50, limit 200 accepted, 201 refused as invalid arguments; newest first."""
    publish(db_engine, "target", playbook=[{"reply": "hi"}])
    order = [*range(0, 60, 2), *range(1, 60, 2)]  # inserted out of creation order
    for i in order:
        add_session(
            db_engine,
            "target",
            name=f"s-{i:02d}",
            created_at=BASE + timedelta(minutes=i),
            status={59: "running", 58: "awaiting_input"}.get(i, "idle"),
        )
    publish(
        db_engine,
        "caller",
        playbook=playbook(
            ("^default$", "get_agent_sessions", {"slug": "target"}),
            ("^max$", "get_agent_sessions", {"slug": "target", "limit": 200}),
            ("^page$", "get_agent_sessions", {"slug": "target", "limit": 10, "offset": 55}),
            ("^too many$", "get_agent_sessions", {"slug": "target", "limit": 201}),
        ),
    )
    set_policy(db_engine, "read", "allow", target="target")
    client = temporal_env.client
    sid = (await launch(client, db_engine, worker, "caller", "default")).session_id
    for prompt in ("max", "page", "too many"):
        await send_message(client, db_engine, session_id=sid, prompt=prompt, sync=True)
    default, most, page, too_many = tool_messages(db_engine, sid)

    first = json.loads(default.text)
    assert first["count"] == 60
    assert [e["name"] for e in first["sessions"]] == [f"s-{i:02d}" for i in range(59, 9, -1)]
    newest = first["sessions"][0]
    assert set(newest) == {
        "session_id",
        "name",
        "created_at",
        "last_activity_at",
        "message_count",
        "running",
    }
    assert datetime.fromisoformat(newest["created_at"]) == BASE + timedelta(minutes=59)
    assert newest["message_count"] == 0
    assert [e["running"] for e in first["sessions"][:3]] == [True, True, False]
    assert len(json.loads(most.text)["sessions"]) == 60
    assert [e["name"] for e in json.loads(page.text)["sessions"]] == [
        f"s-{i:02d}" for i in range(4, -1, -1)
    ]
    assert too_many.is_error and too_many.text.startswith("invalid_arguments: "), too_many.text
    assert "200" in too_many.text
    assert reviews_of(db_engine) == [] and audit_rows(db_engine) == []


def seed_transcript(engine: Engine, session_id: str, agent: str, status_: str) -> None:
    """A stored session: user, assistant calling a tool, a long tool result, final answer."""
    add_session(engine, agent, session_id=session_id, status=status_)
    long_args = {"expression": "1+" * 400 + "1"}
    with session_scope(engine) as s:
        common: dict[str, Any] = {"session_id": session_id, "agent_slug": agent}
        session_store.add_message(
            s, message_id="m1", position=position(1, 0, 0), role="user", text="compute", **common
        )
        session_store.add_message(
            s,
            message_id="m2",
            position=position(1, 1, 1),
            role="assistant",
            text="Let me compute.",
            tool_calls=[{"id": "c1", "name": "calculator", "args": long_args}],
            **common,
        )
        session_store.add_message(
            s,
            message_id="m3",
            position=position(1, 1, 2),
            role="tool",
            text="4" * 2000,
            tool_name="calculator",
            tool_call_id="c1",
            tool_args=long_args,
            **common,
        )
        session_store.add_message(
            s,
            message_id="m4",
            position=position(1, 2, 1),
            role="assistant",
            text="It is 401.",
            **common,
        )


@pytest.mark.parametrize("session_status", ["idle", "running", "awaiting_input"])
async def test_transcript_is_a_status_line_then_messages_with_tool_io_summarised(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker, session_status: str
) -> None:
    """get_agent_session_transcript: "status: <s>" first, then messages; tool I/O cut short."""
    setup_pair(db_engine, "get_agent_session_transcript", READ_TRANSCRIPT)
    seed_transcript(db_engine, TARGET_SESSION, "target", session_status)
    set_policy(db_engine, "read", "allow", target="target")
    launched = await launch(temporal_env.client, db_engine, worker, "caller", "go")
    (msg,) = tool_messages(db_engine, launched.session_id)
    assert not msg.is_error, msg.text
    lines = msg.text.split("\n")
    assert lines[0] == f"status: {session_status}"
    assert lines[1] == "[user] compute"
    assert lines[2] == "[assistant target] Let me compute. (calls calculator)"
    assert lines[3].startswith("[tool calculator] input: ")
    assert "→ output: 4444" in lines[3] and lines[3].count("…") == 2
    assert len(lines[3]) < 500
    assert lines[4:] == ["[assistant target] It is 401."]


async def test_transcript_of_another_agents_session_is_refused(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """A session id of a different agent than ``slug`` is refused, its content never shown."""
    setup_pair(db_engine, "get_agent_session_transcript", READ_TRANSCRIPT)
    publish(db_engine, "third", playbook=[{"reply": "secret"}])
    seed_transcript(db_engine, TARGET_SESSION, "third", "idle")
    set_policy(db_engine, "read", "allow", target="target")
    launched = await launch(temporal_env.client, db_engine, worker, "caller", "go")
    (msg,) = tool_messages(db_engine, launched.session_id)
    assert msg.is_error
    assert f"'{TARGET_SESSION}' is not a session of 'target'" in msg.text
    assert "compute" not in msg.text


# --- 9. invoke_agent: async, continuing sessions ----------------------------------------------


async def test_async_invoke_returns_running_and_the_target_finishes_on_its_own(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """sync=false returns {session_id, status: running} at once; the target's turn completes."""
    setup_pair(db_engine, "invoke_agent", INVOKE_ASYNC)
    set_policy(db_engine, "invoke", "allow", target="target")
    client = temporal_env.client
    launched = await launch(client, db_engine, worker, "caller", "go")
    result = tool_result(launched.response or "")
    assert set(result) == {"session_id", "status"} and result["status"] == "running"
    target_session = result["session_id"]
    await until_idle(client, db_engine, target_session)
    assert transcript(db_engine, target_session) == [
        ("user", "hello target"),
        ("assistant", "target says hi"),
    ]
    row = session_row(db_engine, target_session)
    assert (row.invoked_by_agent, row.name, row.parent_session_id) == (
        "caller",
        "Invoked by caller",
        launched.session_id,
    )


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
async def test_invoke_continuing_a_running_session_is_a_clear_error(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker, sync: bool
) -> None:
    """invoke_agent with the session_id of a running session: session_busy, nothing delivered."""
    slow = {"when": "slow", "reply": "one two three four five six seven", "chunk_delay_ms": 300}
    publish(db_engine, "target", playbook=[slow, {"reply": "target says hi"}])
    client = temporal_env.client
    busy = (await launch(client, db_engine, worker, "target", "slow", sync=False)).session_id
    await wait_for(lambda: status(db_engine, busy) == "running")
    args = {"slug": "target", "prompt": "more", "session_id": busy, "sync": sync}
    publish(db_engine, "caller", playbook=playbook(("^go$", "invoke_agent", args)))
    set_policy(db_engine, "invoke", "allow")
    launched = await launch(client, db_engine, worker, "caller", "go")
    (msg,) = tool_messages(db_engine, launched.session_id)
    assert msg.is_error and "invoke_agent failed (session_busy)" in msg.text, msg.text
    assert status(db_engine, busy) == "running"
    await until_idle(client, db_engine, busy)
    assert [text for role, text in transcript(db_engine, busy) if role == "user"] == ["slow"]


@pytest.mark.parametrize("owner", [None, "third"], ids=["unknown", "other_agent"])
async def test_invoke_continuing_a_missing_or_foreign_session_is_a_clear_error(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker, owner: str | None
) -> None:
    """invoke_agent with an unknown session id, or another agent's session: a tool error."""
    session_id = f"session-{uuid.uuid4()}"
    if owner:
        publish(db_engine, owner, playbook=[{"reply": "x"}])
        add_session(db_engine, owner, session_id=session_id)
    args = {"slug": "target", "prompt": "more", "session_id": session_id, "sync": True}
    setup_pair(db_engine, "invoke_agent", args)
    set_policy(db_engine, "invoke", "allow")
    launched = await launch(temporal_env.client, db_engine, worker, "caller", "go")
    (msg,) = tool_messages(db_engine, launched.session_id)
    assert msg.is_error
    code = "session_of_other_agent" if owner else "session_not_found"
    assert f"invoke_agent failed ({code})" in msg.text and session_id in msg.text, msg.text
    assert sessions_of(db_engine, "target") == []
