"""Remote MCP servers as tools of Baton's agents (docs/mcp.md).

An agent spec lists ``mcp_servers: [{name, url, headers?}]`` (streamable HTTP).
Their tools are discovered once, when the session loads (:func:`discover_sync`,
called by ``load_agent``), and the list is snapshotted in the resolved agent, so
a replay or a retry offers the same tools. The model sees ``<server>.<tool>``;
``allowed_tools`` / ``blocked_tools`` narrow that list like any other tool. Each
call is the ``mcp_tool`` activity: its arguments are validated against the
tool's input schema (jsonschema) first, and an error of any kind — invalid
arguments, an unreachable server, the tool's own error — is the model's tool
error, never a failed turn. Header values are references (``Bearer ${NAME}``)
resolved from the worker's environment inside the activity, so no secret ever
enters workflow history.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import httpx2
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp_types import TextContent
from sqlalchemy.engine import Engine
from temporalio import activity

from activities.outbound_http import http_client
from activities.outcomes import store_result, stored_outcome
from baton.contracts.activity_io import McpToolInput, ToolOutcome
from baton.contracts.values import McpServerRef, McpToolSnapshot
from baton.evals import replay
from baton.outbound import OPEN, OutboundPolicy
from baton.storage.db import session_scope

#: Seconds to connect to a server, and to list all servers' tools when a session loads.
CONNECT_TIMEOUT_S = 10.0
DISCOVERY_TIMEOUT_S = 5.0  # inside load_agent's store timeout (10 s by default)
MAX_RESULT_CHARS = 32_000
_REF = re.compile(r"\$\{([A-Z][A-Z0-9_]{0,127})\}")


#: The worker's variable listing the names header references may use (comma or space
#: separated): the operator's allow-list of MCP credentials.
SECRETS_VAR = "BATON_MCP_HEADER_SECRETS"
#: Baton's own settings (review secret, database URL, Temporal API key, model and voice
#: keys) are never MCP credentials, whatever the allow-list says.
_OWN_PREFIX = "BATON_"


class HeaderUnresolved(Exception):
    """A header references a variable the worker does not have or does not offer."""


def offered_secrets(env: Mapping[str, str]) -> frozenset[str]:
    """The variable names ``env`` offers to MCP headers: :data:`SECRETS_VAR`'s list,
    without Baton's own ``BATON_…`` settings."""
    names = re.split(r"[\s,]+", env.get(SECRETS_VAR, "").strip())
    return frozenset(n for n in names if n and not n.startswith(_OWN_PREFIX))


def resolve_headers(headers: Mapping[str, str], env: Mapping[str, str]) -> dict[str, str]:
    """Header values with each ``${NAME}`` replaced by ``env[NAME]``, for names the
    operator offers (:func:`offered_secrets`) only.

    The spec's author picks the URL, so a reference to any variable would send any
    worker secret (``BATON_REVIEW_SECRET``, which proves review decisions; the database
    URL; a model key) to a server of their choosing: the one rule of which secrets may
    leave is here, and every connection (discovery and ``mcp_tool``) comes through it.
    Raises HeaderUnresolved naming the header and the variable (never a value).
    """
    offered = offered_secrets(env)
    out: dict[str, str] = {}
    for key, value in headers.items():

        def sub(found: re.Match[str], header: str = key) -> str:
            name = found.group(1)
            if name not in offered:
                msg = (
                    f"header {header} references ${{{name}}}, which the worker does not offer "
                    f"to MCP servers (list it in {SECRETS_VAR}; BATON_… settings never are)"
                )
                raise HeaderUnresolved(msg)
            if name not in env:
                msg = f"header {header} references ${{{name}}}, which the worker does not have"
                raise HeaderUnresolved(msg)
            return env[name]

        out[key] = _REF.sub(sub, value)
    return out


def _http_client(headers: dict[str, str], timeout: float, policy: OutboundPolicy) -> Any:
    """The HTTP client of one MCP connection, under the outbound rule
    (:func:`activities.outbound_http.http_client`)."""
    return http_client(
        policy, headers=headers, timeout=httpx2.Timeout(CONNECT_TIMEOUT_S, read=timeout)
    )


@asynccontextmanager
async def _connect(
    server: McpServerRef, timeout: float, policy: OutboundPolicy
) -> AsyncIterator[ClientSession]:
    headers = resolve_headers(server.headers, os.environ)
    async with (
        _http_client(headers, timeout, policy) as http,
        streamable_http_client(server.url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await asyncio.wait_for(session.initialize(), CONNECT_TIMEOUT_S)
        yield session


def _usable(name: str, allowed: list[str] | None, blocked: list[str]) -> bool:
    return (allowed is None or name in allowed) and name not in blocked


async def _list(
    server: McpServerRef, allowed: list[str] | None, blocked: list[str], policy: OutboundPolicy
) -> list[McpToolSnapshot]:
    try:
        async with (
            asyncio.timeout(DISCOVERY_TIMEOUT_S),
            _connect(server, DISCOVERY_TIMEOUT_S, policy) as c,
        ):
            listed = await c.list_tools()
    except Exception as exc:  # any failure of a remote server is data, not a crash
        activity.logger.warning("MCP server %s: %s", server.name, _why(exc))
        return [McpToolSnapshot(server=server.name, name="", error=_why(exc))]
    snaps = [
        McpToolSnapshot(
            server=server.name,
            name=tool.name,
            description=tool.description or "",
            input_schema=dict(tool.input_schema or {"type": "object"}),
        )
        for tool in listed.tools
    ]
    return [t for t in snaps if _usable(t.qualified, allowed, blocked)]


async def discover(
    servers: list[McpServerRef],
    *,
    allowed: list[str] | None,
    blocked: list[str],
    policy: OutboundPolicy = OPEN,
) -> list[McpToolSnapshot]:
    """Every server's tools, narrowed by ``allowed`` / ``blocked`` (qualified names), listed
    in parallel within :data:`DISCOVERY_TIMEOUT_S`, each connection under ``policy`` (the
    worker's :meth:`baton.settings.Settings.outbound_policy`). A server that cannot be
    listed, or that the policy refuses, yields one snapshot with ``error`` and no tools."""
    found = await asyncio.gather(*(_list(m, allowed, blocked, policy) for m in servers))
    return [snap for snaps in found for snap in snaps]


def discover_sync(
    servers: list[McpServerRef],
    *,
    allowed: list[str] | None,
    blocked: list[str],
    policy: OutboundPolicy = OPEN,
) -> list[McpToolSnapshot]:
    """:func:`discover` from a sync activity (its own event loop in the activity's thread)."""
    return asyncio.run(discover(servers, allowed=allowed, blocked=blocked, policy=policy))


def _why(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return _why(exc.exceptions[0])
    return f"{type(exc).__name__}: {exc}"[:500] if str(exc) else type(exc).__name__


def check_arguments(schema: dict[str, Any], args: dict[str, Any]) -> str | None:
    """Up to five problems of ``args`` against the tool's JSON Schema, or None when valid."""
    try:
        validator = Draft202012Validator(schema)
        errors = sorted(validator.iter_errors(args), key=lambda e: list(e.path))[:5]
    except SchemaError as exc:
        return f"the tool's input schema is invalid: {exc.message}"
    if not errors:
        return None
    return "; ".join(f"{'.'.join(map(str, e.path)) or 'arguments'}: {e.message}" for e in errors)


class McpToolActivities:
    """The ``mcp_tool`` activity, built with the DB engine and the worker's outbound policy
    (worker/factory.py)."""

    def __init__(self, engine: Engine, *, policy: OutboundPolicy = OPEN) -> None:
        self._engine = engine
        self._policy = policy

    def _store(self, inp: McpToolInput, text: str, ok: bool) -> ToolOutcome:
        with session_scope(self._engine) as s:
            done = stored_outcome(s, inp.tool.message_id)
            if done is not None:
                return done
            return store_result(s, inp.tool, text[:MAX_RESULT_CHARS], ok=ok)

    def _done(self, message_id: str) -> ToolOutcome | None:
        with session_scope(self._engine) as s:
            return stored_outcome(s, message_id)

    def _replayed(self, inp: McpToolInput) -> ToolOutcome | None:
        """An eval's replay answers the call from the recording
        (:func:`baton.evals.replay.answer_tool`); None: call the server."""
        call = inp.tool.call
        with session_scope(self._engine) as s:
            answer = replay.answer_tool(
                s, session_id=inp.tool.session_id, name=call.name, args=call.args
            )
            return None if answer is None else store_result(s, inp.tool, answer.text, ok=answer.ok)

    @activity.defn(name="mcp_tool")
    async def mcp_tool(self, inp: McpToolInput) -> ToolOutcome:
        """Call ``<server>.<tool>`` once its arguments match the input schema; store the
        result (text content joined) or the error as the tool message. Never raises for
        the server's sake: ``invalid_arguments``, ``mcp_unreachable`` (a server down, or an
        address the outbound policy refuses), ``mcp_tool_error`` are the model's tool
        errors."""
        done = await asyncio.to_thread(self._done, inp.tool.message_id)
        if done is not None:
            return done
        answered = await asyncio.to_thread(self._replayed, inp)
        if answered is not None:
            return answered
        args = inp.tool.call.args
        problems = check_arguments(inp.input_schema, args)
        if problems is not None:
            return await asyncio.to_thread(
                self._store, inp, f"invalid_arguments: {problems}", False
            )
        # Inside the activity's start-to-close (BATON_TOOL_TIMEOUT): a slow server is a tool
        # error, never a timed-out attempt that Temporal would retry (calling it again).
        limit = activity.info().start_to_close_timeout
        budget = 0.8 * (limit.total_seconds() if limit else 60.0)
        try:
            async with _connect(inp.server, budget, self._policy) as session:
                result = await asyncio.wait_for(session.call_tool(inp.name, args), budget)
        except HeaderUnresolved as exc:
            return await asyncio.to_thread(self._store, inp, f"mcp_unreachable: {exc}", False)
        except Exception as exc:  # an unreachable or broken server is the model's tool error
            text = f"mcp_unreachable: {inp.server.name} ({inp.server.url}): {_why(exc)}"
            return await asyncio.to_thread(self._store, inp, text, False)
        body = "\n".join(c.text for c in result.content if isinstance(c, TextContent))
        if result.is_error:
            return await asyncio.to_thread(self._store, inp, f"mcp_tool_error: {body}", False)
        return await asyncio.to_thread(self._store, inp, body, True)
