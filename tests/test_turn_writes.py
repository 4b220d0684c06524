"""A turn's writes as prepared Core statements: what ``_prepare``/``_persist`` and
the API write stays the same on SQLite and PostgreSQL — idempotent message ids and metering,
counters, status rules and events, the stored reply read back, the history's tool calls."""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlmodel import select

from activities.turns import SessionActivities
from baton.agents import registry
from baton.agents.spec import AgentSpec
from baton.contracts.activity_io import LoadAgentInput, ModelTurnInput
from baton.contracts.values import ToolCall, Usage, position
from baton.contracts.workflow_io import Provenance
from baton.errors import SessionNotFound
from baton.runs import metering, run_tree
from baton.runs import session_store as sessions
from baton.storage.db import EventRow, SessionRow, TokenReservationRow, UsageRow, session_scope


def _session(engine: Engine) -> str:
    sid = f"session-{uuid.uuid4()}"
    with session_scope(engine) as s:
        sessions.create_session(
            s, session_id=sid, agent_slug="a", agent_version=1, provenance=Provenance(), name="n"
        )
    return sid


def _events(engine: Engine, sid: str) -> list[tuple[str, dict[str, object]]]:
    with session_scope(engine) as s:
        return [(e.type, e.data) for e in sessions.events_after(s, session_id=sid)]


def _add(engine: Engine, sid: str, mid: str, usage: Usage | None = None) -> bool:
    with session_scope(engine) as s:
        return sessions.add_message(
            s,
            message_id=mid,
            session_id=sid,
            position=position(1, 1, 1),
            role="assistant",
            agent_slug="a",
            text="hello",
            tool_calls=[{"id": "c1", "name": "calculator", "args": {"x": 1}}],
            usage=usage,
        )


def test_a_message_id_is_stored_and_counted_once(engine: Engine) -> None:
    """add_message twice with one id stores one row, one event, and bumps the counters once."""
    sid = _session(engine)
    usage = Usage(requests=1, input_tokens=7, output_tokens=3)
    assert _add(engine, sid, f"{sid}:m1", usage) is True
    assert _add(engine, sid, f"{sid}:m1", usage) is False
    with session_scope(engine) as s:
        row = sessions.get_session(s, session_id=sid)
        assert (row.message_count, row.input_tokens, row.output_tokens) == (1, 7, 3)
    assert [t for t, _ in _events(engine, sid)] == ["message"]


def test_two_attempts_storing_one_message_at_once_store_and_count_it_once(
    engine: Engine,
) -> None:
    """Two concurrent attempts of one activity (the first still running after its
    heartbeat timed out) add the same message id: the second waits for the first's
    transaction, then stores and counts nothing and fails nothing. On PostgreSQL its
    counter check ran before the first committed, so the unique key decides (it raised
    IntegrityError before)."""
    import threading

    sid = _session(engine)
    usage = Usage(requests=1, input_tokens=7, output_tokens=3)
    second: list[object] = []
    with session_scope(engine) as first:
        assert sessions.add_message(
            first,
            message_id=f"{sid}:m1",
            session_id=sid,
            position=position(1, 1, 1),
            role="assistant",
            agent_slug="a",
            text="hello",
            usage=usage,
        )

        def attempt() -> None:
            try:
                second.append(_add(engine, sid, f"{sid}:m1", usage))
            except Exception as exc:  # the outcome under test
                second.append(exc)

        racer = threading.Thread(target=attempt)
        racer.start()
        racer.join(timeout=1.0)
        assert racer.is_alive()  # it waits on the first's lock, past its own check
    racer.join(timeout=30)
    assert second == [False]
    with session_scope(engine) as s:
        row = sessions.get_session(s, session_id=sid)
        assert (row.message_count, row.input_tokens, row.output_tokens) == (1, 7, 3)
    assert [t for t, _ in _events(engine, sid)] == ["message"]


def test_a_message_of_a_missing_session_is_refused_and_not_written(engine: Engine) -> None:
    """add_message for a session that does not exist raises SessionNotFound, writes nothing."""
    with pytest.raises(SessionNotFound), session_scope(engine) as s:
        sessions.add_message(
            s,
            message_id="nobody:m1",
            session_id="session-nobody",
            position=position(1, 0, 0),
            role="user",
            agent_slug="a",
            text="hi",
        )
    with session_scope(engine) as s:
        assert sessions.get_message(s, message_id="nobody:m1") is None


def test_counters_read_in_the_same_transaction_are_current(engine: Engine) -> None:
    """A session row loaded before add_message in one transaction reads the bumped counters."""
    sid = _session(engine)
    with session_scope(engine) as s:
        before = sessions.get_session(s, session_id=sid).message_count
        sessions.add_message(
            s,
            message_id=f"{sid}:m1",
            session_id=sid,
            position=position(1, 0, 0),
            role="user",
            agent_slug="a",
            text="hi",
        )
        assert (before, sessions.get_session(s, session_id=sid).message_count) == (0, 1)


def test_the_stored_reply_reads_back_whole(engine: Engine) -> None:
    """get_message returns every column as written (JSON decoded, tz-aware time); None if absent."""
    sid = _session(engine)
    _add(engine, sid, f"{sid}:m1", Usage(requests=1, input_tokens=7, output_tokens=3))
    with session_scope(engine) as s:
        row = sessions.get_message(s, message_id=f"{sid}:m1")
        assert sessions.get_message(s, message_id=f"{sid}:m2") is None
    assert row is not None and row.id == f"{sid}:m1" and row.text == "hello"
    assert row.tool_calls == [{"id": "c1", "name": "calculator", "args": {"x": 1}}]
    assert row.usage is not None and row.usage["input_tokens"] == 7
    assert row.created_at.tzinfo is not None and row.role == "assistant"


def test_history_decodes_tool_calls_and_keeps_none(engine: Engine) -> None:
    """The model's history carries a reply's tool calls as stored and None where there are none."""
    sid = _session(engine)
    with session_scope(engine) as s:
        sessions.add_message(
            s,
            message_id=f"{sid}:u",
            session_id=sid,
            position=position(1, 0, 0),
            role="user",
            agent_slug="a",
            text="hi",
        )
    _add(engine, sid, f"{sid}:a")
    with session_scope(engine) as s:
        every = sessions.history(s, session_id=sid)
        window = sessions.history(s, session_id=sid, last=1)
    assert [(h.role, h.tool_calls) for h in every] == [
        ("user", None),
        ("assistant", [{"id": "c1", "name": "calculator", "args": {"x": 1}}]),
    ]
    assert [h.role for h in window] == ["assistant"]


def test_status_changes_write_one_event_and_never_reopen(engine: Engine) -> None:
    """set_status: a change writes a status event, no change writes none, a closed session
    stays closed, and a missing session raises SessionNotFound."""
    sid = _session(engine)  # created running
    with session_scope(engine) as s:
        sessions.set_status(s, session_id=sid, status="running")
        sessions.set_status(s, session_id=sid, status="idle")
        sessions.set_status(s, session_id=sid, status="cancelled")
        sessions.set_status(s, session_id=sid, status="running")
    with session_scope(engine) as s:
        assert sessions.get_session(s, session_id=sid).status == "cancelled"
        assert sessions.is_closed(s, session_id=sid)
    assert [d["status"] for t, d in _events(engine, sid) if t == "status"] == ["idle", "cancelled"]
    with pytest.raises(SessionNotFound), session_scope(engine) as s:
        sessions.set_status(s, session_id="session-nobody", status="idle")


def test_a_model_call_is_metered_and_charged_once(engine: Engine) -> None:
    """metering.record twice with one message id writes one usage row and charges once."""
    sid = _session(engine)
    with session_scope(engine) as s:
        metering.set_balance(s, amount=1.0)
    for expected in (True, False):
        with session_scope(engine) as s:
            got = metering.record(
                s,
                message_id=f"{sid}:m1",
                agent="a",
                session_id=sid,
                model="m",
                input_tokens=10,
                output_tokens=5,
                cost_usd=0.25,
            )
            assert got is expected
    with session_scope(engine) as s:
        assert metering.get_balance(s) == pytest.approx(0.75)
        rows = s.exec(select(UsageRow).where(UsageRow.message_id == f"{sid}:m1")).all()
    assert [(r.input_tokens, r.output_tokens, r.cost_usd) for r in rows] == [(10, 5, 0.25)]


def test_a_balance_loaded_before_a_charge_reads_the_charged_amount(engine: Engine) -> None:
    """A balance row loaded earlier in the transaction that meters a call reads the new amount."""
    sid = _session(engine)
    with session_scope(engine) as s:
        metering.set_balance(s, amount=1.0)
    with session_scope(engine) as s:
        metering.set_balance(s, amount=2.0)  # loads the row into this transaction
        metering.record(
            s,
            message_id=f"{sid}:m1",
            agent="a",
            session_id=sid,
            model="m",
            input_tokens=1,
            output_tokens=1,
            cost_usd=0.5,
        )
        assert metering.get_balance(s) == pytest.approx(1.5)
        assert metering.admit_call(s) == pytest.approx(1.5)


def test_metering_settles_the_reservation_once(engine: Engine) -> None:
    """The call's token reservation is settled to its usage when metered, and a retry's
    metering leaves it as settled."""
    sid = _session(engine)
    mid = f"{sid}:m1"
    with session_scope(engine) as s:
        run_tree.reserve_tokens(
            s,
            root_session_id=sid,
            session_id=sid,
            message_id=mid,
            token_budget=1000,
            input_estimate=100,
            max_output=50,
        )
    for _ in range(2):
        with session_scope(engine) as s:
            metering.record(
                s,
                message_id=mid,
                agent="a",
                session_id=sid,
                model="m",
                input_tokens=90,
                output_tokens=20,
                cost_usd=None,
            )
    with session_scope(engine) as s:
        row = s.get(TokenReservationRow, mid)
        assert row is not None and row.settled_at is not None
        assert (row.actual_input_tokens, row.actual_tokens) == (90, 110)


def _turn(sid: str, turn: int) -> ModelTurnInput:
    return ModelTurnInput(
        session_id=sid,
        agent_slug="bench",
        turn=turn,
        step=1,
        assistant_message_id=f"{sid}:t{turn}:s1:assistant",
        position=position(turn, 1, 1),
        user_message_id=f"{sid}:t{turn}:user",
        user_text=f"question {turn}",
        user_position=position(turn, 0, 0),
    )


def test_a_turn_writes_the_same_rows_and_events(engine: Engine) -> None:
    """_prepare then _persist: the user message, status running, the metered reply, status
    idle and their events in order; a retried _prepare returns the stored reply."""
    with session_scope(engine) as s:
        registry.create_agent(
            s, slug="bench", name="B", spec=AgentSpec.model_validate({"playbook": []})
        )
        registry.publish(s, slug="bench")
    sid = _session(engine)
    with session_scope(engine) as s:  # as a launch leaves it: idle between turns
        sessions.set_status(s, session_id=sid, status="idle")
    acts = SessionActivities(engine)
    agent = acts.load_agent(LoadAgentInput(session_id=sid, agent_pin="bench@1"))
    inp = _turn(sid, 1)
    done, got, history, _, balance = acts._prepare(inp)
    assert done is None and got == agent and balance is None
    assert [(h.role, h.text) for h in history] == [("user", "question 1")]
    calls = [ToolCall(id="c1", name="calculator", args={"expression": "1+1"})]
    usage = Usage(requests=1, input_tokens=12, output_tokens=4)
    acts._persist(inp, "let me compute", calls, usage, "tail", 1, "m")
    again, *_ = acts._prepare(inp)
    assert again is not None and again.preview == "let me compute"
    assert again.tool_calls == calls and again.usage.input_tokens == 12
    kinds = [
        (t, d.get("status") or d.get("role") or d.get("text")) for t, d in _events(engine, sid)
    ]
    assert kinds == [
        ("status", "idle"),
        ("message", "user"),
        ("status", "running"),
        ("chunk", "tail"),
        ("message", "assistant"),
    ]
    with session_scope(engine) as s:
        row = s.get(SessionRow, sid)
        assert row is not None and row.status == "running"  # tool calls: the turn goes on
        assert (row.message_count, row.input_tokens, row.output_tokens) == (2, 12, 4)
        ids = s.exec(select(sa.func.count()).select_from(EventRow)).one()
    assert ids == len(kinds)


def test_a_first_turn_on_another_worker_reads_the_launch_snapshot(engine: Engine) -> None:
    """_prepare on a worker that never ran load_agent reads the snapshot the launch recorded
    on the row; agent_snapshot of a missing session raises SessionNotFound."""
    with session_scope(engine) as s:
        registry.create_agent(
            s, slug="bench", name="B", spec=AgentSpec.model_validate({"playbook": []})
        )
        registry.publish(s, slug="bench")
        resolved = registry.resolve_agent(s, ref="bench@1")
    sid = _session(engine)
    with session_scope(engine) as s:
        assert sessions.agent_snapshot(s, session_id=sid) is None
        row = sessions.get_session(s, session_id=sid)
        row.resolved_agent = resolved.model_dump(mode="json")
        s.add(row)
    _, agent, *_ = SessionActivities(engine)._prepare(_turn(sid, 1))
    assert agent == resolved
    with pytest.raises(SessionNotFound), session_scope(engine) as s:
        sessions.agent_snapshot(s, session_id="session-nobody")
