"""One road for every tool call of a session: the model's and an external session's MCP
calls (Updates ``external_tool_call`` and ``external_message``) (docs/mcp.md).
"""

from __future__ import annotations

from collections.abc import Awaitable

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities.external import ExternalActivities
    from activities.mcp_tools import McpToolActivities
    from activities.turns import SessionActivities
    from baton.contracts import (
        DELEGATION_TOOLS,
        EXTERNAL_MESSAGE,
        EXTERNAL_TOOL_CALL,
        INVALID_PROMPT,
        NOT_EXTERNAL,
        SESSION_CLOSED,
        UNKNOWN_TOOL,
        XAGENT_TOOLS,
        ExternalMessage,
        ExternalMessageInput,
        ExternalMessageOutcome,
        ExternalToolCall,
        McpToolInput,
        McpToolSnapshot,
        ResolvedAgent,
        StatusChange,
        ToolCall,
        ToolOutcome,
        position,
    )
    from workflows.options import (
        STORE_RETRY,
        store_timeout,
        tool_timeout,
    )


from workflows.reviews import ReviewMixin
from workflows.session_base import (
    PATCH_DELEGATION,
    PATCH_MCP_TOOLS,
    PATCH_XAGENT,
)


class DispatchMixin(ReviewMixin):
    """Tool-call dispatch and the external session's Updates."""

    def _dispatch(
        self, agent: ResolvedAgent, turn: int, step: int, index: int, call: ToolCall
    ) -> Awaitable[ToolOutcome]:
        """Route a tool call: X-Agent tools and delegations are the workflow's own; a tool
        the agent blocks, or any other, is an ordinary tool (which refuses unknown ones)."""
        if call.name not in agent.blocked_tools:
            if call.name in XAGENT_TOOLS and self._patched(PATCH_XAGENT):
                return self._xagent(agent, turn, step, index, call)
            if call.name in DELEGATION_TOOLS and self._patched(PATCH_DELEGATION):
                return self._delegation(agent, turn, step, index, call)
            # Issue 13: `<server>.<tool>` of the snapshot (only such names reach patched()).
            if "." in call.name and self._patched(PATCH_MCP_TOOLS):
                snap = next(
                    (t for t in agent.mcp_tools if t.name and t.qualified == call.name), None
                )
                if snap is not None:
                    return self._mcp_tool(agent, turn, step, index, call, snap)
        return self._tool(agent, turn, step, index, call)

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

    @external_tool_call.validator
    def _validate_external_call(self, req: ExternalToolCall) -> None:
        self._validate_external()
        if req.name not in XAGENT_TOOLS:
            raise ApplicationError(
                f"unknown tool '{req.name[:64]}'; the tools are {', '.join(XAGENT_TOOLS)}",
                type=UNKNOWN_TOOL,
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
