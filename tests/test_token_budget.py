"""token_budget reserves what calls in flight may spend (Xema Agent
Concepts limits).

Storage-level rules on SQLite and PostgreSQL (admission at the edge, reservations
reused, settled, released), the scripted model's max_tokens, and a parallel fan-out
on the real worker that stays inside the documented bound.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from pydantic_ai.direct import model_request_stream
from pydantic_ai.messages import ModelRequest, TextPart, ToolCallPart, UserPromptPart
from sqlalchemy.engine import Engine
from sqlmodel import Session, select
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from baton.errors import TurnFailed
from baton.providers.models import scripted_model
from baton.runs import metering, run_tree
from baton.storage.db import (
    DelegationRow,
    MessageRow,
    SessionRow,
    TokenReservationRow,
    session_scope,
)
from tests.helpers import TEST_CONFIG, launch, publish
from worker.factory import build_worker

ROOT = "session-root"
CHILD = "session-child"


def add_session(s: Session, session_id: str, *, used: int = 0) -> None:
    """A session row whose metered tokens are ``used``."""
    s.add(
        SessionRow(
            id=session_id, name=session_id, agent_slug="a", agent_version=1, input_tokens=used
        )
    )
    s.flush()


def make_run(engine: Engine, *, used: int) -> None:
    """A run: root session (with ``used`` tokens) and one child under it."""
    with session_scope(engine) as s:
        add_session(s, ROOT, used=used)
        add_session(s, CHILD)
        s.add(
            DelegationRow(
                id="d1",
                root_session_id=ROOT,
                parent_session_id=ROOT,
                child_session_id=CHILD,
                kind="task",
                caller_agent_slug="a",
                target_agent_slug="a",
            )
        )


def reserve(
    engine: Engine, message_id: str, *, budget: int, estimate: int, session_id: str = CHILD
) -> int:
    with session_scope(engine) as s:
        return run_tree.reserve_tokens(
            s,
            root_session_id=ROOT,
            session_id=session_id,
            message_id=message_id,
            token_budget=budget,
            input_estimate=estimate,
            max_output=4096,
        )


def reserved(engine: Engine) -> int:
    with session_scope(engine) as s:
        return run_tree.reserved_tokens(s, root_session_id=ROOT)


def test_a_model_call_is_admitted_with_room_for_one_output_token_and_refused_without(
    engine: Engine,
) -> None:
    """Used 100 of 200: a call estimated at 99 input tokens gets max_tokens 1 (the edge);
    once that reserves the rest, a call estimated at 1 token is refused."""
    make_run(engine, used=100)
    assert reserve(engine, "m1", budget=200, estimate=99) == 1
    assert reserved(engine) == 100
    with pytest.raises(run_tree.BudgetExhausted, match=r"reserve 100 more"):
        reserve(engine, "m2", budget=200, estimate=1, session_id=ROOT)


def test_a_model_call_whose_input_alone_fills_the_budget_is_refused(engine: Engine) -> None:
    """Used 100 of 200: a call estimated at 100 input tokens has no room for a reply."""
    make_run(engine, used=100)
    with pytest.raises(run_tree.BudgetExhausted, match=r"input alone is about 100"):
        reserve(engine, "m1", budget=200, estimate=100)
    assert reserved(engine) == 0


def test_a_delegation_is_admitted_one_below_the_budget_counting_reservations(
    engine: Engine,
) -> None:
    """A delegation needs used + reserved < budget: 100 used + 49 reserved of 150 passes,
    with a budget of 149 (used + reserved reach it) it is refused."""
    make_run(engine, used=100)
    reserve(engine, "m1", budget=149, estimate=48)  # reserves 48 + 1
    with session_scope(engine) as s:
        assert run_tree.admit_tokens(s, root_session_id=ROOT, token_budget=150) == 1
    with session_scope(engine) as s, pytest.raises(run_tree.BudgetExhausted) as refused:
        run_tree.admit_tokens(s, root_session_id=ROOT, token_budget=149)
    assert str(refused.value) == (
        "this run used 100 tokens (and model calls in flight reserve 49 more) of its "
        "token_budget 149"
    )


def test_a_retried_call_gets_its_own_reservation_back(engine: Engine) -> None:
    """A retry of a call (same message id, e.g. after a worker loss) is neither counted
    twice nor refused by its own reservation, even when that took everything left."""
    make_run(engine, used=0)
    assert reserve(engine, "m1", budget=100, estimate=50) == 50
    assert reserve(engine, "m1", budget=100, estimate=60) == 50
    assert reserved(engine) == 100
    with session_scope(engine) as s:
        left = run_tree.admit_tokens(s, root_session_id=ROOT, token_budget=100, excluding="m1")
    assert left == 100


def test_metering_a_call_settles_its_reservation_in_the_same_transaction(
    engine: Engine,
) -> None:
    """metering.record turns the reservation into usage: nothing stays reserved and the
    row keeps the estimate beside the actual tokens."""
    make_run(engine, used=0)
    reserve(engine, "m1", budget=1000, estimate=50)
    with session_scope(engine) as s:
        metering.record(
            s,
            message_id="m1",
            agent="a",
            session_id=CHILD,
            model="scripted",
            input_tokens=50,
            output_tokens=7,
            cost_usd=0.0,
        )
    assert reserved(engine) == 0
    with session_scope(engine) as s:
        row = s.get(TokenReservationRow, "m1")
        assert row is not None and row.settled_at is not None
        assert (row.input_estimate, row.actual_input_tokens, row.actual_tokens) == (50, 50, 57)


def test_a_reservation_never_settled_is_released_not_leaked(engine: Engine) -> None:
    """A failed turn's reservation is released (record_failure / close); a session's new
    call also frees an older open one of that session (one call at a time per session)."""
    make_run(engine, used=0)
    reserve(engine, "m1", budget=1000, estimate=50)
    with session_scope(engine) as s:
        assert run_tree.release_tokens(s, session_id=CHILD) == 1
    assert reserved(engine) == 0
    reserve(engine, "m2", budget=100, estimate=50)
    assert reserved(engine) == 100
    reserve(engine, "m3", budget=100, estimate=50)  # m2 crashed for good: m3 replaces it
    assert reserved(engine) == 100


async def scripted_usage(max_tokens: int | None) -> tuple[int, list[Any]]:
    model = scripted_model(
        [
            {
                "reply": "one two three four",
                "tool_calls": [{"tool": "word_count", "args": {"text": "x"}}],
            }
        ],
        agent_slug="a",
    )
    settings: Any = {"max_tokens": max_tokens} if max_tokens is not None else {}
    async with model_request_stream(
        model, [ModelRequest(parts=[UserPromptPart("hi")])], model_settings=settings
    ) as stream:
        async for _ in stream:
            pass
        response = stream.get()
    return response.usage.output_tokens, list(response.parts)


async def test_the_scripted_model_honours_max_tokens() -> None:
    """The reply meters 4 words + a 4-token call: max_tokens 8 fits it all (the bound), 7
    keeps the text and drops the call that no longer fits, 2 stops after two words."""
    out, parts = await scripted_usage(None)
    assert out == 8 and any(isinstance(p, ToolCallPart) for p in parts)
    out, parts = await scripted_usage(8)
    assert out == 8 and any(isinstance(p, ToolCallPart) for p in parts)
    out, parts = await scripted_usage(7)
    assert out == 4 and not any(isinstance(p, ToolCallPart) for p in parts)
    out, parts = await scripted_usage(2)
    assert out == 2
    assert [p.content for p in parts if isinstance(p, TextPart)] == ["one two "]


BUDGET = 300
FAN = [{"tool": "task", "args": {"alias": "w", "prompt": f"part {i}"}} for i in range(8)]


async def test_parallel_fan_out_never_exceeds_the_token_budget(
    temporal_env: WorkflowEnvironment, engine: Engine
) -> None:
    """token_budget 300 and 8 parallel subagent tasks (SQLite and PostgreSQL): the run
    spends at most 300 (the documented bound: the budget plus what admitted calls' input
    exceeded its estimate, nothing for the scripted model); some tasks run, the rest are
    refused limit_exceeded."""
    async with build_worker(
        temporal_env.client, engine=engine, task_queue=f"tq-{uuid.uuid4()}"
    ) as worker:
        await fan_out(temporal_env, engine, worker)


async def fan_out(temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker) -> None:
    publish(db_engine, "piece", playbook=[{"reply": "a b c d e f g h i j"}])
    publish(
        db_engine,
        "fanner",
        subagents=[{"alias": "w", "agent": "piece"}],
        limits={"token_budget": BUDGET},
        playbook=[{"when": "^task: ", "reply": "all done"}, {"tool_calls": FAN}],
    )
    config = TEST_CONFIG.model_copy(update={"max_output_tokens": 60})
    try:
        root = await launch(temporal_env.client, db_engine, worker, "fanner", "go", config=config)
        root_id = root.session_id
    except TurnFailed:  # the root's last call may find no room left: refused, not overspent
        with session_scope(db_engine) as s:
            root_id = s.exec(select(SessionRow.id).where(SessionRow.agent_slug == "fanner")).one()
    with session_scope(db_engine) as s:
        used = run_tree.run_tokens(s, root_session_id=root_id)
        edges = s.exec(select(DelegationRow).where(DelegationRow.root_session_id == root_id)).all()
        rows = s.exec(select(TokenReservationRow)).all()
        all_messages = s.exec(select(MessageRow)).all()
        replies = [m for m in all_messages if m.role == "assistant"]
        metered = sum(
            int(m.usage["input_tokens"]) + int(m.usage["output_tokens"]) for m in replies if m.usage
        )
    overshoot = sum(
        max(0, (r.actual_input_tokens or 0) - r.input_estimate) for r in rows if r.actual_tokens
    )
    assert overshoot == 0
    assert metered == used <= BUDGET + overshoot
    # Each task ran, or was refused at admission (no child) or at its child's model call.
    results = [m for m in all_messages if m.session_id == root_id and m.role == "tool"]
    assert len(results) == 8
    assert any(not r.is_error for r in results)
    refused = [r for r in results if r.is_error]
    assert refused and all("limit_exceeded" in r.text for r in refused)
    assert len([e for e in edges if e.status == "completed"]) == 8 - len(refused)
    # Every settled call stayed inside what it reserved.
    assert all((r.actual_tokens or 0) <= r.reserved for r in rows)
