"""Every path by which one agent makes another run obeys one decision.

The paths: invoke_agent, delegate_to from the roster, delegate_to from a team lead, a team
route, an @mention and a subagent ``task``. For each, a stored ``invoke: block`` from the
caller to the target refuses the call (audited with ``via``), a global block with no
per-target allow refuses it too, and a per-target allow under a global block lets it run.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import select
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from baton.agents import roster, teams
from baton.runs.launch import Launched
from baton.storage.db import AuditRow, ReviewRow, SessionRow, session_scope
from tests.helpers import launch, publish
from tests.test_teams import team_run
from tests.xagent_helpers import set_policy

RESULT = [{"when": "^(delegate_to|task|invoke_agent): ", "reply": "RESULT {last_message}"}]


@dataclass
class Path:
    """How ``caller`` reaches ``target`` by one path, and how to start that run."""

    via: str
    caller: str
    setup: Callable[[Engine], None]
    start: Callable[[WorkflowEnvironment, Engine, Worker], Awaitable[Launched]]


def _calls(tool: str, args: dict[str, Any]) -> list[dict[str, Any]]:
    return [*RESULT, {"reply": "Calling.", "tool_calls": [{"tool": tool, "args": args}]}]


def _target(engine: Engine, **spec: Any) -> None:
    publish(engine, "target", playbook=[{"reply": "TARGET RAN"}], **spec)


def _team(engine: Engine, routes: list[dict[str, str]]) -> None:
    with session_scope(engine) as s:
        teams.create_team(
            s,
            team=teams.TeamIn.model_validate(
                {
                    "id": "desk",
                    "name": "Desk",
                    "supervisor_agent_id": "caller",
                    "members": [
                        {"agent_id": "caller", "role": "supervisor"},
                        {"agent_id": "target"},
                    ],
                    "routes": routes,
                }
            ),
        )


def _invoke(engine: Engine) -> None:
    _target(engine)
    args = {"slug": "target", "prompt": "hi", "sync": True}
    publish(engine, "caller", playbook=_calls("invoke_agent", args))


def _roster(engine: Engine) -> None:
    _target(engine, delegation={"available_for_delegation": True})
    roster.clear_cache()
    args = {"agent_id": "target", "task": "hi"}
    publish(engine, "caller", playbook=_calls("delegate_to", args))


def _lead(engine: Engine) -> None:
    _target(engine)
    args = {"agent_id": "target", "task": "hi"}
    publish(engine, "caller", playbook=_calls("delegate_to", args))
    _team(engine, routes=[])


def _route(engine: Engine) -> None:
    _target(engine)
    publish(engine, "caller", playbook=RESULT)
    _team(engine, routes=[{"when": "^check:", "to": "target"}])


def _mention(engine: Engine) -> None:
    _target(engine)
    publish(engine, "caller", playbook=RESULT)


def _task(engine: Engine) -> None:
    _target(engine)
    tree = [{"alias": "helper", "agent": "target"}]
    publish(
        engine,
        "caller",
        playbook=_calls("task", {"alias": "helper", "prompt": "hi"}),
        subagents=tree,
    )


def _solo(prompt: str) -> Callable[[WorkflowEnvironment, Engine, Worker], Awaitable[Launched]]:
    async def start(env: WorkflowEnvironment, engine: Engine, worker: Worker) -> Launched:
        return await launch(env.client, engine, worker, "caller", prompt)

    return start


def _team_run(prompt: str) -> Callable[[WorkflowEnvironment, Engine, Worker], Awaitable[Launched]]:
    async def start(env: WorkflowEnvironment, engine: Engine, worker: Worker) -> Launched:
        return await team_run(env, engine, worker, prompt)

    return start


PATHS = [
    Path("invoke", "caller", _invoke, _solo("go")),
    Path("delegate_to", "caller", _roster, _solo("go")),
    Path("delegate_to", "caller", _lead, _team_run("go")),
    Path("route", "caller", _route, _team_run("check: this")),
    Path("mention", "caller", _mention, _solo("@target check this")),
    Path("task", "caller", _task, _solo("go")),
]
IDS = ["invoke", "roster-delegate_to", "lead-delegate_to", "route", "mention", "task"]


def target_sessions(engine: Engine) -> list[SessionRow]:
    with session_scope(engine) as s:
        return list(s.exec(select(SessionRow).where(SessionRow.agent_slug == "target")).all())


def audit(engine: Engine) -> list[tuple[str, str | None, str, str, str | None]]:
    with session_scope(engine) as s:
        rows = s.exec(select(AuditRow).order_by(AuditRow.id)).all()  # type: ignore[arg-type]
        return [
            (r.caller_agent_slug, r.target_agent_slug, r.outcome, r.decided_by, r.via) for r in rows
        ]


@pytest.mark.parametrize("path", PATHS, ids=IDS)
async def test_a_per_target_block_refuses_every_path(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker, path: Path
) -> None:
    """A stored per-target invoke block refuses the path: blocked_by_policy, audited with via,
    and the target never runs."""
    path.setup(db_engine)
    set_policy(db_engine, "invoke", "block", target="target")
    run = await path.start(temporal_env, db_engine, worker)
    assert run.response is not None and "blocked_by_policy: caller may not invoke" in run.response
    assert target_sessions(db_engine) == []
    assert audit(db_engine) == [("caller", "target", "block", "policy", path.via)]


@pytest.mark.parametrize("path", PATHS, ids=IDS)
async def test_a_global_block_without_a_per_target_allow_refuses_every_path(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker, path: Path
) -> None:
    """A global invoke block (no per-target row) refuses the path as well."""
    path.setup(db_engine)
    set_policy(db_engine, "invoke", "block")
    run = await path.start(temporal_env, db_engine, worker)
    assert run.response is not None and "blocked_by_policy" in run.response
    assert target_sessions(db_engine) == []


@pytest.mark.parametrize("path", PATHS, ids=IDS)
async def test_a_per_target_allow_under_a_global_block_lets_every_path_run(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker, path: Path
) -> None:
    """Precedence is the same on every path: the per-target allow beats the global block."""
    path.setup(db_engine)
    set_policy(db_engine, "invoke", "block")
    set_policy(db_engine, "invoke", "allow", target="target")
    run = await path.start(temporal_env, db_engine, worker)
    assert run.response is not None and "TARGET RAN" in run.response
    assert len(target_sessions(db_engine)) == 1
    assert audit(db_engine) == []


@pytest.mark.parametrize("path", PATHS[1:], ids=IDS[1:])
async def test_membership_roster_mention_and_tree_are_the_humans_allow(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker, path: Path
) -> None:
    """With no policy stored, every path but invoke_agent runs without a review."""
    path.setup(db_engine)
    run = await path.start(temporal_env, db_engine, worker)
    assert run.response is not None and "TARGET RAN" in run.response
    with session_scope(db_engine) as s:
        assert s.exec(select(ReviewRow)).all() == []


async def test_a_turn_another_agent_sent_cannot_delegate(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """One hop follows the turn: a user's session of ``middle`` may delegate_to, but a turn
    that ``caller`` sends into that same session (invoke_agent with session_id) cannot."""
    _target(db_engine, delegation={"available_for_delegation": True})
    roster.clear_cache()
    delegate = {"agent_id": "target", "task": "hi"}
    publish(db_engine, "middle", playbook=_calls("delegate_to", delegate))
    own = await launch(temporal_env.client, db_engine, worker, "middle", "go")
    assert own.response is not None and "TARGET RAN" in own.response
    invoke = {"slug": "middle", "prompt": "go", "session_id": own.session_id, "sync": True}
    publish(db_engine, "caller", playbook=_calls("invoke_agent", invoke))
    set_policy(db_engine, "invoke", "allow", target="middle")
    run = await launch(temporal_env.client, db_engine, worker, "caller", "go")
    assert run.response is not None and "one_hop_violation" in run.response
    assert len(target_sessions(db_engine)) == 1
    assert audit(db_engine) == [("middle", "target", "block", "guard", "delegate_to")]


async def test_an_invoked_turn_routes_no_mention(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """An @mention in a prompt another agent wrote is plain text: it reaches no third agent."""
    _target(db_engine)
    publish(db_engine, "middle", playbook=[{"reply": "MIDDLE {last_message}"}])
    invoke = {"slug": "middle", "prompt": "@target do it", "sync": True}
    publish(db_engine, "caller", playbook=_calls("invoke_agent", invoke))
    set_policy(db_engine, "invoke", "allow", target="middle")
    run = await launch(temporal_env.client, db_engine, worker, "caller", "go")
    assert run.response is not None and "MIDDLE @target do it" in run.response
    assert target_sessions(db_engine) == []
