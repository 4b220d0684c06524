"""The session workflow's X-Agent tools and policy reviews: the guard chain, ``authorize``,
the bounded wait for a decision and its one outcome (docs/xagent.md).
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from activities.xagent import XAgentActivities
    from baton.contracts import (
        MAX_SETTLED_REVIEWS,
        OPERATION_OF,
        XAGENT_ARGS,
        AuthorizeInput,
        GetAgentSessionsArgs,
        GetTranscriptArgs,
        InvokeAgentArgs,
        ListAgentsArgs,
        ResolvedAgent,
        ReviewDecision,
        ReviewOutcome,
        SettleInput,
        SettleResult,
        ToolCall,
        ToolMessage,
        ToolOutcome,
        XAgentCall,
        cross_agent_guard,
    )
    from workflows.options import (
        STORE_RETRY,
        heartbeat_timeout,
        store_timeout,
        tool_timeout,
    )


from workflows.delegation import DelegationMixin
from workflows.session_base import (
    PATCH_LOCAL_SETTLE,
    PATCH_LOCAL_XAGENT_READ,
    arg_problems,
    error_cause,
)


def is_short_read(args: object) -> bool:
    """Whether an X-Agent call (its validated arguments) is short DB work with no wait:
    list_agents, get_agent_sessions and a transcript read without ``sync`` (which may wait
    up to 45 s for a running turn, heartbeating). Those run as a local activity."""
    if isinstance(args, GetTranscriptArgs):
        return not args.sync
    return isinstance(args, ListAgentsArgs | GetAgentSessionsArgs)


class ReviewMixin(DelegationMixin):
    """X-Agent tool calls and the review wait."""

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
            return await self._refuse(tool, "invalid_arguments", arg_problems(exc), audit=False)
        target: str | None = getattr(args, "slug", None)
        if isinstance(args, InvokeAgentArgs):
            # The guards every cross-agent path passes (baton.permissions.gate.decide runs them
            # again in `authorize`); refused here, no review and no policy is consulted.
            guard = cross_agent_guard(
                via="invoke", caller=agent.slug, target=args.slug, invoked=self._invoked_turn
            )
            if guard is not None:
                return await self._refuse(tool, guard.code, guard.message, target=target)
        xcall = XAgentCall(tool=tool, user=self._turn_user, auth=self._inp.config.auth)
        # A list or a read is a few queries, no network and no wait: it runs as a local
        # activity in the workflow task that allowed it, so its result is stored before
        # that task completes: one server round trip and one activity dispatch sooner
        # (issue 14). After a review it runs inside `settle_review` (SettleInput.then):
        # one local activity, not two, after the decision. Durable all the same: results
        # are markers in history, and a retry finds the stored result.
        short = is_short_read(args) and self._patched(PATCH_LOCAL_XAGENT_READ)
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
            return await self._refuse(tool, "authorization_failed", error_cause(err), audit=False)
        finally:
            self._expected_reviews.discard(review_id)
        if verdict.decision != "review":
            self._decisions.pop(review_id, None)
        if verdict.decision == "refused":
            assert verdict.outcome is not None
            return verdict.outcome
        if verdict.decision == "review":
            try:
                settled = await self._review(
                    tool, review_id, operation, target, preview, then=xcall if short else None
                )
            except ActivityError as err:
                if self._closed:
                    raise
                return await self._refuse(tool, "review_failed", error_cause(err), audit=False)
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
            summary = f"{call.name} · turn {turn}"
            if short:
                outcome: ToolOutcome = await self._local(
                    XAgentActivities.xagent_tool, xcall, summary=summary
                )
                return outcome
            return await workflow.execute_activity_method(
                XAgentActivities.xagent_tool,
                xcall,
                start_to_close_timeout=tool_timeout(self._inp.config),
                heartbeat_timeout=heartbeat_timeout(self._inp.config),
                retry_policy=STORE_RETRY,
                summary=summary,
            )
        except ActivityError as err:
            if self._closed:
                raise
            # A delegation that timed out or kept failing is the agent's tool error, not
            # the end of its turn: it can retry, pick another agent or answer without it.
            return await self._refuse(tool, "delegation_failed", error_cause(err), audit=False)

    async def _review(
        self,
        tool: ToolMessage,
        review_id: str,
        operation: str,
        target: str | None,
        preview: str,
        *,
        then: XAgentCall | None = None,
    ) -> ToolOutcome | None:
        """Wait for Signal ``review_decision`` up to the review timeout; settle exactly once.

        Returns None when the operation may proceed, else its tool result: the refusal's,
        or that of ``then``, which ``settle_review`` ran once the review was allowed.
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
            then=then,
        )
        # A local activity: the decision's workflow task records the outcome and schedules
        # what follows, one server round trip fewer between decision and resumed turn
        # (issue 14). Durable all the same: its result is a marker in history.
        summary = f"review {outcome}"
        if self._patched(PATCH_LOCAL_SETTLE):
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
        if settled.ran is not None:
            return settled.ran
        return None if settled.allowed else settled.outcome
