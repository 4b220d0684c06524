"""What one turn of a session runs with, handed explicitly to each collaborator of the
session workflow (dispatch, X-Agent calls, reviews, delegations): the run's input, the
pinned agent, the turn, whose permissions it uses and whether another agent sent it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from baton.contracts.activity_io import ToolMessage, ToolOutcome
    from baton.contracts.values import ResolvedAgent, ResolvedLimits, ToolCall, Via
    from baton.contracts.workflow_io import SessionConfig, SessionInput

from workflows.calls import error_cause, refuse, tool_message


@dataclass(frozen=True)
class TurnContext:
    """One turn (a user message, or one external MCP call) of a session run.

    ``user``: whose permissions the turn's X-Agent calls use (auth mode: the sender).
    ``invoked``: another agent sent the turn, or started the session (Gamut X-Agent,
    one hop). ``closed``: whether the session was cancelled meanwhile (read when an
    activity fails: a cancelled session records nothing more). ``interrupted``: a newer
    message asked this turn to stop (read between steps and when its model call fails);
    ``model_call`` is told of the turn's running model call (None when it ended), so an
    interrupt can cancel it (:class:`workflows.inbox.Inbox`).
    """

    inp: SessionInput
    agent: ResolvedAgent
    turn: int
    user: str
    invoked: bool
    closed: Callable[[], bool]
    interrupted: Callable[[], bool] = field(default=lambda: False)
    model_call: Callable[[workflow.ActivityHandle[Any] | None], None] = field(
        default=lambda _handle: None
    )

    @property
    def cfg(self) -> SessionConfig:
        return self.inp.config

    @property
    def session_id(self) -> str:
        return self.inp.session_id

    @property
    def root(self) -> str:
        """The run's root session: this one unless it was delegated."""
        return self.inp.provenance.root_session_id or self.inp.session_id

    def run_limits(self) -> ResolvedLimits:
        """The run's limits: the root agent's, carried down every delegation."""
        return self.inp.provenance.run_limits or self.agent.limits

    def tool(self, step: int, index: int, call: ToolCall) -> ToolMessage:
        """Where call ``index`` of model call ``step`` stores its result."""
        return tool_message(self.session_id, self.agent.slug, self.turn, step, index, call)

    async def refuse(
        self,
        tool: ToolMessage,
        code: str,
        error: str,
        *,
        target: str | None = None,
        audit: bool = True,
        via: Via | None = None,
    ) -> ToolOutcome:
        """Store a refusal as the call's result (:func:`workflows.calls.refuse`)."""
        return await refuse(tool, code, error, self.cfg, target=target, audit=audit, via=via)

    async def failed(self, tool: ToolMessage, code: str, err: ActivityError) -> ToolOutcome:
        """An activity of the call failed: its error becomes the call's result (unaudited),
        so the agent reads why and goes on; re-raised when the session was cancelled."""
        if self.closed():
            raise err
        return await self.refuse(tool, code, error_cause(err), audit=False)
