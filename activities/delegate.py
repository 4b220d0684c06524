"""The ``delegate`` activity (docs/architecture.md, delegation): every delegation —
invoke_agent, delegate_to, a subagent ``task``, a team route, an @mention — starts or
continues the target's own ``Session`` workflow through the Temporal client; and
``cancel_delegations``, the cancel cascade (AgentX Agent Teams; Xema Agent Concepts,
'What bounds a tree'; docs/teams.md).

Before a child starts, the run's bounds are checked in the same transaction that
records the delegation: ``max_delegation_depth`` (delegate_to), the runtime depth
ceiling (every kind), and the run's ``limits`` (``max_depth``, ``max_spawns``,
``token_budget``). A refusal is the caller's tool error ``limit_exceeded: …``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import Session
from temporalio import activity
from temporalio.client import Client

from activities.mcp_tools import discover
from activities.outcomes import cancelled_outcome, heartbeating, store_result, stored_outcome
from activities.xagent import SessionNotContinuable, SessionOfOtherAgent, refuse
from baton import telemetry
from baton.agents import registry, teams
from baton.contracts.activity_io import (
    DelegateInput,
    RouteDecision,
    RouteInput,
    ToolMessage,
    ToolOutcome,
)
from baton.contracts.codes import LIMIT_EXCEEDED
from baton.contracts.values import (
    CLOSED_STATUSES,
    MAX_MESSAGE_CHARS,
    ResolvedAgent,
    ResolvedLimits,
    TeamSnapshot,
    ToolCall,
    delegated_session_id,
)
from baton.contracts.workflow_io import Provenance
from baton.errors import BatonError, EngineUnavailable, TurnCancelled
from baton.evals import replay
from baton.outbound import OPEN, OutboundPolicy
from baton.permissions import gate
from baton.runs import exhibits, launch, run_tree, session_store
from baton.storage.db import DelegationRow, SessionRow, session_scope
from baton.workspaces.sharing import SHARING_KINDS, workspace_of
from baton.workspaces.store import workspace_for

#: Longest inline reply a delegation returns to the caller's model (characters).
MAX_INLINE_REPLY = 32_000


class Refused(Exception):
    """A delegation refused before its child starts: ``code: message`` for the model.

    ``decision`` is set when :func:`baton.permissions.gate.decide` refused it, so that the
    refusal is audited (as a block, with the path it came by) where it is stored.
    """

    def __init__(
        self,
        code: str,
        message: str,
        decision: gate.Decision | None = None,
        target: str | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.decision = decision
        self.target = target


@dataclass
class Plan:
    """What to start: the child's id, configuration, first message and provenance."""

    session_id: str
    target: str
    ref: str
    prompt: str
    agent: ResolvedAgent | None
    provenance: Provenance
    name: str
    continue_existing: bool = False


def child_agent(session: Session, caller: ResolvedAgent, alias: str) -> ResolvedAgent:
    """The configuration a subagent ``task`` runs with (Xema Agent Concepts, 'Subagents').

    The node's pinned agent, overlaid with the node-local instructions, model
    override and narrowed tools; its children are the node's, or (a leaf node)
    the referenced agent's own tree, so recursion is bounded by the runtime
    ceiling rather than by the spec. Raises Refused for an unknown alias.
    """
    node = next((n for n in caller.subagents if n.alias == alias), None)
    if node is None:
        known = ", ".join(n.alias for n in caller.subagents) or "none"
        raise Refused("unknown_subagent", f"no subagent '{alias}' (subagents: {known})")
    base = registry.resolve_agent(session, ref=f"{node.agent}@{node.version}")
    return base.model_copy(
        update={
            "system_prompt": node.system_prompt,
            "model": node.model or base.model,
            "tools": node.tools,
            "allowed_tools": node.allowed_tools,
            "blocked_tools": node.blocked_tools,
            "limits": node.limits,
            "subagents": node.subagents or base.subagents,
        }
    )


def _min(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def _check_limits(session: Session, inp: DelegateInput, root: str) -> None:
    cfg = inp.config
    if inp.kind in ("delegate_to", "route", "mention") and inp.depth > cfg.max_delegation_depth:
        raise Refused(
            LIMIT_EXCEEDED,
            f"delegation depth {inp.depth} exceeds max_delegation_depth "
            f"{cfg.max_delegation_depth}; do the work yourself or answer with what you have",
        )
    if inp.depth > cfg.runtime_depth_ceiling:
        raise Refused(
            LIMIT_EXCEEDED,
            f"nesting depth {inp.depth} exceeds the runtime ceiling {cfg.runtime_depth_ceiling}",
        )
    if run_tree.run_spawns(session, root_session_id=root) >= cfg.max_run_sessions:
        raise Refused(
            LIMIT_EXCEEDED,
            f"this run already started {cfg.max_run_sessions} sessions (the deployment's "
            "BATON_MAX_RUN_SESSIONS)",
        )
    limits = inp.run_limits or ResolvedLimits()
    if limits.max_depth is not None and inp.depth > limits.max_depth:
        raise Refused(
            LIMIT_EXCEEDED, f"nesting depth {inp.depth} exceeds max_depth {limits.max_depth}"
        )
    if limits.max_spawns is not None:
        spawned = run_tree.run_spawns(session, root_session_id=root)
        if spawned >= limits.max_spawns:
            raise Refused(
                LIMIT_EXCEEDED,
                f"this run already started {spawned} sessions (max_spawns {limits.max_spawns})",
            )
    if limits.token_budget is not None:
        # Used + reserved by model calls in flight: the one budget rule.
        try:
            run_tree.admit_tokens(session, root_session_id=root, token_budget=limits.token_budget)
        except run_tree.BudgetExhausted as exc:
            raise Refused(LIMIT_EXCEEDED, str(exc)) from exc


def _with_memories(session: Session, team: TeamSnapshot, task: str) -> str:
    found = teams.relevant_memories(
        session, team_id=team.id, channel=team.shared_channel, task=task
    )
    if not found:
        return task
    lines = "\n".join(
        f"- [{m.agent_slug}] {session_store.summarise(m.text, teams.MEMORY_CHARS)}" for m in found
    )
    block = f"\n\nRelevant memories from the team's shared channel:\n{lines}"
    room = MAX_MESSAGE_CHARS - len(task)
    return task + block[:room] if room > len(block) // 2 else task


def _child_session_id(s: Session, inp: DelegateInput) -> str:
    """The session a delegation runs in: for invoke_agent with ``session_id``, that session
    (it must be the target's, not closed and not a sandbox session: SessionOfOtherAgent,
    SessionNotContinuable);
    else the one derived from the delegation id, so a retry attaches to the same child."""
    if inp.kind != "invoke" or inp.session_id is None:
        return delegated_session_id(inp.delegation_id)
    row = session_store.get_session(s, session_id=inp.session_id)
    if row.agent_slug != inp.target:
        raise SessionOfOtherAgent(
            f"session '{row.id}' is a session of '{row.agent_slug}', not '{inp.target}'"
        )
    if row.status in CLOSED_STATUSES:
        raise SessionNotContinuable(f"session '{row.id}' is {row.status}")
    if row.sandbox:  # it runs a draft, which only its author reaches
        raise SessionNotContinuable(f"session '{row.id}' is a sandbox session")
    return inp.session_id


def _provenance(
    inp: DelegateInput, root: str, *, team_member: bool, workspace_id: str | None
) -> Provenance:
    """The provenance of the session a delegation starts: who, from where, in which run,
    what it may not do (a team member cannot re-delegate; Solo disables delegation) and
    the workspace it works in (``workspace_id``; None: its own)."""
    return Provenance(
        created_by_user=inp.user,
        invoked_by_agent=inp.tool.agent_slug,
        parent_session_id=inp.caller_session_id,
        team=inp.team.id if inp.team else None,
        depth=inp.depth,
        root_session_id=root,
        delegation_id=inp.delegation_id,
        delegation_kind=inp.kind,
        disable_delegation=inp.disable_delegation,
        team_member=team_member,
        run_limits=inp.run_limits,
        workspace_id=workspace_id,
    )


def _workspace(s: Session, inp: DelegateInput, ref: str, agent: ResolvedAgent | None) -> str | None:
    """The workspace the delegation's child works in (the sharing rule,
    :func:`baton.workspaces.sharing.workspace_of`): the target's resolved
    ``workspace_sharing`` (a subagent node's agent, or ``ref`` resolved) decides."""
    if inp.kind not in SHARING_KINDS:
        return None
    target = agent or registry.resolve_agent(s, ref=ref)
    return workspace_of(
        kind=inp.kind,
        sharing=target.workspace_sharing,
        caller_workspace=workspace_for(s, inp.caller_session_id),
    )


class DelegationActivities:
    """``delegate`` and ``cancel_delegations``, built with the DB engine and a client."""

    def __init__(self, engine: Engine, client: Client, *, outbound: OutboundPolicy = OPEN) -> None:
        self._engine = engine
        self._client = client
        #: Where a subagent node's MCP servers may be reached (Settings.outbound_policy).
        self._outbound = outbound

    async def _with_mcp_tools(self, agent: ResolvedAgent | None) -> ResolvedAgent | None:
        """``agent`` (a subagent node's configuration) with its MCP servers' tools discovered
        and narrowed by the node's tool lists. A node's child starts with the configuration
        it is given and never runs ``load_agent``, which discovers them for a pin; without
        this the child was offered none of its servers' tools."""
        if agent is None or not agent.mcp_servers or agent.mcp_tools:
            return agent
        tools = await discover(
            agent.mcp_servers,
            allowed=agent.allowed_tools,
            blocked=agent.blocked_tools,
            policy=self._outbound,
        )
        return agent.model_copy(update={"mcp_tools": tools})

    def _plan(self, inp: DelegateInput) -> Plan:
        """Check the bounds, record the delegation, and say what to start. Raises Refused."""
        caller = inp.tool.agent_slug
        root = inp.root_session_id or inp.caller_session_id
        with session_scope(self._engine) as s:
            child_id = _child_session_id(s, inp)
            existing = s.get(DelegationRow, inp.delegation_id)
            agent: ResolvedAgent | None = None
            ref = inp.target
            prompt = inp.prompt
            if inp.kind == "task":
                caller_row = session_store.get_session(s, session_id=inp.caller_session_id)
                parent = ResolvedAgent.model_validate(caller_row.resolved_agent)
                agent = child_agent(s, parent, inp.alias or "")
                ref = agent.pin
            target_slug = agent.slug if agent else inp.target
            # One decision for every path (guards, membership or roster, ACL, policy). For
            # invoke_agent `authorize` decided (and maybe reviewed) already; deciding again
            # here catches an ACL revoked or a block stored while the review waited.
            decision = gate.decide(
                s,
                gate.Request(
                    caller=caller,
                    operation="invoke",
                    target=target_slug,
                    user=inp.user,
                    auth=inp.config.auth,
                    invoked=inp.invoked,
                    via=inp.kind,
                    team=inp.team if inp.kind != "mention" else None,
                ),
            )
            if decision.verdict == "refuse":
                raise Refused(decision.code or "refused", decision.reason, decision, target_slug)
            team_member = decision.member is not None
            if decision.member is not None and inp.team is not None:
                ref = decision.member.pin
                prompt = _with_memories(s, inp.team, inp.prompt)
            workspace_id = _workspace(s, inp, ref, agent)
            if existing is None:
                # Serialise this run's delegations: count-then-insert must not interleave, or
                # parallel delegate_to calls could all pass max_spawns / token_budget.
                run_tree.lock_run(s, root_session_id=root)
                _check_limits(s, inp, root)
            run_tree.start(
                s,
                delegation_id=inp.delegation_id,
                root_session_id=root,
                parent_session_id=inp.caller_session_id,
                # A continued session (invoke_agent with session_id) is not part of this run:
                # no edge, so its other turns, limits and cancel stay its own.
                child_session_id=None if inp.session_id is not None else child_id,
                kind=inp.kind,
                caller=caller,
                target=agent.slug if agent else inp.target,
                task=inp.prompt,
                depth=inp.depth,
                alias=inp.alias,
                event={
                    "supervisor_agent_id": inp.team.supervisor if inp.team else None,
                    "shared_channel": inp.team.shared_channel if inp.team else None,
                },
            )
        label = "Invoked by" if inp.kind == "invoke" else "Delegated by"
        return Plan(
            session_id=child_id,
            target=agent.slug if agent else inp.target,
            ref=ref,
            prompt=prompt,
            agent=agent,
            provenance=_provenance(inp, root, team_member=team_member, workspace_id=workspace_id),
            name=f"{label} {caller}" if inp.kind != "task" else f"Task {inp.alias} from {caller}",
            continue_existing=inp.kind == "invoke" and inp.session_id is not None,
        )

    @activity.defn(name="delegate")
    async def delegate(self, inp: DelegateInput) -> ToolOutcome:
        """Run one delegation to its result (sync) or its start (async invoke).

        The child's session id derives from the delegation id and its first
        message's Update id is the delegation id, so a retried activity attaches
        to what its first attempt started. Refusals (bounds, membership, unknown
        session, busy, retired target) are the caller's tool error; Temporal being
        unreachable is retried. Team results land on the shared channel.
        """
        tool = inp.tool
        telemetry.annotate(
            agent=tool.agent_slug,
            session=inp.caller_session_id,
            delegation=inp.delegation_id,
            kind=inp.kind,
            target=inp.target,
        )
        done = await asyncio.to_thread(self._stored, tool.message_id)
        if done is not None:
            return done
        answered = await asyncio.to_thread(self._replayed, tool)
        if answered is not None:
            return answered
        sync = inp.sync or inp.kind != "invoke"
        async with heartbeating():
            try:
                plan = await asyncio.to_thread(self._plan, inp)
                reply = await self._send(inp, plan, sync)
            except Refused as exc:
                if exc.decision is not None:
                    return await asyncio.to_thread(
                        self._refused, tool, exc.decision, exc.target, inp.kind
                    )
                return await asyncio.to_thread(self._store, tool, str(exc), False, None)
            except EngineUnavailable:
                raise  # Temporal unreachable: retry the activity
            except TurnCancelled:  # someone cancelled the target's session directly
                text = f"{tool.call.name} cancelled: the target's session was cancelled"
                return await asyncio.to_thread(
                    functools.partial(self._store, tool, text, False, inp, cancelled=True)
                )
            except BatonError as exc:
                text = f"{tool.call.name} failed ({exc.code}): {exc.detail}"
                return await asyncio.to_thread(self._store, tool, text, False, inp)
        telemetry.count_delegation(kind=inp.kind)  # once it has started
        reply = reply or ""
        text = _result_text(inp, plan, reply, sync)
        return await asyncio.to_thread(self._store, tool, text, True, inp, reply, sync)

    async def _send(self, inp: DelegateInput, plan: Plan, sync: bool) -> str | None:
        """Send the delegation's message, its Update id the delegation id: to the session
        the plan continues, or as the first message of the session it starts. The child's
        final reply when ``sync`` (None otherwise); raises as ``launch`` does."""
        if plan.continue_existing:
            _, reply = await launch.send_message(
                self._client,
                self._engine,
                session_id=plan.session_id,
                prompt=plan.prompt,
                sync=sync,
                update_id=inp.delegation_id,
                invoked_by_agent=inp.tool.agent_slug,
                user=inp.user,
            )
            return reply
        launched = await launch.launch_session(
            self._client,
            self._engine,
            task_queue=inp.task_queue,
            config=inp.config,
            ref=plan.ref,
            prompt=plan.prompt,
            provenance=plan.provenance,
            sync=sync,
            name=plan.name,
            session_id=plan.session_id,
            update_id=inp.delegation_id,
            agent=await self._with_mcp_tools(plan.agent),
        )
        return launched.response

    def _refused(
        self, tool: ToolMessage, decision: gate.Decision, target: str | None, via: str
    ) -> ToolOutcome:
        """Store a refusal of the permission decision, audited with the path it came by."""
        with session_scope(self._engine) as s:
            done = stored_outcome(s, tool.message_id)
            if done is not None:
                return done
            if session_store.is_closed(s, session_id=tool.session_id):
                return cancelled_outcome(tool)
            return refuse(s, tool, decision, "invoke", target, via)

    def _replayed(self, tool: ToolMessage) -> ToolOutcome | None:
        """An eval's replay never makes another agent run: the recorded result of the same
        call, or its refusal (:func:`baton.evals.replay.answer_delegation`); None for an
        ordinary session."""
        with session_scope(self._engine) as s:
            answer = replay.answer_delegation(
                s, session_id=tool.session_id, name=tool.call.name, args=tool.call.args
            )
            return None if answer is None else store_result(s, tool, answer.text, ok=answer.ok)

    def _stored(self, message_id: str) -> ToolOutcome | None:
        with session_scope(self._engine) as s:
            return stored_outcome(s, message_id)

    def _store(
        self,
        tool: ToolMessage,
        text: str,
        ok: bool,
        inp: DelegateInput | None,
        reply: str = "",
        finished: bool = True,
        cancelled: bool = False,
    ) -> ToolOutcome:
        """Store the caller's tool result, finish the delegation, feed the team channel."""
        with session_scope(self._engine) as s:
            done = stored_outcome(s, tool.message_id)
            if done is not None:
                return done
            if session_store.is_closed(s, session_id=tool.session_id):
                # The caller was cancelled (its cascade cancelled the child, which is why we
                # got here): nothing reaches its transcript any more.
                if inp is not None:
                    run_tree.finish(s, delegation_id=inp.delegation_id, status="cancelled")
                return cancelled_outcome(tool)
            if inp is not None and finished:
                status = "completed" if ok else "cancelled" if cancelled else "failed"
                # What the delegation showed the person is on its card already: the result
                # says so, so the delegator does not show it again (docs/exhibits.md).
                wires, shown = exhibits.of_delegation(s, inp.delegation_id)
                run_tree.finish(
                    s,
                    delegation_id=inp.delegation_id,
                    status=status,
                    result=reply if ok else "",
                    error=None if ok else text,
                    exhibits=wires,
                )
                text += exhibits.already_displayed(wires, shown, inp.target or inp.alias or "it")
                if ok and inp.team is not None and inp.kind != "invoke":
                    teams.remember(
                        s,
                        team_id=inp.team.id,
                        channel=inp.team.shared_channel,
                        agent=inp.target,
                        text=reply,
                        delegation_id=inp.delegation_id,
                    )
            return store_result(s, tool, text, ok=ok)

    @activity.defn(name="route_turn")
    def route_turn(self, inp: RouteInput) -> RouteDecision:
        """Decide whether a message is routed; if so store it and the routed call.

        The user message and an assistant message carrying the routed
        ``delegate_to`` call are written once (ids from the workflow), so the
        session's model later sees the call and its result and synthesises.
        """
        with session_scope(self._engine) as s:
            stored = session_store.get_message(s, message_id=inp.route_message_id)
            if stored is not None:  # a retry after the write
                call = ToolCall.model_validate((stored.tool_calls or [])[0])
                kind = "route" if ROUTED_BY_TEAM in stored.text else "mention"
                return RouteDecision(kind=kind, target=str(call.args["agent_id"]), call=call)
            found = route_for(s, inp)
            if found is None:
                return RouteDecision()
            kind, target = found
            call = ToolCall(
                id=inp.call_id, name="delegate_to", args={"agent_id": target, "task": inp.prompt}
            )
            session_store.add_message(
                s,
                message_id=inp.user_message_id,
                session_id=inp.session_id,
                position=inp.user_position,
                role="user",
                agent_slug=inp.agent_slug,
                text=inp.prompt,
            )
            session_store.add_message(
                s,
                message_id=inp.route_message_id,
                session_id=inp.session_id,
                position=inp.route_position,
                role="assistant",
                agent_slug=inp.agent_slug,
                text=f"(routed to {target} by {ROUTED_BY_TEAM if kind == 'route' else '@mention'})",
                tool_calls=[call.model_dump()],
            )
            return RouteDecision(kind=kind, target=target, call=call)

    @activity.defn(name="cancel_delegations")
    async def cancel_delegations(self, session_id: str) -> list[str]:
        """Cancel every open session delegated (transitively) from ``session_id``.

        The cancel cascade (issue: cancelling a session cancels every running
        delegation under it, sync and async). Idempotent; returns the ids cancelled.
        """

        def open_children() -> list[str]:
            with session_scope(self._engine) as s:
                ids = run_tree.descendants(s, session_id=session_id)
                rows = [s.get(SessionRow, i) for i in ids]
                # A child whose launch failed has no session: nothing to cancel there.
                return [r.id for r in rows if r is not None and r.status not in CLOSED_STATUSES]

        def record_cancelled() -> None:
            with session_scope(self._engine) as s:
                run_tree.cancel_open(s, session_id=session_id)

        targets = await asyncio.to_thread(open_children)
        for child in targets:
            # The one cancel of a session: a child whose run completed idle has no run to
            # cancel, and Temporal takes a cancel of a closed run as a no-op.
            # EngineUnavailable (Temporal refused) fails the attempt: it is retried.
            await launch.cancel_session(self._client, self._engine, session_id=child)
        await asyncio.to_thread(record_cancelled)
        return targets


def _result_text(inp: DelegateInput, plan: Plan, reply: str, sync: bool) -> str:
    """The caller's tool result of a started delegation: for an invoke, JSON
    ``{session_id, status, response (sync), note and sent_prompt (an edited prompt)}``;
    for the other kinds, the child's reply; replies cut to what a tool result holds."""
    if inp.kind != "invoke":
        return _cut(reply)
    result: dict[str, Any] = {
        "session_id": plan.session_id,
        "status": "completed" if sync else "running",
    }
    if sync:
        result["response"] = _cut(reply)
    if inp.edited_by is not None:
        result["note"] = (
            f"the reviewer ({inp.edited_by}) edited your message; {inp.target} "
            "received the edited prompt"
        )
        result["sent_prompt"] = _cut(inp.prompt)
    return json.dumps(result, ensure_ascii=False)


def _cut(reply: str) -> str:
    if len(reply) <= MAX_INLINE_REPLY:
        return reply
    return reply[:MAX_INLINE_REPLY] + " … (cut; read the rest with get_agent_session_transcript)"


ROUTED_BY_TEAM = "a team route"
MENTION = re.compile(r"(?<![\w@])@([a-z0-9][a-z0-9-]{0,62})\b")


def route_for(session: Session, inp: RouteInput) -> tuple[str, str] | None:
    """``(kind, target)`` for a message: a matching team route first, else the first
    @mention of another live agent (AgentX Agent Teams, '@-mention routing'); else None."""
    if inp.team is not None:
        to = teams.match_route(inp.team.routes, inp.prompt)
        if to is not None:
            return "route", to
    for slug in MENTION.findall(inp.prompt):
        if slug == inp.agent_slug:
            continue
        try:
            registry.resolve_ref(session, ref=slug)
        except BatonError:
            continue  # not an agent that can run: plain text
        return "mention", slug
    return None
