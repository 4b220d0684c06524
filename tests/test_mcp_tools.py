"""MCP servers as tools of Baton's agents: a local MCP server built with the
SDK, served over real HTTP, reached by a real worker through the `mcp_tool` activity."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import Receive, Scope, Send
from temporalio.testing import WorkflowEnvironment

from activities import mcp_tools
from activities.mcp_tools import HeaderUnresolved, check_arguments, resolve_headers
from baton.agents.spec import AgentSpec
from tests.conftest import serve
from tests.openai_stub import OpenAIStub
from tests.test_api_reviews import Stack, messages, running_stack, settled
from worker.stack import free_port

SECRET = "s3cret-value"
SEEN: list[str] = []


def local_server() -> Any:
    """An MCP server with a tool that works, one that errors and one an agent blocks."""
    server = MCPServer("local", log_level="WARNING")

    @server.tool()
    def echo(text: str) -> str:
        """Echo the text back."""
        return f"echo: {text}"

    @server.tool()
    def fail() -> str:
        """Always fails."""
        raise ToolError("the tool broke")

    @server.tool()
    def secret() -> str:
        """Must never be offered to the agent (blocked)."""
        return "leaked"

    app = server.streamable_http_app(
        stateless_http=True,
        json_response=True,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )

    async def recording(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            SEEN.append(headers.get(b"authorization", b"").decode())
        await app(scope, receive, send)

    return recording


@pytest.fixture
def mcp_url() -> Iterator[str]:
    """The local MCP server under uvicorn on a loopback port."""
    server, thread, base = serve(local_server())
    try:
        yield f"{base}/mcp"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture
def stack(
    temporal_env: WorkflowEnvironment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Stack]:
    """API + worker (in this process: it reads MCP_TEST_TOKEN from the environment)."""
    monkeypatch.setenv("MCP_TEST_TOKEN", SECRET)
    monkeypatch.setenv("BATON_MCP_HEADER_SECRETS", "MCP_TEST_TOKEN")
    # The local server answers in this process: a second suite beside this one can hold
    # it past the 5 s discovery bound, and its tools would then be missing from the turn.
    monkeypatch.setattr(mcp_tools, "DISCOVERY_TIMEOUT_S", 60.0)
    with running_stack(temporal_env, tmp_path / "tools.db") as s:
        yield s


def test_remote_tools_succeed_error_and_stay_blocked(stack: Stack, mcp_url: str) -> None:
    """The agent calls `local.echo` (its result), `local.fail` (the tool's error), `local.echo`
    with bad arguments (refused by the schema before any call) and the blocked
    `local.secret` (never offered, refused); an unreachable server costs only its tools.
    The turn completes, and the secret header value is in no workflow input."""
    http = stack.http
    down = f"http://127.0.0.1:{free_port()}/mcp"
    spec = {
        "mcp_servers": [
            {
                "name": "local",
                "url": mcp_url,
                "headers": {"Authorization": "Bearer ${MCP_TEST_TOKEN}"},
            },
            {"name": "down", "url": down},
        ],
        "blocked_tools": ["local.secret"],
        "playbook": [
            {"when": "^(local|down)\\.", "reply": "DONE"},
            {
                "when": "go",
                "reply": "Calling.",
                "tool_calls": [
                    {"tool": "local.echo", "args": {"text": "hi"}},
                    {"tool": "local.fail", "args": {}},
                    {"tool": "local.echo", "args": {"txt": 1}},
                    {"tool": "local.secret", "args": {}},
                ],
            },
        ],
    }
    assert (
        http.post("/v1/agents", json={"slug": "user", "name": "U", "spec": spec}).status_code == 201
    )
    assert http.post("/v1/agents/user/publish").status_code == 201
    resp = http.post("/v1/sessions", json={"agent": "user", "prompt": "go", "sync": True})
    assert resp.status_code == 201, resp.text
    sid = resp.json()["session_id"]
    settled(http, sid)
    tools = [m for m in messages(http, sid) if m["role"] == "tool"]
    by_name = [(m["tool_name"], m["text"]) for m in tools]
    assert by_name[0] == ("local.echo", "echo: hi")
    assert by_name[1][0] == "local.fail" and by_name[1][1].startswith("mcp_tool_error: ")
    assert "the tool broke" in by_name[1][1]
    assert by_name[2][0] == "local.echo" and by_name[2][1].startswith("invalid_arguments: ")
    assert by_name[3][0] == "local.secret" and "leaked" not in by_name[3][1]
    assert messages(http, sid)[-1]["text"] == "DONE"
    assert f"Bearer {SECRET}" in SEEN
    # The snapshot the session runs with: local's two usable tools and down's error.
    row = asyncio.run(_resolved_agent(stack, sid))
    offered = sorted(f"{t['server']}.{t['name']}" for t in row["mcp_tools"] if t["name"])
    assert offered == ["local.echo", "local.fail"]
    assert any(t["server"] == "down" and t["error"] for t in row["mcp_tools"])
    assert SECRET not in str(row)


async def _resolved_agent(stack: Stack, sid: str) -> dict[str, Any]:
    from baton.storage.db import SessionRow, session_scope

    with session_scope(stack.engine) as s:
        row = s.get(SessionRow, sid)
        assert row is not None and row.resolved_agent is not None
        return row.resolved_agent


def test_header_values_reference_secrets_by_name_only() -> None:
    """A spec refuses a literal header value; a reference resolves from the environment
    and a missing variable is named (never its value)."""
    ok = {"name": "gh", "url": "https://x.example/mcp", "headers": {"Authorization": "Bearer ${T}"}}
    AgentSpec.model_validate({"mcp_servers": [ok]})
    literal = {**ok, "headers": {"Authorization": "Bearer ghp_123"}}
    with pytest.raises(ValueError):
        AgentSpec.model_validate({"mcp_servers": [literal]})
    with pytest.raises(ValueError):
        AgentSpec.model_validate({"mcp_servers": [ok, ok]})
    offers = {"BATON_MCP_HEADER_SECRETS": "T"}
    assert resolve_headers({"A": "Bearer ${T}"}, {"T": "v", **offers}) == {"A": "Bearer v"}
    with pytest.raises(HeaderUnresolved, match=r"\$\{T\}"):
        resolve_headers({"A": "Bearer ${T}"}, offers)
    schema = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
    assert check_arguments(schema, {"text": "x"}) is None
    assert "required" in (check_arguments(schema, {}) or "")


def test_a_provider_sees_mcp_tools_under_names_it_accepts(
    stack: Stack, mcp_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenAI-style providers accept function names of [a-zA-Z0-9_-] only: `local.echo` is
    offered as `local__echo`, the provider's call of `local__echo` runs `local.echo`, and
    the history sent back names the call as offered."""
    fake = OpenAIStub(tool=("local__echo", '{"text": "hi"}'))
    server, thread, base = serve(fake.app)
    monkeypatch.setenv("OPENAI_BASE_URL", f"{base}/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    try:
        spec = {
            "model": "openai-chat:stub-model",
            "mcp_servers": [
                {
                    "name": "local",
                    "url": mcp_url,
                    "headers": {"Authorization": "Bearer ${MCP_TEST_TOKEN}"},
                }
            ],
        }
        http = stack.http
        created = http.post("/v1/agents", json={"slug": "wire", "name": "W", "spec": spec})
        assert created.status_code == 201, created.text
        assert http.post("/v1/agents/wire/publish").status_code == 201
        resp = http.post("/v1/sessions", json={"agent": "wire", "prompt": "go", "sync": True})
        assert resp.status_code == 201, resp.text
        assert resp.json()["response"] == "The result is echo: hi."
        offered = [t["function"]["name"] for t in fake.requests[0]["tools"]]
        assert "local__echo" in offered
        assert all(re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", n) for n in offered), offered
        tools = [m for m in messages(http, resp.json()["session_id"]) if m["role"] == "tool"]
        assert [(m["tool_name"], m["text"]) for m in tools] == [("local.echo", "echo: hi")]
        sent_back = [
            c["function"]["name"]
            for m in fake.requests[1]["messages"]
            for c in m.get("tool_calls") or []
        ]
        assert sent_back == ["local__echo"]
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_a_subagent_nodes_child_is_offered_its_agents_mcp_tools(stack: Stack, mcp_url: str) -> None:
    """A subagent node whose agent lists an MCP server: the task's child session (started
    with the node's configuration, so no `load_agent`) is offered `local.echo`, calls it and
    the lead gets its result; the node's `allowed_tools` narrow the list to it."""
    http = stack.http
    server = {
        "name": "local",
        "url": mcp_url,
        "headers": {"Authorization": "Bearer ${MCP_TEST_TOKEN}"},
    }
    worker_spec = {
        "mcp_servers": [server],
        "playbook": [
            {"when": "^local\\.echo: ", "reply": "CHILD {last_message}"},
            {
                "when": "go",
                "reply": "Echoing.",
                "tool_calls": [{"tool": "local.echo", "args": {"text": "hi"}}],
            },
        ],
    }
    lead_spec = {
        "subagents": [{"alias": "helper", "agent": "echoer", "allowed_tools": ["local.echo"]}],
        "playbook": [
            {"when": "^task: ", "reply": "RESULT {last_message}"},
            {
                "when": "go",
                "reply": "Delegating.",
                "tool_calls": [{"tool": "task", "args": {"alias": "helper", "prompt": "go"}}],
            },
        ],
    }
    for slug, spec in (("echoer", worker_spec), ("lead", lead_spec)):
        created = http.post("/v1/agents", json={"slug": slug, "name": slug, "spec": spec})
        assert created.status_code == 201, created.text
        assert http.post(f"/v1/agents/{slug}/publish").status_code == 201
    resp = http.post("/v1/sessions", json={"agent": "lead", "prompt": "go", "sync": True})
    assert resp.status_code == 201, resp.text
    assert resp.json()["response"] == "RESULT CHILD echo: hi", resp.json()["response"]
    (child,) = [r for r in http.get("/v1/sessions", params={"agent": "echoer"}).json()["data"]]
    row = asyncio.run(_resolved_agent(stack, child["session_id"]))
    offered = sorted(t["name"] for t in row["mcp_tools"] if t["name"])
    assert offered == ["echo"]


# --- MCP server headers: which worker secrets may leave ---------------------------------


def test_an_mcp_header_cannot_send_the_workers_own_secrets() -> None:
    """A spec's header may name only variables the operator offers in
    BATON_MCP_HEADER_SECRETS; Baton's own settings (the review secret that proves
    decisions, the database URL) never leave, even when listed."""
    env = {
        "BATON_REVIEW_SECRET": "proof-key",
        "BATON_DATABASE_URL": "postgresql://baton:pw@db/baton",
        "OPENAI_API_KEY": "sk-model",
        "GITHUB_TOKEN": "ghp_ok",
        "BATON_MCP_HEADER_SECRETS": "GITHUB_TOKEN, BATON_REVIEW_SECRET",
    }
    for name in ("BATON_REVIEW_SECRET", "BATON_DATABASE_URL", "OPENAI_API_KEY"):
        with pytest.raises(HeaderUnresolved, match="does not offer") as refused:
            resolve_headers({"X-Leak": f"${{{name}}}"}, env)
        assert env[name] not in str(refused.value)
    assert resolve_headers({"Authorization": "Bearer ${GITHUB_TOKEN}"}, env) == {
        "Authorization": "Bearer ghp_ok"
    }
    # Nothing offered, nothing resolved (the default).
    with pytest.raises(HeaderUnresolved, match="does not offer"):
        resolve_headers({"Authorization": "Bearer ${GITHUB_TOKEN}"}, {"GITHUB_TOKEN": "x"})
