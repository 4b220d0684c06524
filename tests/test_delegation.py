"""Delegation on a real dev server: isolation and the shared channel, the ad-hoc roster,
limits at their edge, subagent trees, tool isolation, events, attribution and the cancel
cascade (AgentX Agent Teams; Xema Agent Concepts 'Subagents', 'What bounds a tree';
docs/teams.md)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from pydantic_ai.messages import ModelMessage, ModelRequest, SystemPromptPart
from pydantic_ai.models import Model
from pydantic_ai.models.function import AgentInfo, FunctionModel
from sqlalchemy.engine import Engine
from sqlmodel import col, select
from temporalio.client import WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

import activities.turns as session_activities
import baton.providers.models
from activities.delegate import Refused
from baton.agents import registry, roster, teams
from baton.agents.spec import AgentSpec
from baton.contracts.activity_io import DelegateInput, ToolMessage
from baton.contracts.values import ToolCall
from baton.contracts.workflow_io import Provenance, SessionConfig
from baton.errors import TurnFailed
from baton.grants import policies
from baton.runs import launch, run_tree, session_store
from baton.runs.launch import Launched, launch_session
from baton.storage.db import (
    AuditRow,
    DelegationRow,
    EventRow,
    MessageRow,
    SessionRow,
    session_scope,
)
from tests.helpers import STEADY_CONFIG, TEST_CONFIG, publish, wait_for
from tests.helpers import launch as launch_agent
from tests.test_teams import team_run

ON_ROSTER = {"available_for_delegation": True}


# --- helpers ----------------------------------------------------------------------


@dataclass
class Call:
    """One model call as the provider saw it."""

    agent: str
    tools: dict[str, Any]
    system: str
    messages: list[ModelMessage]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[Call]:
    """Record every model call (agent, offered tools, system prompt) of the in-process worker."""
    seen: list[Call] = []
    original = baton.providers.models.build_model

    def build(name: str, *, playbook: list[dict[str, Any]] | None, agent_slug: str) -> Model:
        model = original(name, playbook=playbook, agent_slug=agent_slug)
        assert isinstance(model, FunctionModel) and model.stream_function is not None
        inner = model.stream_function

        async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
            first = messages[0] if messages else None
            system = (
                "".join(p.content for p in first.parts if isinstance(p, SystemPromptPart))
                if isinstance(first, ModelRequest)
                else ""
            )
            tools = {t.name: t for t in info.function_tools}
            seen.append(Call(agent_slug, tools, system, list(messages)))
            async for item in inner(messages, info):
                yield item

        return FunctionModel(stream_function=stream, model_name=model.model_name)

    monkeypatch.setattr(session_activities, "build_model", build)
    return seen


def publish_described(engine: Engine, slug: str, description: str, **spec: Any) -> None:
    """Create and publish ``slug`` with a description (identity metadata, not in the spec)."""
    with session_scope(engine) as s:
        registry.create_agent(
            s, slug=slug, name=slug.title(), description=description, spec=AgentSpec(**spec)
        )
        registry.publish(s, slug=slug)


def delegating(target: str, task: str = "pass it on", *, tool: str = "delegate_to") -> list[Any]:
    """A playbook that delegates once to ``target`` and then answers with the result."""
    args = (
        {"agent_id": target, "task": task}
        if tool == "delegate_to"
        else {"alias": target, "prompt": task}
    )
    return [
        {"when": f"^{tool}: ", "reply": "<{last_message}>"},
        {"reply": "Delegating.", "tool_calls": [{"tool": tool, "args": args}]},
    ]


def rows(engine: Engine, model: Any, *where: Any) -> list[Any]:
    with session_scope(engine) as s:
        return list(s.exec(select(model).where(*where)).all())


def all_sessions(engine: Engine) -> list[SessionRow]:
    with session_scope(engine) as s:
        return list(s.exec(select(SessionRow).order_by(col(SessionRow.created_at))).all())


def messages(engine: Engine, session_id: str) -> list[MessageRow]:
    with session_scope(engine) as s:
        return session_store.messages(s, session_id=session_id)


def tool_results(engine: Engine, session_id: str) -> list[MessageRow]:
    return [m for m in messages(engine, session_id) if m.role == "tool"]


def events(engine: Engine, session_id: str) -> list[tuple[str, dict[str, Any]]]:
    found = rows(engine, EventRow, EventRow.session_id == session_id)
    return [(e.type, e.data) for e in sorted(found, key=lambda e: e.id or 0)]


def children(engine: Engine, parent: str) -> list[DelegationRow]:
    found = rows(engine, DelegationRow, DelegationRow.parent_session_id == parent)
    return sorted(found, key=lambda d: d.started_at)


def model_calls(engine: Engine) -> int:
    """Assistant messages stored across every session (one per completed model call)."""
    return len(rows(engine, MessageRow, MessageRow.role == "assistant"))


def run_usage(engine: Engine, root: str) -> int:
    with session_scope(engine) as s:
        return run_tree.run_tokens(s, root_session_id=root)


def message_tokens(msg: MessageRow) -> int:
    assert msg.usage is not None
    return int(msg.usage["input_tokens"]) + int(msg.usage["output_tokens"])


def make_team(
    engine: Engine,
    *,
    lead: list[Any],
    members: dict[str, list[Any]],
    member_spec: dict[str, dict[str, Any]] | None = None,
) -> None:
    """Publish ``lead`` and ``members`` (slug → playbook) and store team ``desk``."""
    for slug, playbook in members.items():
        publish(engine, slug, playbook=playbook, **(member_spec or {}).get(slug, {}))
    publish(engine, "lead", playbook=lead)
    body = {
        "id": "desk",
        "name": "Desk",
        "supervisor_agent_id": "lead",
        "members": [
            {"agent_id": "lead", "role": "supervisor"},
            *({"agent_id": slug, "delegation_hint": f"{slug} work"} for slug in members),
        ],
    }
    with session_scope(engine) as s:
        teams.create_team(s, team=teams.TeamIn.model_validate(body))


async def run(
    env: WorkflowEnvironment,
    engine: Engine,
    worker: Worker,
    ref: str,
    prompt: str = "go",
    *,
    config: SessionConfig = TEST_CONFIG,
    provenance: Provenance | None = None,
    sync: bool = True,
) -> Launched:
    return await launch_session(
        env.client,
        engine,
        task_queue=worker.task_queue,
        config=config,
        ref=ref,
        prompt=prompt,
        provenance=provenance or Provenance(),
        sync=sync,
    )


# --- team isolation and the shared channel ------------------------------------------


async def test_members_see_only_the_task_then_relevant_channel_memories(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """A member's transcript starts with the bare task; on a later delegation whose task shares
    words with an earlier result, the member's first message carries that shared memory; an
    unrelated task gets none."""
    make_team(
        db_engine,
        lead=[
            {"when": "^delegate_to: ", "reply": "SYNTH {last_message}"},
            {
                "when": "first",
                "tool_calls": [
                    {
                        "tool": "delegate_to",
                        "args": {"agent_id": "checker", "task": "check the rainfall figures"},
                    }
                ],
            },
            {
                "when": "second",
                "tool_calls": [
                    {
                        "tool": "delegate_to",
                        "args": {"agent_id": "writer", "task": "write about rainfall figures"},
                    }
                ],
            },
            {
                "when": "third",
                "tool_calls": [
                    {
                        "tool": "delegate_to",
                        "args": {"agent_id": "checker", "task": "verify totals quickly"},
                    }
                ],
            },
        ],
        members={
            "checker": [{"reply": "Rainfall figures verified by checker"}],
            "writer": [{"reply": "WRITTEN"}],
        },
    )
    first = await team_run(temporal_env, db_engine, worker, "first: secret lead context")
    assert first.response == "SYNTH Rainfall figures verified by checker"
    _, second = await launch.send_message(
        temporal_env.client, db_engine, session_id=first.session_id, prompt="second", sync=True
    )
    assert second == "SYNTH WRITTEN"
    _, third = await launch.send_message(
        temporal_env.client, db_engine, session_id=first.session_id, prompt="third", sync=True
    )
    assert third == "SYNTH Rainfall figures verified by checker"

    d1, d2, d3 = children(db_engine, first.session_id)
    assert [d.target_agent_slug for d in (d1, d2, d3)] == ["checker", "writer", "checker"]
    assert d1.child_session_id and d2.child_session_id and d3.child_session_id
    checker_first = messages(db_engine, d1.child_session_id)
    assert (checker_first[0].role, checker_first[0].text) == ("user", "check the rainfall figures")
    assert [m.role for m in checker_first] == ["user", "assistant"]
    writer_first = messages(db_engine, d2.child_session_id)[0].text
    assert writer_first == (
        "write about rainfall figures\n\nRelevant memories from the team's shared channel:\n"
        "- [checker] Rainfall figures verified by checker"
    )
    assert "secret" not in writer_first and "second" not in writer_first
    assert messages(db_engine, d3.child_session_id)[0].text == "verify totals quickly"
    # Members are separate sessions of their own agent, tagged with the team.
    for d in (d1, d2, d3):
        with session_scope(db_engine) as s:
            child = session_store.get_session(s, session_id=d.child_session_id or "")
        assert child.team == "desk" and child.depth == 1
        assert child.parent_session_id == first.session_id


async def test_members_cannot_re_delegate(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """A member whose playbook calls delegate_to gets a delegation_unavailable tool error and no
    session is started; a lead delegating outside its team gets not_a_member."""
    make_team(
        db_engine,
        lead=[
            {"when": "^delegate_to: ", "reply": "SYNTH {last_message}"},
            {
                "when": "go",
                "tool_calls": [
                    {"tool": "delegate_to", "args": {"agent_id": "rogue", "task": "do it"}},
                    {"tool": "delegate_to", "args": {"agent_id": "outsider", "task": "do it"}},
                ],
            },
        ],
        members={"rogue": delegating("checker"), "checker": [{"reply": "CHECKED"}]},
    )
    publish(db_engine, "outsider", playbook=[{"reply": "OUT"}], delegation=ON_ROSTER)
    roster.clear_cache()
    done = await team_run(temporal_env, db_engine, worker, "go")
    (rogue_edge,) = children(db_engine, done.session_id)
    assert rogue_edge.target_agent_slug == "rogue"
    (refusal,) = tool_results(db_engine, rogue_edge.child_session_id or "")
    assert refusal.is_error and refusal.text.startswith("delegation_unavailable: ")
    assert "re-delegate" in refusal.text
    assert children(db_engine, rogue_edge.child_session_id or "") == []
    lead_results = tool_results(db_engine, done.session_id)
    assert not lead_results[0].is_error and "delegation_unavailable" in lead_results[0].text
    assert lead_results[1].is_error and lead_results[1].text.startswith("not_a_member: ")
    assert {s.agent_slug for s in all_sessions(db_engine)} == {"lead", "rogue"}


async def test_solo_is_ignored_for_team_runs(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker, calls: list[Call]
) -> None:
    """A team run started Solo (disable_delegation) still gives the lead delegate_to over its
    specialists, with the orchestrate brief and each member's hint."""
    make_team(
        db_engine,
        lead=[
            {"when": "^delegate_to: ", "reply": "SYNTH {last_message}"},
            {"tool_calls": [{"tool": "delegate_to", "args": {"agent_id": "writer", "task": "w"}}]},
        ],
        members={"writer": [{"reply": "WRITTEN"}], "checker": [{"reply": "CHECKED"}]},
    )
    done = await team_run(
        temporal_env,
        db_engine,
        worker,
        "go",
        provenance=Provenance(team="desk", disable_delegation=True),
    )
    assert done.response == "SYNTH WRITTEN"
    lead_call = next(c for c in calls if c.agent == "lead")
    tool = lead_call.tools["delegate_to"]
    assert tool.parameters_json_schema["properties"]["agent_id"]["enum"] == ["writer", "checker"]
    assert "writer: writer work" in (tool.description or "")
    assert "Orchestrate, don't execute" in lead_call.system
    member_call = next(c for c in calls if c.agent == "writer")
    assert "delegate_to" not in member_call.tools


# --- ad-hoc roster ----------------------------------------------------------------------


async def test_delegate_to_is_offered_only_with_a_roster(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker, calls: list[Call]
) -> None:
    """No opted-in agent: no delegate_to and no roster block; once another agent opts in, the
    tool (enum of the roster) and the roster block with its hint appear; Solo and the
    deployment switch withdraw both."""
    publish(db_engine, "host", system_prompt="HOST PROMPT", playbook=[{"reply": "hi"}])
    publish_described(db_engine, "bystander", "just here", playbook=[{"reply": "x"}])
    await run(temporal_env, db_engine, worker, "host")
    assert "delegate_to" not in calls[-1].tools
    assert calls[-1].system == "HOST PROMPT"

    publish_described(
        db_engine,
        "researcher",
        "Finds things.",
        playbook=[{"reply": "FOUND"}],
        delegation={"available_for_delegation": True, "delegation_hint": "web research"},
    )
    publish_described(
        db_engine,
        "painter",
        "Paints pictures.",
        playbook=[{"reply": "PAINTED"}],
        delegation=ON_ROSTER,
    )
    roster.clear_cache()
    await run(temporal_env, db_engine, worker, "host")
    offered = calls[-1]
    schema = offered.tools["delegate_to"].parameters_json_schema
    assert schema["properties"]["agent_id"]["enum"] == ["painter", "researcher"]
    assert offered.system.startswith("HOST PROMPT\n\nTeammates you can hand a subtask to")
    assert "- researcher: web research" in offered.system
    assert "- painter: Paints pictures." in offered.system
    assert "bystander" not in offered.system and "host" not in schema["properties"]["agent_id"]

    # A roster agent never sees itself.
    await run(temporal_env, db_engine, worker, "researcher")
    assert calls[-1].tools["delegate_to"].parameters_json_schema["properties"]["agent_id"][
        "enum"
    ] == ["painter"]

    await run(
        temporal_env, db_engine, worker, "host", provenance=Provenance(disable_delegation=True)
    )
    assert "delegate_to" not in calls[-1].tools and calls[-1].system == "HOST PROMPT"
    off = TEST_CONFIG.model_copy(update={"allow_adhoc_delegation": False})
    await run(temporal_env, db_engine, worker, "host", config=off)
    assert "delegate_to" not in calls[-1].tools and calls[-1].system == "HOST PROMPT"


async def test_adhoc_delegation_runs_and_refusals(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """delegate_to a roster agent returns its reply; an agent not on the roster is
    not_on_roster; self-delegation is self_delegation; Solo gives delegation_unavailable."""
    publish(db_engine, "helper", playbook=[{"reply": "HELPED"}], delegation=ON_ROSTER)
    publish(db_engine, "hermit", playbook=[{"reply": "HERMIT"}])
    roster.clear_cache()
    publish(db_engine, "host", playbook=delegating("helper"))
    ok = await run(temporal_env, db_engine, worker, "host")
    assert ok.response == "<HELPED>"
    (edge,) = children(db_engine, ok.session_id)
    assert (edge.kind, edge.status, edge.depth) == ("delegate_to", "completed", 1)

    for target, code in (("hermit", "not_on_roster"), ("ghost", "not_on_roster")):
        publish(db_engine, "host", playbook=delegating(target))
        refused = await run(temporal_env, db_engine, worker, "host")
        (result,) = tool_results(db_engine, refused.session_id)
        assert result.is_error and result.text.startswith(f"{code}: "), result.text
        assert children(db_engine, refused.session_id) == []

    publish(db_engine, "helper", playbook=delegating("helper"), delegation=ON_ROSTER)
    roster.clear_cache()
    selfish = await run(temporal_env, db_engine, worker, "helper")
    (result,) = tool_results(db_engine, selfish.session_id)
    assert result.is_error and result.text.startswith("self_delegation: ")
    assert selfish.response is not None and "self_delegation" in selfish.response

    publish(db_engine, "host", playbook=delegating("helper"))
    solo = await run(
        temporal_env, db_engine, worker, "host", provenance=Provenance(disable_delegation=True)
    )
    (result,) = tool_results(db_engine, solo.session_id)
    assert result.is_error and result.text.startswith("delegation_unavailable: ")
    assert children(db_engine, solo.session_id) == []


# --- limits at their edge -----------------------------------------------------------------


def chain(engine: Engine, length: int, **root_spec: Any) -> None:
    """``c0`` (root) → c1 → … → c<length> through subagent ``task``s (one hop exempts a
    tree's own tasks): each ci's tree has one node ``next`` → c(i+1); the last replies LEAF."""
    for i in range(length, 0, -1):
        if i == length:
            publish(engine, f"c{i}", playbook=[{"reply": "LEAF"}])
        else:
            publish(engine, f"c{i}", playbook=delegating("next", tool="task"), **_next(i + 1))
    publish(engine, "c0", playbook=delegating("next", tool="task"), **_next(1), **root_spec)


def _next(i: int) -> dict[str, Any]:
    return {"subagents": [{"alias": "next", "agent": f"c{i}"}]}


async def test_a_delegated_session_cannot_delegate_again(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """One hop on every path: c0 → c1 by roster delegate_to runs, c1's own delegate_to to c2 is
    refused one_hop_violation (audited as a guard block, via delegate_to) and c2 never starts."""
    publish(db_engine, "c2", playbook=[{"reply": "LEAF"}], delegation=ON_ROSTER)
    publish(db_engine, "c1", playbook=delegating("c2"), delegation=ON_ROSTER)
    publish(db_engine, "c0", playbook=delegating("c1"))
    roster.clear_cache()
    done = await run(temporal_env, db_engine, worker, "c0")
    assert done.response is not None
    assert done.response.startswith('<<{"error":"one_hop_violation: ')
    assert sorted(s.agent_slug for s in all_sessions(db_engine)) == ["c0", "c1"]
    (entry,) = rows(db_engine, AuditRow)
    assert (entry.caller_agent_slug, entry.target_agent_slug, entry.via) == (
        "c1",
        "c2",
        "delegate_to",
    )
    assert (entry.operation, entry.outcome, entry.decided_by, entry.reason) == (
        "invoke",
        "block",
        "guard",
        "one_hop_violation",
    )


async def test_an_invoked_session_is_offered_no_roster(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker, calls: list[Call]
) -> None:
    """A session another agent started gets neither delegate_to nor the roster block, so its
    model is not invited to walk around the one-hop rule."""
    publish(db_engine, "c2", playbook=[{"reply": "LEAF"}], delegation=ON_ROSTER)
    publish(db_engine, "c1", playbook=[{"reply": "done"}], delegation=ON_ROSTER)
    publish(db_engine, "c0", playbook=delegating("c1"))
    roster.clear_cache()
    await run(temporal_env, db_engine, worker, "c0")
    by_agent = {c.agent: c for c in calls}
    assert "delegate_to" in by_agent["c0"].tools
    assert "delegate_to" not in by_agent["c1"].tools
    assert "c2" not in by_agent["c1"].system


def test_max_delegation_depth_three_ok_four_refused(db_engine: Engine) -> None:
    """max_delegation_depth (default 3) bounds delegate_to, routes and mentions: depth 3 passes
    the check, depth 4 is refused limit_exceeded (one hop keeps real runs at depth 1; this is
    the second line behind it)."""
    from activities.delegate import _check_limits

    def inp(depth: int) -> DelegateInput:
        tool = ToolMessage(
            session_id="session-x",
            agent_slug="c0",
            message_id="m",
            position="000001.001.2000",
            call=ToolCall(id="c", name="delegate_to", args={}),
        )
        return DelegateInput(
            tool=tool,
            delegation_id="d",
            caller_session_id="session-x",
            user="local",
            target="c1",
            prompt="t",
            task_queue="q",
            config=TEST_CONFIG,
            depth=depth,
            kind="delegate_to",
        )

    with session_scope(db_engine) as s:
        _check_limits(s, inp(3), "session-x")
        with pytest.raises(Refused, match="delegation depth 4 exceeds max_delegation_depth 3"):
            _check_limits(s, inp(4), "session-x")


def delegations_of(engine: Engine, root: str) -> list[str]:
    with session_scope(engine) as s:
        return run_tree.run_sessions(s, root_session_id=root)


async def test_two_agents_delegating_to_each_other_are_bounded(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """ping and pong keep delegating to each other: one hop ends the rally at pong's first
    delegate_to (one_hop_violation), after exactly 2 sessions and 4 model calls."""
    publish(db_engine, "ping", playbook=delegating("pong", "rally"), delegation=ON_ROSTER)
    publish(db_engine, "pong", playbook=delegating("ping", "rally"), delegation=ON_ROSTER)
    roster.clear_cache()
    # Counts model calls: STEADY_CONFIG, so that a heartbeat late under load retries
    # nothing; the suite's timeout bounds a rally that would not end.
    done = await run(temporal_env, db_engine, worker, "ping", config=STEADY_CONFIG)
    assert done.response is not None
    assert done.response.startswith('<<{"error":"one_hop_violation: ')
    assert [s.agent_slug for s in all_sessions(db_engine)] == ["ping", "pong"]
    assert model_calls(db_engine) == 4
    assert {s.status for s in all_sessions(db_engine)} == {"idle"}


async def test_root_max_depth_limit(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """limits.max_depth on the root agent: depth 1 runs, depth 2 is refused limit_exceeded,
    even though the members set no limit (the run's limits are carried down)."""
    chain(db_engine, 3, limits={"max_depth": 1})
    done = await run(temporal_env, db_engine, worker, "c0")
    assert done.response is not None
    assert "limit_exceeded: nesting depth 2 exceeds max_depth 1" in done.response
    assert sorted(s.agent_slug for s in all_sessions(db_engine)) == ["c0", "c1"]
    chain(db_engine, 3, limits={"max_depth": 3})
    deep = await run(temporal_env, db_engine, worker, "c0")
    assert deep.response == "<<<LEAF>>>"


SPAWNER = [
    {"when": "limit_exceeded", "reply": "REFUSED {last_message}"},
    {
        "when": "^delegate_to: one",
        "tool_calls": [{"tool": "delegate_to", "args": {"agent_id": "echo", "task": "two"}}],
    },
    {
        "when": "^delegate_to: two",
        "tool_calls": [{"tool": "delegate_to", "args": {"agent_id": "echo", "task": "three"}}],
    },
    {"when": "^delegate_to: three", "reply": "ALL THREE"},
    {"tool_calls": [{"tool": "delegate_to", "args": {"agent_id": "echo", "task": "one"}}]},
]


async def test_max_spawns_three_ok_fourth_refused(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """limits.max_spawns on the root: N sessions start, delegation N+1 is refused
    limit_exceeded; nested spawns count against the root's run."""
    publish(db_engine, "echo", playbook=[{"reply": "{last_message}"}], delegation=ON_ROSTER)
    roster.clear_cache()
    publish(db_engine, "spawner", playbook=SPAWNER, limits={"max_spawns": 3})
    ok = await run(temporal_env, db_engine, worker, "spawner")
    assert ok.response == "ALL THREE"
    assert len(children(db_engine, ok.session_id)) == 3

    publish(db_engine, "spawner", playbook=SPAWNER, limits={"max_spawns": 2})
    refused = await run(temporal_env, db_engine, worker, "spawner")
    assert refused.response == (
        'REFUSED {"error":"limit_exceeded: this run already started 2 sessions (max_spawns 2)"}'
    )
    assert [d.task for d in children(db_engine, refused.session_id)] == ["one", "two"]

    # Nested: c0 → c1 → c2 → c3 with max_spawns 2: c1 and c2 start, c3 is refused.
    chain(db_engine, 3, limits={"max_spawns": 2})
    nested = await run(temporal_env, db_engine, worker, "c0")
    assert nested.response is not None
    assert "limit_exceeded: this run already started 2 sessions (max_spawns 2)" in nested.response
    assert len(delegations_of(db_engine, nested.session_id)) == 3


async def test_max_spawns_holds_for_parallel_delegations(
    temporal_env: WorkflowEnvironment,
    db_engine: Engine,
    worker: Worker,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two parallel delegate_to calls under max_spawns 1: one session starts, the other is
    refused limit_exceeded, even when both checks read the spawn count at the same moment
    (the count and the insert must not be a read-then-write race)."""
    publish(db_engine, "echo", playbook=[{"reply": "{last_message}"}], delegation=ON_ROSTER)
    roster.clear_cache()
    fan = [
        {"tool": "delegate_to", "args": {"agent_id": "echo", "task": f"part {i}"}} for i in range(2)
    ]
    publish(
        db_engine,
        "fanner",
        playbook=[{"when": "^delegate_to: ", "reply": "done"}, {"tool_calls": fan}],
        limits={"max_spawns": 1},
    )
    # Line both checks up right after they read the count (as two busy workers can); a check
    # that holds a per-run lock while counting makes the other wait and the barrier time out.
    barrier = threading.Barrier(2, timeout=2)
    counted = run_tree.run_spawns

    def run_spawns(session: Any, *, root_session_id: str) -> int:
        n = counted(session, root_session_id=root_session_id)
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait()
        return n

    monkeypatch.setattr(run_tree, "run_spawns", run_spawns)
    done = await run(temporal_env, db_engine, worker, "fanner")
    assert done.response == "done"
    results = tool_results(db_engine, done.session_id)
    refused = [r for r in results if r.is_error and r.text.startswith("limit_exceeded: ")]
    assert (len(children(db_engine, done.session_id)), len(refused)) == (1, 1)


BUDGETED = [
    {"when": "limit_exceeded", "reply": "REFUSED {last_message}"},
    {
        "when": "^delegate_to: one",
        "tool_calls": [{"tool": "delegate_to", "args": {"agent_id": "echo", "task": "two"}}],
    },
    {"when": "^delegate_to: two", "reply": "BOTH"},
    {"tool_calls": [{"tool": "delegate_to", "args": {"agent_id": "echo", "task": "one"}}]},
]


async def test_token_budget_refuses_the_next_delegation_at_the_budget(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """limits.token_budget: with the run's tokens one below the budget the second delegation
    is admitted but its child's model call, with no room for its input, is refused; with
    them at the budget the delegation is refused limit_exceeded, and the root's next model
    call is refused too (never a silent cut)."""
    publish(db_engine, "echo", playbook=[{"reply": "{last_message}"}], delegation=ON_ROSTER)
    roster.clear_cache()
    publish(db_engine, "boss", playbook=BUDGETED)
    probe = await run(temporal_env, db_engine, worker, "boss")
    assert probe.response == "BOTH"
    # Tokens used when the second delegation is checked: root calls 1 and 2, and echo's call.
    root_msgs = [m for m in messages(db_engine, probe.session_id) if m.role == "assistant"]
    (first_child, _) = children(db_engine, probe.session_id)
    (echo_msg,) = [
        m for m in messages(db_engine, first_child.child_session_id or "") if m.role == "assistant"
    ]
    at_second = message_tokens(root_msgs[0]) + message_tokens(root_msgs[1])
    at_second += message_tokens(echo_msg)
    assert at_second > 0

    publish(db_engine, "boss", playbook=BUDGETED, limits={"token_budget": at_second + 1})
    # The second delegation is admitted (one token left); its child's call needs more than
    # that for its input alone, so it is refused and nothing spends past the budget.
    with pytest.raises(TurnFailed, match="limit_exceeded"):
        await run(temporal_env, db_engine, worker, "boss")
    (allowed,) = [
        s for s in all_sessions(db_engine) if s.agent_slug == "boss" and s.agent_version == 2
    ]
    edges = children(db_engine, allowed.id)
    assert [d.status for d in edges] == ["completed", "failed"]
    assert edges[1].error and "limit_exceeded" in edges[1].error
    assert run_usage(db_engine, allowed.id) == at_second

    publish(db_engine, "boss", playbook=BUDGETED, limits={"token_budget": at_second})
    with pytest.raises(TurnFailed, match="limit_exceeded"):
        await run(temporal_env, db_engine, worker, "boss")
    (refused_root,) = [
        s for s in all_sessions(db_engine) if s.agent_slug == "boss" and s.agent_version == 3
    ]
    assert len(children(db_engine, refused_root.id)) == 1
    results = tool_results(db_engine, refused_root.id)
    assert results[-1].is_error
    assert results[-1].text == (
        f"limit_exceeded: this run used {at_second} tokens of its token_budget {at_second}"
    )
    last = messages(db_engine, refused_root.id)[-1]
    assert last.role == "error" and "limit_exceeded" in last.text
    assert run_usage(db_engine, refused_root.id) == at_second


async def test_token_budget_stops_a_model_call_inside_the_subtree(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """A member's model call that would start with the run at its token_budget is refused
    limit_exceeded; the failure comes back to the delegating agent as its tool error."""
    publish(
        db_engine,
        "counter",
        tools=["word_count"],
        playbook=[
            {"when": "^word_count: ", "reply": "counted {last_message}"},
            {"tool_calls": [{"tool": "word_count", "args": {"text": "a b c"}}]},
        ],
        delegation=ON_ROSTER,
    )
    roster.clear_cache()
    publish(db_engine, "boss", playbook=delegating("counter", "count"))
    probe = await run(temporal_env, db_engine, worker, "boss")
    assert probe.response == "<counted 3>"
    (edge,) = children(db_engine, probe.session_id)
    root_first = next(m for m in messages(db_engine, probe.session_id) if m.role == "assistant")
    counter_first = next(
        m for m in messages(db_engine, edge.child_session_id or "") if m.role == "assistant"
    )
    # When counter's second model call is checked: root's first call and counter's first.
    before_second = message_tokens(root_first) + message_tokens(counter_first)

    publish(
        db_engine,
        "boss",
        playbook=delegating("counter", "count"),
        limits={"token_budget": before_second},
    )
    with pytest.raises(TurnFailed, match="limit_exceeded"):
        await run(temporal_env, db_engine, worker, "boss")
    root = next(
        s for s in all_sessions(db_engine) if s.agent_slug == "boss" and s.agent_version == 2
    )
    (edge,) = children(db_engine, root.id)
    child_msgs = messages(db_engine, edge.child_session_id or "")
    assert [m.role for m in child_msgs] == ["user", "assistant", "tool", "error"]
    assert child_msgs[-1].text.startswith("limit_exceeded: this run used")
    (result,) = tool_results(db_engine, root.id)
    assert result.is_error and "limit_exceeded" in result.text
    assert edge.status == "failed" and edge.error and "limit_exceeded" in edge.error


# --- subagent trees (Xema Agent Concepts) ---------------------------------------------------------


async def test_task_runs_a_subagent_with_node_overrides(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker, calls: list[Call]
) -> None:
    """task(alias, prompt) runs the node's agent with its node-local instructions, model
    override and narrowed tools; a tool outside the narrowing is refused inside the child."""
    publish(
        db_engine,
        "helper",
        system_prompt="HELPER BASE",
        model="openai:gpt-4o-mini",
        tools=["calculator", "word_count"],
        playbook=[
            {"when": "^calculator: ", "reply": "calc said {last_message}"},
            {"tool_calls": [{"tool": "calculator", "args": {"expression": "1+1"}}]},
        ],
    )
    publish(
        db_engine,
        "planner",
        playbook=delegating("sums", "add things", tool="task"),
        subagents=[
            {
                "alias": "sums",
                "agent": "helper",
                "instructions": "NODE INSTRUCTIONS",
                "model": "scripted",
                "allowed_tools": ["word_count"],
            }
        ],
    )
    done = await run(temporal_env, db_engine, worker, "planner")
    assert done.response is not None and done.response.startswith("<calc said ")
    assert "not available" in done.response
    (edge,) = children(db_engine, done.session_id)
    assert (edge.kind, edge.alias, edge.target_agent_slug) == ("task", "sums", "helper")
    with session_scope(db_engine) as s:
        child = session_store.get_session(s, session_id=edge.child_session_id or "")
    assert child.agent_slug == "helper" and child.depth == 1
    resolved = child.resolved_agent or {}
    assert "NODE INSTRUCTIONS" in resolved["system_prompt"]
    assert resolved["model"] == "scripted"
    assert resolved["tools"] == ["word_count"]
    (calc,) = tool_results(db_engine, child.id)
    assert calc.is_error and "not available" in calc.text
    helper_call = next(c for c in calls if c.agent == "helper")
    assert "NODE INSTRUCTIONS" in helper_call.system
    assert "word_count" in helper_call.tools and "calculator" not in helper_call.tools
    planner_call = next(c for c in calls if c.agent == "planner")
    assert planner_call.tools["task"].parameters_json_schema["properties"]["alias"]["enum"] == [
        "sums"
    ]


async def test_task_with_an_unknown_alias_is_a_tool_error(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker, calls: list[Call]
) -> None:
    """task with an alias not among the subagents is unknown_subagent, no session starts; an
    agent without subagents is not offered task at all."""
    publish(db_engine, "helper", playbook=[{"reply": "HELPED"}])
    publish(
        db_engine,
        "planner",
        playbook=delegating("ghost", tool="task"),
        subagents=[{"alias": "sums", "agent": "helper"}],
    )
    done = await run(temporal_env, db_engine, worker, "planner")
    (result,) = tool_results(db_engine, done.session_id)
    assert result.is_error and result.text.startswith("unknown_subagent: ")
    assert "sums" in result.text
    assert len(all_sessions(db_engine)) == 1
    await run(temporal_env, db_engine, worker, "helper")
    assert "task" not in calls[-1].tools


async def test_self_recursive_subagent_tree_stops_at_the_runtime_ceiling(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """An agent whose subagent is (the live revision of) itself keeps delegating to a copy of
    itself: the runtime depth ceiling (default 8) refuses depth 9 before the child starts,
    so the run has exactly 9 sessions and the refusal reaches the agent as limit_exceeded."""
    publish(db_engine, "rec", playbook=[{"reply": "base"}])
    publish(
        db_engine,
        "rec",
        playbook=delegating("again", "deeper", tool="task"),
        subagents=[{"alias": "again", "agent": "rec"}],
    )
    assert SessionConfig().runtime_depth_ceiling == 8
    # Nine nested delegations heartbeat at once: STEADY_CONFIG, so that load never
    # retries one (a retry would add model calls); the suite's timeout bounds a hang.
    config = STEADY_CONFIG.model_copy(update={"runtime_depth_ceiling": 8})
    done = await run(temporal_env, db_engine, worker, "rec", config=config)
    assert done.response is not None
    assert "limit_exceeded: nesting depth 9 exceeds the runtime ceiling 8" in done.response
    every = all_sessions(db_engine)
    assert len(every) == 9
    assert sorted(s.depth for s in every) == list(range(9))
    assert model_calls(db_engine) == 18


async def test_subagent_tree_bounded_by_a_lower_ceiling_and_max_depth(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """runtime_depth_ceiling=2 gives 3 sessions; the root's limits.max_depth=1 gives 2."""
    publish(db_engine, "rec", playbook=[{"reply": "base"}])
    publish(
        db_engine,
        "rec",
        playbook=delegating("again", "deeper", tool="task"),
        subagents=[{"alias": "again", "agent": "rec"}],
    )
    config = STEADY_CONFIG.model_copy(update={"runtime_depth_ceiling": 2})
    low = await run(temporal_env, db_engine, worker, "rec", config=config)
    assert low.response is not None and "exceeds the runtime ceiling 2" in low.response
    assert len(delegations_of(db_engine, low.session_id)) == 3

    publish(
        db_engine,
        "rec",
        playbook=delegating("again", "deeper", tool="task"),
        subagents=[{"alias": "again", "agent": "rec"}],
        limits={"max_depth": 1},
    )
    limited = await run(temporal_env, db_engine, worker, "rec")
    assert limited.response is not None and "exceeds max_depth 1" in limited.response
    assert len(delegations_of(db_engine, limited.session_id)) == 2


# --- tool isolation, events and attribution -------------------------------------------------


async def test_tool_isolation_events_and_attribution_inside_a_team_run(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """Members' allowed_tools/blocked_tools hold inside delegations; their tool calls and
    results reach the root as delegation_tool_call / delegation_tool_result; every message is
    attributed to the agent that wrote it."""
    make_team(
        db_engine,
        lead=[
            {"when": "^delegate_to: ", "reply": "SYNTH {last_message}"},
            {
                "tool_calls": [
                    {"tool": "delegate_to", "args": {"agent_id": "counter", "task": "count"}},
                    {"tool": "delegate_to", "args": {"agent_id": "blocked", "task": "add"}},
                    {"tool": "delegate_to", "args": {"agent_id": "narrow", "task": "add"}},
                ],
            },
        ],
        members={
            "counter": [
                {"when": "^word_count: ", "reply": "words {last_message}"},
                {"tool_calls": [{"tool": "word_count", "args": {"text": "one two"}}]},
            ],
            "blocked": [
                {"when": "^calculator: ", "reply": "calc {last_message}"},
                {"tool_calls": [{"tool": "calculator", "args": {"expression": "2+2"}}]},
            ],
            "narrow": [
                {"when": "^calculator: ", "reply": "calc {last_message}"},
                {"tool_calls": [{"tool": "calculator", "args": {"expression": "2+2"}}]},
            ],
        },
        member_spec={
            "counter": {"tools": ["word_count"]},
            "blocked": {"tools": ["calculator"], "blocked_tools": ["calculator"]},
            "narrow": {"tools": ["calculator", "word_count"], "allowed_tools": ["word_count"]},
        },
    )
    done = await team_run(temporal_env, db_engine, worker, "go")
    assert done.response is not None
    by_agent = {d.target_agent_slug: d for d in children(db_engine, done.session_id)}
    counted = tool_results(db_engine, by_agent["counter"].child_session_id or "")
    assert [(m.text, m.is_error) for m in counted] == [("2", False)]
    for slug in ("blocked", "narrow"):
        (refused,) = tool_results(db_engine, by_agent[slug].child_session_id or "")
        assert (
            refused.is_error and refused.text == "tool 'calculator' is not available to this agent"
        )

    root_events = events(db_engine, done.session_id)
    tool_calls = [d for k, d in root_events if k == "delegation_tool_call"]
    tool_done = [d for k, d in root_events if k == "delegation_tool_result"]
    counter_call = next(d for d in tool_calls if d["target_agent_id"] == "counter")
    assert counter_call["tool"] == "word_count"
    assert counter_call["arguments"] == {"text": "one two"}
    assert counter_call["delegation_id"] == by_agent["counter"].id and counter_call["tool_call_id"]
    counter_done = next(d for d in tool_done if d["target_agent_id"] == "counter")
    assert counter_done["success"] is True and counter_done["content"] == "2"
    assert counter_done["tool"] == "word_count" and isinstance(counter_done["duration_ms"], int)
    blocked_done = next(d for d in tool_done if d["target_agent_id"] == "blocked")
    assert blocked_done["success"] is False and "not available" in blocked_done["content"]
    # The lead's own delegate_to results are not forwarded as delegation events of itself.
    assert all(d["target_agent_id"] != "lead" for d in tool_calls + tool_done)

    for session in all_sessions(db_engine):
        authors = {m.agent_slug for m in messages(db_engine, session.id)}
        assert authors == {session.agent_slug}, (session.agent_slug, authors)


async def test_blocked_delegate_to_removes_delegation(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker, calls: list[Call]
) -> None:
    """blocked_tools [delegate_to]: the tool is not offered and a call to it is refused, even
    with a roster; blocked_tools [task] does the same for subagents."""
    publish(db_engine, "helper", playbook=[{"reply": "HELPED"}], delegation=ON_ROSTER)
    roster.clear_cache()
    publish(
        db_engine,
        "loner",
        playbook=delegating("helper"),
        blocked_tools=["delegate_to"],
    )
    done = await run(temporal_env, db_engine, worker, "loner")
    assert "delegate_to" not in calls[-1].tools
    assert "Teammates" not in calls[-1].system
    (result,) = tool_results(db_engine, done.session_id)
    assert result.is_error and "not available" in result.text
    assert children(db_engine, done.session_id) == []

    publish(
        db_engine,
        "planner",
        playbook=delegating("sub", tool="task"),
        subagents=[{"alias": "sub", "agent": "helper"}],
        blocked_tools=["task"],
    )
    planned = await run(temporal_env, db_engine, worker, "planner")
    assert "task" not in calls[-1].tools
    (result,) = tool_results(db_engine, planned.session_id)
    assert result.is_error and "not available" in result.text
    assert children(db_engine, planned.session_id) == []


# --- cancel cascade ---------------------------------------------------------------------------

SLOW = [{"reply": "w " * 80, "chunk_delay_ms": 100}]


def status_of(engine: Engine, session_id: str) -> str:
    with session_scope(engine) as s:
        return session_store.get_session(s, session_id=session_id).status


async def workflow_end(
    env: WorkflowEnvironment, session_id: str, timeout: float = 20.0
) -> WorkflowExecutionStatus | None:
    """The workflow's status once it is no longer running."""
    handle = env.client.get_workflow_handle(session_id)
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        state = (await handle.describe()).status
        if state != WorkflowExecutionStatus.RUNNING or asyncio.get_running_loop().time() > deadline:
            return state
        await asyncio.sleep(0.05)


def chunks(engine: Engine, session_id: str) -> int:
    return sum(k == "chunk" for k, _ in events(engine, session_id))


async def test_cancel_cascades_two_levels_down(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker, calls: list[Call]
) -> None:
    """Cancelling the root while its grandchild streams cancels root, child and grandchild;
    no model call starts after the cancel, nothing more is written, and cancelling again is
    harmless."""
    publish(db_engine, "leaf", playbook=SLOW)
    mid_tree = [{"alias": "leaf", "agent": "leaf"}]
    publish(db_engine, "mid", playbook=delegating("leaf", tool="task"), subagents=mid_tree)
    top_tree = [{"alias": "mid", "agent": "mid"}]
    publish(db_engine, "top", playbook=delegating("mid", tool="task"), subagents=top_tree)
    root = await run(temporal_env, db_engine, worker, "top", sync=False)

    def leaf_streaming() -> bool:
        leafs = [s for s in all_sessions(db_engine) if s.agent_slug == "leaf"]
        return bool(leafs) and chunks(db_engine, leafs[0].id) > 0

    await wait_for(leaf_streaming, 20)
    started = len(calls)
    assert [c.agent for c in calls] == ["top", "mid", "leaf"]
    await launch.cancel_session(temporal_env.client, db_engine, session_id=root.session_id)
    ids = {s.agent_slug: s.id for s in all_sessions(db_engine)}
    assert set(ids) == {"top", "mid", "leaf"}
    await wait_for(lambda: all(status_of(db_engine, i) == "cancelled" for i in ids.values()), 30)
    for sid in ids.values():
        assert await workflow_end(temporal_env, sid) == WorkflowExecutionStatus.CANCELED

    written = {sid: len(messages(db_engine, sid)) for sid in ids.values()}
    leaf_chunks = chunks(db_engine, ids["leaf"])
    await asyncio.sleep(1.5)
    assert len(calls) == started
    assert {sid: len(messages(db_engine, sid)) for sid in ids.values()} == written
    assert chunks(db_engine, ids["leaf"]) == leaf_chunks
    assert not [m for m in messages(db_engine, ids["leaf"]) if m.role == "assistant"]

    for _ in range(2):
        await launch.cancel_session(temporal_env.client, db_engine, session_id=root.session_id)
        await launch.cancel_session(temporal_env.client, db_engine, session_id=ids["mid"])
    assert {status_of(db_engine, i) for i in ids.values()} == {"cancelled"}
    assert not rows(db_engine, MessageRow, MessageRow.role == "error")


async def test_cancel_reaches_an_async_invoked_child(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """An async invoke_agent child still running when its caller's session is cancelled is
    cancelled too."""
    publish(db_engine, "slowpoke", playbook=SLOW)
    publish(
        db_engine,
        "boss",
        playbook=[
            {"when": "^invoke_agent: ", "reply": "{last_message}"},
            {
                "tool_calls": [
                    {
                        "tool": "invoke_agent",
                        "args": {"slug": "slowpoke", "prompt": "work", "sync": False},
                    }
                ]
            },
        ],
    )
    with session_scope(db_engine) as s:
        policies.save_policy(
            s, caller="boss", operation="invoke", target="slowpoke", decision="allow"
        )
    done = await launch_agent(temporal_env.client, db_engine, worker, "boss", "go")
    result = json.loads(done.response or "{}")
    assert result["status"] == "running"
    child = result["session_id"]
    await wait_for(lambda: chunks(db_engine, child) > 0, 20)
    assert status_of(db_engine, done.session_id) == "idle"
    await launch.cancel_session(temporal_env.client, db_engine, session_id=done.session_id)
    await wait_for(lambda: status_of(db_engine, child) == "cancelled", 30)
    assert status_of(db_engine, done.session_id) == "cancelled"
    assert await workflow_end(temporal_env, child) == WorkflowExecutionStatus.CANCELED
    count = len(messages(db_engine, child))
    await asyncio.sleep(1.0)
    assert len(messages(db_engine, child)) == count
    assert not [m for m in messages(db_engine, child) if m.role == "assistant"]


@pytest.mark.parametrize("streaming_s", [0.0, 3.5])
async def test_cancelled_caller_gets_no_late_tool_result(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker, streaming_s: float
) -> None:
    """Once a session is cancelled mid-delegation nothing more lands in its transcript (no
    late delegate_to error), and the cut delegation is recorded as cancelled, not failed,
    also when the cancel reaches the delegate activity through a heartbeat (3.5 s in)."""
    publish(db_engine, "leaf", playbook=SLOW, delegation=ON_ROSTER)
    publish(db_engine, "top", playbook=delegating("leaf"))
    roster.clear_cache()
    root = await run(temporal_env, db_engine, worker, "top", sync=False)

    def leaf_streaming() -> bool:
        leafs = [s for s in all_sessions(db_engine) if s.agent_slug == "leaf"]
        return bool(leafs) and chunks(db_engine, leafs[0].id) > 0

    await wait_for(leaf_streaming, 20)
    await asyncio.sleep(streaming_s)
    await launch.cancel_session(temporal_env.client, db_engine, session_id=root.session_id)
    assert await workflow_end(temporal_env, root.session_id) == WorkflowExecutionStatus.CANCELED
    (edge,) = children(db_engine, root.session_id)
    await wait_for(lambda: status_of(db_engine, edge.child_session_id or "") == "cancelled", 20)
    await asyncio.sleep(1.0)  # let a delegate activity still in flight finish (or not)

    log = events(db_engine, root.session_id)
    cut = next(i for i, (k, d) in enumerate(log) if k == "status" and d["status"] == "cancelled")
    late = [k for k, _ in log[cut + 1 :] if k == "message"]
    assert late == [], f"messages written after the cancel: {log[cut + 1 :]}"
    assert [m.role for m in messages(db_engine, root.session_id)] == ["user", "assistant"]
    (edge,) = children(db_engine, root.session_id)
    assert edge.status == "cancelled", (edge.status, edge.error)


async def test_delegated_sessions_do_not_route_mentions(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """An @mention inside a delegated task is plain text: a team member never re-delegates
    through it, and an ad-hoc delegate cannot reach an agent off the roster with it."""
    make_team(
        db_engine,
        lead=[
            {"when": "^delegate_to: ", "reply": "SYNTH {last_message}"},
            {
                "tool_calls": [
                    {
                        "tool": "delegate_to",
                        "args": {"agent_id": "writer", "task": "ask @checker and @hermit"},
                    }
                ]
            },
        ],
        members={"writer": [{"reply": "WRITTEN"}], "checker": [{"reply": "CHECKED"}]},
    )
    publish(db_engine, "hermit", playbook=[{"reply": "HERMIT"}])
    done = await team_run(temporal_env, db_engine, worker, "go")
    assert done.response == "SYNTH WRITTEN"
    edges = rows(db_engine, DelegationRow)
    assert [(d.kind, d.caller_agent_slug, d.target_agent_slug) for d in edges] == [
        ("delegate_to", "lead", "writer")
    ]

    publish(db_engine, "helper", playbook=[{"reply": "HELPED"}], delegation=ON_ROSTER)
    roster.clear_cache()
    publish(db_engine, "host", playbook=delegating("helper", "loop in @hermit please"))
    adhoc = await run(temporal_env, db_engine, worker, "host")
    assert adhoc.response == "<HELPED>"
    assert "hermit" not in {s.agent_slug for s in all_sessions(db_engine)}
