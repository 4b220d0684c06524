"""One user message of a session, answered (docs/sessions.md): a team route or @mention
first when the message may be routed, then model calls and their tool calls until a
reply without tool calls, at most ``max_steps_per_message`` model calls.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities.turns import SessionActivities
    from baton.contracts.activity_io import ModelTurnResult
    from baton.contracts.values import Usage, position
    from baton.contracts.workflow_io import TurnOutcome, UserMessage

from workflows.calls import error_cause, model_turn_input, record_failure, turn_failure
from workflows.context import TurnContext
from workflows.delegation import delegation_offer, may_route, route
from workflows.dispatch import FAILED_REPLY_PATCH, dispatch_reply
from workflows.options import heartbeat_timeout, model_retry
from workflows.reviews import Reviews


async def answer(ctx: TurnContext, reviews: Reviews, msg: UserMessage) -> TurnOutcome:
    """Answer ``msg`` to its final assistant message (tool loops included).

    Raises ApplicationError ``turn_failed`` when a model call fails for good and
    ``step_limit`` after ``max_steps_per_message`` model calls, each recorded in the
    transcript first; a cancelled session's failure is re-raised unrecorded. A turn a
    newer message interrupts (``ctx.interrupted``) stops before its next model call, or
    when its cancelled model call ends, and returns ``interrupted`` (marked in the
    transcript; the cancelled call keeps its partial reply).
    """
    cfg = ctx.cfg
    prefix = f"{ctx.session_id}:t{ctx.turn}"
    usage = Usage()
    # Stored with the first model call of the turn, unless a fork's prefix holds it.
    user: str | None = None if msg.in_transcript else msg.prompt
    if user and may_route(ctx.inp, ctx.agent, ctx.invoked, msg) and await route(ctx, msg):
        user = None  # stored by the route, with the routed call and its result
    for step in range(1, cfg.max_steps_per_message + 1):
        if ctx.interrupted():
            return await _interrupted(ctx, step - 1, usage)
        try:
            result = await model_turn(ctx, step, user)
        except ActivityError as err:
            if ctx.closed():  # cancelled by the session's cancel: nothing to record
                raise
            if ctx.interrupted():
                return await _interrupted(ctx, step, usage)
            await _record(
                ctx, f"{prefix}:s{step}:error", position(ctx.turn, step, 3), error_cause(err)
            )
            raise ApplicationError(
                f"turn {ctx.turn} failed: {error_cause(err)}",
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
        try:
            await dispatch_reply(ctx, reviews, step, result.tool_calls)
        except ActivityError as err:
            if ctx.closed() or not workflow.patched(FAILED_REPLY_PATCH):
                raise
            # Recorded like a failed model call; `record_failure` cancels its open reviews.
            await _record(
                ctx, f"{prefix}:s{step}:tool-error", position(ctx.turn, step, 3), error_cause(err)
            )
            raise ApplicationError(
                f"turn {ctx.turn} failed: {error_cause(err)}",
                type="turn_failed",
                non_retryable=True,
            ) from err
    error = f"stopped after {cfg.max_steps_per_message} model calls for one message"
    await _record(ctx, f"{prefix}:limit", position(ctx.turn, 999, 3), error)
    raise ApplicationError(error, type="step_limit", non_retryable=True)


async def _interrupted(ctx: TurnContext, step: int, usage: Usage) -> TurnOutcome:
    """Mark where a turn was interrupted (an error row after model call ``step``, which the
    model never reads) and answer its sender with the turn's last reply."""
    prefix = f"{ctx.session_id}:t{ctx.turn}"
    note = "interrupted: a newer message stopped this turn"
    await _record(ctx, f"{prefix}:s{step}:interrupted", position(ctx.turn, step, 3), note)
    last = f"{prefix}:s{max(step, 1)}:assistant"
    return TurnOutcome(message_id=last, preview=note, usage=usage, interrupted=True)


async def _record(ctx: TurnContext, message_id: str, pos: str, error: str) -> None:
    failure = turn_failure(ctx.session_id, ctx.agent.slug, message_id, pos, error)
    await record_failure(failure, ctx.cfg)


async def model_turn(ctx: TurnContext, step: int, user: str | None) -> ModelTurnResult:
    """The ``model_turn`` activity for model call ``step`` of the turn (``user``: the
    turn's message, on its first call only), with the delegation tools the turn offers
    and the run's token budget."""
    cfg = ctx.cfg
    agent = ctx.agent
    handle = workflow.start_activity_method(
        SessionActivities.model_turn,
        model_turn_input(
            ctx.session_id,
            agent.slug,
            ctx.turn,
            step,
            cfg,
            user,
            delegation=delegation_offer(ctx.inp, agent, ctx.invoked),
            run_root=ctx.root,
            token_budget=ctx.run_limits().token_budget,
            max_output_tokens=cfg.max_output_tokens,
            provider_failures=cfg.model_provider_failures,
            workspace=True,
        ),
        start_to_close_timeout=timedelta(seconds=cfg.model_turn_timeout_s),
        heartbeat_timeout=heartbeat_timeout(cfg),
        retry_policy=model_retry(cfg),
        summary=f"turn {ctx.turn}" + (f".{step}" if step > 1 else "") + f" · {agent.pin}",
    )
    ctx.model_call(handle)  # an interrupt cancels it (the same command as execute_activity)
    try:
        return await handle
    finally:
        ctx.model_call(None)
