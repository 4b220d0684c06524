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

The class owns the run's state and its handlers; collaborators do the work with explicit
inputs (a :class:`~workflows.context.TurnContext` per turn): ``turn``, ``dispatch``, ``xagent``,
``reviews``, ``delegation``, ``external``, ``idle``, ``lifecycle``, ``status``, ``inbox``.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from baton.contracts.activity_io import ToolOutcome
    from baton.contracts.codes import INVALID_PROMPT, SESSION_CLOSED, SESSION_EXTERNAL
    from baton.contracts.values import MAX_MESSAGE_CHARS, ResolvedAgent, SessionStatus, ToolCall
    from baton.contracts.workflow_io import (
        EXTERNAL_MESSAGE,
        EXTERNAL_TOOL_CALL,
        ExternalMessage,
        ExternalMessageOutcome,
        ExternalToolCall,
        SessionInput,
        TurnOutcome,
        UserMessage,
    )

from workflows import external, idle, lifecycle, turn
from workflows.calls import store_status
from workflows.context import TurnContext
from workflows.dispatch import dispatch
from workflows.inbox import Inbox
from workflows.reviews import Reviews
from workflows.status import publish_status, session_details


@workflow.defn(name="Session")
class SessionWorkflow:
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
        self._external_calls = 0  # in flight: the session is idle again after the last
        self._reviews = Reviews(inp, set_status=self._set_status, show=self._show)
        busy, closed = (lambda: self._busy), (lambda: self._closed)
        self._inbox = Inbox(
            inp.config.max_queued_messages, busy=busy, closed=closed, reviews=self._reviews
        )
        self._last_message = ""
        self._completed_idle = False
        self._ended: SessionStatus | None = None

    @workflow.run
    async def run(self, inp: SessionInput) -> str:
        """Load the pinned agent once, answer messages, continue-as-new when suggested."""
        try:
            if self._agent is None:
                self._agent = await lifecycle.load_agent(inp)
            if inp.first_message is not None:
                # A failed first turn is recorded in the transcript; the session stays open.
                with contextlib.suppress(ApplicationError):
                    await self._answer(inp.first_message)
            if not await idle.serve(
                inp, working=self._working, due=self._due, carried=self._next_input
            ):
                self._completed_idle = True
                self._show()
                return "idle"
        except asyncio.CancelledError:
            await self._cancel()
            raise
        except ActivityError as err:
            # The pin no longer resolves (retired/deleted since launch): end the session.
            self._closed = True
            self._ended = "failed"
            self._last_message = lifecycle.unloadable(inp, err)
            self._show()
            await lifecycle.record_unloadable(inp, err)
            return "failed"
        # Let in-flight handlers finish so no Update is lost across continue-as-new.
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(self._next_input())

    async def _cancel(self) -> None:
        """Cancel the running turn too (handlers are separate tasks), so no model call or
        tool runs after the cancel and ``cancelled`` is the last event; then record it."""
        self._closed = True
        self._ended = "cancelled"
        running = self._turn_task
        if running is not None and not running.done():
            running.cancel()
        await workflow.wait_condition(lambda: not self._busy)
        self._set_status("cancelled")
        await lifecycle.record_cancel(self._inp)

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
            late_decisions=self._reviews.late,
            settled_reviews=list(self._reviews.settled),
        )

    def _working(self) -> bool:
        """A turn, an external call or any other handler is in flight (not idle)."""
        return self._busy or bool(self._external_calls) or not workflow.all_handlers_finished()

    def _due(self) -> bool:
        return idle.continue_as_new_due(self._inp, self._turn)

    def _context(self, agent: ResolvedAgent, invoked: bool, user: str) -> TurnContext:
        return TurnContext(
            inp=self._inp,
            agent=agent,
            turn=self._turn,
            user=user,
            invoked=invoked,
            closed=lambda: self._closed,
            interrupted=lambda: self._inbox.interrupting,
            model_call=self._inbox.model_call,
        )

    def _set_status(self, status: SessionStatus) -> None:
        if status == self._status:
            return
        self._status = status
        self._show()
        publish_status(status)

    def _show(self) -> None:
        """Set the current details the Temporal UI shows (workflow metadata, no command)."""
        workflow.set_current_details(
            session_details(
                state=self._ended or self._status,
                pin=self._agent.pin if self._agent else self._inp.agent_pin,
                turn=self._turn,
                completed_idle=self._completed_idle,
                reviews=self._reviews.open,
                expiry=self._reviews.expiry,
                last_message=self._last_message,
            )
        )

    @workflow.query(name="status")
    def status(self) -> str:
        """running | idle | awaiting_input (| cancelled once closed)."""
        return "cancelled" if self._closed else self._status

    @workflow.query(name="pending_reviews")
    def pending_reviews(self) -> list[dict[str, Any]]:
        """Reviews this session waits on: ``[{review_id, operation, target, preview}]``."""
        return self._reviews.pending()

    @workflow.query(name="late_decisions")
    def late_decisions(self) -> list[dict[str, Any]]:
        """The newest (≤ MAX_LATE_DECISIONS) decisions that changed nothing, oldest first:
        ``[{review_id, decision (None when invalid), reason: too_late | unknown_review |
        invalid_decision}]``."""
        return [d.model_dump() for d in self._reviews.late]

    @workflow.signal(name="review_decision")
    def review_decision(self, raw: Any) -> None:
        """A human's decision on an open review (docs/xagent.md, Reviews); ``raw``: the
        JSON of a :class:`~baton.contracts.ReviewDecision`, parsed by
        :meth:`Reviews.decide <workflows.reviews.Reviews.decide>` (a Signal handler never
        raises). Who decided is not checked here (workflows cannot read the secret):
        ``settle_review`` verifies the proof."""
        self._reviews.decide(raw)

    # A cancel deliberately abandons the running turn; its client gets an error, not a hang.
    @workflow.update(
        name="send_message", unfinished_policy=workflow.HandlerUnfinishedPolicy.ABANDON
    )
    async def send_message(self, msg: UserMessage) -> TurnOutcome:
        """Run one user message to its final reply, now or when its turn comes (inbox)."""
        return await self._inbox.take(msg, self._answer)

    @send_message.validator
    def _validate_send(self, msg: UserMessage) -> None:
        if self._closed:
            raise ApplicationError("the session is closed", type=SESSION_CLOSED)
        if self._inp.provenance.external:  # its turns are taken outside Baton
            raise ApplicationError(
                "this session is external: an outside process takes its turns, so no "
                "model turn runs here",
                type=SESSION_EXTERNAL,
            )
        self._inbox.check(msg)
        if not msg.prompt.strip() or len(msg.prompt) > MAX_MESSAGE_CHARS:
            raise ApplicationError(
                f"prompt must be 1..{MAX_MESSAGE_CHARS} characters", type=INVALID_PROMPT
            )

    async def _answer(self, msg: UserMessage) -> TurnOutcome:
        self._turn_task = asyncio.current_task()
        self._busy = True
        # Gamut X-Agent, one hop: a turn another agent sent (or any turn of an invoked session).
        invoked = bool(self._inp.provenance.invoked_by_agent or msg.invoked_by_agent)
        user = msg.user or self._inp.provenance.created_by_user
        self._last_message = f"{msg.invoked_by_agent or user}: {msg.prompt}"
        self._set_status("running")
        try:
            await workflow.wait_condition(lambda: self._agent is not None)
            assert self._agent is not None
            self._turn += 1
            ctx = self._context(self._agent, invoked, user)
            outcome = await turn.answer(ctx, self._reviews, msg)
            self._last_message = f"{self._agent.slug}: {outcome.preview}"
            return outcome
        except ApplicationError as err:
            self._last_message = f"turn {self._turn} failed: {err.message}"
            raise
        finally:
            self._busy = False
            self._set_status("idle")
            self._show()  # the last message changed even when the status did not

    @workflow.update(
        name=EXTERNAL_TOOL_CALL, unfinished_policy=workflow.HandlerUnfinishedPolicy.ABANDON
    )
    async def external_tool_call(self, req: ExternalToolCall) -> ToolOutcome:
        """Run one X-Agent tool call of the external process; its result is stored as the
        tool message ``<session>:t<n>:s1:tool0`` (``ok`` false for a refusal).

        The one-hop rule follows the session's provenance (Gamut X-Agent): an external
        session another agent started cannot invoke. Calls may run in parallel, each its
        own turn number.
        """
        await workflow.wait_condition(lambda: self._agent is not None)
        assert self._agent is not None
        self._turn += 1
        self._external_calls += 1
        prov = self._inp.provenance
        ctx = self._context(self._agent, bool(prov.invoked_by_agent), prov.created_by_user)
        self._set_status("running")
        try:
            call = ToolCall(id=req.call_id, name=req.name, args=req.args)
            return await dispatch(ctx, self._reviews, 1, 0, call)
        finally:
            self._external_calls -= 1
            if not self._external_calls and not self._closed:
                self._set_status("idle")
                # A review set the stored status; nothing else ends this "turn".
                await store_status(self._inp.session_id, "idle", self._inp.config)

    @external_tool_call.validator
    def _validate_external_call(self, req: ExternalToolCall) -> None:
        external.check_external_call(self._inp, self._closed, req)

    @workflow.update(name=EXTERNAL_MESSAGE)
    async def external_message(self, msg: ExternalMessage) -> ExternalMessageOutcome:
        """Store a message the external process posts (``assistant``: what it did; ``user``:
        what it was asked) as turn ``n``'s message, so other agents read it in the transcript."""
        await workflow.wait_condition(lambda: self._agent is not None)
        assert self._agent is not None
        self._turn += 1
        return await external.record_message(self._inp, self._agent.slug, self._turn, msg)

    @external_message.validator
    def _validate_external_message(self, msg: ExternalMessage) -> None:
        external.check_external_message(self._inp, self._closed, msg)
