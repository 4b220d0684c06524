"""The session workflow's delegations: ``delegate_to``, subagent ``task``s, team routes and
@mentions, and the ``delegate`` activity every one of them runs (docs/teams.md).
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from activities.delegate import DelegationActivities
    from baton.contracts import (
        DelegateInput,
        DelegateToArgs,
        ResolvedAgent,
        RouteInput,
        TaskArgs,
        ToolCall,
        ToolMessage,
        ToolOutcome,
        UserMessage,
        Via,
        cross_agent_guard,
        delegated_session_id,
        position,
    )
    from workflows.options import (
        DELEGATE_RETRY,
        STORE_RETRY,
        heartbeat_timeout,
        store_timeout,
    )


from workflows.session_base import (
    PATCH_ONE_DECISION,
    SessionBase,
    arg_problems,
    error_cause,
)


class DelegationMixin(SessionBase):
    """Routing, delegation tools and the one ``delegate`` activity call."""

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
            return await self._refuse(tool, "invalid_arguments", arg_problems(exc), audit=False)
        try:
            if call.name == "delegate_to":
                offer = self._offer(agent)
                member = self._inp.provenance.team_member
                if not member and self._patched(PATCH_ONE_DECISION):
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
            return await self._refuse(tool, "delegation_failed", error_cause(err), audit=False)

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
            await self._refuse(tool, "delegation_failed", error_cause(err), audit=False)
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
