"""Replaying recorded sessions against a candidate (docs/change-safely.md, Replay against a
candidate) on the real stack: uvicorn + worker + Temporal dev server + SQLite, the scripted
playbook model standing in for a paid one."""

from __future__ import annotations

import asyncio
import io
import json
import threading
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from playwright.sync_api import expect, sync_playwright
from rich.console import Console
from sqlmodel import col, select
from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment
from typer.testing import CliRunner

from baton.contracts.search import SA_KIND
from baton.evals import replay
from baton.storage.db import UsageRow, session_scope
from cli import common as cli_common
from cli.evals import report_table
from cli.main import app as cli_app
from tests.conftest import serve
from tests.test_api_agents import assert_problem
from tests.test_api_reviews import Stack, decide, pending, poll, running_stack
from tests.test_console import CHROMIUM, CHROMIUM_ARGS

#: The live agent: a sum calls the calculator, a question for the target invokes it (the
#: policy asks for a review), anything else is echoed.
LIVE: list[dict[str, Any]] = [
    {"when": "^(calculator|invoke_agent): ", "reply": "done: {last_message}"},
    {
        "when": "sum",
        "reply": "Computing.",
        "tool_calls": [{"tool": "calculator", "args": {"expression": "6*7"}}],
    },
    {
        "when": "ask",
        "reply": "Asking.",
        "tool_calls": [
            {"tool": "invoke_agent", "args": {"slug": "target", "prompt": "hi", "sync": True}}
        ],
    },
    {"reply": "plain: {last_message}"},
]
#: The draft: one rule changed, a sum now asks the target instead of computing.
DRAFT: list[dict[str, Any]] = [
    LIVE[0],
    {
        "when": "sum",
        "reply": "Asking instead.",
        "tool_calls": [
            {"tool": "invoke_agent", "args": {"slug": "target", "prompt": "sum?", "sync": True}}
        ],
    },
    *LIVE[2:],
]
PROMPTS = [
    "sum one",
    "hello one",
    "ask one",
    "hello two",
    "sum two",
    "ask two",
    "hello three",
    "sum three",
    "hello four",
    "ask three",
]


@pytest.fixture
def stack(temporal_env: WorkflowEnvironment, tmp_path: Path) -> Iterator[Stack]:
    """API + worker on a fresh SQLite file."""
    with running_stack(temporal_env, tmp_path / "evals.db") as s:
        yield s


def publish(http: httpx.Client, slug: str, playbook: list[dict[str, Any]], **spec: Any) -> None:
    """Create and publish ``slug`` (its scripted ``playbook``, ``spec`` besides)."""
    body = {"slug": slug, "name": slug.title(), "spec": {"playbook": playbook, **spec}}
    assert http.post("/v1/agents", json=body).status_code == 201
    assert http.post(f"/v1/agents/{slug}/publish").status_code == 201


def record(http: httpx.Client, slug: str, prompt: str, decision: str = "allow_once") -> str:
    """A recorded session of ``slug`` answering ``prompt`` (a review it asks for decided
    ``decision``)."""
    resp = http.post("/v1/sessions", json={"agent": slug, "prompt": prompt})
    assert resp.status_code == 201, resp.text
    sid: str = resp.json()["session_id"]

    def settled() -> bool:
        state = http.get(f"/v1/sessions/{sid}").json()["status"]
        if state == "awaiting_input":
            (review,) = pending(http)
            assert decide(http, review["id"], decision).status_code == 200
        return bool(state == "idle")

    poll(settled, f"{sid} to answer", timeout=120)
    return sid


def finished(http: httpx.Client, slug: str, eval_id: str) -> dict[str, Any]:
    """The eval once it has ended."""

    def done() -> dict[str, Any] | None:
        body: dict[str, Any] = http.get(f"/v1/agents/{slug}/evals/{eval_id}").json()
        return body if body["status"] != "running" else None

    found: dict[str, Any] = poll(done, f"eval {eval_id} to end", timeout=600)
    return found


def start(http: httpx.Client, slug: str, **body: Any) -> dict[str, Any]:
    """POST an eval of ``slug``; its summary (202)."""
    resp = http.post(f"/v1/agents/{slug}/evals", json=body)
    assert resp.status_code == 202, resp.text
    summary: dict[str, Any] = resp.json()
    return summary


def test_an_eval_of_a_draft_changing_one_rule_reports_exactly_the_sessions_it_touches(
    stack: Stack,
) -> None:
    """Ten recorded sessions; a draft changes the rule for sums: the eval reports exactly
    the three sum sessions changed, each with its tool-sequence diff (calculator removed,
    invoke_agent added) and its decision diff (the candidate's invoke review, with no
    recorded review to answer it, denied); the asks are answered from their recorded
    review and invoke, alike on both sides."""
    http = stack.http
    publish(http, "target", [{"reply": "target says hi"}])
    publish(http, "helper", LIVE, tools=["calculator"])
    recorded = [record(http, "helper", p) for p in PROMPTS]
    draft = {"playbook": DRAFT, "tools": ["calculator"]}
    assert http.put("/v1/agents/helper/draft", json=draft).status_code == 200
    targets_before = http.get("/v1/sessions", params={"agent": "target"}).json()["count"]

    summary = start(http, "helper", sessions=10)
    assert (summary["status"], summary["total"], summary["candidate"]) == ("running", 10, "draft")
    body = finished(http, "helper", summary["id"])
    assert (body["status"], body["done"], body["changed"]) == ("completed", 10, 3)
    report = body["report"]
    assert [s["session_id"] for s in report["sessions"]] == recorded
    changed = {s["session_id"] for s in report["sessions"] if s["changed"]}
    assert changed == {sid for sid, p in zip(recorded, PROMPTS, strict=True) if "sum" in p}
    for item in report["sessions"]:
        prompt = PROMPTS[recorded.index(item["session_id"])]
        if "sum" in prompt:
            assert item["tools"]["baseline"] == ["calculator"]
            assert item["tools"]["candidate"] == ["invoke_agent"]
            assert item["tools"]["diff"] == [
                {"op": "removed", "tool": "calculator"},
                {"op": "added", "tool": "invoke_agent"},
            ]
            assert item["decisions"]["baseline"] == []
            assert item["decisions"]["candidate"] == [
                {
                    "operation": "invoke",
                    "target": "target",
                    "decision": "review",
                    "outcome": "block",
                }
            ]
            assert item["final"]["baseline"] == "done: 42"
            assert "eval_unrecorded: this call needs a review" in item["final"]["candidate"]
            assert item["final"]["diff"].startswith("--- baseline")
            assert 0 < item["final"]["similarity"] < 1
            assert item["regression"] is True
        else:
            assert item["final"]["same"] and item["tools"]["same"] and item["decisions"]["same"]
            assert item["final"]["diff"] == "" and item["final"]["similarity"] == 1.0
        if "ask" in prompt:
            assert item["decisions"]["baseline"] == [
                {
                    "operation": "invoke",
                    "target": "target",
                    "decision": "review",
                    "outcome": "allow",
                }
            ]
            assert "target says hi" in item["final"]["candidate"]
    totals = report["totals"]
    assert (totals["sessions"], totals["changed"], totals["regressions"]) == (10, 3, 3)
    assert (totals["tools_changed"], totals["decisions_changed"]) == (3, 3)
    assert totals["tokens"]["baseline"] > 0 and totals["tokens"]["candidate"] > 0
    # No person was asked and no other agent ran: every review was answered by the eval.
    assert http.get("/v1/reviews", params={"status": "pending"}).json()["count"] == 0
    assert http.get("/v1/sessions", params={"agent": "target"}).json()["count"] == targets_before


def test_a_recorded_denied_review_is_replayed_denied(stack: Stack) -> None:
    """A recording whose invoke review a person denied is replayed with that review denied
    again on both sides, from the recording: no person is asked, the target never runs,
    and the decision shows the recorded denial."""
    http = stack.http
    publish(http, "target", [{"reply": "target says hi"}])
    publish(http, "helper", LIVE, tools=["calculator"])
    recorded = record(http, "helper", "ask one", decision="deny")
    targets_before = http.get("/v1/sessions", params={"agent": "target"}).json()["count"]
    body = finished(http, "helper", start(http, "helper", candidate="helper@1")["id"])
    assert (body["status"], body["changed"]) == ("completed", 0)
    (item,) = body["report"]["sessions"]
    assert item["session_id"] == recorded
    denied = {"operation": "invoke", "target": "target", "decision": "review"}
    for side in ("baseline", "candidate"):
        assert item["decisions"][side] == [{**denied, "outcome": "denied_by_user"}]
        assert "denied: the recorded review of this call ended" in item["final"][side]
        assert "target says hi" not in item["final"][side]
    assert http.get("/v1/reviews", params={"status": "pending"}).json()["count"] == 0
    assert http.get("/v1/sessions", params={"agent": "target"}).json()["count"] == targets_before


def test_a_recorded_timed_out_review_is_replayed_as_a_timeout(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """A recording whose invoke review nobody decided (it timed out) is replayed with that
    review timed out again on both sides, from the recording: the replays' audit rows read
    ``review_timeout`` (not a person's denial), no person is asked, the target never runs."""
    with running_stack(
        temporal_env, tmp_path / "timeout.db", review_timeout=2.0, review_delivery_grace=0
    ) as quick:
        http = quick.http
        publish(http, "target", [{"reply": "target says hi"}])
        publish(http, "helper", LIVE, tools=["calculator"])
        resp = http.post("/v1/sessions", json={"agent": "helper", "prompt": "ask one"})
        assert resp.status_code == 201, resp.text
        recorded = resp.json()["session_id"]
        poll(
            lambda: http.get(f"/v1/sessions/{recorded}").json()["status"] == "idle",
            f"{recorded}'s review to time out",
            timeout=120,
        )
        audit = http.get("/v1/audit", params={"session_id": recorded}).json()["data"]
        assert [a["outcome"] for a in audit if a.get("review_id")] == ["review_timeout"]
        targets_before = http.get("/v1/sessions", params={"agent": "target"}).json()["count"]
        body = finished(http, "helper", start(http, "helper", candidate="helper@1")["id"])
        assert (body["status"], body["changed"]) == ("completed", 0)
        (item,) = body["report"]["sessions"]
        assert item["session_id"] == recorded
        timed_out = {"operation": "invoke", "target": "target", "decision": "review"}
        for side in ("baseline", "candidate"):
            assert item["decisions"][side] == [{**timed_out, "outcome": "review_timeout"}]
            assert (
                "the recorded review of this call ended 'review_timeout'" in (item["final"][side])
            )
            assert "target says hi" not in item["final"][side]
        assert http.get("/v1/reviews", params={"status": "pending"}).json()["count"] == 0
        targets = http.get("/v1/sessions", params={"agent": "target"}).json()["count"]
        assert targets == targets_before


def test_a_policy_allowed_invoke_with_no_recording_is_refused_unrecorded(stack: Stack) -> None:
    """The policy allows invokes (no review), and the draft invokes the target where the
    recording computed: the replay records the policy's allow, then refuses the call
    ``eval_unrecorded`` (the recording holds no such invoke); the target never runs."""
    http = stack.http
    publish(http, "target", [{"reply": "target says hi"}])
    publish(http, "helper", LIVE, tools=["calculator"])
    allow = {"global": {"list": "review", "read": "review", "invoke": "allow"}, "targets": {}}
    assert http.put("/v1/agents/helper/policies", json=allow).status_code == 200
    recorded = record(http, "helper", "sum one")
    draft = {"playbook": DRAFT, "tools": ["calculator"]}
    assert http.put("/v1/agents/helper/draft", json=draft).status_code == 200
    targets_before = http.get("/v1/sessions", params={"agent": "target"}).json()["count"]
    body = finished(http, "helper", start(http, "helper")["id"])
    (item,) = body["report"]["sessions"]
    assert (item["session_id"], item["changed"]) == (recorded, True)
    assert item["decisions"]["baseline"] == []
    assert item["decisions"]["candidate"] == [
        {"operation": "invoke", "target": "target", "decision": "allow", "outcome": "allow"}
    ]
    assert item["tools"]["candidate"] == ["invoke_agent"]
    assert "eval_unrecorded: 'invoke_agent'" in item["final"]["candidate"]
    assert item["final"]["baseline"] == "done: 42"
    assert http.get("/v1/reviews", params={"status": "pending"}).json()["count"] == 0
    assert http.get("/v1/sessions", params={"agent": "target"}).json()["count"] == targets_before


def test_since_replays_only_the_sessions_created_at_or_after_it(stack: Stack) -> None:
    """``since`` (an RFC 3339 string) through the API picks the recorded sessions created at
    or after it, oldest first, and is kept in the eval's options; a ``since`` after every
    session is 422 ``no_sessions``, a number or a time without a timezone 422."""
    http = stack.http
    publish(http, "helper", [{"reply": "hi {last_message}"}])
    record(http, "helper", "older")
    newer = [record(http, "helper", "newer one"), record(http, "helper", "newer two")]
    since = http.get(f"/v1/sessions/{newer[0]}").json()["created_at"]
    summary = start(http, "helper", candidate="helper@1", since=since)
    assert summary["total"] == 2 and summary["options"]["session_ids"] == newer
    body = finished(http, "helper", summary["id"])
    assert [s["session_id"] for s in body["report"]["sessions"]] == newer
    assert body["options"]["since"] is not None
    later = "2999-01-01T00:00:00Z"
    assert_problem(http.post("/v1/agents/helper/evals", json={"since": later}), 422, "no_sessions")
    for bad in (0, "1700000000", "2026-01-01T00:00:00"):  # numbers and no timezone
        refused = http.post("/v1/agents/helper/evals", json={"since": bad})
        assert_problem(refused, 422, "validation_error")


async def test_at_most_the_concurrency_setting_of_replays_run_at_once(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """With the eval concurrency set to 2 and three recorded sessions (six replays), the
    eval's history shows at most two replay activities between their scheduled and
    completed events at any moment, and two at once."""
    with running_stack(temporal_env, tmp_path / "bounded.db", eval_concurrency=2) as stack:
        http = stack.http
        publish(http, "helper", [{"reply": "hi {last_message}"}])
        for prompt in ("one", "two", "three"):
            record(http, "helper", prompt)
        body = finished(http, "helper", start(http, "helper", candidate="helper@1")["id"])
        assert body["status"] == "completed" and body["options"]["concurrency"] == 2
        handle = temporal_env.client.get_workflow_handle(body["workflow_id"])
        history = await handle.fetch_history()
    scheduled: dict[int, datetime] = {}
    edges: list[tuple[datetime, int]] = []
    for ev in history.events:
        if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = ev.activity_task_scheduled_event_attributes
            if attrs.activity_type.name == "replay":
                scheduled[ev.event_id] = ev.event_time.ToDatetime()
        elif ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            done = ev.activity_task_completed_event_attributes.scheduled_event_id
            if done in scheduled:
                edges += [(scheduled[done], 1), (ev.event_time.ToDatetime(), -1)]
    assert len(edges) == 2 * 6
    running, most = 0, 0
    for _, step in sorted(edges):  # at one instant an end (-1) sorts before a start
        running += step
        most = max(most, running)
    assert most == 2


# --- tools: recorded or live -----------------------------------------------------------

CALLS: list[str] = []
RELEASE = threading.Event()


def counting_server() -> Any:
    """An MCP server whose tools count their calls: ``echo`` answers at once, ``slow``
    only once RELEASE is set."""
    server = MCPServer("local", log_level="WARNING")

    @server.tool()
    def echo(text: str) -> str:
        """Echo the text back."""
        CALLS.append(text)
        return f"echo: {text}"

    @server.tool()
    async def slow() -> str:
        """Answer once released."""
        CALLS.append("slow")
        while not RELEASE.is_set():
            await asyncio.sleep(0.05)
        return "slow done"

    return server.streamable_http_app(
        stateless_http=True,
        json_response=True,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )


@pytest.fixture
def mcp_url() -> Iterator[str]:
    """The counting MCP server under uvicorn on a loopback port."""
    CALLS.clear()
    RELEASE.set()
    server, thread, base = serve(counting_server())
    try:
        yield f"{base}/mcp"
    finally:
        RELEASE.set()
        server.should_exit = True
        thread.join(timeout=10)


def tool_agent(url: str, text: str) -> dict[str, Any]:
    """A spec calling ``local.echo`` with ``text`` on "echo", ``local.slow`` on "slow"."""
    return {
        "mcp_servers": [{"name": "local", "url": url}],
        "playbook": [
            {"when": "^local\\.", "reply": "got {last_message}"},
            {
                "when": "echo",
                "reply": "Echoing.",
                "tool_calls": [{"tool": "local.echo", "args": {"text": text}}],
            },
            {
                "when": "slow",
                "reply": "Waiting.",
                "tool_calls": [{"tool": "local.slow", "args": {}}],
            },
        ],
    }


def test_recorded_tools_run_no_tool_and_a_miss_fails_or_runs_as_asked(
    stack: Stack, mcp_url: str
) -> None:
    """``tools: recorded`` answers each call from the recording: the server's counter does
    not move. ``tools: live`` calls it for both sides. A call with other arguments is a
    miss: ``on_miss: fail`` refuses it (``eval_unrecorded``, no call), ``on_miss: live``
    calls the server once per missed call."""
    http = stack.http
    body = {"slug": "helper", "name": "Helper", "spec": tool_agent(mcp_url, "hi")}
    assert http.post("/v1/agents", json=body).status_code == 201
    assert http.post("/v1/agents/helper/publish").status_code == 201
    recorded = [record(http, "helper", "echo one"), record(http, "helper", "echo two")]
    assert CALLS == ["hi", "hi"]

    same = finished(http, "helper", start(http, "helper", candidate="helper@1")["id"])
    assert (same["status"], same["changed"]) == ("completed", 0)
    assert CALLS == ["hi", "hi"]  # nothing ran
    for item in same["report"]["sessions"]:
        assert item["tools"]["candidate"] == ["local.echo"]
        assert item["final"]["candidate"] == "got echo: hi"

    live = finished(http, "helper", start(http, "helper", candidate="helper@1", tools="live")["id"])
    assert live["status"] == "completed" and len(CALLS) == 2 + 4

    assert http.put("/v1/agents/helper/draft", json=tool_agent(mcp_url, "other")).status_code == 200
    assert http.post("/v1/agents/helper/publish").status_code == 201
    fail = finished(
        http, "helper", start(http, "helper", candidate="helper@2", baseline="helper@1")["id"]
    )
    assert len(CALLS) == 6
    assert (
        fail["changed"] == 2 and [s["session_id"] for s in fail["report"]["sessions"]] == recorded
    )
    assert all("eval_unrecorded" in s["final"]["candidate"] for s in fail["report"]["sessions"])
    run = finished(
        http,
        "helper",
        start(http, "helper", candidate="helper@2", baseline="helper@1", on_miss="live")["id"],
    )
    assert CALLS[6:] == ["other", "other"]  # the candidate's misses only
    assert {s["final"]["candidate"] for s in run["report"]["sessions"]} == {"got echo: other"}


def test_a_cancelled_eval_is_cancelled_with_its_replays(stack: Stack, mcp_url: str) -> None:
    """Cancelling an eval whose replay waits in a live tool call answers ``cancelled`` at
    once; its replay sessions end cancelled and the eval writes nothing more."""
    http = stack.http
    body = {"slug": "helper", "name": "Helper", "spec": tool_agent(mcp_url, "hi")}
    assert http.post("/v1/agents", json=body).status_code == 201
    assert http.post("/v1/agents/helper/publish").status_code == 201
    record(http, "helper", "slow one")
    record(http, "helper", "slow two")
    RELEASE.clear()
    summary = start(http, "helper", candidate="helper@1", tools="live")
    eval_id = summary["id"]
    poll(lambda: CALLS.count("slow") >= 3, "a replay to wait in the slow tool", timeout=120)
    resp = http.post(f"/v1/agents/helper/evals/{eval_id}/cancel")
    assert resp.status_code == 200, resp.text
    assert resp.json()["status"] == "cancelled"
    RELEASE.set()
    with session_scope(stack.engine) as s:
        ids = [r.id for r in replay.eval_sessions(s, eval_id=eval_id)]
    assert ids

    def replays_cancelled() -> bool:
        with session_scope(stack.engine) as s:
            return all(r.status == "cancelled" for r in replay.eval_sessions(s, eval_id=eval_id))

    poll(replays_cancelled, "the replays to be cancelled", timeout=120)
    body = http.get(f"/v1/agents/helper/evals/{eval_id}").json()
    assert (body["status"], body["done"]) == ("cancelled", 0)
    again = http.post(f"/v1/agents/helper/evals/{eval_id}/cancel")
    assert again.status_code == 200 and again.json()["status"] == "cancelled"


def test_an_eval_started_twice_with_one_idempotency_key_is_one_eval(stack: Stack) -> None:
    """POST …/evals twice with the same Idempotency-Key answers the first eval again
    (``Idempotent-Replayed``) and records one eval; the same key with another body is 422
    ``idempotency_key_reused``; a keyed cancel replays its answer."""
    http = stack.http
    publish(http, "helper", [{"reply": "one"}])
    record(http, "helper", "hello")
    key = {"Idempotency-Key": "eval-start-1"}
    first = http.post("/v1/agents/helper/evals", json={"candidate": "helper@1"}, headers=key)
    assert first.status_code == 202, first.text
    again = http.post("/v1/agents/helper/evals", json={"candidate": "helper@1"}, headers=key)
    assert again.status_code == 202 and again.headers["idempotent-replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    other = http.post("/v1/agents/helper/evals", json={"sessions": 1}, headers=key)
    assert_problem(other, 422, "idempotency_key_reused")
    listed = http.get("/v1/agents/helper/evals").json()
    assert [e["id"] for e in listed["data"]] == [first.json()["id"]]
    finished(http, "helper", first.json()["id"])
    url = f"/v1/agents/helper/evals/{first.json()['id']}/cancel"
    cancel = {"Idempotency-Key": "eval-cancel-1"}
    assert http.post(url, headers=cancel).status_code == 200
    replayed = http.post(url, headers=cancel)
    assert replayed.status_code == 200 and replayed.headers["idempotent-replayed"] == "true"


# --- bad input, lists, metering ----------------------------------------------------------


def test_bad_eval_requests_are_refused_with_codes_and_start_nothing(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unknown candidates and baselines, no sessions, unknown session ids, a count past
    its bounds (ok at 1 and 100, refused at 0 and 101), session_ids with a count, a judge
    model with no key configured: each a 4xx problem with its code, and no eval
    recorded."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    http = stack.http
    publish(http, "helper", [{"reply": "hi"}])
    publish(http, "other", [{"reply": "hi"}])
    assert_problem(http.post("/v1/agents/helper/evals", json={}), 422, "no_sessions")
    sid = record(http, "helper", "hello")
    cases = [
        ({"candidate": "helper@9"}, 422, "unknown_candidate"),
        ({"candidate": "other@1"}, 422, "unknown_candidate"),
        ({"baseline": "helper@9"}, 422, "unknown_candidate"),
        ({"candidate": "live"}, 422, "validation_error"),
        ({"sessions": 0}, 422, "validation_error"),
        ({"sessions": 101}, 422, "validation_error"),
        ({"session_ids": [sid] * 101}, 422, "validation_error"),
        (
            {"session_ids": [f"session-{'0' * 8}-0000-0000-0000-{'0' * 12}"]},
            422,
            "unknown_sessions",
        ),
        ({"session_ids": [sid], "sessions": 1}, 422, "validation_error"),
        ({"judge": "openai:gpt-4o"}, 422, "unknown_judge"),
        ({"tools": "sometimes"}, 422, "validation_error"),
    ]
    for body, code, name in cases:
        assert_problem(http.post("/v1/agents/helper/evals", json=body), code, name)
    assert_problem(http.post("/v1/agents/nobody/evals", json={}), 404, "agent_not_found")
    assert http.get("/v1/agents/helper/evals").json()["count"] == 0
    for n in (1, 100):
        summary = start(http, "helper", candidate="helper@1", sessions=n)
        assert summary["total"] == 1  # at most n: there is one recorded session
        finished(http, "helper", summary["id"])
    by_id = start(http, "helper", candidate="helper@1", session_ids=[sid])
    assert by_id["options"]["session_ids"] == [sid]
    finished(http, "helper", by_id["id"])
    # The eval's replays are no recordings: a second eval still finds one session.
    again = start(http, "helper", candidate="helper@1")
    assert again["total"] == 1
    finished(http, "helper", again["id"])


async def test_replays_are_marked_eval_kept_out_of_lists_and_metered_to_the_eval(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """An eval's replay sessions run with BatonKind "eval"; GET /v1/sessions and the
    console list only the recorded session; the replays' usage is theirs
    (the recorded session's tokens and usage rows do not move), it is the report's, and the
    balance pays for it."""
    with running_stack(
        temporal_env, tmp_path / "metered.db", prices={"scripted": (1000.0, 1000.0)}
    ) as stack:
        http = stack.http
        publish(http, "helper", [{"reply": "hi {last_message}"}])
        sid = record(http, "helper", "hello")
        assert http.put("/v1/balance", json={"balance": 100.0}).status_code == 200
        before = http.get(f"/v1/sessions/{sid}").json()
        with session_scope(stack.engine) as s:
            usage_rows = len(s.exec(select(UsageRow).where(UsageRow.session_id == sid)).all())
        body = finished(http, "helper", start(http, "helper", candidate="helper@1")["id"])
        item = body["report"]["sessions"][0]
        replays = {item["baseline_session_id"], item["candidate_session_id"]}

        listed = http.get("/v1/sessions").json()
        assert [r["session_id"] for r in listed["data"]] == [sid] and listed["count"] == 1
        html = http.get("/ui").text
        assert sid in html and not any(r in html for r in replays)

        after = http.get(f"/v1/sessions/{sid}").json()
        assert (after["input_tokens"], after["output_tokens"]) == (
            before["input_tokens"],
            before["output_tokens"],
        )
        with session_scope(stack.engine) as s:
            assert (
                len(s.exec(select(UsageRow).where(UsageRow.session_id == sid)).all()) == usage_rows
            )
            metered = s.exec(select(UsageRow).where(col(UsageRow.session_id).in_(replays))).all()
        tokens = sum(u.input_tokens + u.output_tokens for u in metered)
        cost = sum(u.cost_usd or 0.0 for u in metered)
        totals = body["report"]["totals"]
        assert tokens == totals["tokens"]["baseline"] + totals["tokens"]["candidate"] > 0
        assert cost == pytest.approx(
            totals["cost_usd"]["baseline"] + totals["cost_usd"]["candidate"]
        )
        assert cost > 0
        balance = http.get("/v1/balance").json()["balance"]
        assert balance == pytest.approx(100.0 - cost)
        for rid in replays:
            handle = temporal_env.client.get_workflow_handle(rid)
            attrs = (await handle.describe()).typed_search_attributes
            assert attrs.get(SA_KIND) == "eval"
        described = await temporal_env.client.get_workflow_handle(body["workflow_id"]).describe()
        assert described.typed_search_attributes.get(SA_KIND) == "eval"


def test_the_console_lists_the_recording_and_none_of_its_replays(stack: Stack) -> None:
    """In Chromium, the console's session list shows the recorded session and none of an
    eval's replays (their links, their "Eval ·" names)."""
    http = stack.http
    publish(http, "helper", [{"reply": "hi {last_message}"}])
    sid = record(http, "helper", "hello console")
    body = finished(http, "helper", start(http, "helper", candidate="helper@1")["id"])
    item = body["report"]["sessions"][0]
    replays = [item["baseline_session_id"], item["candidate_session_id"]]
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} missing: `apt-get install chromium` (.ci/run does it)")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(f"{stack.url}/ui")
            expect(page.locator("#list-h")).to_have_text("Newest 1 of 1")
            links = page.locator("table a[href^='/ui/sessions/']")
            expect(links).to_have_count(1)
            assert links.first.get_attribute("href") == f"/ui/sessions/{sid}"
            content = page.content()
            assert "Eval ·" not in content and not any(r in content for r in replays)
        finally:
            browser.close()


def test_baton_eval_prints_the_table_and_totals_and_writes_the_json_report(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``baton eval helper --json FILE`` starts the eval of the draft, waits, prints a row
    per session and the totals, writes the ended eval for CI and exits 0 (changes are the
    gate's to judge); ``--no-wait`` prints the id only; a refused request exits non-zero
    with its code."""
    http = stack.http
    publish(http, "helper", [{"when": "sum", "reply": "one"}, {"reply": "two"}])
    sums = record(http, "helper", "sum it")
    record(http, "helper", "hello")
    draft = {"playbook": [{"when": "sum", "reply": "uno"}, {"reply": "two"}]}
    assert http.put("/v1/agents/helper/draft", json=draft).status_code == 200
    monkeypatch.setenv("BATON_API_URL", stack.url)
    # The console is built when cli.common is imported, so its width is set, not COLUMNS.
    monkeypatch.setattr(cli_common.console, "width", 250)
    report = tmp_path / "eval.json"
    out = CliRunner().invoke(cli_app, ["eval", "helper", "--json", str(report)])
    assert out.exit_code == 0, out.output
    assert sums in out.output and "completed: 2 sessions · 1 changed" in out.output
    written = json.loads(report.read_text(encoding="utf-8"))
    assert written["status"] == "completed" and written["changed"] == 1
    assert [s["session_id"] for s in written["report"]["sessions"] if s["changed"]] == [sums]
    bare = CliRunner().invoke(cli_app, ["eval", "helper", "--no-wait", "--sessions", "1"])
    assert bare.exit_code == 0 and "1 sessions · draft against live" in bare.output
    refused = CliRunner().invoke(cli_app, ["eval", "helper", "--candidate", "helper@9"])
    assert refused.exit_code != 0 and "unknown_candidate" in refused.output


def test_baton_eval_replays_the_named_sessions_with_live_tools(
    stack: Stack, mcp_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``baton eval helper --session A --session C --tools live --on-miss live`` replays
    exactly A and C (not B), runs their tool calls on both sides (the server's counter
    moves by four), and the eval keeps those options."""
    http = stack.http
    body = {"slug": "helper", "name": "Helper", "spec": tool_agent(mcp_url, "hi")}
    assert http.post("/v1/agents", json=body).status_code == 201
    assert http.post("/v1/agents/helper/publish").status_code == 201
    first, _, third = (record(http, "helper", f"echo {n}") for n in ("one", "two", "three"))
    assert CALLS == ["hi"] * 3
    monkeypatch.setenv("BATON_API_URL", stack.url)
    monkeypatch.setattr(cli_common.console, "width", 250)
    report = tmp_path / "eval.json"
    args = ["eval", "helper", "--candidate", "helper@1", "--session", first, "--session", third]
    args += ["--tools", "live", "--on-miss", "live", "--json", str(report)]
    out = CliRunner().invoke(cli_app, args)
    assert out.exit_code == 0, out.output
    assert "completed: 2 sessions · 0 changed" in out.output
    written = json.loads(report.read_text(encoding="utf-8"))
    options = written["options"]
    assert options["session_ids"] == [first, third]
    assert (options["tools"], options["on_miss"]) == ("live", "live")
    assert [s["session_id"] for s in written["report"]["sessions"]] == [first, third]
    assert CALLS == ["hi"] * 7


def test_a_narrow_terminal_folds_the_session_id_and_never_elides_it() -> None:
    """At 60 columns the report table breaks a session id over lines; every character of
    it is printed and no ellipsis stands in for part of it."""
    sid = "session-5fc0d38b-bd98-4edd-aab6-ad099a35d9ff"
    usage = {"tokens": 10, "cost_usd": 0.0}
    item = {
        "session_id": sid,
        "regression": False,
        "changed": True,
        "final": {"similarity": 0.5},
        "tools": {"diff": [{"op": "added", "tool": "invoke_agent"}]},
        "decisions": {"same": True, "candidate": []},
        "usage": {"baseline": usage, "candidate": usage},
    }
    body = {"id": "eval-x", "candidate": "draft", "baseline": "live"}
    out = io.StringIO()
    Console(file=out, width=60).print(report_table({**body, "report": {"sessions": [item]}}))
    first_column = "".join(
        line.split("│")[1].strip() for line in out.getvalue().splitlines() if line.count("│") > 2
    )
    assert sid in first_column and "…" not in first_column
