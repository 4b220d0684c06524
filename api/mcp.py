"""The MCP server ``agents`` at ``/mcp`` (streamable HTTP): the five X-Agent tools for agents
that run outside Baton (Gamut X-Agent 'How it works', docs/mcp.md).

Built with the official SDK's :class:`mcp.server.mcpserver.MCPServer` (mcp 2.x).
Every request carries ``Authorization: Bearer <proxy_token>``; :class:`ProxyAuth`
refuses it with a 401 problem+json before the SDK sees it, otherwise the tools
act for the token's session. Each tool call is the Update ``external_tool_call``
on that session's workflow (:func:`baton.runs.external.call_tool`), so guards, ACL,
policy, reviews, audit and durability are the model path's own; this module only
translates. Stateless HTTP: any API replica can answer any request (docs/deployment.md).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import CallToolResult, TextContent
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from api.deps import Caller, get_temporal
from api.problems import problem_response
from baton.errors import BatonError
from baton.grants.auth import Unauthorized
from baton.runs import external
from baton.storage.db import session_scope

#: Where the server is mounted on the API process.
MCP_PATH = "/mcp"
#: Largest MCP request body (bytes): one tool call's arguments, kept well below
#: Temporal's payload limit so an oversized call never reaches a workflow.
MAX_BODY_BYTES = 1024 * 1024
#: The request-state key under which ProxyAuth leaves the caller's identity.
IDENTITY = "baton_external"
#: ``_meta`` key a client may set to make a retried call attach to the first one.
IDEMPOTENCY_KEY = "baton/idempotency_key"

INSTRUCTIONS = (
    "X-Agent tools of Baton: discover (list_agents), create (create_agent), invoke "
    "(invoke_agent) other agents and read their sessions. Every call is checked by the "
    "host's policies; a call may wait for a human review (up to 5 minutes)."
)


class ProxyAuth:
    """ASGI guard in front of the SDK's app: 401 problem+json (code ``unauthorized``)
    without a valid proxy token (:func:`baton.runs.external.authenticate`), else the identity
    goes into the request state for the tools."""

    def __init__(self, inner: ASGIApp) -> None:
        self._inner = inner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._inner(scope, receive, send)
            return
        token = external.bearer(Headers(scope=scope).get("authorization"))
        engine = scope["app"].state.engine

        def check() -> external.ExternalIdentity:
            if token is None:
                raise Unauthorized("send `Authorization: Bearer <proxy_token>`")
            with session_scope(engine) as s:
                return external.authenticate(s, token)

        try:
            identity = await asyncio.to_thread(check)
        except Unauthorized as exc:
            response = problem_response(exc.to_problem())
            response.headers["WWW-Authenticate"] = 'Bearer realm="baton-mcp"'
            await response(scope, receive, send)
            return
        scope.setdefault("state", {})[IDENTITY] = identity
        await self._inner(scope, receive, send)


def _text(result: external.ToolResult) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=result.text)], is_error=not result.ok
    )


async def _call(ctx: Context, tool: str, **args: Any) -> CallToolResult:
    """One tool call through the caller session's workflow, with progress while it waits."""
    request = ctx.request_context.request
    assert isinstance(request, Request)
    identity: external.ExternalIdentity = request.state.baton_external
    settings = request.app.state.settings
    client = await get_temporal(request, Caller(user=identity.user_id, auth=settings.auth == "on"))
    meta = ctx.request_context.meta or {}
    key = str(meta.get(IDEMPOTENCY_KEY) or uuid.uuid4())[:100]

    async def waiting(seconds: float) -> None:
        # Progress keeps the client's stream (and every proxy on the way) from timing out
        # while a review or a sync invoke runs; the total is unknown.
        await ctx.report_progress(seconds, None, f"{tool}: waiting ({seconds:.0f} s)")

    try:
        result = await external.call_tool(
            client,
            request.app.state.engine,
            identity,
            name=tool,
            args={k: v for k, v in args.items() if v is not None},
            key=key,
            waiting=waiting,
        )
    except BatonError as exc:
        result = external.ToolResult(ok=False, text=f"{exc.code}: {exc.detail}", code=exc.code)
    return _text(result)


@contextmanager
def root_logging_kept() -> Iterator[None]:
    """Undo whatever the block does to the root logger's handlers and level.

    The SDK's ``MCPServer`` runs its ``configure_logging`` when built: a
    ``logging.basicConfig`` that puts a Rich handler on the root logger of the whole
    process (the API's, and in `baton dev` the worker's too). Logging is the
    application's to configure, never a library's.
    """
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def build_server() -> MCPServer:
    """The ``agents`` server with exactly the five tools of Gamut's X-Agent; the root
    logger is left as it was (:func:`root_logging_kept`)."""
    with root_logging_kept():
        server: MCPServer = MCPServer(
            "agents", instructions=INSTRUCTIONS, version="1", log_level="WARNING"
        )

    @server.tool()
    async def list_agents(ctx: Context) -> CallToolResult:
        """The other agents of the workspace (you are excluded): slug, name, description."""
        return await _call(ctx, "list_agents")

    @server.tool()
    async def create_agent(
        name: str, ctx: Context, description: str | None = None, instructions: str | None = None
    ) -> CallToolResult:
        """Create an agent (always reviewed by a human); returns its slug for invoke_agent."""
        return await _call(
            ctx, "create_agent", name=name, description=description, instructions=instructions
        )

    @server.tool()
    async def invoke_agent(
        slug: str, prompt: str, ctx: Context, session_id: str | None = None, sync: bool = False
    ) -> CallToolResult:
        """Send a message to another agent. sync=true waits for its final reply; else returns
        at once with status running (read it later with get_agent_session_transcript)."""
        return await _call(
            ctx, "invoke_agent", slug=slug, prompt=prompt, session_id=session_id, sync=sync
        )

    @server.tool()
    async def get_agent_sessions(
        slug: str, ctx: Context, limit: int = 50, offset: int = 0
    ) -> CallToolResult:
        """Another agent's sessions, newest first (limit ≤ 200)."""
        return await _call(ctx, "get_agent_sessions", slug=slug, limit=limit, offset=offset)

    @server.tool()
    async def get_agent_session_transcript(
        slug: str, session_id: str, ctx: Context, sync: bool = False
    ) -> CallToolResult:
        """A session's transcript: a status line, then one entry per message, starting with
        its header ([user], [assistant <slug>], [tool <name>]); its further lines start with
        '  | '. 'via external process' marks what an outside process wrote. sync=true waits
        for a running turn to finish first."""
        return await _call(
            ctx, "get_agent_session_transcript", slug=slug, session_id=session_id, sync=sync
        )

    return server


class MountedMCP:
    """The server, its route for the FastAPI app and the lifespan its sessions need."""

    def __init__(self) -> None:
        self.server = build_server()
        # Bearer tokens, not cookies, authenticate: a DNS-rebinding page cannot send one,
        # so the SDK's Host/Origin allow-list (for cookie-less local servers) stays off.
        self.server.streamable_http_app(
            streamable_http_path=MCP_PATH,
            stateless_http=True,
            # The largest valid call (create_agent's instructions) is far smaller.
            max_request_body_size=MAX_BODY_BYTES,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        app = StreamableHTTPASGIApp(self.server.session_manager)
        self.route = Route(MCP_PATH, endpoint=ProxyAuth(app), methods=["GET", "POST", "DELETE"])

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Run the SDK's session manager (once per app)."""
        async with self.server.session_manager.run():
            yield
