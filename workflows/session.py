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
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from activities.delegate import DelegationActivities
    from activities.external import ExternalActivities
    from activities.mcp_tools import McpToolActivities
    from activities.turns import SessionActivities
    from activities.xagent import XAgentActivities
    from baton.contracts import (
        DELEGATION_TOOLS,
        EXTERNAL_MESSAGE,
        EXTERNAL_TOOL_CALL,
        INVALID_PROMPT,
        MAX_LATE_DECISIONS,
        MAX_MESSAGE_CHARS,
        MAX_SETTLED_REVIEWS,
        NOT_EXTERNAL,
        OPERATION_OF,
        SA_AGENT,
        SA_STATUS,
        SESSION_BUSY,
        SESSION_CLOSED,
        SESSION_EXTERNAL,
        UNKNOWN_TOOL,
        XAGENT_ARGS,
        XAGENT_TOOLS,
        AuthorizeInput,
        DelegateInput,
        DelegateToArgs,
        DelegationOffer,
        ExternalMessage,
        ExternalMessageInput,
        ExternalMessageOutcome,
        ExternalToolCall,
        InvokeAgentArgs,
        LateDecision,
        LoadAgentInput,
        McpToolInput,
        McpToolSnapshot,
        ModelTurnInput,
        ModelTurnResult,
        RefusalInput,
        ResolvedAgent,
        ResolvedLimits,
        ResumePoint,
        ReviewDecision,
        ReviewOutcome,
        RouteInput,
        SessionConfig,
        SessionInput,
        SessionStatus,
        SettleInput,
        SettleResult,
        StatusChange,
        TaskArgs,
        ToolCall,
        ToolInput,
        ToolMessage,
        ToolOutcome,
        TurnFailure,
        TurnOutcome,
        Usage,
        UserMessage,
        Via,
        XAgentCall,
        cross_agent_guard,
        delegated_session_id,
        position,
    )
    from workflows.options import (
        DELEGATE_RETRY,
        STORE_RETRY,
        heartbeat_timeout,
        model_retry,
        store_timeout,
        tool_timeout,
    )


#: Patch ids (workflow.patched): each gates a command change for runs already in flight.
PATCH_COARSE_STATUS = "coarse-status-search-attribute"
PATCH_CANCEL_TURN = "cancel-cancels-running-turn"
PATCH_LOAD_FAILED = "unloadable-pin-fails-session"
PATCH_XAGENT = "x-agent-tools"
PATCH_DELEGATION = "delegation-tools"
PATCH_CASCADE = "cancel-cascades-to-delegations"
PATCH_ROUTING = "team-routes-and-mentions"
PATCH_CALL_CAP = "cap-tool-calls-per-reply"
PATCH_ONE_DECISION = "one-decision-every-cross-agent-path"
PATCH_MCP_TOOLS = "mcp-server-tools"
PATCH_LOCAL_LOAD = "load-agent-local-activity"
PATCH_LOCAL_SETTLE = "settle-review-local-activity"
PATCH_IDLE_COMPLETE = "idle-session-completes"

#: Characters of the last message shown in the current details.
DETAILS_PREVIEW = 80


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
                if workflow.patched(PATCH_LOCAL_LOAD):
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
            if workflow.patched(PATCH_CANCEL_TURN):
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
            if workflow.patched(PATCH_CASCADE):
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
            final: SessionStatus = "failed" if workflow.patched(PATCH_LOAD_FAILED) else "idle"
            self._ended = "failed"
            self._last_message = f"{inp.agent_pin} cannot run: {_cause(err)}"
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
        if idle is None or not workflow.patched(PATCH_IDLE_COMPLETE):
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

    def _set_status(self, status: SessionStatus) -> None:
        if status == self._status:
            return
        self._status = status
        self._show()
        attrs = workflow.info().typed_search_attributes
        # Upsert only where the starter set Baton's attributes (so they are registered):
        # an unregistered attribute would fail every workflow task and wedge the session.
        if attrs.get(SA_AGENT) is None:
            return
        if not workflow.patched(PATCH_COARSE_STATUS):
            # Runs started before the patch upserted every change; replay must match.
            workflow.upsert_search_attributes([SA_STATUS.value_set(status)])
            return
        # BatonStatus is coarse on purpose: "running" while the session is open, and
        # awaiting_input / cancelled when an operator must act or it ended. Flipping it
        # running <-> idle on every turn cost two visibility writes per turn (bench/);
        # the exact state is the `status` Query and the sessions table.
        searchable = "running" if status == "idle" else status
        if attrs.get(SA_STATUS) != searchable:
            workflow.upsert_search_attributes([SA_STATUS.value_set(searchable)])

    def _show(self) -> None:
        """Set the current details the Temporal UI shows (issue 12, item 3), in markdown:
        status, agent pin and turn; each open review with its deadline and the command
        that decides it; the last message. Workflow metadata, not a command: no patch."""
        pin = self._agent.pin if self._agent else self._inp.agent_pin
        state = self._ended or self._status
        lines = [f"**{state}** · `{pin}` · turn {self._turn}"]
        if self._completed_idle:
            lines.append("- this run completed idle; the next message starts the next run")
        for rid, review in self._open_reviews.items():
            target = f" → {review['target']}" if review["target"] else ""
            lines.append(
                f"- review `{rid}`: {review['operation']}{target}, decide by "
                f"{self._review_deadlines.get(rid, '?')} (`baton reviews approve {rid}`)"
            )
        if self._last_message:
            text = " ".join(self._last_message.split())
            cut = text if len(text) <= DETAILS_PREVIEW else text[: DETAILS_PREVIEW - 1] + "…"
            lines.append(f"- last: {cut}")
        workflow.set_current_details("\n".join(lines))

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
        routable = self._may_route(agent, msg) and workflow.patched(PATCH_ROUTING)
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
                    f"turn {turn} failed: {_cause(err)}", type="turn_failed", non_retryable=True
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
            capped = workflow.patched(PATCH_CALL_CAP)
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

    def _tool_message(
        self, agent: ResolvedAgent, turn: int, step: int, index: int, call: ToolCall
    ) -> ToolMessage:
        return tool_message(self._inp.session_id, agent.slug, turn, step, index, call)

    def _dispatch(
        self, agent: ResolvedAgent, turn: int, step: int, index: int, call: ToolCall
    ) -> Awaitable[ToolOutcome]:
        """Route a tool call: X-Agent tools and delegations are the workflow's own; a tool
        the agent blocks, or any other, is an ordinary tool (which refuses unknown ones)."""
        if call.name not in agent.blocked_tools:
            if call.name in XAGENT_TOOLS and workflow.patched(PATCH_XAGENT):
                return self._xagent(agent, turn, step, index, call)
            if call.name in DELEGATION_TOOLS and workflow.patched(PATCH_DELEGATION):
                return self._delegation(agent, turn, step, index, call)
            # Issue 13: `<server>.<tool>` of the snapshot (only such names reach patched()).
            if "." in call.name and workflow.patched(PATCH_MCP_TOOLS):
                snap = next(
                    (t for t in agent.mcp_tools if t.name and t.qualified == call.name), None
                )
                if snap is not None:
                    return self._mcp_tool(agent, turn, step, index, call, snap)
        return self._tool(agent, turn, step, index, call)

    def _may_route(self, agent: ResolvedAgent, msg: UserMessage) -> bool:
        """Whether this message could be routed: a lead with team routes, or an @mention.

        Checked in the workflow so that ordinary turns pay no extra activity. Only turns a
        human sent are routed: a task another agent wrote is not an instruction to re-route
        (members and delegated sessions cannot re-delegate through a mention).
        """
        if self._invoked_turn:
            return False
        team = self._inp.team
        routes = (
            team is not None
            and bool(team.routes)
            and not self._inp.provenance.team_member
            and agent.slug == team.supervisor
        )
        return routes or "@" in msg.prompt

    async def _route(self, agent: ResolvedAgent, turn: int, msg: UserMessage) -> bool:
        """Execute a team route or an @mention: delegate the message straight to that
        agent, then the session's agent synthesises (docs/teams.md; the reference only
        stores routes). Returns whether the turn was routed."""
        sid = self._inp.session_id
        prefix = f"{sid}:t{turn}"
        decision = await workflow.execute_activity_method(
            DelegationActivities.route_turn,
            RouteInput(
                session_id=sid,
                agent_slug=agent.slug,
                prompt=msg.prompt,
                team=self._inp.team if not self._inp.provenance.team_member else None,
                user_message_id=f"{prefix}:user",
                user_position=position(turn, 0, 0),
                route_message_id=f"{prefix}:s0:assistant",
                route_position=position(turn, 0, 1),
                call_id=f"route_t{turn}",
            ),
            start_to_close_timeout=store_timeout(self._inp.config),
            retry_policy=STORE_RETRY,
            summary=f"route · turn {turn}",
        )
        if decision.call is None:
            return False
        # The routed call is step 0's only tool call.
        tool = self._tool_message(agent, turn, 0, 0, decision.call)
        try:
            await self._delegate(
                tool, turn, kind=decision.kind, target=decision.target, prompt=msg.prompt
            )
        except ActivityError as err:
            if self._closed:
                raise
            await self._refuse(tool, "delegation_failed", _cause(err), audit=False)
        return True

    async def _too_many(
        self, agent: ResolvedAgent, turn: int, step: int, index: int, call: ToolCall
    ) -> ToolOutcome:
        tool = self._tool_message(agent, turn, step, index, call)
        return await self._refuse(
            tool,
            "too_many_tool_calls",
            f"at most {self._inp.config.max_tool_calls_per_reply} tool calls run per reply; "
            "call the rest in your next reply",
            audit=False,
        )

    def _offer(self, agent: ResolvedAgent) -> DelegationOffer:
        """Which delegation tools this session offers (AgentX Agent Teams; Xema Agent Concepts
        subagents).

        A team run's supervisor gets delegate_to over the team's specialists (Solo is
        ignored: a team run is delegation); members never re-delegate; other sessions
        get the ad-hoc roster unless the deployment or the session (Solo) turns it off.
        """
        prov = self._inp.provenance
        cfg = self._inp.config
        team = self._inp.team
        lead = team is not None and not prov.team_member and agent.slug == team.supervisor
        adhoc = (
            cfg.allow_adhoc_delegation
            and team is None
            and not prov.team_member
            and not prov.disable_delegation
            # One hop (Gamut X-Agent) on every path: an invoked turn is offered no roster.
            and not (self._invoked_turn and workflow.patched(PATCH_ONE_DECISION))
        )
        return DelegationOffer(team=team if lead else None, adhoc=adhoc, task=bool(agent.subagents))

    def _run_limits(self, agent: ResolvedAgent) -> ResolvedLimits:
        """The run's limits: the root agent's, carried down every delegation."""
        return self._inp.provenance.run_limits or agent.limits

    @property
    def _root(self) -> str:
        return self._inp.provenance.root_session_id or self._inp.session_id

    async def _model_turn(
        self, agent: ResolvedAgent, turn: int, step: int, user: str | None
    ) -> ModelTurnResult:
        cfg = self._inp.config
        return await workflow.execute_activity_method(
            SessionActivities.model_turn,
            model_turn_input(
                self._inp.session_id,
                agent.slug,
                turn,
                step,
                cfg,
                user,
                delegation=self._offer(agent),
                run_root=self._root,
                token_budget=self._run_limits(agent).token_budget,
                max_output_tokens=cfg.max_output_tokens,
                provider_failures=cfg.model_provider_failures,
            ),
            start_to_close_timeout=timedelta(seconds=cfg.model_turn_timeout_s),
            heartbeat_timeout=heartbeat_timeout(cfg),
            retry_policy=model_retry(cfg),
            summary=f"turn {turn}" + (f".{step}" if step > 1 else "") + f" · {agent.pin}",
        )

    async def _tool(
        self, agent: ResolvedAgent, turn: int, step: int, index: int, call: ToolCall
    ) -> ToolOutcome:
        tool = self._tool_message(agent, turn, step, index, call)
        return await run_ordinary_tool(tool, agent.tools, f"turn {turn}", self._inp.config)

    # --- X-Agent tools (Gamut X-Agent) and policy reviews (Gamut X-Agent Policies) ----------------

    async def _xagent(
        self, agent: ResolvedAgent, turn: int, step: int, index: int, call: ToolCall
    ) -> ToolOutcome:
        """Guards, then ACL + policy (``authorize``), then a review wait, then the operation.

        docs/xagent.md: self-invocation and one-hop are refused before any policy;
        refusals go back to the model as tool errors.
        """
        tool = self._tool_message(agent, turn, step, index, call)
        operation = OPERATION_OF[call.name]
        try:
            args = XAGENT_ARGS[call.name].model_validate(call.args)
        except ValidationError as exc:
            return await self._refuse(tool, "invalid_arguments", _problems(exc), audit=False)
        target: str | None = getattr(args, "slug", None)
        if isinstance(args, InvokeAgentArgs):
            # The guards every cross-agent path passes (baton.permissions.gate.decide runs them
            # again in `authorize`); refused here, no review and no policy is consulted.
            guard = cross_agent_guard(
                via="invoke", caller=agent.slug, target=args.slug, invoked=self._invoked_turn
            )
            if guard is not None:
                return await self._refuse(tool, guard.code, guard.message, target=target)
        review_id = f"review-{workflow.uuid4()}"
        preview = args.prompt[:500] if isinstance(args, InvokeAgentArgs) else ""
        if call.name == "create_agent":
            preview = f"create agent '{call.args.get('name', '')}'"
        self._expected_reviews.add(review_id)
        try:
            verdict = await workflow.execute_activity_method(
                XAgentActivities.authorize,
                AuthorizeInput(
                    tool=tool,
                    user=self._turn_user,
                    operation=operation,
                    target=target,
                    review_id=review_id,
                    preview=preview,
                    auth=self._inp.config.auth,
                    invoked=self._invoked_turn,
                ),
                start_to_close_timeout=store_timeout(self._inp.config),
                retry_policy=STORE_RETRY,
                summary=f"authorize {operation}" + (f" → {target}" if target else ""),
            )
        except ActivityError as err:
            if self._closed:
                raise
            # Never leave a call without a result: the agent reads why and goes on.
            return await self._refuse(tool, "authorization_failed", _cause(err), audit=False)
        finally:
            self._expected_reviews.discard(review_id)
        if verdict.decision != "review":
            self._decisions.pop(review_id, None)
        if verdict.decision == "refused":
            assert verdict.outcome is not None
            return verdict.outcome
        if verdict.decision == "review":
            try:
                settled = await self._review(tool, review_id, operation, target, preview)
            except ActivityError as err:
                if self._closed:
                    raise
                return await self._refuse(tool, "review_failed", _cause(err), audit=False)
            if settled is not None:
                return settled
        try:
            if isinstance(args, InvokeAgentArgs):
                return await self._delegate(
                    tool,
                    turn,
                    kind="invoke",
                    target=args.slug,
                    prompt=args.prompt,
                    session_id=args.session_id,
                    sync=args.sync,
                )
            return await workflow.execute_activity_method(
                XAgentActivities.xagent_tool,
                XAgentCall(
                    tool=tool,
                    user=self._turn_user,
                    auth=self._inp.config.auth,
                ),
                start_to_close_timeout=tool_timeout(self._inp.config),
                heartbeat_timeout=heartbeat_timeout(self._inp.config),
                retry_policy=STORE_RETRY,
                summary=f"{call.name} · turn {turn}",
            )
        except ActivityError as err:
            if self._closed:
                raise
            # A delegation that timed out or kept failing is the agent's tool error, not
            # the end of its turn: it can retry, pick another agent or answer without it.
            return await self._refuse(tool, "delegation_failed", _cause(err), audit=False)

    async def _review(
        self, tool: ToolMessage, review_id: str, operation: str, target: str | None, preview: str
    ) -> ToolOutcome | None:
        """Wait for Signal ``review_decision`` up to the review timeout; settle exactly once.

        Returns None when the operation may proceed, else the refusal's tool result.
        """
        self._open_reviews[review_id] = {
            "operation": operation,
            "target": target,
            "preview": preview,
        }
        timeout = self._inp.config.review_timeout_s
        deadline = workflow.now() + timedelta(seconds=timeout)
        self._review_deadlines[review_id] = deadline.strftime("%Y-%m-%d %H:%M:%S UTC")
        self._set_status("awaiting_input")
        self._show()  # a second review while one waits changes no status
        outcome: ReviewOutcome
        try:
            await workflow.wait_condition(
                lambda: review_id in self._decisions,
                timeout=timedelta(seconds=timeout),
                timeout_summary=f"review {operation}" + (f" → {target}" if target else ""),
            )
            decision: ReviewDecision | None = self._decisions[review_id]
            assert decision is not None
            outcome = "denied" if decision.decision == "deny" else "allowed"
        except TimeoutError:
            decision, outcome = None, "timed_out"
        # The outcome is fixed from here: a decision arriving now is too late.
        del self._open_reviews[review_id]
        self._review_deadlines.pop(review_id, None)
        self._decisions.pop(review_id, None)
        self._settled_reviews[review_id] = None
        while len(self._settled_reviews) > MAX_SETTLED_REVIEWS:
            del self._settled_reviews[next(iter(self._settled_reviews))]
        if not self._open_reviews:
            self._set_status("running")
        self._show()
        settle = SettleInput(
            tool=tool,
            review_id=review_id,
            operation=OPERATION_OF[tool.call.name],
            target=target,
            outcome=outcome,
            decision=decision,
            timeout_s=timeout,
            auth=self._inp.config.auth,
        )
        # A local activity: the decision's workflow task records the outcome and schedules
        # what follows, one server round trip fewer between decision and resumed turn
        # (issue 14). Durable all the same: its result is a marker in history.
        summary = f"review {outcome}"
        if workflow.patched(PATCH_LOCAL_SETTLE):
            settled: SettleResult = await self._local(
                XAgentActivities.settle_review, settle, summary=summary
            )
        else:
            settled = await workflow.execute_activity_method(
                XAgentActivities.settle_review,
                settle,
                start_to_close_timeout=store_timeout(self._inp.config),
                retry_policy=STORE_RETRY,
                summary=summary,
            )
        return None if settled.allowed else settled.outcome

    async def _local(self, fn: Callable[..., Any], arg: Any, *, summary: str) -> Any:
        """A short DB activity run as a local activity, with the store options.

        Its failure is raised as :class:`ActivityError` (cause: the activity's error), as an
        ordinary activity's is: this SDK hands a local activity's own ApplicationError over
        unwrapped, and the callers' ``except ActivityError`` must serve both paths.
        """
        try:
            return await workflow.execute_local_activity_method(
                fn,
                arg,
                start_to_close_timeout=store_timeout(self._inp.config),
                retry_policy=STORE_RETRY,
                summary=summary,
            )
        except ApplicationError as err:
            raise ActivityError(
                f"local activity failed: {err.message}",
                scheduled_event_id=0,
                started_event_id=0,
                identity="",
                activity_type=getattr(fn, "__name__", "activity"),
                activity_id="",
                retry_state=None,
            ) from err

    # --- External sessions: X-Agent calls of an outside process over MCP (issue 13) ----
    # An external session's turns are taken outside Baton (docs/mcp.md). Each MCP tool call
    # arrives as an Update and runs through `_dispatch`, the very path of a model's tool
    # call (guards → authorize → review → delegate / xagent_tool), under a message id the
    # workflow chooses: durable, audited, in the Temporal UI and in the transcript. These
    # handlers only ever run for Updates sent by new code, so no in-flight run changes.

    #: External calls in flight (a class default: instances created before this existed
    #: have none). The session is idle again once the last one has its result.
    _external_calls = 0

    @workflow.update(
        name=EXTERNAL_TOOL_CALL, unfinished_policy=workflow.HandlerUnfinishedPolicy.ABANDON
    )
    async def external_tool_call(self, req: ExternalToolCall) -> ToolOutcome:
        """Run one X-Agent tool call of the external process; its result is stored as the
        tool message ``<session>:t<n>:s1:tool0`` (``ok`` false for a refusal).

        The one-hop rule follows the session's provenance (Gamut X-Agent): an external session
        another agent started cannot invoke. Calls may run in parallel, each its own turn
        number. The validator refuses closed and non-external sessions and unknown tools.
        """
        await workflow.wait_condition(lambda: self._agent is not None)
        assert self._agent is not None
        self._turn += 1
        turn = self._turn
        self._external_calls += 1
        self._invoked_turn = bool(self._inp.provenance.invoked_by_agent)
        self._turn_user = self._inp.provenance.created_by_user
        self._set_status("running")
        try:
            call = ToolCall(id=req.call_id, name=req.name, args=req.args)
            return await self._dispatch(self._agent, turn, 1, 0, call)
        finally:
            self._external_calls -= 1
            if not self._external_calls and not self._closed:
                self._set_status("idle")
                # A review set the stored status; nothing else ends this "turn".
                await workflow.execute_activity_method(
                    SessionActivities.set_status,
                    StatusChange(session_id=self._inp.session_id, status="idle"),
                    start_to_close_timeout=store_timeout(self._inp.config),
                    retry_policy=STORE_RETRY,
                    summary="idle",
                )

    async def _mcp_tool(
        self,
        agent: ResolvedAgent,
        turn: int,
        step: int,
        index: int,
        call: ToolCall,
        snap: McpToolSnapshot,
    ) -> ToolOutcome:
        """A tool of a remote MCP server (issue 13, item 4): the ``mcp_tool`` activity. Its
        errors (schema, unreachable server, the tool's own) are tool results, not failures."""
        server = next(m for m in agent.mcp_servers if m.name == snap.server)
        return await workflow.execute_activity_method(
            McpToolActivities.mcp_tool,
            McpToolInput(
                tool=self._tool_message(agent, turn, step, index, call),
                server=server,
                name=snap.name,
                input_schema=snap.input_schema,
            ),
            start_to_close_timeout=tool_timeout(self._inp.config),
            retry_policy=STORE_RETRY,
            summary=f"{call.name} · turn {turn}",
        )

    @external_tool_call.validator
    def _validate_external_call(self, req: ExternalToolCall) -> None:
        self._validate_external()
        if req.name not in XAGENT_TOOLS:
            raise ApplicationError(
                f"unknown tool '{req.name[:64]}'; the tools are {', '.join(XAGENT_TOOLS)}",
                type=UNKNOWN_TOOL,
            )

    @workflow.update(name=EXTERNAL_MESSAGE)
    async def external_message(self, msg: ExternalMessage) -> ExternalMessageOutcome:
        """Store a message the external process posts (``assistant``: what it did; ``user``:
        what it was asked) as turn ``n``'s message, so other agents read it in the transcript."""
        await workflow.wait_condition(lambda: self._agent is not None)
        assert self._agent is not None
        self._turn += 1
        sid = self._inp.session_id
        message_id = f"{sid}:t{self._turn}:{msg.role}"
        await workflow.execute_activity_method(
            ExternalActivities.record_external_message,
            ExternalMessageInput(
                session_id=sid,
                agent_slug=self._agent.slug,
                message_id=message_id,
                position=position(self._turn, 0, 0 if msg.role == "user" else 1),
                role=msg.role,
                text=msg.text,
            ),
            start_to_close_timeout=store_timeout(self._inp.config),
            retry_policy=STORE_RETRY,
            summary=f"external {msg.role} message",
        )
        return ExternalMessageOutcome(message_id=message_id)

    @external_message.validator
    def _validate_external_message(self, msg: ExternalMessage) -> None:
        self._validate_external()
        if not msg.text.strip():
            raise ApplicationError("text must not be blank", type=INVALID_PROMPT)

    def _validate_external(self) -> None:
        if self._closed:
            raise ApplicationError("the session is closed", type=SESSION_CLOSED)
        if not self._inp.provenance.external:
            raise ApplicationError(
                "this session is not external (its turns are the model's)", type=NOT_EXTERNAL
            )

    async def _delegation(
        self, agent: ResolvedAgent, turn: int, step: int, index: int, call: ToolCall
    ) -> ToolOutcome:
        """``delegate_to`` (AgentX Agent Teams) and ``task`` (Xema Agent Concepts): a
        delegation, always sync."""
        tool = self._tool_message(agent, turn, step, index, call)
        try:
            if call.name == "delegate_to":
                wanted = DelegateToArgs.model_validate(call.args)
            else:
                task = TaskArgs.model_validate(call.args)
        except ValidationError as exc:
            return await self._refuse(tool, "invalid_arguments", _problems(exc), audit=False)
        try:
            if call.name == "delegate_to":
                offer = self._offer(agent)
                member = self._inp.provenance.team_member
                if not member and workflow.patched(PATCH_ONE_DECISION):
                    # Gamut X-Agent's guards on every path (baton.permissions.gate.decide runs them
                    # again in the `delegate` activity): audited, with the path it came by.
                    guard = cross_agent_guard(
                        via="delegate_to",
                        caller=agent.slug,
                        target=wanted.agent_id,
                        invoked=self._invoked_turn,
                    )
                    if guard is not None:
                        return await self._refuse(
                            tool,
                            guard.code,
                            guard.message,
                            target=wanted.agent_id,
                            via="delegate_to",
                        )
                if offer.team is None and not offer.adhoc:
                    why = (
                        "team members cannot re-delegate"
                        if member
                        else "delegation is off for this session (Solo, or ad-hoc delegation "
                        "disabled)"
                    )
                    return await self._refuse(tool, "delegation_unavailable", why, audit=False)
                if wanted.agent_id == agent.slug:
                    return await self._refuse(
                        tool, "self_delegation", "an agent cannot delegate to itself", audit=False
                    )
                return await self._delegate(
                    tool, turn, kind="delegate_to", target=wanted.agent_id, prompt=wanted.task
                )
            return await self._delegate(
                tool, turn, kind="task", target="", prompt=task.prompt, alias=task.alias
            )
        except ActivityError as err:
            if self._closed:
                raise
            return await self._refuse(tool, "delegation_failed", _cause(err), audit=False)

    async def _delegate(
        self,
        tool: ToolMessage,
        turn: int,
        *,
        kind: Via,
        target: str,
        prompt: str,
        session_id: str | None = None,
        sync: bool = True,
        alias: str | None = None,
    ) -> ToolOutcome:
        cfg = self._inp.config
        assert self._agent is not None
        delegation_id = f"{tool.message_id}:delegation"
        # Issue 12, item 1: the summary names the child's workflow id, so the caller's
        # timeline shows where each delegation went (user metadata, not a command).
        child = session_id or delegated_session_id(delegation_id)
        return await workflow.execute_activity_method(
            DelegationActivities.delegate,
            DelegateInput(
                tool=tool,
                delegation_id=delegation_id,
                caller_session_id=self._inp.session_id,
                user=self._turn_user,
                target=target,
                prompt=prompt,
                session_id=session_id,
                sync=sync,
                task_queue=workflow.info().task_queue,
                config=cfg,
                depth=self._inp.provenance.depth + 1,
                kind=kind,
                alias=alias,
                root_session_id=self._root,
                team=self._inp.team,
                run_limits=self._run_limits(self._agent),
                disable_delegation=self._inp.provenance.disable_delegation,
                invoked=self._invoked_turn,
            ),
            start_to_close_timeout=timedelta(seconds=cfg.delegation_timeout_s),
            # The delegation as a whole, retries included, is bounded by the same timeout.
            schedule_to_close_timeout=timedelta(seconds=cfg.delegation_timeout_s),
            heartbeat_timeout=heartbeat_timeout(cfg),
            retry_policy=DELEGATE_RETRY,
            summary=f"{kind} → {alias or target}"
            + (" (sync)" if sync else "")
            + f" · turn {turn} · {child}",
        )

    async def _refuse(
        self,
        tool: ToolMessage,
        code: str,
        error: str,
        *,
        target: str | None = None,
        audit: bool = True,
        via: Via | None = None,
    ) -> ToolOutcome:
        return await workflow.execute_activity_method(
            XAgentActivities.refuse_tool,
            RefusalInput(
                tool=tool,
                error=error,
                code=code,
                # Every path that makes another agent run is the `invoke` operation.
                operation=OPERATION_OF.get(tool.call.name) or ("invoke" if via else None),
                target=target,
                audit=audit,
                via=via,
            ),
            start_to_close_timeout=store_timeout(self._inp.config),
            retry_policy=STORE_RETRY,
            summary=f"refuse {tool.call.name}: {code}",
        )

    async def _fail(
        self, message_id: str, pos: str, err: ActivityError, final: SessionStatus = "idle"
    ) -> None:
        await self._fail_text(message_id, pos, _cause(err), final)

    async def _fail_text(
        self, message_id: str, pos: str, error: str, final: SessionStatus = "idle"
    ) -> None:
        await workflow.execute_activity_method(
            SessionActivities.record_failure,
            TurnFailure(
                session_id=self._inp.session_id,
                agent_slug=self._agent.slug if self._agent else "",
                message_id=message_id,
                position=pos,
                error=error,
                final_status=final,
            ),
            start_to_close_timeout=store_timeout(self._inp.config),
            retry_policy=STORE_RETRY,
            summary="record failure",
        )


def _cause(err: ActivityError) -> str:
    cause = err.cause
    return str(cause.message) if isinstance(cause, ApplicationError) else str(cause or err)


def _problems(exc: ValidationError) -> str:
    """Up to five argument problems, ``path: message``, for the model to correct."""
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}" for e in exc.errors()[:5]
    )


def model_turn_input(
    session_id: str,
    agent_slug: str,
    turn: int,
    step: int,
    cfg: SessionConfig,
    user_text: str | None,
    **extra: Any,
) -> ModelTurnInput:
    """The ``model_turn`` input: the ids and positions the workflow chooses for the reply
    (and, on a turn's first call, its user message), shared by sessions and steps."""
    first = user_text is not None
    return ModelTurnInput(
        session_id=session_id,
        agent_slug=agent_slug,
        turn=turn,
        step=step,
        assistant_message_id=f"{session_id}:t{turn}:s{step}:assistant",
        position=position(turn, step, 1),
        user_message_id=f"{session_id}:t{turn}:user" if first else None,
        user_text=user_text,
        user_position=position(turn, 0, 0) if first else None,
        default_model=cfg.default_model,
        prices=cfg.prices,
        **extra,
    )


def tool_message(
    session_id: str, agent_slug: str, turn: int, step: int, index: int, call: ToolCall
) -> ToolMessage:
    """Where a tool call's result is stored: the id and position the workflow chooses
    (``<session>:t<turn>:s<step>:tool<index>``), shared by sessions and steps."""
    return ToolMessage(
        session_id=session_id,
        agent_slug=agent_slug,
        message_id=f"{session_id}:t{turn}:s{step}:tool{index}",
        position=position(turn, step, 2, index),
        call=call,
    )


async def run_ordinary_tool(
    tool: ToolMessage, allowed: list[str], label: str, cfg: SessionConfig
) -> ToolOutcome:
    """The ``run_tool`` activity for one ordinary tool call (summary ``<tool> · <label>``);
    it heartbeats, so a lost worker's call is retried after the heartbeat timeout."""
    return await workflow.execute_activity_method(
        SessionActivities.run_tool,
        ToolInput(
            session_id=tool.session_id,
            agent_slug=tool.agent_slug,
            message_id=tool.message_id,
            position=tool.position,
            call=tool.call,
            allowed_tools=allowed,
        ),
        start_to_close_timeout=tool_timeout(cfg),
        heartbeat_timeout=heartbeat_timeout(cfg),
        retry_policy=STORE_RETRY,
        summary=f"{tool.call.name} · {label}",
    )
