"""Results that would fail the same way on every retry are bounded before they are returned.

A scripted reply whose ``{last_message}`` fills blew its tool arguments past Temporal's
payload limit failed ``model_turn`` with ``TMPRL1103`` six times (~32 s); a deliverable
nested 40,000 deep raised ``RecursionError`` in ``check_deliverable`` ten times and failed
the step. Now fills are bounded by what they expand to, tool calls are fitted to the
payload bound (an oversized call becomes a tool error the model reads), and a deliverable
too deep or too large is a validation error fed back.
"""

from __future__ import annotations

import json
import random
import string
import uuid
from typing import Any

import pytest
from pydantic_ai.direct import model_request_stream
from pydantic_ai.messages import ModelMessage, ModelRequest, ToolCallPart, UserPromptPart
from pydantic_ai.models import ModelRequestParameters
from sqlalchemy.engine import Engine
from temporalio.api.enums.v1 import EventType
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.steps import RESULT_HEADROOM, parse_deliverable
from activities.turns import MAX_CALLS_BYTES, UNPARSED, fit_tool_calls
from baton.contracts.activity_io import DeliverableResult
from baton.contracts.values import ToolCall
from baton.contracts.workflow_io import StepInput, StepRetry
from baton.payloads import MAX_PAYLOAD_DEPTH, MAX_RESULT_BYTES, ensure_fits, json_bytes
from baton.providers.models import MAX_ARG_FILL_CHARS, fill, scripted_model
from baton.runs.launch import launch_step
from tests.helpers import TEST_CONFIG, launch, publish, transcript
from tests.test_steps import finished

#: A tool argument made of 1,000 fills (14,000 characters, within the playbook's bound).
THOUSAND_FILLS = "{last_message}" * 1000


async def scripted_calls(playbook: list[dict[str, Any]], prompt: str) -> list[ToolCallPart]:
    """The tool calls the scripted model makes for ``prompt``."""
    model = scripted_model(playbook, agent_slug="filler")
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart(prompt)])]
    async with model_request_stream(
        model, messages, model_request_parameters=ModelRequestParameters()
    ) as stream:
        async for _event in stream:
            pass
        response = stream.get()
    return [p for p in response.parts if isinstance(p, ToolCallPart)]


# --- fills ------------------------------------------------------------------------------


async def test_one_fill_puts_the_first_2000_characters_of_the_message_into_the_args() -> None:
    """A single ``{last_message}`` in args gets exactly MAX_ARG_FILL_CHARS characters."""
    rule = {"tool_calls": [{"tool": "word_count", "args": {"text": "{last_message}"}}]}
    (call,) = await scripted_calls([rule], "x" * 5000)
    assert json.loads(str(call.args))["text"] == "x" * MAX_ARG_FILL_CHARS


async def test_many_fills_share_one_bound_per_tool_call() -> None:
    """1,000 fills in one call put at most MAX_ARG_FILL_CHARS characters of the message in all."""
    rule = {"tool_calls": [{"tool": "word_count", "args": {"text": THOUSAND_FILLS}}] * 16}
    calls = await scripted_calls([rule], "x" * 5000)
    assert len(calls) == 16
    for call in calls:
        assert json.loads(str(call.args))["text"].count("x") <= MAX_ARG_FILL_CHARS


def test_a_reply_s_fills_share_the_reply_bound() -> None:
    """``fill`` splits its budget among the fills: 4 fills of a 10-character budget get 2 each."""
    assert fill("{last_message}|" * 4, "abcdefgh", budget=10) == "ab|ab|ab|ab|"
    assert fill({"a": ["{last_message}"]}, "abc", budget=10) == {"a": ["abc"]}
    assert fill("no fill", "abc", budget=0) == "no fill"


# --- tool calls fitted to the payload bound ---------------------------------------------


def call_of(size: int, call_id: str = "c1") -> ToolCall:
    """A tool call whose encoded JSON is exactly ``size`` bytes."""
    base = json_bytes(ToolCall(id=call_id, name="word_count", args={"text": ""}))
    return ToolCall(id=call_id, name="word_count", args={"text": "a" * (size - base)})


def test_tool_calls_at_the_bound_are_kept_whole() -> None:
    """Calls weighing MAX_CALLS_BYTES in all pass unchanged."""
    calls = [
        call_of(MAX_CALLS_BYTES // 2, "a"),
        call_of(MAX_CALLS_BYTES - MAX_CALLS_BYTES // 2, "b"),
    ]
    assert sum(json_bytes(c) for c in calls) == MAX_CALLS_BYTES
    assert fit_tool_calls(calls) == calls


def test_one_byte_past_the_bound_the_largest_call_becomes_a_tool_error() -> None:
    """One byte more: the largest call's args become the error marker; ids and order stay."""
    small, large = call_of(1000, "a"), call_of(MAX_CALLS_BYTES - 999, "b")
    fitted = fit_tool_calls([small, large])
    assert fitted[0] == small
    assert (fitted[1].id, fitted[1].name, list(fitted[1].args)) == ("b", "word_count", [UNPARSED])
    assert "at most" in fitted[1].args[UNPARSED]
    assert sum(json_bytes(c) for c in fitted) <= MAX_CALLS_BYTES


def test_a_result_over_the_payload_bound_is_a_non_retryable_error() -> None:
    """ensure_fits passes a result at the bound and refuses one past it, never retried."""
    base = json_bytes(DeliverableResult(ok=True, deliverable=""))
    at_bound = DeliverableResult(ok=True, deliverable="a" * (MAX_RESULT_BYTES - base))
    assert ensure_fits(at_bound, what="test") is at_bound
    with pytest.raises(ApplicationError) as raised:
        ensure_fits(
            DeliverableResult(ok=True, deliverable="a" * (MAX_RESULT_BYTES - base + 1)), what="test"
        )
    assert raised.value.non_retryable and raised.value.type == "result_too_large"


async def test_fills_past_the_payload_limit_end_in_one_attempt_not_retries(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """16 calls of 1,000 fills each (32 MB before the fix) finish the turn at the first
    ``model_turn`` attempt; the model reads the tool results and answers."""
    publish(
        db_engine,
        "filler",
        tools=["word_count"],
        playbook=[
            {"when": "^word_count", "reply": "counted"},
            {"tool_calls": [{"tool": "word_count", "args": {"text": THOUSAND_FILLS}}] * 16},
        ],
    )
    # Incompressible text: gRPC compression must not hide the size from the server.
    prompt = "".join(random.Random(7).choices(string.ascii_letters, k=2000))
    launched = await launch(temporal_env.client, db_engine, worker, "filler", prompt)
    assert launched.response == "counted"
    history = await temporal_env.client.get_workflow_handle(launched.session_id).fetch_history()
    attempts = [
        e.activity_task_started_event_attributes.attempt
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
    ]
    assert attempts and set(attempts) == {1}
    tools = [t for role, t in transcript(db_engine, launched.session_id) if role == "tool"]
    assert len(tools) == 16


# --- deliverables -----------------------------------------------------------------------


def nested(levels: int) -> str:
    """JSON of ``levels`` nested arrays."""
    return "[" * levels + "]" * levels


def test_a_deliverable_at_the_depth_bound_validates_and_one_deeper_is_fed_back() -> None:
    """MAX_PAYLOAD_DEPTH (32) levels validate; 33 and 40,000 are validation errors, not raises."""
    schema = {"type": "array"}
    assert parse_deliverable(nested(MAX_PAYLOAD_DEPTH), schema).ok
    for levels in (MAX_PAYLOAD_DEPTH + 1, 40_000):
        result = parse_deliverable(nested(levels), schema)
        assert not result.ok and "nests deeper than 32" in result.errors[0]


def test_a_deliverable_at_the_size_bound_validates_and_one_byte_more_is_fed_back() -> None:
    """Up to MAX_RESULT_BYTES - RESULT_HEADROOM bytes of JSON is kept; one byte more is refused."""
    bound = MAX_RESULT_BYTES - RESULT_HEADROOM
    text = "a" * (bound - 2)  # JSON adds the two quotes
    assert parse_deliverable(text, None).ok
    assert parse_deliverable(json.dumps(text), {"type": "string"}).ok
    assert not parse_deliverable(text + "a", None).ok
    refused = parse_deliverable(json.dumps(text + "a"), {"type": "string"})
    assert not refused.ok and "larger than" in refused.errors[0]


async def test_a_deeply_nested_deliverable_is_fed_back_to_the_model(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """A reply nested 40,000 deep is a validation error the model sees; the next reply passes."""
    publish(
        db_engine,
        "nester",
        playbook=[{"when": "does not validate", "reply": "[1]"}, {"reply": nested(40_000)}],
    )
    step_id = f"step-{uuid.uuid4()}"
    await launch_step(
        temporal_env.client,
        db_engine,
        task_queue=worker.task_queue,
        ref="nester",
        inp=StepInput(
            step_id=step_id,
            agent_pin="nester",
            input="Give me an array.",
            output_schema={"type": "array"},
            retry=StepRetry(max_attempts=2, initial_interval_s=0.01),
            config=TEST_CONFIG,
        ),
    )
    row = await finished(db_engine, step_id, "completed")
    assert (row.deliverable, row.attempts) == ([1], 2)
    feedback = [t for role, t in transcript(db_engine, step_id) if role == "user"][1]
    assert "nests deeper than 32" in feedback
