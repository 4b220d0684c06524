"""The policy reviews of one session run (Gamut X-Agent Policies; docs/xagent.md, Reviews):
the reviews open and expected, the decisions received by Signal, the bounded wait for one
and its single outcome, and the bounded memory carried across runs.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities.xagent import XAgentActivities
    from baton.contracts.activity_io import (
        SettleInput,
        SettleResult,
        ToolMessage,
        ToolOutcome,
        XAgentCall,
    )
    from baton.contracts.values import OPERATION_OF, Decision, ReviewOutcome, SessionStatus
    from baton.contracts.workflow_io import (
        MAX_LATE_DECISIONS,
        MAX_SETTLED_REVIEWS,
        LateDecision,
        LateReason,
        ReviewDecision,
        SessionInput,
        from_signal,
        review_in_time,
    )

from workflows.calls import local


class Reviews:
    """A session run's reviews. ``set_status`` and ``show`` are the workflow's: a review
    waiting makes the session ``awaiting_input``, the last one settled ``running``;
    ``warn`` logs a decision that changed nothing (default: the workflow's logger).

    Carried to the next run (continue-as-new, idle completion): :attr:`late` (the newest
    ``MAX_LATE_DECISIONS`` decisions that changed nothing) and :attr:`settled` (the newest
    ``MAX_SETTLED_REVIEWS`` settled ids, oldest first, so a decision for one of them
    reads ``too_late`` and any other id ``unknown_review``).
    """

    def __init__(
        self,
        inp: SessionInput,
        *,
        set_status: Callable[[SessionStatus], None],
        show: Callable[[], None],
        warn: Callable[..., None] | None = None,
    ) -> None:
        self._inp = inp
        self._set_status = set_status
        self._show = show
        self._warn = warn or workflow.logger.warning
        #: Reviews waited on: id -> {operation, target, preview}.
        self.open: dict[str, dict[str, Any]] = {}
        # Review ids handed to `authorize` whose verdict is not back yet: the review row
        # is visible (API, CLI) as soon as that activity commits, so a decision can
        # arrive before the wait opens it; it is kept for the wait to find.
        self._expected: set[str] = set()
        self._decisions: dict[str, ReviewDecision] = {}
        self.late: list[LateDecision] = list(inp.late_decisions)
        self.settled: dict[str, None] = dict.fromkeys(inp.settled_reviews)
        #: Each review's deadline, fixed before `authorize` opens it (the row stores it):
        #: a decision received later is too late, whenever the review's timer fires.
        self.expiry: dict[str, datetime] = {}
        #: A newer message interrupted the turn (if_busy=interrupt): every review it
        #: waits on, or would open, settles `withdrawn` until the next turn starts.
        self.withdrawing = False
        # Allowed calls a proven reviewer edited: review id -> the settled result with the
        # edit (an invoke's prompt, a create's name and instructions) and who edited.
        self._edits: dict[str, SettleResult] = {}

    def expect(self, review_id: str) -> datetime:
        """Fix the deadline of a review about to be asked for (``review_timeout_s`` from
        now) and accept decisions for it from now on; returns the deadline."""
        expiry = workflow.now() + timedelta(seconds=self._inp.config.review_timeout_s)
        self.expiry[review_id] = expiry
        self._expected.add(review_id)
        return expiry

    def asked(self, review_id: str, *, opened: bool) -> None:
        """``authorize`` answered: a review was ``opened`` (the wait follows), or none was
        needed and what was kept for it goes."""
        self._expected.discard(review_id)
        if not opened:
            self._decisions.pop(review_id, None)
            self.expiry.pop(review_id, None)

    def withdraw(self, on: bool = True) -> None:
        """Withdraw the running turn's reviews (a newer message interrupted it): each wait
        ends now, settled ``withdrawn`` unless a decision came first; ``on=False`` when
        the next turn starts."""
        self.withdrawing = on

    def decide(self, raw: Any) -> None:
        """Signal ``review_decision``: the first decision received by the review's deadline
        (its signed ``received_at``; a raw Signal's is now) wins. Every other one changes
        nothing and is kept in :attr:`late`: ``too_late`` after the review's outcome or
        received past its deadline, ``unknown_review`` naming no review of this session,
        ``invalid_decision`` when the argument is no decision. Never raises."""
        decision = from_signal(ReviewDecision, raw)
        if decision is None:
            named = raw.get("review_id") if isinstance(raw, dict) else None
            self._late(str(named or "")[:80], None, "invalid_decision")
            return
        rid = decision.review_id
        open_ = rid in self.open or rid in self._expected
        if open_ and rid not in self._decisions:
            expiry = self.expiry.get(rid)
            received = decision.received_at or workflow.now()
            if expiry is None or review_in_time(received, expiry):
                self._decisions[rid] = decision
                return
        known = open_ or rid in self.settled
        self._late(rid, decision.decision, "too_late" if known else "unknown_review")

    def _late(self, review_id: str, decision: Decision | None, reason: LateReason) -> None:
        """Keep a decision that changed nothing (the newest MAX_LATE_DECISIONS)."""
        self._warn("review %s: decision %s ignored (%s)", review_id, decision, reason)
        self.late.append(LateDecision(review_id=review_id, decision=decision, reason=reason))
        del self.late[:-MAX_LATE_DECISIONS]  # keep the newest: the sender asks next

    async def wait(
        self,
        tool: ToolMessage,
        review_id: str,
        target: str | None,
        preview: str,
        *,
        then: XAgentCall | None = None,
    ) -> ToolOutcome | None:
        """Wait for a decision until the review's timeout, then settle it exactly once
        (``settle_review``, a local activity).

        Returns None when the operation may proceed, else its tool result: the refusal's,
        or that of ``then``, which ``settle_review`` ran once the review was allowed.
        """
        operation = OPERATION_OF[tool.call.name]
        self.open[review_id] = {"operation": operation, "target": target, "preview": preview}
        timeout = self._inp.config.review_timeout_s
        self._set_status("awaiting_input")
        self._show()  # a second review while one waits changes no status
        # The timer runs the whole timeout from here, a little past the deadline (by how
        # long `authorize` took), and the delivery grace on top: the Signal handler refuses
        # whatever is received after the deadline, so the timer only bounds the wait, and a
        # decision received in time whose Signal lands after the deadline still counts.
        # One timer as before, only longer: no other command, so no patch gate.
        wait_s = timeout + self._inp.config.review_delivery_grace_s
        try:
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: review_id in self._decisions or self.withdrawing,
                    timeout=timedelta(seconds=wait_s),
                    timeout_summary=f"review {operation}" + (f" → {target}" if target else ""),
                )
        except asyncio.CancelledError:
            # The session was cancelled or the turn failed: whoever ended it cancels the
            # row (audited); here it is no longer waited on, and a decision is too late.
            self._forget(review_id)
            raise
        decision, outcome = self._close(review_id)
        settle = SettleInput(
            tool=tool,
            review_id=review_id,
            operation=operation,
            target=target,
            outcome=outcome,
            decision=decision,
            timeout_s=timeout,
            auth=self._inp.config.auth,
            then=then,
        )
        # A local activity: the decision's workflow task records the outcome and schedules
        # what follows, one server round trip fewer between decision and resumed turn.
        # Durable all the same: its result is a marker in history.
        settled: SettleResult = await local(
            XAgentActivities.settle_review, settle, self._inp.config, summary=f"review {outcome}"
        )
        if settled.ran is not None:
            return settled.ran
        if settled.edited_prompt is not None or settled.edited_agent is not None:
            self._edits[review_id] = settled
        return None if settled.allowed else settled.outcome

    def take_edit(self, review_id: str) -> SettleResult | None:
        """The settled result of an allowed call a reviewer edited (``edited_prompt`` and
        ``edited_by`` of an invoke, ``edited_agent`` of a create), once."""
        return self._edits.pop(review_id, None)

    def _close(self, review_id: str) -> tuple[ReviewDecision | None, ReviewOutcome]:
        """Fix a review's outcome: the decision the Signal handler took (received by the
        deadline: it counts even when handled with the timer, delivered late while the
        worker was down), else ``withdrawn`` when an interrupt withdrew it, else
        ``timed_out``. A decision arriving after is too late."""
        decision = self._decisions.get(review_id)
        outcome: ReviewOutcome = "timed_out"
        if decision is not None:
            outcome = "denied" if decision.decision == "deny" else "allowed"
        elif self.withdrawing:
            outcome = "withdrawn"
        del self.open[review_id]
        self.expiry.pop(review_id, None)
        self._decisions.pop(review_id, None)
        self.settled[review_id] = None
        while len(self.settled) > MAX_SETTLED_REVIEWS:
            del self.settled[next(iter(self.settled))]
        if not self.open:
            self._set_status("running")
        self._show()
        return decision, outcome

    def _forget(self, review_id: str) -> None:
        """A review whose wait was cancelled: no longer open, settled for the Signal
        handler (a decision for it is ``too_late``)."""
        self.open.pop(review_id, None)
        self.expiry.pop(review_id, None)
        self._decisions.pop(review_id, None)
        self.settled[review_id] = None
        while len(self.settled) > MAX_SETTLED_REVIEWS:
            del self.settled[next(iter(self.settled))]

    def pending(self) -> list[dict[str, Any]]:
        """Reviews waited on: ``[{review_id, operation, target, preview}]``."""
        return [dict(v, review_id=k) for k, v in self.open.items()]
