"""The balance ceiling at its edge, on every model path (session turns and steps through
``model_turn``, inquiries through ``inquiry_turn``): a spent balance (≤ 0) refuses the
call before the provider, non-retryable and unmetered; the smallest positive balance
lets it through. Activities run in temporalio's ActivityEnvironment on a SQLite file."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import select
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.inquiry import InquiryActivities
from baton.contracts.activity_io import InquiryTurnInput, ModelTurnResult
from baton.contracts.codes import BALANCE_EXHAUSTED
from baton.contracts.workflow_io import InquiryInput
from baton.runs import inquiries, metering
from baton.storage.db import UsageRow, session_scope
from tests.helpers import publish
from tests.test_activities import loaded_session, new_session, turn_input

#: The smallest balance a call may run on: anything above the ceiling (0) admits it.
JUST_ABOVE = 1e-9

ModelPath = Callable[[Engine], Awaitable[ModelTurnResult]]


async def session_turn(engine: Engine) -> ModelTurnResult:
    acts, env, sid = loaded_session(engine, [{"reply": "hi back"}])
    return await env.run(acts.model_turn, turn_input(sid))


async def inquiry_turn(engine: Engine) -> ModelTurnResult:
    publish(engine, "echo", playbook=[])
    publish(engine, "briefer", kind="ambassador", playbook=[{"reply": "all quiet"}])
    sid = new_session(engine, "echo")
    with session_scope(engine) as s:
        inquiries.create(
            s,
            inquiry_id="inquiry-edge",
            session_id=sid,
            user="local",
            ambassador="briefer",
            version=1,
            question="how is it going?",
        )
    inquiry = InquiryInput(
        inquiry_id="inquiry-edge",
        session_id=sid,
        user="local",
        ambassador_pin="briefer@1",
        question="how is it going?",
    )
    turn = InquiryTurnInput(
        inquiry=inquiry, step=1, message_id="inquiry-edge:s1", position="000001"
    )
    return await ActivityEnvironment().run(InquiryActivities(engine).inquiry_turn, turn)


PATHS = [pytest.param(session_turn, id="model_turn"), pytest.param(inquiry_turn, id="inquiry")]


def metered_calls(engine: Engine) -> int:
    with session_scope(engine) as s:
        return len(s.exec(select(UsageRow)).all())


@pytest.mark.parametrize("path", PATHS)
async def test_a_spent_balance_refuses_the_call_before_the_model(
    db_engine: Engine, path: ModelPath
) -> None:
    """At a balance of exactly 0 the call fails balance_exhausted, non-retryable, unmetered."""
    with session_scope(db_engine) as s:
        metering.set_balance(s, amount=0.0)
    with pytest.raises(ApplicationError) as refused:
        await path(db_engine)
    assert refused.value.type == BALANCE_EXHAUSTED and refused.value.non_retryable
    assert metered_calls(db_engine) == 0


@pytest.mark.parametrize("path", PATHS)
async def test_a_balance_just_above_zero_lets_the_call_through(
    db_engine: Engine, path: ModelPath
) -> None:
    """At the smallest positive balance the call reaches the model and is metered once."""
    with session_scope(db_engine) as s:
        metering.set_balance(s, amount=JUST_ABOVE)
    result = await path(db_engine)
    assert result.message_id and metered_calls(db_engine) == 1


def test_admit_call_returns_the_balance_it_checked(db_engine: Engine) -> None:
    """admit_call passes None (unlimited) and any positive balance through, refuses ≤ 0."""
    with session_scope(db_engine) as s:
        assert metering.admit_call(s) is None
        metering.set_balance(s, amount=JUST_ABOVE)
        assert metering.admit_call(s) == JUST_ABOVE
        metering.set_balance(s, amount=-0.5)
        with pytest.raises(ApplicationError, match=BALANCE_EXHAUSTED):
            metering.admit_call(s)


def test_a_stream_is_cut_once_its_cost_reaches_the_balance() -> None:
    """stream_cut: None one character-token below the balance, the cost at the balance."""
    prices = {"m": (0.0, 1_000_000.0)}  # one USD per output token
    chars = 3 * metering.CHARS_PER_TOKEN
    below = metering.stream_cut(prices, "m", input_tokens=0, streamed_chars=chars, balance=4.0)
    at = metering.stream_cut(prices, "m", input_tokens=0, streamed_chars=chars, balance=3.0)
    unpriced = metering.stream_cut({}, "m", input_tokens=0, streamed_chars=chars, balance=0.1)
    assert below is None and at == pytest.approx(3.0) and unpriced is None
