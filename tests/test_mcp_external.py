"""The `agents` MCP server over real HTTP with the SDK's own client: uvicorn +
real worker + Temporal dev server + SQLite. Every call runs through the caller session's
workflow, so guards, policies, reviews and the audit are the model path's own."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, TextContent
from sqlalchemy.engine import Engine
from temporalio.testing import WorkflowEnvironment

from baton.contracts.workflow_io import Provenance
from baton.errors import SessionExternal
from baton.grants import auth
from baton.runs import external as external_mod
from baton.runs import launch
from baton.runs.external import open_external_session
from baton.storage.db import session_scope
from tests.test_api_reviews import Stack, agent, decide, messages, pending, poll, running_stack
from tests.test_auth import add_user


@pytest.fixture
def stack(temporal_env: WorkflowEnvironment, tmp_path: Path) -> Iterator[Stack]:
    """API + worker with the default review timeout: a decision made here never races a
    timer, however loaded the machine."""
    with running_stack(temporal_env, tmp_path / "mcp.db") as s:
        yield s


@pytest.fixture
def quick(temporal_env: WorkflowEnvironment, tmp_path: Path) -> Iterator[Stack]:
    """API + worker with a 4 s review timeout, for the tests that wait it out."""
    with running_stack(
        temporal_env, tmp_path / "quick.db", review_timeout=4, review_delivery_grace=0
    ) as s:
        yield s


def external(http: httpx.Client, slug: str) -> dict[str, Any]:
    """Open an external session of ``slug``; returns the 201 body."""
    resp = http.post("/v1/sessions", json={"agent": slug, "external": True})
    assert resp.status_code == 201, resp.text
    body: dict[str, Any] = resp.json()
    return body


@asynccontextmanager
async def mcp_client(url: str, token: str) -> AsyncIterator[ClientSession]:
    """The SDK's streamable-HTTP client, initialised, sending the proxy token."""
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300)) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def text(result: CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


async def call(url: str, token: str, tool: str, **args: Any) -> tuple[bool, str]:
    """One tool call in a fresh client: ``(is_error, text)``."""
    async with mcp_client(url, token) as session:
        result = await session.call_tool(tool, args)
        return bool(result.is_error), text(result)


def test_external_session_lists_tools_and_agents_without_the_caller(stack: Stack) -> None:
    """An external session gets a proxy token and the MCP URL; the server offers exactly
    the five X-Agent tools and list_agents (after its review) excludes the caller."""
    http = stack.http
    agent(http, "outside")
    agent(http, "helper")
    opened = external(http, "outside")
    assert opened["proxy_token"].startswith("baton_px_")
    assert opened["mcp_url"] == f"{stack.url}/mcp"
    assert opened["status"] == "idle"

    async def run() -> tuple[list[str], tuple[bool, str]]:
        async with mcp_client(opened["mcp_url"], opened["proxy_token"]) as session:
            tools = sorted(t.name for t in (await session.list_tools()).tools)
            result = await session.call_tool("list_agents", {})
            return tools, (bool(result.is_error), text(result))

    def approve() -> None:
        review = pending(http)[0]
        assert (review["caller"], review["operation"]) == ("outside", "list")
        assert decide(http, review["id"], "allow_once").status_code == 200

    approver = threading.Thread(target=approve)
    approver.start()
    tools, (failed, body) = asyncio.run(run())
    approver.join()
    assert tools == sorted(
        [
            "list_agents",
            "create_agent",
            "invoke_agent",
            "get_agent_sessions",
            "get_agent_session_transcript",
        ]
    )
    assert not failed
    assert [a["slug"] for a in json.loads(body)["agents"]] == ["helper"]
    # The call is in the caller's transcript, as a model's tool call would be.
    tools_run = [m for m in messages(http, opened["session_id"]) if m["role"] == "tool"]
    assert [m["tool_name"] for m in tools_run] == ["list_agents"]


def test_sync_invoke_returns_the_reply_after_a_review_approved_through_the_api(
    stack: Stack,
) -> None:
    """invoke_agent(sync=true) waits for the review, approved over the API, then returns the
    target's final reply inline; the target session records the external caller."""
    http = stack.http
    agent(http, "outside")
    agent(http, "target", [{"reply": "target says hi"}])
    opened = external(http, "outside")

    def approve() -> None:
        review = pending(http)[0]
        assert (review["operation"], review["target"]) == ("invoke", "target")
        assert decide(http, review["id"], "allow_once").status_code == 200

    approver = threading.Thread(target=approve)
    approver.start()
    failed, body = asyncio.run(
        call(
            opened["mcp_url"],
            opened["proxy_token"],
            "invoke_agent",
            slug="target",
            prompt="hello",
            sync=True,
        )
    )
    approver.join()
    assert not failed, body
    result = json.loads(body)
    assert (result["status"], result["response"]) == ("completed", "target says hi")
    child = http.get(f"/v1/sessions/{result['session_id']}").json()
    assert child["invoked_by_agent"] == "outside"


def test_async_invoke_then_transcript(stack: Stack) -> None:
    """invoke_agent(sync=false) returns at once with status running; the transcript read
    with sync=true shows the target's reply (policies allow both, so no review)."""
    http = stack.http
    agent(http, "outside")
    agent(http, "target", [{"reply": "later reply"}])
    policies = {"targets": {"target": {"invoke": "allow", "read": "allow"}}}
    assert http.put("/v1/agents/outside/policies", json=policies).status_code == 200
    opened = external(http, "outside")
    url, token = opened["mcp_url"], opened["proxy_token"]
    failed, body = asyncio.run(call(url, token, "invoke_agent", slug="target", prompt="go"))
    assert not failed, body
    started = json.loads(body)
    assert started["status"] == "running"
    failed, body = asyncio.run(
        call(
            url,
            token,
            "get_agent_session_transcript",
            slug="target",
            session_id=started["session_id"],
            sync=True,
        )
    )
    assert not failed, body
    transcript = json.loads(body)["transcript"]
    assert transcript.startswith("status: idle")
    assert "later reply" in transcript


def test_refusals_are_tool_errors_that_start_with_their_code(stack: Stack) -> None:
    """Self-invocation, a stored block and the one-hop rule of an invoked external session
    are MCP tool errors (isError) whose text starts with the Baton code."""
    http = stack.http
    agent(http, "outside")
    agent(http, "target", [{"reply": "hi"}])
    opened = external(http, "outside")
    url, token = opened["mcp_url"], opened["proxy_token"]
    failed, body = asyncio.run(call(url, token, "invoke_agent", slug="outside", prompt="me"))
    assert failed and body.startswith("self_invocation: "), body
    blocked = {"targets": {"target": {"invoke": "block"}}}
    assert http.put("/v1/agents/outside/policies", json=blocked).status_code == 200
    failed, body = asyncio.run(call(url, token, "invoke_agent", slug="target", prompt="x"))
    assert failed and body.startswith("blocked_by_policy: "), body
    failed, body = asyncio.run(call(url, token, "invoke_agent", slug="target", prompt=" "))
    assert failed and body.startswith("invalid_arguments: "), body
    audit = http.get("/v1/audit").json()["data"]
    assert {(a["operation"], a["outcome"], a["decided_by"]) for a in audit} >= {
        ("invoke", "block", "guard"),
        ("invoke", "block", "policy"),
    }


def test_review_timeout_and_deny_are_coded_tool_errors(stack: Stack, quick: Stack) -> None:
    """A review nobody decides times out (4 s here) as ``review_timeout: …``; a denied one
    is ``review_denied: …``; the session is idle again afterwards."""
    for http in (quick.http, stack.http):
        agent(http, "outside")
        agent(http, "target", [{"reply": "hi"}])
    timing_out = external(quick.http, "outside")
    url, token = timing_out["mcp_url"], timing_out["proxy_token"]
    failed, body = asyncio.run(call(url, token, "invoke_agent", slug="target", prompt="x"))
    assert failed and body.startswith("review_timeout: "), body

    http = stack.http  # the denial: no timer to race on a loaded machine
    opened = external(http, "outside")
    url, token = opened["mcp_url"], opened["proxy_token"]

    def deny() -> None:
        review = pending(http)[0]
        assert decide(http, review["id"], "deny").status_code == 200

    denier = threading.Thread(target=deny)
    denier.start()
    failed, body = asyncio.run(call(url, token, "invoke_agent", slug="target", prompt="y"))
    denier.join()
    assert failed and body.startswith("review_denied: "), body
    poll(
        lambda: http.get(f"/v1/sessions/{opened['session_id']}").json()["status"] == "idle",
        "the external session to be idle again",
    )


def test_tokens_401_and_revocation_on_cancel(stack: Stack) -> None:
    """No token, a wrong token and the token of a cancelled session are 401 problem+json."""
    http = stack.http
    agent(http, "outside")
    opened = external(http, "outside")
    url = opened["mcp_url"]
    for headers in ({}, {"Authorization": "Bearer baton_px_wrong"}):
        resp = httpx.post(url, json={}, headers=headers)
        assert resp.status_code == 401
        assert resp.json()["code"] == "unauthorized"
    cancel = http.post(f"/v1/sessions/{opened['session_id']}/cancel")
    assert cancel.status_code == 202
    poll(
        lambda: http.get(f"/v1/sessions/{opened['session_id']}").json()["status"] == "cancelled",
        "the cancel",
    )
    resp = httpx.post(url, json={}, headers={"Authorization": f"Bearer {opened['proxy_token']}"})
    assert resp.status_code == 401


def test_external_process_posts_its_own_messages(stack: Stack) -> None:
    """With its proxy token the external process posts assistant messages to its
    transcript; without it 401; an ordinary session refuses assistant messages (409)."""
    http = stack.http
    agent(http, "outside", [{"reply": "model reply"}])
    opened = external(http, "outside")
    sid = opened["session_id"]
    path = f"/v1/sessions/{sid}/messages"
    body = {"prompt": "I refactored the parser.", "role": "assistant"}
    assert http.post(path, json=body).status_code == 401
    auth = {"Authorization": f"Bearer {opened['proxy_token']}"}
    resp = http.post(path, json=body, headers=auth)
    assert resp.status_code == 200, resp.text
    assert [(m["role"], m["text"]) for m in messages(http, sid)] == [
        ("assistant", "I refactored the parser.")
    ]
    ordinary = http.post("/v1/sessions", json={"agent": "outside", "prompt": "hi"}).json()
    resp = http.post(f"/v1/sessions/{ordinary['session_id']}/messages", json=body)
    assert resp.status_code == 409
    assert resp.json()["code"] == "not_external"


def test_an_external_session_invoked_by_another_agent_cannot_invoke(
    stack: Stack, temporal_env: WorkflowEnvironment
) -> None:
    """One hop follows the external session's provenance (Gamut X-Agent): a session another agent
    started gets ``one_hop_violation`` for invoke_agent, before any policy or review."""
    http = stack.http
    agent(http, "outside")
    agent(http, "target", [{"reply": "hi"}])
    opened = asyncio.run(
        open_external_session(
            temporal_env.client,
            stack.engine,
            task_queue=stack.settings.task_queue,
            config=stack.settings.session_config(),
            ref="outside",
            provenance=Provenance(invoked_by_agent="boss"),
        )
    )
    failed, body = asyncio.run(
        call(f"{stack.url}/mcp", opened.proxy_token, "invoke_agent", slug="target", prompt="x")
    )
    assert failed and body.startswith("one_hop_violation: "), body
    assert http.get("/v1/reviews").json()["count"] == 0


@pytest.fixture
def auth_stack(temporal_env: WorkflowEnvironment, tmp_path: Path) -> Iterator[tuple[Stack, str]]:
    """API + worker in auth mode with user alice (her API token)."""
    tokens: dict[str, str] = {}

    def prepare(engine: Engine) -> None:
        tokens["alice"] = add_user(engine, "alice")

    with running_stack(temporal_env, tmp_path / "mcp-auth.db", prepare, auth="on") as st:
        yield st, tokens["alice"]


def test_auth_mode_session_belongs_to_the_user_and_the_token_uses_her_roles(
    auth_stack: tuple[Stack, str],
) -> None:
    """In auth mode the external session is the requesting user's, and its proxy token acts
    with her roles: invoke on an agent she only views is ``access_denied``; the proxy
    token is no API token (401 on the API)."""
    st, token = auth_stack
    alice = st.client(token)
    for slug in ("outside", "target"):
        agent(alice, slug, [{"reply": "hi"}])
    with session_scope(st.engine) as s:
        auth.grant(s, agent="target", user_id="alice", role="viewer")
    opened = external(alice, "outside")
    assert alice.get(f"/v1/sessions/{opened['session_id']}").json()["created_by_user"] == "alice"
    failed, body = asyncio.run(
        call(opened["mcp_url"], opened["proxy_token"], "invoke_agent", slug="target", prompt="x")
    )
    assert failed and body.startswith("access_denied: "), body
    assert "'alice'" in body
    assert st.client(opened["proxy_token"]).get("/v1/agents").status_code == 401


def test_a_call_waiting_for_review_sends_progress(
    quick: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a call waits for its review (here until the 4 s timeout), the server sends MCP
    progress notifications (every KEEPALIVE_S, shortened here) on the call's stream."""
    monkeypatch.setattr(external_mod, "KEEPALIVE_S", 0.5)
    http = quick.http
    agent(http, "outside")
    agent(http, "target", [{"reply": "hi"}])
    opened = external(http, "outside")
    seen: list[str | None] = []

    async def progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(message)

    async def run() -> CallToolResult:
        async with mcp_client(opened["mcp_url"], opened["proxy_token"]) as session:
            args = {"slug": "target", "prompt": "x"}
            return await session.call_tool("invoke_agent", args, progress_callback=progress)

    result = asyncio.run(run())
    assert result.is_error and text(result).startswith("review_timeout: ")
    assert len(seen) >= 3, seen
    assert all(m and m.startswith("invoke_agent: waiting") for m in seen)


def test_external_session_requests_are_checked_at_their_edges(
    stack: Stack, temporal_env: WorkflowEnvironment
) -> None:
    """token_ttl_s 60 is accepted and 59 refused (422); an external session takes no
    prompt; an ordinary one needs one; send_message is 409 session_external there."""
    http = stack.http
    agent(http, "outside")
    ok = http.post("/v1/sessions", json={"agent": "outside", "external": True, "token_ttl_s": 60})
    assert ok.status_code == 201, ok.text
    for body in (
        {"agent": "outside", "external": True, "token_ttl_s": 59},
        {"agent": "outside", "external": True, "prompt": "hi"},
        {"agent": "outside"},
    ):
        resp = http.post("/v1/sessions", json=body)
        assert resp.status_code == 422, (body, resp.text)
    # The workflow itself refuses a model turn on an external session.
    sid = ok.json()["session_id"]
    with pytest.raises(SessionExternal):
        asyncio.run(
            launch.send_message(
                temporal_env.client, stack.engine, session_id=sid, prompt="hi", sync=True
            )
        )
    assert messages(http, sid) == []
