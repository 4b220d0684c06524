"""SessionWorkflow on a real Temporal dev server (Update paths), with the scripted model."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy.engine import Engine
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from baton.errors import InvalidPrompt, SessionBusy
from baton.runs import launch as launching
from tests.helpers import TEST_CONFIG, launch, publish, status, transcript, wait_for

CALC_PLAYBOOK = [
    {"when": "calculator: ", "reply": "The answer is {last_message}."},
    {
        "when": "add",
        "reply": "Let me add.",
        "tool_calls": [{"tool": "calculator", "args": {"expression": "2 + 3"}}],
    },
]


async def test_sync_message_returns_the_final_reply(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """A sync launch returns the assistant's reply; user and assistant messages are stored once."""
    publish(db_engine, "echo", playbook=[{"reply": "Hello from echo."}])
    launched = await launch(temporal_env.client, db_engine, worker, "echo", "hi there")
    assert launched.response == "Hello from echo."
    assert transcript(db_engine, launched.session_id) == [
        ("user", "hi there"),
        ("assistant", "Hello from echo."),
    ]
    assert status(db_engine, launched.session_id) == "idle"
    handle = temporal_env.client.get_workflow_handle(launched.session_id)
    assert await handle.query("status") == "idle"


async def test_tool_calls_run_as_activities_and_loop_back(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """A tool call runs, its result goes back to the model, and the final reply uses it."""
    publish(db_engine, "adder", tools=["calculator"], playbook=CALC_PLAYBOOK)
    launched = await launch(temporal_env.client, db_engine, worker, "adder", "please add")
    assert launched.response == "The answer is 5."
    roles = [role for role, _ in transcript(db_engine, launched.session_id)]
    assert roles == ["user", "assistant", "tool", "assistant"]


async def test_bad_tool_arguments_go_back_to_the_model(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """Arguments failing the tool schema become a tool error the model sees and recovers from."""
    publish(
        db_engine,
        "sloppy",
        tools=["calculator"],
        playbook=[
            {"when": "invalid arguments", "reply": "Sorry, I fix my call."},
            {"reply": "Trying.", "tool_calls": [{"tool": "calculator", "args": {"expr": 1}}]},
        ],
    )
    launched = await launch(temporal_env.client, db_engine, worker, "sloppy", "go")
    assert launched.response == "Sorry, I fix my call."
    tool_text = next(t for r, t in transcript(db_engine, launched.session_id) if r == "tool")
    assert "invalid arguments for calculator" in tool_text


async def test_second_message_while_running_is_session_busy(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """An Update arriving during a turn is rejected with session_busy; the turn completes."""
    publish(
        db_engine,
        "slow",
        playbook=[{"reply": "one two three four five six", "chunk_delay_ms": 400}],
    )
    launched = await launch(temporal_env.client, db_engine, worker, "slow", "start", sync=False)
    # Mid-turn: the model call stored the user message and streams its reply for 2.4 s.
    await wait_for(lambda: transcript(db_engine, launched.session_id) == [("user", "start")])
    with pytest.raises(SessionBusy):
        await launching.send_message(
            temporal_env.client,
            db_engine,
            session_id=launched.session_id,
            prompt="again",
            sync=True,
        )
    await wait_for(lambda: status(db_engine, launched.session_id) == "idle")
    assert [r for r, _ in transcript(db_engine, launched.session_id)] == ["user", "assistant"]


async def test_conversation_continues_with_full_history(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """A second message is answered in the same session, after the first exchange."""
    publish(db_engine, "echo", playbook=[])
    launched = await launch(temporal_env.client, db_engine, worker, "echo", "first")
    _, text = await launching.send_message(
        temporal_env.client, db_engine, session_id=launched.session_id, prompt="second", sync=True
    )
    assert text == "[echo] received: second"
    assert [t for _, t in transcript(db_engine, launched.session_id)] == [
        "first",
        "[echo] received: first",
        "second",
        "[echo] received: second",
    ]


async def test_empty_prompt_is_rejected_by_the_validator(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """A blank message is rejected by the Update validator and never reaches history."""
    publish(db_engine, "echo", playbook=[])
    launched = await launch(temporal_env.client, db_engine, worker, "echo", "first")
    with pytest.raises(InvalidPrompt):
        await launching.send_message(
            temporal_env.client, db_engine, session_id=launched.session_id, prompt="   ", sync=True
        )


async def test_continue_as_new_carries_the_conversation(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """After continue-as-new the session keeps its id, agent snapshot and turn numbering."""
    publish(db_engine, "echo", playbook=[])
    config = TEST_CONFIG.model_copy(update={"continue_as_new_after_turns": 1})
    launched = await launch(temporal_env.client, db_engine, worker, "echo", "one", config=config)
    sid = launched.session_id
    await wait_for_runs(temporal_env, sid, 2)
    _, text = await launching.send_message(
        temporal_env.client, db_engine, session_id=sid, prompt="two", sync=True
    )
    assert text == "[echo] received: two"
    assert [m for m, _ in transcript(db_engine, sid)] == ["user", "assistant"] * 2
    await wait_for_runs(temporal_env, sid, 3)
    handle = temporal_env.client.get_workflow_handle(sid)
    assert await handle.query("status") == "idle"


async def wait_for_runs(env: WorkflowEnvironment, workflow_id: str, runs: int) -> None:
    """Wait until visibility lists ``runs`` runs of ``workflow_id``."""
    deadline = asyncio.get_running_loop().time() + 60
    while asyncio.get_running_loop().time() < deadline:
        found = [w async for w in env.client.list_workflows(f"WorkflowId = '{workflow_id}'")]
        if len(found) >= runs:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"expected {runs} runs of {workflow_id}")


async def test_cancel_marks_the_search_attribute_and_closes(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """A cancelled session shows BatonStatus=cancelled and refuses async messages too."""
    from baton.contracts.search import SA_STATUS
    from baton.errors import SessionClosed

    publish(db_engine, "slow", playbook=[{"reply": "w " * 40, "chunk_delay_ms": 100}])
    launched = await launch(temporal_env.client, db_engine, worker, "slow", "go", sync=False)
    with pytest.raises(SessionBusy):
        await launching.send_message(
            temporal_env.client, db_engine, session_id=launched.session_id, prompt="x", sync=False
        )
    await launching.cancel_session(temporal_env.client, db_engine, session_id=launched.session_id)
    await wait_for(lambda: status(db_engine, launched.session_id) == "cancelled")
    handle = temporal_env.client.get_workflow_handle(launched.session_id)
    described = await handle.describe()
    assert described.typed_search_attributes.get(SA_STATUS) == "cancelled"
    with pytest.raises(SessionClosed):
        await launching.send_message(
            temporal_env.client, db_engine, session_id=launched.session_id, prompt="x", sync=False
        )
