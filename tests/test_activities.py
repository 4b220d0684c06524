"""Session activities in isolation (temporalio's ActivityEnvironment), on a SQLite file."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.engine import Engine
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.turns import SessionActivities
from baton.agents import registry
from baton.contracts.activity_io import LoadAgentInput, ModelTurnInput, ToolInput
from baton.contracts.values import ToolCall
from baton.contracts.workflow_io import Provenance
from baton.runs import session_store
from baton.storage.db import session_scope
from tests.helpers import publish, transcript


def new_session(engine: Engine, slug: str, version: int = 1) -> str:
    with session_scope(engine) as s:
        session_store.create_session(
            s,
            session_id="session-test",
            agent_slug=slug,
            agent_version=version,
            provenance=Provenance(),
            name="test",
        )
    return "session-test"


def turn_input(session_id: str, step: int = 1) -> ModelTurnInput:
    return ModelTurnInput(
        session_id=session_id,
        agent_slug="echo",
        turn=1,
        step=step,
        assistant_message_id=f"{session_id}:t1:s{step}:assistant",
        position=f"000001.00{step}.1000",
        user_message_id=f"{session_id}:t1:user" if step == 1 else None,
        user_text="hello" if step == 1 else None,
        user_position="000001.000.0000",
    )


def loaded_session(
    engine: Engine, playbook: list[dict[str, Any]]
) -> tuple[SessionActivities, ActivityEnvironment, str]:
    """Agent ``echo`` published with ``playbook`` and a session of it whose agent is
    loaded: the activities, their environment and the session id."""
    publish(engine, "echo", playbook=playbook)
    sid = new_session(engine, "echo")
    acts = SessionActivities(engine)
    env = ActivityEnvironment()
    env.run(acts.load_agent, LoadAgentInput(session_id=sid, agent_pin="echo@1"))
    return acts, env, sid


async def test_retried_model_turn_never_duplicates_or_recalls(db_engine: Engine) -> None:
    """Running model_turn twice with the same ids stores one reply and returns it again."""
    acts, env, sid = loaded_session(db_engine, [{"reply": "hi back"}])
    first = await env.run(acts.model_turn, turn_input(sid))
    publish(db_engine, "echo", playbook=[{"reply": "a different reply"}])  # must not matter
    again = await env.run(acts.model_turn, turn_input(sid))
    assert first == again and first.preview == "hi back" and first.preview_is_full
    assert transcript(db_engine, sid) == [("user", "hello"), ("assistant", "hi back")]


def test_load_agent_of_a_retired_pin_is_non_retryable(db_engine: Engine) -> None:
    """A pin that no longer resolves fails load_agent as agent_unavailable, not retryable."""
    publish(db_engine, "echo", playbook=[])
    sid = new_session(db_engine, "echo")
    with session_scope(db_engine) as s:
        registry.retire(s, slug="echo")
    env = ActivityEnvironment()
    with pytest.raises(ApplicationError) as info:
        env.run(
            SessionActivities(db_engine).load_agent,
            LoadAgentInput(session_id=sid, agent_pin="echo@1"),
        )
    assert info.value.type == "agent_unavailable" and info.value.non_retryable


def test_run_tool_records_one_result_even_when_retried(db_engine: Engine) -> None:
    """run_tool is idempotent on its message id and records tool errors as results."""
    publish(db_engine, "echo", playbook=[])
    sid = new_session(db_engine, "echo")
    acts = SessionActivities(db_engine)
    env = ActivityEnvironment()
    inp = ToolInput(
        session_id=sid,
        agent_slug="echo",
        message_id=f"{sid}:t1:s1:tool0",
        position="000001.001.2000",
        call=ToolCall(id="c1", name="calculator", args={"expression": "2 ** 10"}),
        allowed_tools=["calculator"],
    )
    assert env.run(acts.run_tool, inp).preview == "1024"
    assert env.run(acts.run_tool, inp).preview == "1024"
    bad = inp.model_copy(update={"message_id": f"{sid}:t1:s1:tool1", "allowed_tools": []})
    outcome = env.run(acts.run_tool, bad)
    assert not outcome.ok and "not available" in outcome.preview
    assert [r for r, _ in transcript(db_engine, sid)] == ["tool", "tool"]
