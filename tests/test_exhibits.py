"""Exhibits (docs/exhibits.md): what ``present_exhibit`` accepts at its bounds, and on the
real stack (uvicorn + worker + Temporal dev server + SQLite file) the ``exhibit`` event, the
``present_exhibit`` turn a reload rebuilds from, the served content, refusals that write
nothing, and a large image that never enters a Temporal payload."""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import zlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from pydantic_ai.messages import ModelMessage
from pydantic_ai.models import Model
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel
from sqlalchemy.engine import Engine
from sqlmodel import select
from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

import activities.turns as session_activities
import baton.providers.models
from baton.agents import roster
from baton.contracts.tool_args import CLAIM_CHECK, claim_checked, compact_exhibit_args
from baton.contracts.values import ExhibitLimits
from baton.contracts.workflow_io import Provenance
from baton.runs import exhibits
from baton.runs.launch import launch_session
from baton.storage.db import (
    DelegationRow,
    EventRow,
    ExhibitRow,
    MessageRow,
    SessionRow,
    UsageRow,
    session_scope,
)
from tests.helpers import STEADY_CONFIG, launch, publish
from tests.test_api_reviews import Stack as ApiStack
from tests.test_auth import Users, create_agent, grant, live_auth  # noqa: F401  (fixture)
from tests.test_e2e_sessions import agent, sse

LIMITS = ExhibitLimits(
    max_bytes=1000, max_inline_chars=100, max_columns=3, max_rows=4, max_cell_chars=10
)


def png(width: int = 2, height: int = 2, pad: int = 0) -> bytes:
    """A valid RGB PNG of ``width`` x ``height`` red pixels, ``pad`` bytes longer (a tEXt chunk)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body))
            + kind
            + body
            + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)
        )

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    raw = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    out = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw))
    if pad:
        out += chunk(b"tEXt", b"c\x00" + b"x" * max(pad - 14, 0))
    return out + chunk(b"IEND", b"")


def png_of_size(size: int) -> bytes:
    """A valid PNG of exactly ``size`` bytes."""
    base = len(png())
    out = png(pad=size - base)
    assert len(out) == size, (len(out), size)
    return out


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def image_args(raw: bytes, media_type: str = "image/png", title: str = "Red") -> dict[str, Any]:
    return {"kind": "image", "title": title, "media_type": media_type, "data": b64(raw)}


def refusal(args: dict[str, Any], limits: ExhibitLimits = LIMITS) -> str:
    with pytest.raises(exhibits.ExhibitRefused) as caught:
        exhibits.build(args, limits)
    return str(caught.value)


# --- what present_exhibit accepts ---------------------------------------------------------


def test_an_image_at_the_byte_bound_is_shown_and_one_byte_more_is_refused() -> None:
    """An image of exactly max_bytes decoded bytes is built; one byte more is refused."""
    built = exhibits.build(image_args(png_of_size(1000)), LIMITS)
    assert (built.kind, built.media_type, len(built.content or b"")) == ("image", "image/png", 1000)
    assert built.wire == {"title": "Red", "media_type": "image/png", "size": 1000}
    assert "an exhibit may hold 1000" in refusal(image_args(png_of_size(1001)))


@pytest.mark.parametrize("media_type", ["image/svg+xml", "text/html", "image/bmp", None])
def test_only_safe_raster_types_are_images(media_type: str | None) -> None:
    """SVG, HTML and any type but png/jpeg/gif/webp are refused as an image (a download may
    carry them)."""
    args = image_args(b"<svg onload=alert(1)></svg>")
    args["media_type"] = media_type
    assert "present anything else (SVG, HTML) as kind download" in refusal(args)


def test_an_image_whose_bytes_are_not_its_declared_type_is_refused() -> None:
    """Content declared image/png that is SVG (or JPEG) by its signature is refused."""
    assert "not a image/png image" in refusal(image_args(b"<svg xmlns='x'/>"))
    jpeg = b"\xff\xd8\xff\xe0" + b"\x00" * 20
    assert "not a image/png image" in refusal(image_args(jpeg))
    assert exhibits.build(image_args(jpeg, "image/jpeg"), LIMITS).media_type == "image/jpeg"


def test_bad_base64_and_unknown_arguments_are_refused() -> None:
    """Data that is not base64 and an argument the tool does not take are refused by name."""
    assert "not valid base64" in refusal({**image_args(png()), "data": "%%%"})
    assert "colour" in refusal({**image_args(png()), "colour": "red"})


def test_a_table_at_its_bounds_is_shown_and_one_more_row_column_or_character_is_refused() -> None:
    """max_rows rows of max_columns cells of max_cell_chars are built; one row, one column
    or one character more, or a ragged row, is refused."""
    cols = ["a", "b", "c"]
    rows: list[list[Any]] = [["x" * 10, 1, None]] * 4
    built = exhibits.build({"kind": "table", "title": "T", "columns": cols, "rows": rows}, LIMITS)
    assert built.wire["rows"] == rows
    table = {"kind": "table", "title": "T", "columns": cols}
    assert "5 rows" in refusal({**table, "rows": [*rows, rows[0]]})
    assert "4 columns" in refusal({**table, "columns": [*cols, "d"], "rows": []})
    assert "rows.0.0 is 11 characters" in refusal({**table, "rows": [["x" * 11, 1, 2]]})
    assert "rows.1 has 2 cells" in refusal({**table, "rows": [[1, 2, 3], [1, 2]]})
    assert "columns is required" in refusal({"kind": "table", "title": "T", "rows": []})


def test_markdown_and_a_chart_at_the_inline_bound_are_shown_and_one_more_is_refused() -> None:
    """Markdown of max_inline_chars and a spec whose JSON is that long are built; one more
    character is refused; a chart is stored as its spec, never run."""
    text = "*" * 100
    assert exhibits.build({"kind": "markdown", "title": "M", "text": text}, LIMITS).wire["text"]
    assert "101 characters" in refusal({"kind": "markdown", "title": "M", "text": text + "*"})
    spec = {"mark": "x" * (100 - len('{"mark": ""}'))}
    chart = exhibits.build({"kind": "chart", "title": "C", "spec": spec}, LIMITS)
    assert chart.wire == {"title": "C", "format": "vega-lite", "spec": spec}
    spec["mark"] += "x"
    assert "101 characters of JSON" in refusal({"kind": "chart", "title": "C", "spec": spec})


@pytest.mark.parametrize("path", ["../etc/passwd", "/abs", "a/../b", "C:x", "a\\b", ""])
def test_a_file_path_leaving_the_workspace_is_refused(path: str) -> None:
    """A file exhibit's path passes the workspace's path rule (relative, no '..')."""
    assert refusal({"kind": "file", "title": "F", "path": path}).startswith("path: ")


def test_a_download_needs_a_filename_and_may_carry_html() -> None:
    """A download carries any type (HTML too: it is never rendered) but needs a plain
    filename."""
    html = {"kind": "download", "title": "Page", "media_type": "text/html", "data": b64(b"<b>")}
    assert "filename is required" in refusal(html)
    assert "filename is required" in refusal({**html, "filename": "../x.html"})
    built = exhibits.build({**html, "filename": "page.html"}, LIMITS)
    assert built.wire["filename"] == "page.html" and built.content == b"<b>"


def test_claim_checked_arguments_carry_no_bulk() -> None:
    """The workflow receives an exhibit or write_file call's compact arguments and the
    claim-check id; other tools' arguments pass unchanged."""
    args = image_args(png_of_size(900))
    checked = claim_checked("present_exhibit", args, "m1")
    assert checked[CLAIM_CHECK] == "m1" and checked["data"].endswith("bytes, shown)")
    assert len(json.dumps(checked)) < 200
    assert compact_exhibit_args(args)["title"] == "Red"
    assert claim_checked("calculator", {"expression": "1"}, "m1") == {"expression": "1"}
    written = claim_checked("write_file", {"path": "a.txt", "content": "x" * 900}, "m1")
    assert written == {"path": "a.txt", "content": "(902 bytes, claim-checked)", CLAIM_CHECK: "m1"}


# --- on the real stack ----------------------------------------------------------------------


def presenting(*calls: dict[str, Any]) -> list[dict[str, Any]]:
    """A playbook that presents ``calls`` (present_exhibit arguments) and then says DONE."""
    return [
        {"when": "^present_exhibit: ", "reply": "DONE"},
        {
            "reply": "Here it is.",
            "tool_calls": [{"tool": "present_exhibit", "args": c} for c in calls],
        },
    ]


def _exhibit_turns(api: httpx.Client, sid: str) -> list[dict[str, Any]]:
    messages = api.get(f"/v1/sessions/{sid}/transcript").json()["messages"]
    return [m for m in messages if m.get("exhibit")]


def test_an_agent_presents_an_image_streamed_stored_and_rebuilt_from_the_transcript(
    live_api: httpx.Client,
) -> None:
    """present_exhibit appends an ``exhibit`` event, stores a present_exhibit turn whose
    wire equals the event's (a reload rebuilds the card from it), serves the image inline
    with nosniff, and tells the model it is displayed."""
    raw = png()
    table = {"kind": "table", "title": "Q3", "columns": ["k", "v"], "rows": [["a", 1]]}
    agent(live_api, "painter", playbook=presenting(image_args(raw), table))
    body = live_api.post("/v1/sessions", json={"agent": "painter", "prompt": "draw", "sync": True})
    assert body.status_code == 201, body.text
    sid = body.json()["session_id"]
    assert body.json()["response"] == "DONE"

    events = sse(live_api, f"/v1/sessions/{sid}/events?until=idle")
    shown = [e["data"] for e in events if e["event"] == "exhibit"]
    # The reply's two calls run in parallel (docs/exhibits.md): either may be shown first.
    assert sorted(w["kind"] for w in shown) == ["image", "table"]
    image, table_shown = sorted(shown, key=lambda w: w["kind"] != "image")
    assert image["url"] == f"/v1/sessions/{sid}/exhibits/{image['id']}"
    assert (image["title"], image["media_type"], image["size"]) == ("Red", "image/png", len(raw))
    assert (image["agent"], image["session_id"], image["delegation_id"]) == ("painter", sid, None)
    assert "data" not in image
    # The stream never carries the image's bytes (the call's event has them compacted).
    assert b64(raw) not in json.dumps([e["data"] for e in events])

    turns = _exhibit_turns(live_api, sid)
    # The stream shows the cards as the calls finish; the transcript keeps the reply's call
    # order (each turn stands at its call's position), image first as the playbook asks.
    assert [t["exhibit"] for t in turns] == [image, table_shown]
    image_turn = next(t for t in turns if t["exhibit"]["kind"] == "image")
    assert image_turn["tool_name"] == "present_exhibit" and image_turn["tool_input"] is None
    assert image_turn["text"].startswith("displayed to the person: image 'Red'")

    got = live_api.get(image["url"])
    assert got.status_code == 200 and got.content == raw
    assert got.headers["content-type"] == "image/png"
    assert got.headers["x-content-type-options"] == "nosniff"
    assert got.headers["content-disposition"].startswith("inline")
    assert "sandbox" in got.headers["content-security-policy"]
    missing = live_api.get(f"/v1/sessions/{sid}/exhibits/ex-{'0' * 24}")
    assert missing.status_code == 404 and missing.json()["code"] == "exhibit_not_found"
    # A table has no content to download: it is all in its wire.
    assert live_api.get(f"/v1/sessions/{sid}/exhibits/{table_shown['id']}").status_code == 404


async def _failed_activities(env: WorkflowEnvironment, sid: str) -> int:
    """Activity attempts of ``sid``'s workflow that failed or timed out."""
    failed = (
        EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED,
        EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT,
    )
    handle = env.client.get_workflow_handle(sid)
    return len([e async for e in handle.fetch_history_events() if e.event_type in failed])


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (image_args(b"<svg onload='alert(1)'/>", "image/svg+xml"), "is not shown inline"),
        (image_args(png(pad=3000)), "an exhibit may hold 2000"),
        (
            {"kind": "table", "title": "T", "columns": ["a", "b"], "rows": [[1]]},
            "rows.0 has 1 cells",
        ),
    ],
    ids=["unsafe-type", "oversize", "bad-table"],
)
def test_bad_exhibits_are_tool_errors_and_write_nothing(
    small_exhibits: None,
    live_api: httpx.Client,
    temporal_env: WorkflowEnvironment,
    args: dict[str, Any],
    why: str,
) -> None:
    """An unsafe image type, content over the bound and a ragged table are tool errors the
    model reads: the turn goes on (idle, not failed), no activity fails or retries, no
    exhibit, no exhibit event."""
    playbook = [{"when": "present_exhibit: ", "reply": "SORRY {last_message}"}, *presenting(args)]
    agent(live_api, "clumsy", playbook=playbook)
    body = live_api.post("/v1/sessions", json={"agent": "clumsy", "prompt": "x", "sync": True})
    assert body.status_code == 201, body.text
    sid = body.json()["session_id"]
    assert body.json()["status"] == "idle" and why in body.json()["response"]
    events = sse(live_api, f"/v1/sessions/{sid}/events?until=idle")
    assert not [e for e in events if e["event"] == "exhibit"]
    assert not _exhibit_turns(live_api, sid)
    tools = [
        m
        for m in live_api.get(f"/v1/sessions/{sid}/transcript").json()["messages"]
        if m["role"] == "tool"
    ]
    assert len(tools) == 1 and why in tools[0]["text"]
    assert asyncio.run(_failed_activities(temporal_env, sid)) == 0


@pytest.fixture
def small_exhibits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Exhibits of at most 2000 bytes on the stack started after this fixture."""
    monkeypatch.setenv("BATON_EXHIBIT_MAX_BYTES", "2000")


#: A 1 MiB image: twice the activity-result bound (baton.payloads.MAX_RESULT_BYTES).
BIG = png_of_size(1024 * 1024)


@pytest.fixture
def big_painter(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model of agent ``big-painter`` presents BIG (the scripted model's playbook cannot
    carry 1 MiB without it entering the agent's snapshot); every other agent is scripted."""
    original = baton.providers.models.build_model

    def build(name: str, *, playbook: list[dict[str, Any]] | None, agent_slug: str) -> Model:
        if agent_slug != "big-painter":
            return original(name, playbook=playbook, agent_slug=agent_slug)

        async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
            if len(messages) > 1:
                yield "DONE"
                return
            args = json.dumps(image_args(BIG, title="Big"))
            call = DeltaToolCall(name="present_exhibit", json_args=args, tool_call_id="big")
            calls: DeltaToolCalls = {0: call}
            yield calls

        return FunctionModel(stream_function=stream, model_name="scripted:big-painter")

    monkeypatch.setattr(session_activities, "build_model", build)


async def test_a_large_image_never_enters_a_temporal_payload(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker, big_painter: None
) -> None:
    """A 1 MiB image is shown whole while no payload of the session's history is over
    4 KiB: the workflow receives a claim-check, the activity reads the stored reply."""
    publish(db_engine, "big-painter", playbook=[{"reply": "unused"}])
    done = await launch(
        temporal_env.client, db_engine, worker, "big-painter", "go", config=STEADY_CONFIG
    )
    assert done.response == "DONE"
    with session_scope(db_engine) as s:
        (row,) = s.exec(select(ExhibitRow).where(ExhibitRow.session_id == done.session_id)).all()
        assert row.content == BIG and row.wire["size"] == len(BIG)
    handle = temporal_env.client.get_workflow_handle(done.session_id)
    sizes = []
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            sizes.append(event.activity_task_completed_event_attributes.result.ByteSize())
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            sizes.append(event.activity_task_scheduled_event_attributes.input.ByteSize())
    assert sizes and max(sizes) < 4096, max(sizes)


def test_an_agent_that_blocks_present_exhibit_cannot_show_anything(
    live_api: httpx.Client,
) -> None:
    """An agent whose blocked_tools holds present_exhibit cannot show anything: its call is
    refused as an unavailable tool and nothing is stored."""
    agent(
        live_api,
        "mute",
        blocked_tools=["present_exhibit"],
        playbook=[
            {"when": "present_exhibit: ", "reply": "NO {last_message}"},
            *presenting(image_args(png())),
        ],
    )
    body = live_api.post("/v1/sessions", json={"agent": "mute", "prompt": "x", "sync": True})
    assert "is not available to this agent" in body.json()["response"]
    assert not _exhibit_turns(live_api, body.json()["session_id"])


def _events_of(engine: Engine, sid: str, kind: str) -> list[dict[str, Any]]:
    with session_scope(engine) as s:
        rows = s.exec(
            select(EventRow).where(EventRow.session_id == sid, EventRow.type == kind)
        ).all()
        return [dict(r.data) for r in rows]


def _messages(engine: Engine, sid: str) -> list[MessageRow]:
    with session_scope(engine) as s:
        return list(s.exec(select(MessageRow).where(MessageRow.session_id == sid)).all())


# --- through delegations (AgentX Agent Teams, 'Multimodal specialist output passes through') ---


def delegating_to(target: str) -> list[dict[str, Any]]:
    """A lead that delegates to ``target`` once and answers with the result."""
    return [
        {"when": "^delegate_to: ", "reply": "<{last_message}>"},
        {
            "reply": "Delegating.",
            "tool_calls": [
                {"tool": "delegate_to", "args": {"agent_id": target, "task": "draw it"}}
            ],
        },
    ]


def test_a_specialists_exhibits_reach_the_parent_top_level_unchanged_and_survive_a_reload(
    live_api: httpx.Client,
) -> None:
    """A delegate_to specialist's exhibit events appear in the parent's stream with the
    same type and data, delegation_complete carries the wires, the parent's transcript
    holds present_exhibit turns with them (before the delegation's result, which says they
    are already displayed), and the image is served to the parent's reader."""
    raw = png(3, 1)
    table = {"kind": "table", "title": "Sizes", "columns": ["n"], "rows": [[1], [2]]}
    agent(
        live_api,
        "illustrator",
        playbook=presenting(image_args(raw, title="Sketch"), table),
        delegation={"available_for_delegation": True, "delegation_hint": "pictures"},
    )
    agent(live_api, "host", playbook=delegating_to("illustrator"))
    roster.clear_cache()  # the roster the in-process worker reads
    body = live_api.post("/v1/sessions", json={"agent": "host", "prompt": "go", "sync": True})
    assert body.status_code == 201, body.text
    sid = body.json()["session_id"]

    events = sse(live_api, f"/v1/sessions/{sid}/events?until=idle")
    (start,) = [e["data"] for e in events if e["event"] == "delegation_start"]
    child = start["session_id"]
    own = sse(live_api, f"/v1/sessions/{child}/events?until=idle")
    mine = [e["data"] for e in own if e["event"] == "exhibit"]
    theirs = [e["data"] for e in events if e["event"] == "exhibit"]
    # The two calls run in parallel: either may be shown first, in both streams alike.
    assert theirs == mine and sorted(w["title"] for w in theirs) == ["Sizes", "Sketch"]
    assert {w["delegation_id"] for w in theirs} == {start["delegation_id"]}
    assert {(w["agent"], w["session_id"]) for w in theirs} == {("illustrator", child)}
    (complete,) = [e["data"] for e in events if e["event"] == "delegation_complete"]
    assert sorted(complete["exhibits"], key=str) == sorted(theirs, key=str)

    for _reload in range(2):  # what a reloaded page reads: the transcript, every time
        messages = live_api.get(f"/v1/sessions/{sid}/transcript").json()["messages"]
        cards = [m["exhibit"] for m in messages if m.get("exhibit")]
        assert cards == theirs
    names = [(m["role"], m["tool_name"]) for m in messages]
    result_at = names.index(("tool", "delegate_to"))
    assert names[result_at - 2 : result_at] == [("tool", "present_exhibit")] * 2
    result = messages[result_at]["text"]
    assert "Already displayed to the person: 2 exhibit(s) from illustrator" in result
    assert "do not repeat them" in result and "'Sketch'" in result
    (image,) = [w for w in theirs if w["kind"] == "image"]
    assert live_api.get(image["url"]).content == raw


@pytest.mark.parametrize("count", [5, 6])
async def test_delegation_complete_carries_at_most_five_exhibits(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker, count: int
) -> None:
    """A subagent task that shows 5 exhibits carries all 5 in delegation_complete; one that
    shows 6 carries 5, and the caller's result counts 6 ("and 1 more"); every one of them
    is forwarded to the root's stream and transcript."""
    notes = [{"kind": "markdown", "title": f"n{i}", "text": f"# {i}"} for i in range(count)]
    publish(db_engine, "scribe", playbook=presenting(*notes))
    publish(
        db_engine,
        "editor",
        subagents=[{"alias": "write", "agent": "scribe"}],
        playbook=[
            {"when": "^task: ", "reply": "<{last_message}>"},
            {
                "reply": "On it.",
                "tool_calls": [{"tool": "task", "args": {"alias": "write", "prompt": "x"}}],
            },
        ],
    )
    done = await launch(
        temporal_env.client, db_engine, worker, "editor", "go", config=STEADY_CONFIG
    )
    (complete,) = _events_of(db_engine, done.session_id, "delegation_complete")
    forwarded = _events_of(db_engine, done.session_id, "exhibit")
    assert len(forwarded) == count
    assert len(complete["exhibits"]) == 5
    assert all(w in forwarded for w in complete["exhibits"])
    turns = [m for m in _messages(db_engine, done.session_id) if m.tool_name == "present_exhibit"]
    assert len(turns) == count
    (result,) = [m for m in _messages(db_engine, done.session_id) if m.tool_name == "task"]
    assert f"{count} exhibit(s) from" in result.text
    assert ("and 1 more" in result.text) is (count == 6)


async def test_a_specialist_works_under_its_own_identity_for_the_conversations_user(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """Inside a delegation the specialist's tool calls, exhibits and metered usage are its
    own (its slug), and its session belongs to the conversation's user."""
    publish(
        db_engine,
        "maker",
        playbook=presenting({"kind": "markdown", "title": "m", "text": "hi"}),
        delegation={"available_for_delegation": True},
    )
    publish(db_engine, "lead", playbook=delegating_to("maker"))
    roster.clear_cache()
    done = await launch_session(
        temporal_env.client,
        db_engine,
        task_queue=worker.task_queue,
        config=STEADY_CONFIG,
        ref="lead",
        prompt="go",
        provenance=Provenance(created_by_user="alice"),
        sync=True,
    )
    with session_scope(db_engine) as s:
        (edge,) = s.exec(
            select(DelegationRow).where(DelegationRow.parent_session_id == done.session_id)
        ).all()
        child = s.get(SessionRow, edge.child_session_id)
        assert child is not None and child.created_by_user == "alice"
        assert child.agent_slug == "maker" and child.invoked_by_agent == "lead"
        usage = s.exec(select(UsageRow).where(UsageRow.session_id == child.id)).all()
        assert usage and {u.agent_slug for u in usage} == {"maker"}
        (shown,) = s.exec(select(ExhibitRow).where(ExhibitRow.session_id == child.id)).all()
        assert shown.wire["agent"] == "maker" and shown.root_session_id == done.session_id
    tools = [m for m in _messages(db_engine, child.id) if m.role == "tool"]
    assert tools and {m.agent_slug for m in tools} == {"maker"}


def test_a_workspace_file_is_presented_with_its_type_size_and_download_url(
    live_api: httpx.Client,
) -> None:
    """An agent writes a file and presents it: the exhibit names the file's path, content
    type and size, and its URL downloads the file; a path with no file is a tool error."""
    agent(
        live_api,
        "writer",
        playbook=[
            {"when": "^present_exhibit: ", "reply": "SHOWN {last_message}"},
            {
                "when": "^write_file: ",
                "reply": "Written.",
                "tool_calls": [
                    {
                        "tool": "present_exhibit",
                        "args": {"kind": "file", "title": "Notes", "path": "out/notes.md"},
                    },
                    {
                        "tool": "present_exhibit",
                        "args": {"kind": "file", "title": "Gone", "path": "out/none.md"},
                    },
                ],
            },
            {
                "reply": "Writing.",
                "tool_calls": [
                    {"tool": "write_file", "args": {"path": "out/notes.md", "content": "# hi"}}
                ],
            },
        ],
    )
    body = live_api.post("/v1/sessions", json={"agent": "writer", "prompt": "x", "sync": True})
    assert body.status_code == 201, body.text
    sid = body.json()["session_id"]
    (turn,) = _exhibit_turns(live_api, sid)
    wire = turn["exhibit"]
    assert (wire["kind"], wire["path"], wire["size"]) == ("file", "out/notes.md", 4)
    assert wire["media_type"] == "text/markdown"
    assert wire["url"] == f"/v1/sessions/{sid}/files/out/notes.md"
    assert live_api.get(wire["url"]).content == b"# hi"
    tools = live_api.get(f"/v1/sessions/{sid}/transcript").json()["messages"]
    assert any(
        m["tool_name"] == "present_exhibit" and m["text"].startswith("path: ") for m in tools
    )


def test_a_file_attached_to_a_specialists_session_is_forwarded_to_the_root_unchanged(
    live_api: httpx.Client,
) -> None:
    """A person's upload to a delegated session appends workspace_attached there and the
    same event, same data, to the run's root stream."""
    agent(
        live_api,
        "helper",
        playbook=[{"reply": "HELPED"}],
        delegation={"available_for_delegation": True},
    )
    agent(live_api, "host", playbook=delegating_to("helper"))
    roster.clear_cache()
    body = live_api.post("/v1/sessions", json={"agent": "host", "prompt": "go", "sync": True})
    sid = body.json()["session_id"]
    events = sse(live_api, f"/v1/sessions/{sid}/events?until=idle")
    (start,) = [e["data"] for e in events if e["event"] == "delegation_start"]
    child = start["session_id"]
    before = sse(live_api, f"/v1/sessions/{child}/events?until=idle")[-1]["id"]
    put = live_api.put(
        f"/v1/sessions/{child}/files/brief.txt",
        content=b"read me",
        headers={"content-type": "text/plain"},
    )
    assert put.status_code in (200, 201), put.text
    after = events[-1]["id"]
    root = sse(live_api, f"/v1/sessions/{sid}/events?until=idle&after={after}")
    own = sse(live_api, f"/v1/sessions/{child}/events?until=idle&after={before}")
    theirs = [e["data"] for e in root if e["event"] == "workspace_attached"]
    mine = [e["data"] for e in own if e["event"] == "workspace_attached"]
    assert theirs == mine and len(mine) == 1 and mine[0]["path"] == "brief.txt"


def test_in_auth_mode_an_exhibit_is_read_by_who_may_read_its_session_or_its_root(
    live_auth: tuple[Users, ApiStack],  # noqa: F811  (the fixture imported above)
) -> None:
    """A delegated specialist's image is served to a viewer of the conversation's agent
    (the run's root), though not of the specialist, and refused (403) to a user with no
    role on either."""
    users, st = live_auth
    alice = users["alice"]
    roster_entry = {"available_for_delegation": True}
    spec = {"playbook": presenting(image_args(png())), "delegation": roster_entry}
    made = alice.post("/v1/agents", json={"slug": "drawer", "name": "Drawer", "spec": spec})
    assert made.status_code == 201, made.text
    assert alice.post("/v1/agents/drawer/publish").status_code == 201
    create_agent(alice, "asker", delegating_to("drawer"))
    grant(st.engine, "asker", "bob", "viewer")
    roster.clear_cache()
    body = alice.post("/v1/sessions", json={"agent": "asker", "prompt": "go", "sync": True})
    assert body.status_code == 201, body.text
    sid = body.json()["session_id"]
    (card,) = [
        m["exhibit"]
        for m in users["bob"].get(f"/v1/sessions/{sid}/transcript").json()["messages"]
        if m.get("exhibit")
    ]
    assert card["agent"] == "drawer" and card["session_id"] != sid
    assert users["bob"].get(card["url"]).content == png()
    refused = users["carol"].get(card["url"])
    assert refused.status_code == 403 and refused.json()["code"] == "forbidden"
