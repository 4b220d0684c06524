"""Teams and delegation at their edges: argument depth and blank tasks, a team run across
continue-as-new, run-tree edges without a session, continued sessions outside the run,
the run's session cap, the ACL on a delegation's target, one team per shared channel."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError
from pydantic_ai.messages import ToolCallPart
from sqlalchemy.engine import Engine
from sqlmodel import select
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.delegate import DelegationActivities, Refused
from activities.turns import MAX_ARG_DEPTH, _tool_call
from baton.agents import teams
from baton.contracts.activity_io import DelegateInput, ToolMessage
from baton.contracts.tool_args import DelegateToArgs
from baton.contracts.values import ToolCall
from baton.contracts.workflow_io import Provenance
from baton.runs import run_tree, session_store
from baton.storage.db import DelegationRow, session_scope
from tests.helpers import TEST_CONFIG, launch, publish
from tests.test_teams import make_team, team_run
from tests.xagent_helpers import caller_playbook, set_policy


def test_arguments_nested_past_the_limit_are_not_carried_to_the_workflow() -> None:
    """Tool-call args deeper than MAX_ARG_DEPTH become an error marker (ok at the bound)."""

    def nested(levels: int) -> dict[str, object]:
        value: object = 1
        for _ in range(levels - 1):
            value = [value]
        return {"z": value}

    ok = _tool_call(ToolCallPart("calculator", nested(MAX_ARG_DEPTH), tool_call_id="a"))
    assert "z" in ok.args
    deep = _tool_call(ToolCallPart("calculator", nested(MAX_ARG_DEPTH + 1), tool_call_id="b"))
    assert list(deep.args) == ["_unparsed_arguments"]


def test_blank_delegation_tasks_are_bad_arguments() -> None:
    """delegate_to with a whitespace-only task is refused before any child starts."""
    with pytest.raises(ValidationError):
        DelegateToArgs.model_validate({"agent_id": "a", "task": " \n\t "})
    assert DelegateToArgs.model_validate({"agent_id": "a", "task": " x "}).task == " x "


async def test_a_team_run_stays_a_team_run_across_continue_as_new(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """After continue-as-new the lead still has its team: the next turn fans out again."""
    make_team(db_engine)
    config = TEST_CONFIG.model_copy(update={"continue_as_new_after_turns": 1})
    run = await team_run(temporal_env, db_engine, worker, "go", config=config)
    assert run.response is not None and "CHECKED" in run.response
    from baton.runs import launch as launching

    _, text = await launching.send_message(
        temporal_env.client, db_engine, session_id=run.session_id, prompt="go", sync=True
    )
    assert text is not None and "CHECKED" in text and "WRITTEN" in text


def test_an_edge_without_a_session_is_skipped_by_trace_and_cascade(db_engine: Engine) -> None:
    """A delegation whose child never started (launch failed) breaks neither trace nor cancel."""
    with session_scope(db_engine) as s:
        from baton.storage.db import Agent

        s.add(Agent(slug="a", name="A"))
        session_store.create_session(
            s,
            session_id="session-00000000-0000-0000-0000-000000000001",
            agent_slug="a",
            agent_version=1,
            provenance=Provenance(),
            name="root",
        )
        s.add(
            DelegationRow(
                id="d1",
                root_session_id="session-00000000-0000-0000-0000-000000000001",
                parent_session_id="session-00000000-0000-0000-0000-000000000001",
                child_session_id="session-00000000-0000-0000-0000-00000000dead",
                kind="delegate_to",
                caller_agent_slug="a",
                target_agent_slug="gone",
            )
        )
    with session_scope(db_engine) as s:
        tree = run_tree.trace(s, session_id="session-00000000-0000-0000-0000-000000000001")
    assert tree.children == []
    acts = DelegationActivities(db_engine, client=None)  # type: ignore[arg-type]
    root = "session-00000000-0000-0000-0000-000000000001"
    assert asyncio.run(acts.cancel_delegations(root)) == []


async def test_continuing_a_session_does_not_pull_it_into_the_run(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """invoke_agent with session_id records no tree edge: limits, trace and cancel stay apart."""
    publish(db_engine, "target", playbook=[{"reply": "hi"}])
    own = await launch(temporal_env.client, db_engine, worker, "target", "mine")
    args = {"slug": "target", "prompt": "more", "session_id": own.session_id, "sync": True}
    publish(db_engine, "caller", playbook=caller_playbook("invoke_agent", args))
    set_policy(db_engine, "invoke", "allow")
    run = await launch(temporal_env.client, db_engine, worker, "caller", "go")
    assert "hi" in (run.response or "")
    with session_scope(db_engine) as s:
        (edge,) = s.exec(select(DelegationRow)).all()
        assert edge.child_session_id is None
        assert run_tree.descendants(s, session_id=run.session_id) == []


async def test_a_run_starts_at_most_max_run_sessions(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """With max_run_sessions 2, two delegations start and the third is limit_exceeded."""
    for slug in ("m1", "m2", "m3"):
        publish(
            db_engine,
            slug,
            playbook=[{"reply": slug}],
            delegation={"available_for_delegation": True},
        )
    calls = [
        {"tool": "delegate_to", "args": {"agent_id": s, "task": "t"}} for s in ("m1", "m2", "m3")
    ]
    publish(
        db_engine,
        "boss",
        playbook=[
            {"when": "^delegate_to: ", "reply": "{last_message}"},
            {"when": "go", "tool_calls": calls},
        ],
    )
    from baton.agents import roster

    roster.clear_cache()
    config = TEST_CONFIG.model_copy(update={"max_run_sessions": 2})
    run = await launch(temporal_env.client, db_engine, worker, "boss", "go", config=config)
    assert (run.response or "").count("limit_exceeded") == 1
    with session_scope(db_engine) as s:
        assert run_tree.run_spawns(s, root_session_id=run.session_id) == 2


def test_a_delegation_in_auth_mode_needs_the_user_role_on_its_target(db_engine: Engine) -> None:
    """_plan refuses (access_denied) a delegate_to whose target the session user cannot run."""
    publish(db_engine, "boss", playbook=[])
    publish(db_engine, "secret", playbook=[], delegation={"available_for_delegation": True})
    from baton.agents import roster
    from baton.grants import auth

    roster.clear_cache()
    with session_scope(db_engine) as s:
        auth.create_user(s, user_id="bob")
        session_store.create_session(
            s,
            session_id="session-00000000-0000-0000-0000-000000000002",
            agent_slug="boss",
            agent_version=1,
            provenance=Provenance(created_by_user="bob"),
            name="x",
        )
    tool = ToolMessage(
        session_id="session-00000000-0000-0000-0000-000000000002",
        agent_slug="boss",
        message_id="m",
        position="000001.001.2000",
        call=ToolCall(id="c", name="delegate_to", args={}),
    )
    inp = DelegateInput(
        tool=tool,
        delegation_id="d",
        caller_session_id=tool.session_id,
        user="bob",
        target="secret",
        prompt="t",
        task_queue="q",
        config=TEST_CONFIG.model_copy(update={"auth": True}),
        kind="delegate_to",
    )
    acts = DelegationActivities(db_engine, client=None)  # type: ignore[arg-type]
    with pytest.raises(Refused, match="access_denied"):
        acts._plan(inp)
    with session_scope(db_engine) as s:
        auth.grant(s, agent="secret", user_id="bob", role="user")
    assert acts._plan(inp).target == "secret"


def test_a_shared_channel_belongs_to_one_team(db_engine: Engine) -> None:
    """A second team naming another team's channel is refused (invalid_team)."""
    make_team(db_engine)
    other = teams.TeamIn.model_validate(
        {
            "id": "copycat",
            "name": "Copycat",
            "supervisor_agent_id": "lead",
            "members": [{"agent_id": "lead", "role": "supervisor"}],
            "shared_channel": "_team_desk",
        }
    )
    with session_scope(db_engine) as s, pytest.raises(teams.InvalidTeam):
        teams.create_team(s, team=other)
