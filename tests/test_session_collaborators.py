"""The session workflow's collaborators on their own, without a worker: the delegation
offer, the review decisions, the current details, the external Updates' checks, the
handoff rule and the worker's activity list."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from temporalio import activity
from temporalio.exceptions import ApplicationError

from baton.contracts.values import ResolvedAgent, SessionStatus, TeamSnapshot
from baton.contracts.workflow_io import (
    MAX_LATE_DECISIONS,
    ExternalMessage,
    ExternalToolCall,
    HandoffDecision,
    Provenance,
    SessionInput,
)
from baton.runs.handoff import status_after
from worker.factory import activity_methods
from workflows.delegation import delegation_offer, delegation_unavailable
from workflows.external import check_external_call, check_external_message
from workflows.reviews import Reviews
from workflows.status import DETAILS_PREVIEW, searchable_status, session_details

AGENT = ResolvedAgent(slug="lead", version=1, digest="d")
TEAM = TeamSnapshot(id="desk", supervisor="lead", shared_channel="c")


def session(**prov: object) -> SessionInput:
    return SessionInput(session_id="s", agent_pin="lead@1", provenance=Provenance(**prov))


def test_a_team_member_is_offered_no_delegation_and_told_why() -> None:
    """A member's turn offers neither the team nor the roster; delegate_to is refused
    with 'team members cannot re-delegate'."""
    inp = session(team_member=True).model_copy(update={"team": TEAM})
    offer = delegation_offer(inp, AGENT, invoked=False)
    assert offer.team is None and not offer.adhoc
    assert delegation_unavailable(inp, offer) == "team members cannot re-delegate"


def test_the_supervisor_is_offered_its_team_and_an_invoked_turn_no_roster() -> None:
    """The supervisor of a team run gets the team; an ordinary session the ad-hoc roster,
    except on an invoked turn (one hop) or Solo."""
    lead = session().model_copy(update={"team": TEAM})
    assert delegation_offer(lead, AGENT, invoked=False).team == TEAM
    assert delegation_offer(session(), AGENT, invoked=False).adhoc
    assert not delegation_offer(session(), AGENT, invoked=True).adhoc
    solo = session(disable_delegation=True)
    offer = delegation_offer(solo, AGENT, invoked=False)
    assert not offer.adhoc
    assert "Solo" in (delegation_unavailable(solo, offer) or "")
    assert delegation_unavailable(lead, delegation_offer(lead, AGENT, invoked=False)) is None


def reviews() -> tuple[Reviews, list[SessionStatus]]:
    statuses: list[SessionStatus] = []
    book = Reviews(session(), set_status=statuses.append, show=lambda: None, warn=print)
    return book, statuses


def test_a_decision_for_no_review_is_kept_as_unknown_and_bounded() -> None:
    """Decisions naming no review read unknown_review, a non-decision invalid_decision;
    only the newest MAX_LATE_DECISIONS are kept."""
    book, _ = reviews()
    now = datetime.now(UTC)
    for n in range(MAX_LATE_DECISIONS + 1):
        book.decide({"review_id": f"r{n}", "decision": "deny", "received_at": now.isoformat()})
    book.decide({"review_id": "x", "decision": "maybe"})
    assert len(book.late) == MAX_LATE_DECISIONS
    assert book.late[0].review_id == "r2"
    assert book.late[-2].reason == "unknown_review"
    assert (book.late[-1].review_id, book.late[-1].reason) == ("x", "invalid_decision")


def test_a_decision_received_after_the_deadline_is_too_late() -> None:
    """A decision for an open review received past its deadline changes nothing: too_late;
    one received by the deadline is kept for the wait."""
    book, _ = reviews()
    deadline = datetime.now(UTC)
    book.open["r"] = {"operation": "invoke", "target": "t", "preview": ""}
    book.expiry["r"] = deadline
    late = (deadline + timedelta(seconds=1)).isoformat()
    book.decide({"review_id": "r", "decision": "allow_once", "received_at": late})
    assert [d.reason for d in book.late] == ["too_late"]
    book.decide({"review_id": "r", "decision": "deny", "received_at": deadline.isoformat()})
    assert len(book.late) == 1
    assert book.pending() == [
        {"operation": "invoke", "target": "t", "preview": "", "review_id": "r"}
    ]


def test_the_searchable_status_is_coarse() -> None:
    """BatonStatus reads running for an idle session; other states as they are."""
    assert searchable_status("idle") == "running"
    assert searchable_status("awaiting_input") == "awaiting_input"


def test_the_details_name_each_review_and_cut_the_last_message_at_the_edge() -> None:
    """Each open review shows its deadline and command; the last message is cut to
    DETAILS_PREVIEW characters, a message of exactly that length is not cut."""
    by = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    exact = "a" * DETAILS_PREVIEW
    text = session_details(
        state="awaiting_input",
        pin="lead@1",
        turn=2,
        completed_idle=False,
        reviews={"r": {"operation": "invoke", "target": "t"}},
        expiry={"r": by},
        last_message=exact,
    )
    assert text.splitlines() == [
        "**awaiting_input** · `lead@1` · turn 2",
        "- review `r`: invoke → t, decide by 2030-01-02 03:04:05 UTC (`baton reviews approve r`)",
        f"- last: {exact}",
    ]
    longer = session_details(
        state="idle",
        pin="lead@1",
        turn=2,
        completed_idle=True,
        reviews={},
        expiry={},
        last_message=exact + "b",
    )
    assert longer.splitlines()[1] == (
        "- this run completed idle; the next message starts the next run"
    )
    assert longer.splitlines()[2] == f"- last: {'a' * (DETAILS_PREVIEW - 1)}…"


def test_external_updates_are_refused_on_the_wrong_session() -> None:
    """An external Update on a session that is not external, closed, naming a tool that is
    no X-Agent tool, or posting blank text is refused by its validator, with its code."""
    call = ExternalToolCall(call_id="c", name="list_agents", args={})
    with pytest.raises(ApplicationError) as not_external:
        check_external_call(session(), False, call)
    assert not_external.value.type == "not_external"
    external = session(external=True)
    check_external_call(external, False, call)
    with pytest.raises(ApplicationError) as closed:
        check_external_call(external, True, call)
    assert closed.value.type == "session_closed"
    with pytest.raises(ApplicationError) as unknown:
        check_external_call(external, False, call.model_copy(update={"name": "calculator"}))
    assert unknown.value.type == "unknown_tool"
    with pytest.raises(ApplicationError) as blank:
        check_external_message(external, False, ExternalMessage(text="  "))
    assert blank.value.type == "invalid_prompt"


@pytest.mark.parametrize(
    ("decision", "status"),
    [("approve", "completed"), ("reject", "rejected"), ("revise", "running")],
    ids=["approve", "reject", "revise"],
)
def test_a_handoff_decision_leads_to_one_status(decision: str, status: str) -> None:
    """The status each handoff decision leads to, for the step workflow and the API."""
    assert status_after(HandoffDecision.model_validate({"decision": decision})) == status


def test_the_worker_registers_every_activity_method_of_the_activity_classes() -> None:
    """The activity list is derived from the classes: each @activity.defn method, bound to
    its instance, inherited ones included and an override in their place, and nothing
    else."""

    class Acts:
        @activity.defn(name="one")
        def one(self) -> None: ...

        def helper(self) -> None: ...

        @activity.defn(name="two")
        async def two(self) -> None: ...

    class Slower(Acts):
        @activity.defn(name="two")
        async def two(self) -> None: ...

        @property
        def unread(self) -> None:
            raise AssertionError("a property is never read")

    acts = Acts()
    assert activity_methods(acts) == [acts.one, acts.two]
    slower = Slower()
    assert activity_methods(slower) == [slower.one, slower.two]
    assert activity_methods(slower)[1].__func__ is Slower.two  # type: ignore[attr-defined]
