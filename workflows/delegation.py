"""Delegations of a session: ``delegate_to``, subagent ``task``s, team routes and
@mentions, and the ``delegate`` activity every one of them runs (docs/teams.md).
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from activities.delegate import DelegationActivities
    from baton.contracts.activity_io import (
        DelegateInput,
        DelegationOffer,
        RouteInput,
        ToolMessage,
        ToolOutcome,
    )
    from baton.contracts.tool_args import DelegateToArgs, TaskArgs
    from baton.contracts.values import ResolvedAgent, Via, delegated_session_id, position
    from baton.contracts.workflow_io import SessionInput, UserMessage
    from baton.permissions.guard import cross_agent_guard

from workflows.calls import arg_problems
from workflows.context import TurnContext
from workflows.options import DELEGATE_RETRY, STORE_RETRY, heartbeat_timeout, store_timeout


def delegation_offer(inp: SessionInput, agent: ResolvedAgent, invoked: bool) -> DelegationOffer:
    """Which delegation tools a turn offers (AgentX Agent Teams; Xema Agent Concepts
    subagents).

    A team run's supervisor gets delegate_to over the team's specialists (Solo is
    ignored: a team run is delegation); members never re-delegate; other sessions get
    the ad-hoc roster unless the deployment or the session (Solo) turns it off, and an
    invoked turn gets none (one hop, Gamut X-Agent).
    """
    prov = inp.provenance
    team = inp.team
    lead = team is not None and not prov.team_member and agent.slug == team.supervisor
    adhoc = (
        inp.config.allow_adhoc_delegation
        and team is None
        and not prov.team_member
        and not prov.disable_delegation
        and not invoked
    )
    return DelegationOffer(team=team if lead else None, adhoc=adhoc, task=bool(agent.subagents))


def delegation_unavailable(inp: SessionInput, offer: DelegationOffer) -> str | None:
    """Why ``delegate_to`` is refused (``delegation_unavailable``), or None when offered:
    a team member cannot re-delegate; Solo or a deployment without ad-hoc delegation
    offers none."""
    if offer.team is not None or offer.adhoc:
        return None
    if inp.provenance.team_member:
        return "team members cannot re-delegate"
    return "delegation is off for this session (Solo, or ad-hoc delegation disabled)"


async def delegate(
    ctx: TurnContext,
    tool: ToolMessage,
    *,
    kind: Via,
    target: str,
    prompt: str,
    session_id: str | None = None,
    sync: bool = True,
    alias: str | None = None,
    edited_by: str | None = None,
) -> ToolOutcome:
    """The ``delegate`` activity: start (or message) the child session and, when
    ``sync``, wait for its reply, bounded by ``delegation_timeout_s`` retries included.
    ``edited_by``: the reviewer who edited ``prompt`` (the caller's result says so)."""
    cfg = ctx.cfg
    delegation_id = f"{tool.message_id}:delegation"
    # The summary names the child's workflow id, so the caller's timeline shows where
    # each delegation went (user metadata, not a command).
    child = session_id or delegated_session_id(delegation_id)
    return await workflow.execute_activity_method(
        DelegationActivities.delegate,
        DelegateInput(
            tool=tool,
            delegation_id=delegation_id,
            caller_session_id=ctx.session_id,
            user=ctx.user,
            target=target,
            prompt=prompt,
            session_id=session_id,
            sync=sync,
            task_queue=workflow.info().task_queue,
            config=cfg,
            depth=ctx.inp.provenance.depth + 1,
            kind=kind,
            alias=alias,
            root_session_id=ctx.root,
            team=ctx.inp.team,
            run_limits=ctx.run_limits(),
            disable_delegation=ctx.inp.provenance.disable_delegation,
            invoked=ctx.invoked,
            edited_by=edited_by,
        ),
        start_to_close_timeout=timedelta(seconds=cfg.delegation_timeout_s),
        schedule_to_close_timeout=timedelta(seconds=cfg.delegation_timeout_s),
        heartbeat_timeout=heartbeat_timeout(cfg),
        retry_policy=DELEGATE_RETRY,
        summary=f"{kind} → {alias or target}"
        + (" (sync)" if sync else "")
        + f" · turn {ctx.turn} · {child}",
    )


async def delegation_tool(ctx: TurnContext, tool: ToolMessage) -> ToolOutcome:
    """``delegate_to`` (AgentX Agent Teams) and ``task`` (Xema Agent Concepts): a
    delegation, always sync. Bad arguments, the cross-agent guard and an unavailable
    delegation are refusals the model reads; a failed delegation is its tool error."""
    call = tool.call
    try:
        if call.name == "delegate_to":
            wanted = DelegateToArgs.model_validate(call.args)
        else:
            task = TaskArgs.model_validate(call.args)
    except ValidationError as exc:
        return await ctx.refuse(tool, "invalid_arguments", arg_problems(exc), audit=False)
    try:
        if call.name == "delegate_to":
            return await _delegate_to(ctx, tool, wanted)
        return await delegate(
            ctx, tool, kind="task", target="", prompt=task.prompt, alias=task.alias
        )
    except ActivityError as err:
        return await ctx.failed(tool, "delegation_failed", err)


async def _delegate_to(ctx: TurnContext, tool: ToolMessage, wanted: DelegateToArgs) -> ToolOutcome:
    """``delegate_to``: the cross-agent guard (self-delegation, one hop), then whether
    this session offers delegation at all, then the delegation."""
    if not ctx.inp.provenance.team_member:
        # The guards every cross-agent path passes (baton.permissions.gate.decide runs them
        # again in the `delegate` activity): audited, with the path it came by.
        guard = cross_agent_guard(
            via="delegate_to", caller=ctx.agent.slug, target=wanted.agent_id, invoked=ctx.invoked
        )
        if guard is not None:
            return await ctx.refuse(
                tool, guard.code, guard.message, target=wanted.agent_id, via="delegate_to"
            )
    why = delegation_unavailable(ctx.inp, delegation_offer(ctx.inp, ctx.agent, ctx.invoked))
    if why is not None:
        return await ctx.refuse(tool, "delegation_unavailable", why, audit=False)
    return await delegate(ctx, tool, kind="delegate_to", target=wanted.agent_id, prompt=wanted.task)


def may_route(inp: SessionInput, agent: ResolvedAgent, invoked: bool, msg: UserMessage) -> bool:
    """Whether this message could be routed: a lead with team routes, or an @mention.

    Checked in the workflow so that ordinary turns pay no extra activity. Only turns a
    human sent are routed: a task another agent wrote is not an instruction to re-route
    (members and delegated sessions cannot re-delegate through a mention).
    """
    if invoked:
        return False
    team = inp.team
    routes = (
        team is not None
        and bool(team.routes)
        and not inp.provenance.team_member
        and agent.slug == team.supervisor
    )
    return routes or "@" in msg.prompt


async def route(ctx: TurnContext, msg: UserMessage) -> bool:
    """Execute a team route or an @mention: delegate the message straight to that
    agent, then the session's agent synthesises (docs/teams.md; the reference only
    stores routes). Returns whether the turn was routed."""
    sid = ctx.session_id
    turn = ctx.turn
    prefix = f"{sid}:t{turn}"
    decision = await workflow.execute_activity_method(
        DelegationActivities.route_turn,
        RouteInput(
            session_id=sid,
            agent_slug=ctx.agent.slug,
            prompt=msg.prompt,
            team=ctx.inp.team if not ctx.inp.provenance.team_member else None,
            user_message_id=f"{prefix}:user",
            user_position=position(turn, 0, 0),
            route_message_id=f"{prefix}:s0:assistant",
            route_position=position(turn, 0, 1),
            call_id=f"route_t{turn}",
        ),
        start_to_close_timeout=store_timeout(ctx.cfg),
        retry_policy=STORE_RETRY,
        summary=f"route · turn {turn}",
    )
    if decision.call is None:
        return False
    # The routed call is step 0's only tool call.
    tool = ctx.tool(0, 0, decision.call)
    try:
        await delegate(ctx, tool, kind=decision.kind, target=decision.target, prompt=msg.prompt)
    except ActivityError as err:
        await ctx.failed(tool, "delegation_failed", err)
    return True
