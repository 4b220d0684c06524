"""The session workflow's state and the small steps every section shares: status and
current details, a tool call's message, the model turn, an ordinary tool, refusals and
failures, local activities. The patch ids of every session change live here, in one
place (docs/architecture.md, "The session workflow, file by file").

The sections build on it in one line: :class:`~workflows.delegation.DelegationMixin`
→ :class:`~workflows.reviews.ReviewMixin` → :class:`~workflows.dispatch.DispatchMixin`
→ :class:`~workflows.session.SessionWorkflow`; each calls only what is below it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from activities.turns import SessionActivities
    from activities.xagent import XAgentActivities
    from baton.contracts import (
        OPERATION_OF,
        SA_AGENT,
        SA_STATUS,
        DelegationOffer,
        LateDecision,
        ModelTurnInput,
        ModelTurnResult,
        RefusalInput,
        ResolvedAgent,
        ResolvedLimits,
        ReviewDecision,
        SessionConfig,
        SessionInput,
        SessionStatus,
        ToolCall,
        ToolInput,
        ToolMessage,
        ToolOutcome,
        TurnFailure,
        Via,
        position,
    )
    from workflows.options import (
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
PATCH_LOCAL_XAGENT_READ = "xagent-read-local-activity"

#: The level (``SessionInput.patch_level``) at which a run is born with each patch: it
#: runs the patched branch from its first command, without a marker (``_patched``). A
#: patch added later gets the next level, and SESSION_PATCH_LEVEL moves up with it.
BORN_PATCHED: dict[str, int] = dict.fromkeys(
    (
        PATCH_COARSE_STATUS,
        PATCH_CANCEL_TURN,
        PATCH_LOAD_FAILED,
        PATCH_XAGENT,
        PATCH_DELEGATION,
        PATCH_CASCADE,
        PATCH_ROUTING,
        PATCH_CALL_CAP,
        PATCH_ONE_DECISION,
        PATCH_MCP_TOOLS,
        PATCH_LOCAL_LOAD,
        PATCH_LOCAL_SETTLE,
        PATCH_IDLE_COMPLETE,
    ),
    1,
)
# Not born yet: PATCH_LOCAL_XAGENT_READ (issue 14's local list/read). A worker one release
# older than the launcher must run a born run's patched branches (docs/deployment.md), and
# the release before this one has no such branch; so it records its marker for one
# release, and joins BORN_PATCHED at level 2 (with SESSION_PATCH_LEVEL = 2) in the next.

#: Characters of the last message shown in the current details.
DETAILS_PREVIEW = 80


def _marked(patch_id: str) -> bool:
    """Whether this run's history holds a marker for ``patch_id``: the patches the SDK was
    notified of while replaying (what ``workflow.patched`` itself consults; temporalio
    1.35's ``_patches_notified``). tests/test_born_patched.py fails if the SDK renames it.
    """
    notified: set[str] = workflow._Runtime.current()._patches_notified  # type: ignore[attr-defined]
    return patch_id in notified


class SessionBase:
    """The state of one session run (set in :meth:`SessionWorkflow.__init__`) and the
    steps shared by every section."""

    _agent: ResolvedAgent | None
    _status: SessionStatus
    _turn_task: asyncio.Task[Any] | None
    _open_reviews: dict[str, dict[str, Any]]
    _expected_reviews: set[str]
    _decisions: dict[str, ReviewDecision]
    _late_decisions: list[LateDecision]
    _settled_reviews: dict[str, None]
    _review_deadlines: dict[str, str]
    _ended: SessionStatus | None
    _inp: SessionInput
    _turn: int
    _busy: bool
    _closed: bool
    _invoked_turn: bool
    _turn_user: str
    _last_message: str
    _completed_idle: bool

    def _patched(self, patch_id: str) -> bool:
        """``workflow.patched(patch_id)``, without the marker in a run born patched.

        A run whose input's ``patch_level`` reaches the patch's ``BORN_PATCHED`` level was
        started by code that has the patch, so it takes the patched branch from its first
        command and records nothing. A marker costs a history event and a
        ``TemporalChangeVersion`` search-attribute upsert (a visibility write) each: two
        of each in a new session's first turn, ~10 ms of it (bench/README.md, issue 14).
        A marker the history holds anyway (a worker that ignored the field recorded it)
        is replayed through ``workflow.patched``, so such a history stays deterministic.
        """
        level = BORN_PATCHED.get(patch_id)
        if level is not None and self._inp.patch_level >= level and not _marked(patch_id):
            return True
        return workflow.patched(patch_id)

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
        if not self._patched(PATCH_COARSE_STATUS):
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

    def _tool_message(
        self, agent: ResolvedAgent, turn: int, step: int, index: int, call: ToolCall
    ) -> ToolMessage:
        return tool_message(self._inp.session_id, agent.slug, turn, step, index, call)

    @property
    def _root(self) -> str:
        return self._inp.provenance.root_session_id or self._inp.session_id

    def _run_limits(self, agent: ResolvedAgent) -> ResolvedLimits:
        """The run's limits: the root agent's, carried down every delegation."""
        return self._inp.provenance.run_limits or agent.limits

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
            and not (self._invoked_turn and self._patched(PATCH_ONE_DECISION))
        )
        return DelegationOffer(team=team if lead else None, adhoc=adhoc, task=bool(agent.subagents))

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
        await self._fail_text(message_id, pos, error_cause(err), final)

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

    async def _tool(
        self, agent: ResolvedAgent, turn: int, step: int, index: int, call: ToolCall
    ) -> ToolOutcome:
        tool = self._tool_message(agent, turn, step, index, call)
        return await run_ordinary_tool(tool, agent.tools, f"turn {turn}", self._inp.config)

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


def error_cause(err: ActivityError) -> str:
    cause = err.cause
    return str(cause.message) if isinstance(cause, ApplicationError) else str(cause or err)


def arg_problems(exc: ValidationError) -> str:
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
