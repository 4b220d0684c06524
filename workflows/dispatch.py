"""One road for every tool call of a session, the model's and an external session's MCP
calls (docs/mcp.md): X-Agent tools and delegations are the workflow's own, a snapshot's
``<server>.<tool>`` a remote MCP tool, anything else (or a tool the agent blocks) an
ordinary tool, which refuses unknown names; a workspace tool (``write_file`` …) the
``workspace_tool`` activity.
"""

from __future__ import annotations

import asyncio

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.mcp_tools import McpToolActivities
    from activities.workspaces import WorkspaceActivities
    from baton.contracts.activity_io import McpToolInput, ToolMessage, ToolOutcome
    from baton.contracts.values import DELEGATION_TOOLS, XAGENT_TOOLS, McpToolSnapshot, ToolCall
    from baton.contracts.workspaces import WORKSPACE_TOOLS

from workflows.calls import run_ordinary_tool, run_tool_activity, usable_tools
from workflows.context import TurnContext
from workflows.delegation import delegation_tool
from workflows.options import STORE_RETRY, tool_timeout
from workflows.reviews import Reviews
from workflows.xagent import xagent_tool

#: Release 1.0.0 ran a call named like a workspace tool as an ordinary tool (refused);
#: runs from before this gate replay that way (docs/development.md, Workflow changes).
WORKSPACE_TOOLS_PATCH = "workspace-tools"
#: Before this gate a call of a reply that failed for good left its siblings running (a
#: review went on waiting, and could still run its invoke, after the turn had failed) and
#: the turn failed unrecorded; runs from before it replay that way.
FAILED_REPLY_PATCH = "failed-reply-ends-its-calls"


async def dispatch(
    ctx: TurnContext, reviews: Reviews, step: int, index: int, call: ToolCall
) -> ToolOutcome:
    """Run call ``index`` of model call ``step`` by the road its name picks."""
    tool = ctx.tool(step, index, call)
    agent = ctx.agent
    if call.name not in agent.blocked_tools:
        if call.name in XAGENT_TOOLS:
            return await xagent_tool(ctx, reviews, tool)
        if call.name in DELEGATION_TOOLS:
            return await delegation_tool(ctx, tool)
        if call.name in WORKSPACE_TOOLS and workflow.patched(WORKSPACE_TOOLS_PATCH):
            return await workspace_tool(ctx, tool)
        if "." in call.name:
            snap = next((t for t in agent.mcp_tools if t.name and t.qualified == call.name), None)
            if snap is not None:
                return await mcp_tool(ctx, tool, snap)
    return await run_ordinary_tool(tool, usable_tools(agent), f"turn {ctx.turn}", ctx.cfg)


async def dispatch_reply(
    ctx: TurnContext, reviews: Reviews, step: int, calls: list[ToolCall]
) -> None:
    """The tool calls of one model reply, in parallel, up to ``max_tool_calls_per_reply``:
    each holds worker slots (a sync delegation for as long as its child runs), so the
    rest are refused (``too_many_tool_calls``) for the model to call in its next reply."""
    cap = ctx.cfg.max_tool_calls_per_reply
    tasks = [
        asyncio.ensure_future(
            dispatch(ctx, reviews, step, i, call) if i < cap else too_many(ctx, step, i, call)
        )
        for i, call in enumerate(calls)
    ]
    try:
        await asyncio.gather(*tasks)
    except ActivityError:
        # One call failed for good and fails the turn: its siblings end with it (a review
        # stops waiting; `record_failure` cancels its row), none runs after the turn.
        if workflow.patched(FAILED_REPLY_PATCH):
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def too_many(ctx: TurnContext, step: int, index: int, call: ToolCall) -> ToolOutcome:
    """The refusal of a call past the per-reply cap."""
    return await ctx.refuse(
        ctx.tool(step, index, call),
        "too_many_tool_calls",
        f"at most {ctx.cfg.max_tool_calls_per_reply} tool calls run per reply; "
        "call the rest in your next reply",
        audit=False,
    )


async def mcp_tool(ctx: TurnContext, tool: ToolMessage, snap: McpToolSnapshot) -> ToolOutcome:
    """A tool of a remote MCP server: the ``mcp_tool`` activity. Its errors (schema,
    unreachable server, the tool's own) are tool results, not failures."""
    server = next(m for m in ctx.agent.mcp_servers if m.name == snap.server)
    return await workflow.execute_activity_method(
        McpToolActivities.mcp_tool,
        McpToolInput(tool=tool, server=server, name=snap.name, input_schema=snap.input_schema),
        start_to_close_timeout=tool_timeout(ctx.cfg),
        retry_policy=STORE_RETRY,
        summary=f"{tool.call.name} · turn {ctx.turn}",
    )


async def workspace_tool(ctx: TurnContext, tool: ToolMessage) -> ToolOutcome:
    """A built-in workspace tool: the ``workspace_tool`` activity, which finds the session's
    workspace itself (the input carries no file, docs/workspaces.md). Its refusals are tool
    results, not failures."""
    fn = WorkspaceActivities.workspace_tool
    return await run_tool_activity(fn, tool, [], f"turn {ctx.turn}", ctx.cfg)
