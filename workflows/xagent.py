"""A session's X-Agent tool calls (Gamut X-Agent; docs/xagent.md): the cross-agent guard,
``authorize`` (ACL and policy), a review wait when the policy asks for one, then the
operation: ``invoke_agent`` a delegation, every other call the ``xagent_tool`` activity.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel, ValidationError

    from activities.xagent import XAgentActivities
    from baton.contracts.activity_io import (
        AuthorizeInput,
        AuthorizeResult,
        ToolMessage,
        ToolOutcome,
        XAgentCall,
    )
    from baton.contracts.tool_args import (
        XAGENT_ARGS,
        GetAgentSessionsArgs,
        GetTranscriptArgs,
        InvokeAgentArgs,
        ListAgentsArgs,
    )
    from baton.contracts.values import OPERATION_OF
    from baton.permissions.guard import cross_agent_guard

from workflows.calls import arg_problems, local
from workflows.context import TurnContext
from workflows.delegation import delegate
from workflows.options import STORE_RETRY, heartbeat_timeout, store_timeout, tool_timeout
from workflows.reviews import Reviews


def is_short_read(args: object) -> bool:
    """Whether an X-Agent call (its validated arguments) is short DB work with no wait:
    list_agents, get_agent_sessions and a transcript read without ``sync`` (which may wait
    up to 45 s for a running turn, heartbeating). Those run as a local activity."""
    if isinstance(args, GetTranscriptArgs):
        return not args.sync
    return isinstance(args, ListAgentsArgs | GetAgentSessionsArgs)


def review_preview(tool: ToolMessage, args: BaseModel) -> str:
    """What a reviewer reads of the call: an invoke's prompt (500 characters), the name
    of an agent to create, else nothing."""
    if tool.call.name == "create_agent":
        return f"create agent '{tool.call.args.get('name', '')}'"
    return args.prompt[:500] if isinstance(args, InvokeAgentArgs) else ""


async def xagent_tool(ctx: TurnContext, reviews: Reviews, tool: ToolMessage) -> ToolOutcome:
    """Guards, then ACL + policy (``authorize``), then a review wait, then the operation.

    Self-invocation and one hop are refused before any policy; every refusal and
    failure goes back to the model as the call's tool error.
    """
    call = tool.call
    try:
        args = XAGENT_ARGS[call.name].model_validate(call.args)
    except ValidationError as exc:
        return await ctx.refuse(tool, "invalid_arguments", arg_problems(exc), audit=False)
    target: str | None = getattr(args, "slug", None)
    if isinstance(args, InvokeAgentArgs):
        # The guards every cross-agent path passes (baton.permissions.gate.decide runs them
        # again in `authorize`); refused here, no review and no policy is consulted.
        guard = cross_agent_guard(
            via="invoke", caller=ctx.agent.slug, target=args.slug, invoked=ctx.invoked
        )
        if guard is not None:
            return await ctx.refuse(tool, guard.code, guard.message, target=target)
    xcall = XAgentCall(tool=tool, user=ctx.user, auth=ctx.cfg.auth)
    # A list or a read is a few queries, no network and no wait: it runs as a local
    # activity in the workflow task that allowed it, so its result is stored before that
    # task completes. After a review it runs inside `settle_review` (SettleInput.then):
    # one local activity, not two, after the decision. Durable all the same: results are
    # markers in history, and a retry finds the stored result.
    short = is_short_read(args)
    review_id = f"review-{workflow.uuid4()}"
    preview = review_preview(tool, args)
    try:
        verdict = await _authorize(ctx, reviews, tool, review_id, target, preview)
    except ActivityError as err:
        # Never leave a call without a result: the agent reads why and goes on.
        return await ctx.failed(tool, "authorization_failed", err)
    if verdict.decision == "refused":
        assert verdict.outcome is not None
        return verdict.outcome
    if verdict.decision == "review":
        try:
            settled = await reviews.wait(
                tool, review_id, target, preview, then=xcall if short else None
            )
        except ActivityError as err:
            return await ctx.failed(tool, "review_failed", err)
        if settled is not None:
            return settled
    edit = reviews.take_edit(review_id)
    edited_by: str | None = None
    if edit is not None and edit.edited_prompt is not None and isinstance(args, InvokeAgentArgs):
        args = args.model_copy(update={"prompt": edit.edited_prompt})  # the reviewer's, signed
        edited_by = edit.edited_by or ""
    if edit is not None and edit.edited_agent is not None:
        # A create's new name or instructions: `xagent_tool` applies them to the arguments.
        xcall = xcall.model_copy(update={"edited_agent": edit.edited_agent})
    try:
        return await _operate(ctx, xcall, args, short=short, edited_by=edited_by)
    except ActivityError as err:
        # A delegation that timed out or kept failing is the agent's tool error, not
        # the end of its turn: it can retry, pick another agent or answer without it.
        return await ctx.failed(tool, "delegation_failed", err)


async def _authorize(
    ctx: TurnContext,
    reviews: Reviews,
    tool: ToolMessage,
    review_id: str,
    target: str | None,
    preview: str,
) -> AuthorizeResult:
    """The ``authorize`` activity: allowed, refused, or a review opened under
    ``review_id`` with a deadline fixed before the row exists (the row stores it, the
    API refuses a decision received later, and the wait ends at it)."""
    operation = OPERATION_OF[tool.call.name]
    expiry = reviews.expect(review_id)
    opened = False
    try:
        verdict: AuthorizeResult = await workflow.execute_activity_method(
            XAgentActivities.authorize,
            AuthorizeInput(
                tool=tool,
                user=ctx.user,
                operation=operation,
                target=target,
                review_id=review_id,
                preview=preview,
                auth=ctx.cfg.auth,
                invoked=ctx.invoked,
                expires_at=expiry,
            ),
            start_to_close_timeout=store_timeout(ctx.cfg),
            retry_policy=STORE_RETRY,
            summary=f"authorize {operation}" + (f" → {target}" if target else ""),
        )
        opened = verdict.decision == "review"
        return verdict
    finally:
        reviews.asked(review_id, opened=opened)


async def _operate(
    ctx: TurnContext,
    xcall: XAgentCall,
    args: BaseModel,
    *,
    short: bool,
    edited_by: str | None = None,
) -> ToolOutcome:
    """The allowed operation: an invoke is a delegation (``edited_by``: the reviewer who
    edited its prompt); a short read a local activity; anything else the ``xagent_tool``
    activity (it heartbeats)."""
    tool = xcall.tool
    if isinstance(args, InvokeAgentArgs):
        return await delegate(
            ctx,
            tool,
            kind="invoke",
            target=args.slug,
            prompt=args.prompt,
            session_id=args.session_id,
            sync=args.sync,
            edited_by=edited_by,
        )
    summary = f"{tool.call.name} · turn {ctx.turn}"
    if short:
        outcome: ToolOutcome = await local(
            XAgentActivities.xagent_tool, xcall, ctx.cfg, summary=summary
        )
        return outcome
    return await workflow.execute_activity_method(
        XAgentActivities.xagent_tool,
        xcall,
        start_to_close_timeout=tool_timeout(ctx.cfg),
        heartbeat_timeout=heartbeat_timeout(ctx.cfg),
        retry_policy=STORE_RETRY,
        summary=summary,
    )
