"""End to end over HTTP: uvicorn + real worker + Temporal dev server + SQLite file."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from tests.test_api_agents import assert_problem
from tests.test_api_reviews import poll

#: Delay between streamed words of the cancel test's reply (10 words: 3 s in all), long
#: enough that a cancel sent once the stream started always lands while it streams.
STREAM_CHUNK_MS = 300


def agent(api: httpx.Client, slug: str, **spec: Any) -> None:
    assert (
        api.post("/v1/agents", json={"slug": slug, "name": slug, "spec": spec}).status_code == 201
    )
    assert api.post(f"/v1/agents/{slug}/publish").status_code == 201


def sse(
    api: httpx.Client, path: str, headers: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """Read an SSE stream to its end: ``[{id, event, data}]``."""
    events: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    with api.stream("GET", path, headers=headers or {}) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if not line:
                if "event" in current:
                    events.append(current)
                current = {}
            elif line.startswith("id:"):
                current["id"] = int(line[3:].strip())
            elif line.startswith("event:"):
                current["event"] = line[6:].strip()
            elif line.startswith("data:"):
                current["data"] = json.loads(line[5:].strip())
    return events


def wait_status(api: httpx.Client, sid: str, want: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while api.get(f"/v1/sessions/{sid}").json()["status"] != want:
        assert time.monotonic() < deadline, f"session never became {want}"
        time.sleep(0.05)


def test_sync_session_transcript_and_listing(live_api: httpx.Client) -> None:
    """A sync launch answers inline; the session, list and transcript show it."""
    agent(
        live_api,
        "helper",
        tools=["calculator"],
        playbook=[
            {"when": "calculator:", "reply": "It is {last_message}"},
            {
                "reply": "Computing.",
                "tool_calls": [{"tool": "calculator", "args": {"expression": "6*7"}}],
            },
        ],
    )
    resp = live_api.post(
        "/v1/sessions", json={"agent": "helper", "prompt": "6 times 7?", "sync": True}
    )
    assert resp.status_code == 201, resp.text
    body = resp.json()
    assert body["response"] == "It is 42" and body["version"] == 1
    assert body["workflow_url"].endswith(f"/workflows/{body['session_id']}")
    sid = body["session_id"]

    detail = live_api.get(f"/v1/sessions/{sid}").json()
    assert detail["status"] == "idle" and detail["running"] is False
    assert detail["message_count"] == 4 and detail["name"] == "6 times 7?"
    assert detail["invoked_by_agent"] is None and detail["created_by_user"] == "local"

    listed = live_api.get("/v1/sessions", params={"agent": "helper"}).json()
    assert listed["count"] == 1 and listed["data"][0]["session_id"] == sid

    transcript = live_api.get(f"/v1/sessions/{sid}/transcript").json()
    assert transcript["status"] == "idle"
    assert [m["role"] for m in transcript["messages"]] == ["user", "assistant", "tool", "assistant"]
    tool = transcript["messages"][2]
    assert tool["tool_name"] == "calculator" and tool["tool_input"] == '{"expression":"6*7"}'


def test_events_stream_and_resume(live_api: httpx.Client) -> None:
    """SSE replays the durable log; Last-Event-ID resumes after the given event only."""
    agent(live_api, "talker", playbook=[{"reply": "alpha beta gamma delta", "chunk_delay_ms": 120}])
    sid = live_api.post("/v1/sessions", json={"agent": "talker", "prompt": "talk"}).json()[
        "session_id"
    ]
    events = sse(live_api, f"/v1/sessions/{sid}/events?until=idle")
    kinds = [e["event"] for e in events]
    assert "chunk" in kinds and kinds[-1] == "status" and events[-1]["data"]["status"] == "idle"
    text = "".join(e["data"]["text"] for e in events if e["event"] == "chunk")
    assert text == "alpha beta gamma delta"
    cut = events[1]["id"]
    resumed = sse(live_api, f"/v1/sessions/{sid}/events?until=idle", {"Last-Event-ID": str(cut)})
    assert [e["id"] for e in resumed] == [e["id"] for e in events if e["id"] > cut]


def test_second_turn_busy_and_cancel(live_api: httpx.Client) -> None:
    """A message during a turn is 409 session_busy; cancel closes the session for good."""
    agent(live_api, "slowpoke", playbook=[{"reply": "w " * 40, "chunk_delay_ms": 100}])
    sid = live_api.post("/v1/sessions", json={"agent": "slowpoke", "prompt": "go"}).json()[
        "session_id"
    ]
    for sync in (True, False):
        busy = live_api.post(f"/v1/sessions/{sid}/messages", json={"prompt": "hurry", "sync": sync})
        assert_problem(busy, 409, "session_busy")
    cancelled = live_api.post(f"/v1/sessions/{sid}/cancel")
    assert cancelled.status_code == 202
    wait_status(live_api, sid, "cancelled")
    closed = live_api.post(f"/v1/sessions/{sid}/messages", json={"prompt": "still there?"})
    assert_problem(closed, 409, "session_closed")
    assert live_api.post(f"/v1/sessions/{sid}/cancel").json()["status"] == "cancelled"


def test_follow_up_message_after_idle(live_api: httpx.Client) -> None:
    """An async follow-up is accepted, then its events end at the next idle."""
    agent(live_api, "echoer", playbook=[])
    sid = live_api.post(
        "/v1/sessions", json={"agent": "echoer", "prompt": "one", "sync": True}
    ).json()["session_id"]
    last = sse(live_api, f"/v1/sessions/{sid}/events?until=idle")[-1]["id"]
    sent = live_api.post(f"/v1/sessions/{sid}/messages", json={"prompt": "two"})
    assert sent.status_code == 200 and sent.json()["status"] == "running"
    events = sse(live_api, f"/v1/sessions/{sid}/events?until=idle", {"Last-Event-ID": str(last)})
    assert any(
        e["event"] == "message" and e["data"]["text"] == "[echoer] received: two" for e in events
    )


def test_bad_session_input_is_4xx(live_api: httpx.Client) -> None:
    """Unknown/retired agents, bad refs, blank or huge prompts and unknown sessions are 4xx."""
    agent(live_api, "gone", playbook=[])
    live_api.post("/v1/agents/gone/retire")
    cases = [
        ({"agent": "ghost", "prompt": "x"}, 404, "agent_not_found"),
        ({"agent": "gone", "prompt": "x"}, 409, "agent_retired"),
        ({"agent": "gone@7", "prompt": "x"}, 409, "agent_retired"),
        ({"agent": "Bad Ref", "prompt": "x"}, 422, "validation_error"),
        ({"agent": "gone", "prompt": "   "}, 422, "validation_error"),
        ({"agent": "gone", "prompt": "x" * 64_001}, 422, "validation_error"),
        ({"agent": "gone", "prompt": "x", "created_by_user": "mallory"}, 422, "validation_error"),
    ]
    for body, code, name in cases:
        assert_problem(live_api.post("/v1/sessions", json=body), code, name)
    assert live_api.get("/v1/sessions").json()["count"] == 0
    unknown = "session-00000000-0000-0000-0000-000000000000"
    assert_problem(live_api.get(f"/v1/sessions/{unknown}"), 404, "session_not_found")
    assert_problem(
        live_api.post(f"/v1/sessions/{unknown}/messages", json={"prompt": "x"}),
        404,
        "session_not_found",
    )
    assert_problem(live_api.get("/v1/sessions/not-a-session/transcript"), 422, "validation_error")
    sid = live_api.post("/v1/sessions", json={"agent": "helper2", "prompt": "x"})
    assert sid.status_code == 404  # unknown agent: nothing started
    huge = {"Last-Event-ID": str(2**63)}
    assert_problem(
        live_api.get(f"/v1/sessions/{unknown}/events", headers=huge), 422, "validation_error"
    )


def test_cancel_mid_turn_stops_the_turn(live_api: httpx.Client) -> None:
    """Cancelling while the model streams runs no tool afterwards; `cancelled` is the last event."""
    agent(
        live_api,
        "toolish",
        tools=["calculator"],
        playbook=[
            {"when": "calculator:", "reply": "done"},
            {
                "reply": "a b c d e f g h i j",
                "chunk_delay_ms": STREAM_CHUNK_MS,
                "tool_calls": [{"tool": "calculator", "args": {"expression": "1+1"}}],
            },
        ],
    )
    sid = live_api.post("/v1/sessions", json={"agent": "toolish", "prompt": "go"}).json()[
        "session_id"
    ]

    def roles() -> list[str]:
        messages = live_api.get(f"/v1/sessions/{sid}/transcript").json()["messages"]
        return [m["role"] for m in messages]

    # The model call stores the user message, then streams its 10 words: cancel mid-stream.
    poll(lambda: roles() == ["user"], "the model call to start")
    streaming = time.monotonic()
    assert live_api.post(f"/v1/sessions/{sid}/cancel").status_code == 202
    events = sse(live_api, f"/v1/sessions/{sid}/events?until=idle")
    assert events[-1]["event"] == "status" and events[-1]["data"]["status"] == "cancelled"
    # Nothing may land after the cancel, not even once the abandoned stream has ended.
    time.sleep(max(0.0, streaming + 10 * STREAM_CHUNK_MS / 1000 + 0.5 - time.monotonic()))
    assert roles() == ["user"]
    assert sse(live_api, f"/v1/sessions/{sid}/events?until=idle")[-1]["id"] == events[-1]["id"]
