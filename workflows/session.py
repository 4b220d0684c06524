"""SessionWorkflow: one conversation with one pinned agent revision (docs/sessions.md).

Messages arrive by Update ``send_message`` (rejected with ``session_busy``
while a turn runs). Each model call is the ``model_turn`` activity and each tool
call an activity; the transcript stays in the DB and history carries only ids,
previews and tool calls. The session continues-as-new when Temporal suggests it,
once every handler has finished, carrying the agent snapshot and turn counter.

A run that has been idle for ``config.idle_timeout_s`` stores the same carried state
on the session row (``record_resume``) and completes, so RUNNING in Temporal means a
turn, review or external call is in flight and an idle session holds no worker
memory; the next message starts the next run under the same workflow id
(update-with-start, :func:`baton.runs.launch.deliver_update`). The workflow's current
details (Temporal UI) say what an operator wants to see now.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities.delegate import DelegationActivities
    from activities.turns import SessionActivities
    from baton.contracts import (
        INVALID_PROMPT,
        MAX_LATE_DECISIONS,
        MAX_MESSAGE_CHARS,
        SA_AGENT,
        SA_STATUS,
        SESSION_BUSY,
        SESSION_CLOSED,
        SESSION_EXTERNAL,
        SESSION_PATCH_LEVEL,
        LateDecision,
        LoadAgentInput,
        ResolvedAgent,
        ResumePoint,
        ReviewDecision,
        SessionInput,
        SessionStatus,
        StatusChange,
        TurnOutcome,
        Usage,
        UserMessage,
        position,
    )
    from workflows.options import (
        STORE_RETRY,
        store_timeout,
    )


from workflows.dispatch import DispatchMixin
from workflows.session_base import (
    PATCH_CALL_CAP,
    PATCH_CANCEL_TURN,
    PATCH_CASCADE,
    PATCH_IDLE_COMPLETE,
    PATCH_LOAD_FAILED,
    PATCH_LOCAL_LOAD,
    PATCH_ROUTING,
    error_cause,
)


@workflow.defn(name="Session")
class SessionWorkflow(DispatchMixin):
    """A durable conversation. Input: :class:`SessionInput`; result: the final status."""

    @workflow.init
    def __init__(self, inp: SessionInput) -> None:
        self._inp = inp
        self._agent: ResolvedAgent | None = inp.agent
        self._turn = inp.turn
        self._busy = False
        self._closed = False
        self._status: SessionStatus = "idle"
        self._turn_task: asyncio.Task[Any] | None = None
        self._invoked_turn = False
        # Whose permissions this turn's X-Agent calls use (auth mode): the message's sender.
        self._turn_user = inp.provenance.created_by_user
        # Reviews this run is waiting on (id -> summary), and the decisions received.
        self._open_reviews: dict[str, dict[str, Any]] = {}
        # Review ids handed to `authorize` whose verdict is not back yet: the review row
        # is visible (API, CLI) as soon as that activity commits, so a decision can
        # arrive before `_review` opens it; it is kept for `_review` to find.
        self._expected_reviews: set[str] = set()
        self._decisions: dict[str, ReviewDecision] = {}
        # Both carried across continue-as-new, bounded (issue 10, item 9): the decisions
        # that changed nothing, and the reviews settled here (an ordered set, oldest first)
        # so a decision for one of them reads too_late and any other id unknown_review.
        self._late_decisions: list[LateDecision] = list(inp.late_decisions)
        self._settled_reviews: dict[str, None] = dict.fromkeys(inp.settled_reviews)
        # What the current details show (workflow metadata: no command, no patch needed).
        self._review_deadlines: dict[str, str] = {}
        self._last_message = ""
        self._completed_idle = False
        self._ended: SessionStatus | None = None

    @workflow.run
    async def run(self, inp: SessionInput) -> str:
        """Load the pinned agent once, answer messages, continue-as-new when suggested."""
        try:
            if self._agent is None:
                load = LoadAgentInput(session_id=inp.session_id, agent_pin=inp.agent_pin)
                if self._patched(PATCH_LOCAL_LOAD):
                    # A local activity: it runs inside the first workflow task, so the first
                    # model turn is scheduled by that same task instead of one more server
                    # round trip (issue 14). Still durable: its result is a history marker.
                    self._agent = await self._local(
                        SessionActivities.load_agent, load, summary=f"load {inp.agent_pin}"
                    )
                else:
                    self._agent = await workflow.execute_activity_method(
                        SessionActivities.load_agent,
                        load,
                        start_to_close_timeout=store_timeout(self._inp.config),
                        retry_policy=STORE_RETRY,
                        summary=f"load {inp.agent_pin}",
                    )
            if inp.first_message is not None:
                # A failed first turn is recorded in the transcript; the session stays open.
                with contextlib.suppress(ApplicationError):
                    await self._answer(inp.first_message)
            if not await self._serve():
                return "idle"
        except asyncio.CancelledError:
            self._closed = True
            self._ended = "cancelled"
            if self._patched(PATCH_CANCEL_TURN):
                # Cancel the Update's running turn too (handlers are separate tasks), so no
                # model call or tool runs after the cancel and `cancelled` is the last event.
                turn = self._turn_task
                if turn is not None and not turn.done():
                    turn.cancel()
                await workflow.wait_condition(lambda: not self._busy)
                self._set_status("cancelled")
            await workflow.execute_activity_method(
                SessionActivities.set_status,
                StatusChange(session_id=inp.session_id, status="cancelled"),
                start_to_close_timeout=store_timeout(self._inp.config),
                retry_policy=STORE_RETRY,
                summary="cancelled",
            )
            if self._patched(PATCH_CASCADE):
                # Every open session delegated from this one (sync or async, any depth).
                # Best effort: the session itself is cancelled whatever this reports.
                with contextlib.suppress(ActivityError):
                    await workflow.execute_activity_method(
                        DelegationActivities.cancel_delegations,
                        inp.session_id,
                        start_to_close_timeout=store_timeout(self._inp.config),
                        retry_policy=STORE_RETRY,
                        summary="cancel delegations",
                    )
            raise
        except ActivityError as err:
            # The pin no longer resolves (retired/deleted since launch): end the session.
            self._closed = True
            final: SessionStatus = "failed" if self._patched(PATCH_LOAD_FAILED) else "idle"
            self._ended = "failed"
            self._last_message = f"{inp.agent_pin} cannot run: {error_cause(err)}"
            self._show()
            await self._fail(self._inp.session_id + ":load", "000000.000.3000", err, final)
            return "failed"
        # 👉 Let in-flight handlers finish so no Update is lost across continue-as-new.
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(self._next_input())

    def _next_input(self) -> SessionInput:
        """The input of this session's next run: continue-as-new, or the resume point
        stored when the run completes idle (the same carried state either way)."""
        inp = self._inp
        return SessionInput(
            session_id=inp.session_id,
            agent_pin=inp.agent_pin,
            provenance=inp.provenance,
            config=inp.config,
            agent=self._agent,
            turn=self._turn,
            team=inp.team,
            # Payloads only: the command sequence is unchanged, so no patch is needed.
            late_decisions=self._late_decisions,
            settled_reviews=list(self._settled_reviews),
            # The next run starts under this code, which has every patch of this level.
            patch_level=SESSION_PATCH_LEVEL,
        )

    def _working(self) -> bool:
        """A turn, an external call or any other handler is in flight (not idle)."""
        return self._busy or bool(self._external_calls) or not workflow.all_handlers_finished()

    async def _serve(self) -> bool:
        """Wait until this run should end: True to continue-as-new, False to complete idle.

        Idle means no handler in flight for ``idle_timeout_s`` seconds in a row (issue 12,
        item 2; the clock restarts after every turn). Before completing, the carried
        state goes to the session row (``record_resume``); a message that arrived
        meanwhile keeps the run going. One that arrives while the completion is in
        flight makes the server refuse it (unhandled message), so this runs again with
        the message; one that arrives after finds the run closed and starts the next
        (update-with-start). Runs started before this patch wait forever, as they did.
        """
        idle = self._inp.config.idle_timeout_s
        if idle is None or not self._patched(PATCH_IDLE_COMPLETE):
            await workflow.wait_condition(lambda: self._should_continue_as_new() and not self._busy)
            return True
        while True:
            # No idle timer while something is in flight: a long turn or review is not idle.
            await workflow.wait_condition(lambda: not self._working())
            if self._should_continue_as_new():
                return True
            try:
                await workflow.wait_condition(
                    lambda: self._working() or self._should_continue_as_new(),
                    timeout=timedelta(seconds=idle),
                    timeout_summary="idle",
                )
                continue
            except TimeoutError:
                pass
            if self._working():
                continue
            carried = self._next_input()
            try:
                await workflow.execute_activity_method(
                    SessionActivities.record_resume,
                    ResumePoint(input=carried, task_queue=workflow.info().task_queue),
                    start_to_close_timeout=store_timeout(self._inp.config),
                    retry_policy=STORE_RETRY,
                    summary="idle: store the resume point",
                )
            except ActivityError:
                continue  # the DB kept refusing: stay up and try again after another idle spell
            # 👉 A message, call or signal that came in during the write keeps the run going
            # (and made the stored point stale: it is written again after the next idle spell).
            if self._working() or self._next_input() != carried:
                continue
            self._completed_idle = True
            self._show()
            if workflow.info().typed_search_attributes.get(SA_AGENT) is not None:
                # Operators find the sessions whose run completed idle: BatonStatus = 'idle'.
                workflow.upsert_search_attributes([SA_STATUS.value_set("idle")])
            return False

    def _should_continue_as_new(self) -> bool:
        limit = self._inp.config.continue_as_new_after_turns
        if limit is not None and self._turn - self._inp.turn >= limit:
            return True
        return workflow.info().is_continue_as_new_suggested()

    @workflow.query(name="status")
    def status(self) -> str:
        """running | idle | awaiting_input (| cancelled once closed)."""
        return "cancelled" if self._closed else self._status

    @workflow.query(name="pending_reviews")
    def pending_reviews(self) -> list[dict[str, Any]]:
        """Reviews this session waits on: ``[{review_id, operation, target, preview}]``."""
        return [dict(v, review_id=k) for k, v in self._open_reviews.items()]

    @workflow.query(name="late_decisions")
    def late_decisions(self) -> list[dict[str, Any]]:
        """The newest (≤ MAX_LATE_DECISIONS) decisions that changed nothing, oldest first:
        ``[{review_id, decision, reason: too_late | unknown_review}]`` (issue 10, item 9)."""
        return [d.model_dump() for d in self._late_decisions]

    @workflow.signal(name="review_decision")
    def review_decision(self, decision: ReviewDecision) -> None:
        """A human's decision on an open review (docs/xagent.md, Reviews).

        The first decision for an open review wins; one that arrives after the
        review's outcome (decided or timed out) changes nothing and is kept in
        ``late_decisions`` as ``too_late``, one naming no review of this session as
        ``unknown_review``, so the sender can be told. Who decided is not checked
        here (workflows cannot read the secret): ``settle_review`` verifies the proof.
        """
        rid = decision.review_id
        open_ = rid in self._open_reviews or rid in self._expected_reviews
        if open_ and rid not in self._decisions:
            self._decisions[rid] = decision
            return
        known = open_ or rid in self._settled_reviews
        reason = "too_late" if known else "unknown_review"
        workflow.logger.warning(
            "review %s: decision %s ignored (%s)", rid, decision.decision, reason
        )
        self._late_decisions.append(
            LateDecision(review_id=rid, decision=decision.decision, reason=reason)
        )
        del self._late_decisions[:-MAX_LATE_DECISIONS]  # keep the newest: the sender asks next

    # A cancel deliberately abandons the running turn; its client gets an error, not a hang.
    @workflow.update(
        name="send_message", unfinished_policy=workflow.HandlerUnfinishedPolicy.ABANDON
    )
    async def send_message(self, msg: UserMessage) -> TurnOutcome:
        """Run one user message to its final assistant message (tool loops included)."""
        if self._busy:  # two Updates validated in one task: only the first runs
            raise ApplicationError(
                "a turn is already running", type=SESSION_BUSY, non_retryable=True
            )
        return await self._answer(msg)

    @send_message.validator
    def _validate_send(self, msg: UserMessage) -> None:
        if self._closed:
            raise ApplicationError("the session is closed", type=SESSION_CLOSED)
        if self._inp.provenance.external:  # issue 13: its turns are taken outside Baton
            raise ApplicationError(
                "this session is external: an outside process takes its turns, so no "
                "model turn runs here",
                type=SESSION_EXTERNAL,
            )
        if self._busy:
            raise ApplicationError(
                "a turn is already running; wait for it to finish", type=SESSION_BUSY
            )
        if not msg.prompt.strip() or len(msg.prompt) > MAX_MESSAGE_CHARS:
            raise ApplicationError(
                f"prompt must be 1..{MAX_MESSAGE_CHARS} characters", type=INVALID_PROMPT
            )

    async def _answer(self, msg: UserMessage) -> TurnOutcome:
        self._turn_task = asyncio.current_task()
        self._busy = True
        # Gamut X-Agent, one-hop: a turn another agent sent (or any turn of an invoked session).
        self._invoked_turn = bool(self._inp.provenance.invoked_by_agent or msg.invoked_by_agent)
        self._turn_user = msg.user or self._inp.provenance.created_by_user
        self._last_message = f"{msg.invoked_by_agent or self._turn_user}: {msg.prompt}"
        self._set_status("running")
        try:
            await workflow.wait_condition(lambda: self._agent is not None)
            assert self._agent is not None
            self._turn += 1
            outcome = await self._turn_loop(self._agent, self._turn, msg)
            self._last_message = f"{self._agent.slug}: {outcome.preview}"
            return outcome
        except ApplicationError as err:
            self._last_message = f"turn {self._turn} failed: {err.message}"
            raise
        finally:
            self._busy = False
            self._set_status("idle")
            self._show()  # the last message changed even when the status did not

    async def _turn_loop(self, agent: ResolvedAgent, turn: int, msg: UserMessage) -> TurnOutcome:
        sid = self._inp.session_id
        cfg = self._inp.config
        prefix = f"{sid}:t{turn}"
        usage = Usage()
        user: str | None = msg.prompt  # stored with the first model call of the turn
        routable = self._may_route(agent, msg) and self._patched(PATCH_ROUTING)
        if routable and await self._route(agent, turn, msg):
            user = None  # stored by the route, with the routed call and its result
        for step in range(1, cfg.max_steps_per_message + 1):
            try:
                result = await self._model_turn(agent, turn, step, user)
            except ActivityError as err:
                if self._closed:  # cancelled by the session's cancel: nothing to record
                    raise
                await self._fail(f"{prefix}:s{step}:error", position(turn, step, 3), err)
                raise ApplicationError(
                    f"turn {turn} failed: {error_cause(err)}",
                    type="turn_failed",
                    non_retryable=True,
                ) from err
            user = None
            usage = usage + result.usage
            if not result.tool_calls:
                return TurnOutcome(
                    message_id=result.message_id,
                    preview=result.preview,
                    preview_is_full=result.preview_is_full,
                    usage=usage,
                )
            # Several tool calls in one model response run in parallel, up to a cap: each
            # holds worker slots (a sync delegation for as long as its child runs).
            capped = self._patched(PATCH_CALL_CAP)
            await asyncio.gather(
                *(
                    self._dispatch(agent, turn, step, i, call)
                    if not capped or i < self._inp.config.max_tool_calls_per_reply
                    else self._too_many(agent, turn, step, i, call)
                    for i, call in enumerate(result.tool_calls)
                )
            )
        error = f"stopped after {cfg.max_steps_per_message} model calls for one message"
        await self._fail_text(f"{prefix}:limit", position(turn, 999, 3), error)
        raise ApplicationError(error, type="step_limit", non_retryable=True)

    # --- X-Agent tools (Gamut X-Agent) and policy reviews (Gamut X-Agent Policies) ----------------

    # --- External sessions: X-Agent calls of an outside process over MCP (issue 13) ----
    # An external session's turns are taken outside Baton (docs/mcp.md). Each MCP tool call
    # arrives as an Update and runs through `_dispatch`, the very path of a model's tool
    # call (guards → authorize → review → delegate / xagent_tool), under a message id the
    # workflow chooses: durable, audited, in the Temporal UI and in the transcript. These
    # handlers only ever run for Updates sent by new code, so no in-flight run changes.
