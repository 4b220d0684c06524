"""The real-model path (pydantic-ai → OpenAI SDK → HTTP/SSE) against a local OpenAI stub."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy.engine import Engine
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import ActivityTaskStartedEventAttributes
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from baton.agents.tools import TOOLS
from baton.contracts.values import XAGENT_TOOLS
from baton.contracts.workspaces import WORKSPACE_TOOLS
from baton.errors import TurnFailed
from baton.runs import session_store
from baton.storage.db import session_scope
from tests.conftest import serve
from tests.helpers import launch, publish, status, transcript
from tests.openai_stub import COMPLETION_TOKENS, PROMPT_TOKENS, OpenAIStub

SYSTEM_PROMPT = "You are a careful assistant. Use the calculator for arithmetic."
PROMPT = "What is 2 + 2?"


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> Iterator[OpenAIStub]:
    """The stub on a loopback port; the OpenAI provider is pointed at it by environment."""
    fake = OpenAIStub()
    server, thread, base = serve(fake.app)
    monkeypatch.setenv("OPENAI_BASE_URL", f"{base}/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    try:
        yield fake
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def publish_calculating_agent(engine: Engine) -> None:
    publish(
        engine,
        "calc",
        model="openai-chat:stub-model",
        tools=["calculator"],
        system_prompt=SYSTEM_PROMPT,
    )


async def model_turn_starts(
    env: WorkflowEnvironment, session_id: str
) -> list[ActivityTaskStartedEventAttributes]:
    """The ``ActivityTaskStarted`` events of the session's ``model_turn`` activities."""
    history = await env.client.get_workflow_handle(session_id).fetch_history()
    scheduled = {
        e.event_id
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == "model_turn"
    }
    return [
        e.activity_task_started_event_attributes
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
        and e.activity_task_started_event_attributes.scheduled_event_id in scheduled
    ]


def session_tokens(engine: Engine, session_id: str) -> tuple[int, int]:
    with session_scope(engine) as s:
        row = session_store.get_session(s, session_id=session_id)
        return row.input_tokens, row.output_tokens


def assistant_usages(engine: Engine, session_id: str) -> list[dict[str, Any]]:
    with session_scope(engine) as s:
        return [
            dict(m.usage or {})
            for m in session_store.messages(s, session_id=session_id)
            if m.role == "assistant"
        ]


async def test_tool_round_trip_through_the_provider(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker, stub: OpenAIStub
) -> None:
    """A streamed tool call runs, its result goes back to the provider, a streamed reply ends it."""
    publish_calculating_agent(db_engine)
    launched = await launch(temporal_env.client, db_engine, worker, "calc", PROMPT)

    assert launched.response == "The result is 4."
    assert transcript(db_engine, launched.session_id) == [
        ("user", PROMPT),
        ("assistant", ""),
        ("tool", "4"),
        ("assistant", "The result is 4."),
    ]
    assert status(db_engine, launched.session_id) == "idle"

    assert len(stub.requests) == 2
    first, second = stub.requests
    assert first["model"] == "stub-model"
    assert first["messages"][0] == {"role": "system", "content": SYSTEM_PROMPT}
    assert first["messages"][1] == {"role": "user", "content": PROMPT}
    calculator = TOOLS["calculator"]
    for request in stub.requests:
        assert request["stream"] is True
        assert request["stream_options"]["include_usage"] is True
        # The agent's own tool, then the five X-Agent tools, the four workspace tools and
        # present_exhibit every session's agent is offered.
        names = [t["function"]["name"] for t in request["tools"]]
        assert names == ["calculator", *XAGENT_TOOLS, *WORKSPACE_TOOLS, "present_exhibit"]
        tool = request["tools"][0]
        assert tool["type"] == "function"
        assert tool["function"]["name"] == "calculator"
        assert tool["function"]["description"] == calculator.description
        assert tool["function"]["parameters"] == calculator.parameters
    assert all(h["authorization"] == "Bearer test-key" for h in stub.headers)

    # The second request carries the whole exchange: the call as the model made it, and its result.
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "tool"]
    [call] = second["messages"][2]["tool_calls"]
    assert call["id"] == "call_stub0001"
    assert call["function"]["name"] == "calculator"
    assert json.loads(call["function"]["arguments"]) == {"expression": "2 + 2"}
    assert second["messages"][3]["tool_call_id"] == "call_stub0001"
    assert second["messages"][3]["content"] == "4"

    # Token usage comes from the stub's final usage chunk, per model call and per session.
    usages = assistant_usages(db_engine, launched.session_id)
    assert [(u["input_tokens"], u["output_tokens"]) for u in usages] == [
        (PROMPT_TOKENS, COMPLETION_TOKENS)
    ] * 2
    assert session_tokens(db_engine, launched.session_id) == (
        2 * PROMPT_TOKENS,
        2 * COMPLETION_TOKENS,
    )
    assert launched.outcome is not None
    assert launched.outcome.usage.input_tokens == 2 * PROMPT_TOKENS
    assert launched.outcome.usage.output_tokens == 2 * COMPLETION_TOKENS


async def test_unauthorized_fails_the_turn_without_retry(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker, stub: OpenAIStub
) -> None:
    """An HTTP 401 from the provider ends the turn at once with an error message; no retry."""
    publish_calculating_agent(db_engine)
    stub.failures.append(401)
    with pytest.raises(TurnFailed) as failed:
        await launch(temporal_env.client, db_engine, worker, "calc", PROMPT)

    assert "401" in failed.value.detail
    session_id = failed.value.extra["session_id"]
    assert len(stub.requests) == 1
    history = transcript(db_engine, session_id)
    assert [role for role, _ in history] == ["user", "error"]
    assert "HTTP 401" in history[1][1]
    assert "Incorrect API key" in history[1][1]
    assert status(db_engine, session_id) == "idle"
    assert session_tokens(db_engine, session_id) == (0, 0)


async def test_server_error_is_retried_by_temporal(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker, stub: OpenAIStub
) -> None:
    """An HTTP 500 is retried as a new activity attempt that completes; nothing is stored twice."""
    publish_calculating_agent(db_engine)
    stub.failures.append(500)
    launched = await launch(temporal_env.client, db_engine, worker, "calc", PROMPT)

    assert launched.response == "The result is 4."
    assert [role for role, _ in transcript(db_engine, launched.session_id)] == [
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert len(stub.requests) == 3
    assert stub.requests[0] == stub.requests[1]  # the retry sent the same request again
    # The SDK made one attempt per activity attempt (max_retries=0): the retry is Temporal's.
    assert [h["x-stainless-retry-count"] for h in stub.headers] == ["0", "0", "0"]
    attempts = [a.attempt for a in await model_turn_starts(temporal_env, launched.session_id)]
    assert sorted(attempts) == [1, 2]  # the first model call took two attempts, the second one
    # Only the successful attempts' usage is counted.
    assert session_tokens(db_engine, launched.session_id) == (
        2 * PROMPT_TOKENS,
        2 * COMPLETION_TOKENS,
    )


async def test_retried_attempt_records_the_provider_error(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker, stub: OpenAIStub
) -> None:
    """The failure Temporal records for a retried model call is the provider's HTTP 500."""
    publish_calculating_agent(db_engine)
    stub.failures.append(500)
    launched = await launch(temporal_env.client, db_engine, worker, "calc", PROMPT)
    [retried] = [
        a for a in await model_turn_starts(temporal_env, launched.session_id) if a.attempt == 2
    ]
    # The server may wrap a large failure ("Failure exceeds size limit"); the provider
    # error must still be there, not a failure-conversion error.
    recorded = str(retried.last_failure)
    assert "status_code: 500" in recorded and "recursion" not in recorded


async def test_team_lead_is_offered_delegate_to_only_with_specialists(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker, stub: OpenAIStub
) -> None:
    """A lead-only team offers no delegate_to; one specialist gives an enum of exactly it."""
    from baton.agents import teams
    from tests.test_teams import team_run

    publish(db_engine, "solo-lead", model="openai-chat:stub-model", system_prompt="Lead.")
    publish(db_engine, "helper", playbook=[{"reply": "ok"}])
    lead = {"agent_id": "solo-lead", "role": "supervisor"}
    with session_scope(db_engine) as s:
        for team_id, members in (
            ("lone", [lead]),
            ("pair", [lead, {"agent_id": "helper", "delegation_hint": "helps"}]),
        ):
            team = {"id": team_id, "name": team_id, "supervisor_agent_id": "solo-lead"}
            teams.create_team(s, team=teams.TeamIn.model_validate({**team, "members": members}))

    def offered(request: dict[str, Any]) -> dict[str, Any]:
        return {t["function"]["name"]: t["function"] for t in request["tools"]}

    await team_run(temporal_env, db_engine, worker, "hi", team_id="lone")
    lone = offered(stub.requests[0])
    assert "delegate_to" not in lone and set(XAGENT_TOOLS) <= set(lone)
    assert "orchestrate" not in stub.requests[0]["messages"][0]["content"].lower()
    stub.requests.clear()
    await team_run(temporal_env, db_engine, worker, "hi", team_id="pair")
    pair = offered(stub.requests[0])
    assert pair["delegate_to"]["parameters"]["properties"]["agent_id"]["enum"] == ["helper"]
    assert "helper: helps" in pair["delegate_to"]["description"]
