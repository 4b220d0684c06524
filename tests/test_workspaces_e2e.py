"""Session workspaces end to end: uvicorn + real worker + Temporal dev server + SQLite file.

An agent writes a file and the person downloads it; a person attaches one and the agent and
the event stream hear of it; shareable and isolated subagents and delegate_to targets see
and do not see their caller's files, an invoke_agent target works in its own; bad paths,
sizes, types and quotas are 4xx problems; a 20 MB file passes between activities of two
sessions, and a file of megabytes an agent writes reaches the store, without entering a
Temporal payload."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic_ai.messages import ModelMessage, ToolReturnPart
from pydantic_ai.models import Model
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel
from temporalio.testing import WorkflowEnvironment
from typer.testing import CliRunner, Result

import activities.turns as session_activities
import baton.providers.models
from baton.agents import roster
from cli import app
from tests.conftest import live_stack
from tests.test_api_agents import assert_problem
from tests.test_e2e_sessions import agent, sse

#: The small limits of the refusal tests' stack.
MAX_FILE = 1024
MAX_FILES = 3
QUOTA = 2048


@pytest.fixture
def small_api(temporal_env: WorkflowEnvironment, tmp_path: Path) -> Iterator[httpx.Client]:
    """The real API and worker with small workspace limits and HTML refused."""
    with live_stack(
        temporal_env,
        tmp_path / "small.db",
        workspace_max_file_bytes=MAX_FILE,
        workspace_max_files=MAX_FILES,
        workspace_quota_bytes=QUOTA,
        workspace_refused_types="text/html",
    ) as client:
        yield client


def call(tool: str, **args: Any) -> dict[str, Any]:
    """A playbook tool call."""
    return {"tool": tool, "args": args}


def start(api: httpx.Client, slug: str, prompt: str) -> dict[str, Any]:
    """A sync session of ``slug``; its 201 answer."""
    resp = api.post("/v1/sessions", json={"agent": slug, "prompt": prompt, "sync": True})
    assert resp.status_code == 201, resp.text
    body: dict[str, Any] = resp.json()
    return body


def files(api: httpx.Client, sid: str) -> list[str]:
    """The paths the session's workspace lists."""
    resp = api.get(f"/v1/sessions/{sid}/files")
    assert resp.status_code == 200, resp.text
    return [f["path"] for f in resp.json()["data"]]


def child_of(api: httpx.Client, slug: str) -> str:
    """The id of the one session of ``slug``."""
    data = api.get("/v1/sessions", params={"agent": slug}).json()["data"]
    assert len(data) == 1, data
    sid: str = data[0]["session_id"]
    return sid


def reader(api: httpx.Client, slug: str, path: str, **spec: Any) -> None:
    """Publish ``slug``: it reads ``path`` and answers with the tool's result."""
    agent(
        api,
        slug,
        playbook=[
            {"when": "read_file:", "reply": "{last_message}"},
            {"reply": "Reading.", "tool_calls": [call("read_file", path=path)]},
        ],
        **spec,
    )


def test_shareable_subagent_sees_its_callers_files_and_isolated_does_not(
    live_api: httpx.Client,
) -> None:
    """The lead writes notes.txt; its shareable subagent reads it, its isolated one gets
    file_not_found and its own empty workspace; the person downloads what the lead wrote."""
    reader(live_api, "sharer", "notes.txt", workspace_sharing="shareable")
    reader(live_api, "loner", "notes.txt")  # isolated: the default
    agent(
        live_api,
        "lead",
        subagents=[{"alias": "shared", "agent": "sharer"}, {"alias": "alone", "agent": "loner"}],
        playbook=[
            {"when": "task:", "reply": "{last_message}"},
            {
                "when": "write_file:",
                "reply": "Asking.",
                "tool_calls": [
                    call("task", alias="shared", prompt="read the notes"),
                    call("task", alias="alone", prompt="read the notes"),
                ],
            },
            {
                "reply": "Writing.",
                "tool_calls": [call("write_file", path="notes.txt", content="the secret is 42")],
            },
        ],
    )
    body = start(live_api, "lead", "go")
    sid, answer = body["session_id"], body["response"]
    assert answer.count("the secret is 42") == 1, answer
    assert "file_not_found" in answer, answer

    shared, alone = child_of(live_api, "sharer"), child_of(live_api, "loner")
    assert files(live_api, sid) == ["notes.txt"]
    assert files(live_api, shared) == ["notes.txt"]  # the caller's workspace
    assert files(live_api, alone) == []  # its own

    got = live_api.get(f"/v1/sessions/{sid}/files/notes.txt")
    assert got.status_code == 200 and got.content == b"the secret is 42"
    assert got.headers["content-type"].startswith("text/plain")
    assert got.headers["content-disposition"].startswith('attachment; filename="notes.txt"')
    assert got.headers["x-content-type-options"] == "nosniff"


#: What makes an agent a delegate_to target.
DELEGABLE = {"available_for_delegation": True, "delegation_hint": "reads the notes"}


def test_a_shareable_delegate_to_target_sees_its_callers_files_and_an_isolated_one_does_not(
    live_api: httpx.Client,
) -> None:
    """The lead writes notes.txt and delegates to two teammates: the shareable one reads it
    in the lead's workspace, the isolated one gets file_not_found in its own empty one."""
    reader(live_api, "sharer", "notes.txt", workspace_sharing="shareable", delegation=DELEGABLE)
    reader(live_api, "loner", "notes.txt", delegation=DELEGABLE)  # isolated: the default
    agent(
        live_api,
        "lead",
        playbook=[
            {"when": "delegate_to:", "reply": "{last_message}"},
            {
                "when": "write_file:",
                "reply": "Delegating.",
                "tool_calls": [
                    call("delegate_to", agent_id="sharer", task="read the notes"),
                    call("delegate_to", agent_id="loner", task="read the notes"),
                ],
            },
            {
                "reply": "Writing.",
                "tool_calls": [call("write_file", path="notes.txt", content="the secret is 42")],
            },
        ],
    )
    roster.clear_cache()  # the delegation roster the in-process worker reads
    body = start(live_api, "lead", "go")
    sid, answer = body["session_id"], body["response"]
    assert answer.count("the secret is 42") == 1, answer
    assert "file_not_found" in answer, answer
    shared, alone = child_of(live_api, "sharer"), child_of(live_api, "loner")
    assert files(live_api, sid) == ["notes.txt"]
    assert files(live_api, shared) == ["notes.txt"]  # the caller's workspace
    assert files(live_api, alone) == []  # its own


def test_an_invoke_agent_target_works_in_its_own_workspace_even_when_shareable(
    live_api: httpx.Client,
) -> None:
    """A caller writes notes.txt and invokes a shareable agent: the invoked session reads
    in a workspace of its own (file_not_found) and lists no files."""
    reader(live_api, "peer", "notes.txt", workspace_sharing="shareable")
    agent(
        live_api,
        "caller",
        playbook=[
            {"when": "invoke_agent:", "reply": "{last_message}"},
            {
                "when": "write_file:",
                "reply": "Invoking.",
                "tool_calls": [
                    call("invoke_agent", slug="peer", prompt="read the notes", sync=True)
                ],
            },
            {
                "reply": "Writing.",
                "tool_calls": [call("write_file", path="notes.txt", content="the secret is 42")],
            },
        ],
    )
    allowed = live_api.put(
        "/v1/agents/caller/policies", json={"targets": {"peer": {"invoke": "allow"}}}
    )
    assert allowed.status_code == 200, allowed.text
    body = start(live_api, "caller", "go")
    sid, answer = body["session_id"], body["response"]
    assert '"status": "completed"' in answer and "file_not_found" in answer, answer
    assert "the secret is 42" not in answer, answer
    invoked = child_of(live_api, "peer")
    assert files(live_api, sid) == ["notes.txt"]
    assert files(live_api, invoked) == []  # its own, whatever the target says


def _events_until(api: httpx.Client, sid: str, kind: str) -> list[dict[str, Any]]:
    """The session's events from the start up to the first of ``kind`` (SSE)."""
    events: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    with api.stream("GET", f"/v1/sessions/{sid}/events") as resp:
        for line in resp.iter_lines():
            if line.startswith("event:"):
                current["event"] = line[6:].strip()
            elif line.startswith("data:"):
                current["data"] = json.loads(line[5:].strip())
            elif not line and current:
                events.append(current)
                if current.get("event") == kind:
                    return events
                current = {}
    raise AssertionError(f"the stream ended before a {kind} event")


def test_a_persons_upload_reaches_the_stream_the_transcript_and_the_agent(
    live_api: httpx.Client,
) -> None:
    """A PUT stores the file, appends workspace_attached, and the agent's next model call
    reads the attachment note; the download is the uploaded bytes."""
    agent(live_api, "echo", playbook=[{"reply": "I read: {last_message}"}])
    sid = start(live_api, "echo", "hello")["session_id"]
    blob = bytes(range(256)) * 4
    put = live_api.put(
        f"/v1/sessions/{sid}/files/data/raw.bin",
        content=blob,
        headers={"Content-Type": "application/octet-stream"},
    )
    assert put.status_code == 201, put.text
    assert put.json()["path"] == "data/raw.bin" and put.json()["size"] == len(blob)

    attached = _events_until(live_api, sid, "workspace_attached")[-1]["data"]
    assert attached["path"] == "data/raw.bin" and attached["by"] == "local"
    assert attached["size"] == 1024

    reply = live_api.post(
        f"/v1/sessions/{sid}/messages", json={"prompt": "what now?", "sync": True}
    )
    assert reply.status_code == 200, reply.text
    assert "attached 'data/raw.bin'" in reply.json()["response"]
    roles = [m["role"] for m in live_api.get(f"/v1/sessions/{sid}/transcript").json()["messages"]]
    assert roles == ["user", "assistant", "attachment", "user", "assistant"]
    assert live_api.get(f"/v1/sessions/{sid}/files/data/raw.bin").content == blob


def test_refusals_are_problems_and_store_nothing(small_api: httpx.Client) -> None:
    """Escaping paths, a file one byte over the limit, a refused type, a count and a quota
    past their bounds are 4xx problems with codes; a file at each bound is stored."""
    api = small_api
    agent(api, "quiet", playbook=[{"reply": "ok"}])
    sid = start(api, "quiet", "hi")["session_id"]
    base = f"/v1/sessions/{sid}/files"
    for escaping in ("..%2Fescape.txt", "a/..%2F..%2Fescape.txt", "%2Fetc%2Fpasswd", "a%5Cb"):
        assert_problem(api.put(f"{base}/{escaping}", content=b"x"), 422, "invalid_path")
    assert api.put(f"{base}/edge.bin", content=b"x" * MAX_FILE).status_code == 201
    assert_problem(
        api.put(f"{base}/over.bin", content=b"x" * (MAX_FILE + 1)), 413, "file_too_large"
    )
    assert_problem(api.put(f"{base}/page.html", content=b"<p>hi</p>"), 415, "content_type_refused")
    assert api.put(f"{base}/second.bin", content=b"x" * MAX_FILE).status_code == 201
    # 2048 bytes held: the quota exactly; one byte more is refused, a new file past 3 too.
    assert_problem(api.put(f"{base}/third.bin", content=b"x"), 409, "workspace_quota_exceeded")
    api.put(f"{base}/second.bin", content=b"x" * (MAX_FILE - 1))  # replaced: 2047 held
    assert api.put(f"{base}/third.bin", content=b"x").status_code == 201  # 3 files, 2048
    assert_problem(api.put(f"{base}/fourth.bin", content=b""), 409, "too_many_files")
    assert files(api, sid) == ["edge.bin", "second.bin", "third.bin"]
    assert_problem(api.get(f"{base}/missing.txt"), 404, "file_not_found")
    assert_problem(api.get(f"{base}/..%2F..%2Fsmall.db"), 422, "invalid_path")
    assert_problem(
        api.get("/v1/sessions/session-00000000-0000-0000-0000-000000000000/files"),
        404,
        "session_not_found",
    )


def test_the_agents_refusals_are_tool_errors_it_reads(small_api: httpx.Client) -> None:
    """A write_file past the size limit and one escaping the workspace come back to the
    model as tool errors with their codes; the turn completes and nothing is stored."""
    agent(
        small_api,
        "clumsy",
        playbook=[
            {"when": "write_file:", "reply": "{last_message}"},
            {
                "reply": "Writing.",
                "tool_calls": [
                    call("write_file", path="../out.txt", content="x"),
                    call("write_file", path="big.txt", content="x" * (MAX_FILE + 1)),
                ],
            },
        ],
    )
    body = start(small_api, "clumsy", "go")
    assert "invalid_path" in body["response"] and "file_too_large" in body["response"]
    assert files(small_api, body["session_id"]) == []


def test_active_types_download_as_attachments_and_images_may_be_inline(
    live_api: httpx.Client,
) -> None:
    """SVG is an attachment even when inline is asked; a PNG is inline when asked."""
    agent(live_api, "quiet", playbook=[{"reply": "ok"}])
    sid = start(live_api, "quiet", "hi")["session_id"]
    base = f"/v1/sessions/{sid}/files"
    live_api.put(f"{base}/x.svg", content=b"<svg onload='alert(1)'/>")
    live_api.put(f"{base}/ok.png", content=b"\x89PNG\r\n\x1a\n")
    svg = live_api.get(f"{base}/x.svg", params={"inline": "true"})
    assert svg.headers["content-type"] == "image/svg+xml"
    assert svg.headers["content-disposition"].startswith("attachment;")
    assert svg.headers["x-content-type-options"] == "nosniff"
    assert "sandbox" in svg.headers["content-security-policy"]
    png = live_api.get(f"{base}/ok.png", params={"inline": "true"})
    assert png.headers["content-disposition"].startswith("inline;")


#: 20 MiB: the file the claim-check test passes between activities.
BIG = 20 * 1024 * 1024
#: The largest payload a history event of that run may carry (bytes): far below the file.
MAX_EVENT_BYTES = 64 * 1024


async def _history_sizes(env: WorkflowEnvironment, workflow_id: str) -> tuple[int, int]:
    """``(largest event, whole history)`` of the workflow's latest run, in bytes."""
    history = await env.client.get_workflow_handle(workflow_id).fetch_history()
    sizes = [event.ByteSize() for event in history.events]
    return max(sizes), sum(sizes)


async def test_a_20_mb_file_passes_between_activities_without_entering_a_payload(
    live_api: httpx.Client, temporal_env: WorkflowEnvironment
) -> None:
    """A person attaches 20 MiB; the lead's activities list and read it and its shareable
    subagent's activity reads it too, by reference: no event of either workflow's history
    carries more than 64 KiB, nor the whole history 1 MiB."""
    tail = b"THEEND"
    agent(
        live_api,
        "peer",
        workspace_sharing="shareable",
        playbook=[
            {"when": "read_file:", "reply": "{last_message}"},
            {
                "reply": "Checking.",
                "tool_calls": [call("read_file", path="big.bin", offset=BIG - 6)],
            },
        ],
    )
    agent(
        live_api,
        "keeper",
        subagents=[{"alias": "peer", "agent": "peer"}],
        playbook=[
            {"when": "stand by", "reply": "Standing by."},
            {"when": "task:", "reply": "{last_message}"},
            {
                "when": "read_file:",
                "reply": "Asking.",
                "tool_calls": [call("task", alias="peer", prompt="check big.bin")],
            },
            {
                "when": "list_files:",
                "reply": "Reading.",
                "tool_calls": [call("read_file", path="big.bin", offset=BIG - 6, length=6)],
            },
            {"reply": "Listing.", "tool_calls": [call("list_files")]},
        ],
    )
    sid = start(live_api, "keeper", "stand by")["session_id"]
    put = live_api.put(f"/v1/sessions/{sid}/files/big.bin", content=b"A" * (BIG - 6) + tail)
    assert put.status_code == 201 and put.json()["size"] == BIG
    reply = live_api.post(f"/v1/sessions/{sid}/messages", json={"prompt": "go", "sync": True})
    assert reply.status_code == 200, reply.text
    answer = reply.json()["response"]
    assert '"content": "THEEND"' in answer and f'"size": {BIG}' in answer, answer
    transcript = live_api.get(f"/v1/sessions/{sid}/transcript").json()["messages"]
    listed = next(m for m in transcript if m.get("tool_name") == "list_files")
    assert listed["role"] == "tool"
    for workflow_id in (sid, child_of(live_api, "peer")):
        largest, whole = await _history_sizes(temporal_env, workflow_id)
        assert largest < MAX_EVENT_BYTES, (workflow_id, largest)
        assert whole < 1024 * 1024, (workflow_id, whole)


#: 6 MiB of text written through write_file: over ten times one activity result's bound
#: (baton.payloads.MAX_RESULT_BYTES).
WRITTEN = ("0123456789abcdef" * (6 * 1024 * 1024 // 16))[:-6] + "THEEND"
#: The largest a history event of the writing session may be (bytes).
MAX_WRITE_EVENT_BYTES = 8 * 1024


@pytest.fixture
def big_writer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model of agent ``big-writer`` writes WRITTEN to big.txt through write_file, then
    answers with the tool's result (a playbook cannot carry 6 MiB without it entering the
    agent's snapshot); every other agent is scripted."""
    original = baton.providers.models.build_model

    def build(name: str, *, playbook: list[dict[str, Any]] | None, agent_slug: str) -> Model:
        if agent_slug != "big-writer":
            return original(name, playbook=playbook, agent_slug=agent_slug)

        async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
            if len(messages) > 1:
                last = messages[-1].parts[-1]
                yield f"DONE {last.content if isinstance(last, ToolReturnPart) else ''}"
                return
            args = json.dumps({"path": "big.txt", "content": WRITTEN})
            calls: DeltaToolCalls = {
                0: DeltaToolCall(name="write_file", json_args=args, tool_call_id="big")
            }
            yield calls

        return FunctionModel(stream_function=stream, model_name="scripted:big-writer")

    monkeypatch.setattr(session_activities, "build_model", build)


async def test_a_file_of_megabytes_written_by_the_agent_never_enters_a_payload(
    live_api: httpx.Client, temporal_env: WorkflowEnvironment, big_writer: None
) -> None:
    """An agent's write_file of 6 MiB stores the whole file while no event of the session's
    history carries more than 8 KiB: the workflow carries a claim-check, the activity reads
    the stored reply."""
    agent(live_api, "big-writer", playbook=[{"reply": "unused"}])
    body = start(live_api, "big-writer", "write it")
    sid, answer = body["session_id"], body["response"]
    assert answer.startswith("DONE") and f'"size": {len(WRITTEN)}' in answer, answer
    got = live_api.get(f"/v1/sessions/{sid}/files/big.txt")
    assert got.status_code == 200 and got.content == WRITTEN.encode()
    transcript = live_api.get(f"/v1/sessions/{sid}/transcript").json()["messages"]
    (tool,) = [m for m in transcript if m.get("tool_name") == "write_file"]
    assert f"({len(WRITTEN) + 2} bytes, claim-checked)" in tool["tool_input"]
    largest, whole = await _history_sizes(temporal_env, sid)
    assert largest < MAX_WRITE_EVENT_BYTES, largest
    assert whole < 64 * 1024, whole
    # Nor does the file ride the session's stream: its events show the compact call.
    events = sse(live_api, f"/v1/sessions/{sid}/events?until=idle")
    calls = [c for e in events for c in e["data"].get("tool_calls") or []]
    assert [c["args"]["content"] for c in calls] == [f"({len(WRITTEN) + 2} bytes, claim-checked)"]
    assert len(json.dumps([e["data"] for e in events])) < 64 * 1024


def test_cli_lists_gets_and_puts_files(live_api: httpx.Client, tmp_path: Path) -> None:
    """``baton files put`` attaches a file, ``baton files SESSION`` lists it and ``baton
    files get -o`` downloads the same bytes; a refusal is one error line and exit 1."""
    agent(live_api, "quiet", playbook=[{"reply": "ok"}])
    sid = start(live_api, "quiet", "hi")["session_id"]
    api = ["--api", str(live_api.base_url)]
    local = tmp_path / "report.csv"
    local.write_bytes(b"a,b\n1,2\n")

    def baton(*args: str) -> Result:
        return CliRunner().invoke(app, list(args), catch_exceptions=False)

    put = baton("files", "put", sid, "in/report.csv", str(local), *api)
    assert put.exit_code == 0, put.output
    assert "attached in/report.csv (8 bytes, text/csv)" in put.output
    listed = baton("files", sid, *api)
    assert listed.exit_code == 0 and "in/report.csv" in listed.output, listed.output
    out = tmp_path / "back.csv"
    got = baton("files", "get", sid, "in/report.csv", "-o", str(out), *api)
    assert got.exit_code == 0, got.output
    assert out.read_bytes() == local.read_bytes()
    missing = baton("files", "get", sid, "nope.csv", *api)
    assert missing.exit_code == 1 and "file_not_found" in missing.output
    escaping = baton("files", "put", sid, "../x.csv", str(local), *api)
    assert escaping.exit_code == 1 and "invalid_path" in escaping.output
