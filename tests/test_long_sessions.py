"""Long sessions: the transcript pages by cursor, and a model call reads a bounded
context window (the newest messages, from a user message on) after the pinned system prompt."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy.engine import Engine
from temporalio.testing import WorkflowEnvironment

from baton.contracts.values import position
from baton.contracts.workflow_io import Provenance
from baton.runs import session_store as sessions
from baton.runs.launch import send_message
from baton.settings import Settings
from baton.storage.db import session_scope
from tests.conftest import serve
from tests.helpers import launch, publish
from tests.openai_stub import OpenAIStub
from worker.factory import build_worker


def _session(engine: Engine, messages: int) -> str:
    """A session with ``messages`` alternating user/assistant messages (turn i: two)."""
    sid = f"session-{uuid.uuid4()}"
    with session_scope(engine) as s:
        sessions.create_session(
            s,
            session_id=sid,
            agent_slug="a",
            agent_version=1,
            provenance=Provenance(),
            name="long",
        )
        for i in range(messages):
            turn, kind = i // 2 + 1, i % 2
            sessions.add_message(
                s,
                message_id=f"{sid}:m{i}",
                session_id=sid,
                position=position(turn, kind, kind),
                role="user" if kind == 0 else "assistant",
                agent_slug="a",
                text=f"m{i}",
            )
    return sid


def _page(
    engine: Engine, sid: str, limit: int | None, cursor: str | None = None
) -> sessions.Transcript:
    with session_scope(engine) as s:
        return sessions.transcript(s, session_id=sid, limit=limit, cursor=cursor)


def test_pages_walk_every_message_once_in_order(engine: Engine) -> None:
    """Pages of 3 over 7 messages are 3, 3, 1, in order; only the last has no next_cursor."""
    sid = _session(engine, 7)
    texts, sizes, cursor = [], [], None
    while True:
        page = _page(engine, sid, 3, cursor)
        texts += [m.text for m in page.messages]
        sizes.append(len(page.messages))
        cursor = page.next_cursor
        if cursor is None:
            break
        assert cursor == page.messages[-1].id
    assert sizes == [3, 3, 1]
    assert texts == [f"m{i}" for i in range(7)]


def test_a_page_that_ends_exactly_at_the_last_message_has_no_next_cursor(engine: Engine) -> None:
    """limit = the message count: one page, next_cursor null; limit - 1: a second page of one."""
    sid = _session(engine, 4)
    whole = _page(engine, sid, 4)
    assert len(whole.messages) == 4 and whole.next_cursor is None
    first = _page(engine, sid, 3)
    assert first.next_cursor == first.messages[-1].id
    rest = _page(engine, sid, 3, first.next_cursor)
    assert [m.text for m in rest.messages] == ["m3"] and rest.next_cursor is None
    unpaged = _page(engine, sid, None)
    assert len(unpaged.messages) == 4 and unpaged.next_cursor is None


def test_a_cursor_of_another_session_is_refused(engine: Engine) -> None:
    """A cursor naming another session's message (or none) is InvalidCursor, not a page."""
    mine, theirs = _session(engine, 2), _session(engine, 2)
    with pytest.raises(sessions.InvalidCursor):
        _page(engine, mine, 10, f"{theirs}:m0")
    with pytest.raises(sessions.InvalidCursor):
        _page(engine, mine, 10, "no-such-message")


def test_history_window_keeps_the_newest_messages_from_a_user_message(engine: Engine) -> None:
    """last=4 of 7 (u a u a u a u) drops the leading assistant reply: the newest 3, from u;
    last=None reads all 7; a window holding no user message is kept as it is."""
    sid = _session(engine, 7)
    with session_scope(engine) as s:
        window = sessions.history(s, session_id=sid, last=4)
        everything = sessions.history(s, session_id=sid)
        exact = sessions.history(s, session_id=sid, last=3)
        lone = sessions.history(s, session_id=sid, last=1)
    assert [m.text for m in window] == ["m4", "m5", "m6"]
    assert [m.text for m in exact] == ["m4", "m5", "m6"]
    assert [m.text for m in everything] == [f"m{i}" for i in range(7)]
    assert [m.text for m in lone] == ["m6"]
    sid2 = _session(engine, 6)  # ends with an assistant reply
    with session_scope(engine) as s:
        tail = sessions.history(s, session_id=sid2, last=1)
    assert [(m.role, m.text) for m in tail] == [("assistant", "m5")]


def test_transcript_route_checks_limit_and_cursor(settings: Settings, api: httpx.Client) -> None:
    """limit 0 or 501 is a 422; a cursor naming nothing is invalid_cursor; a cursor without
    limit pages by the default; limit 500 (the bound) pages."""
    from baton.storage.db import make_engine

    engine = make_engine(settings.database_url)
    try:
        sid = _session(engine, 3)
    finally:
        engine.dispose()
    url = f"/v1/sessions/{sid}/transcript"
    assert api.get(url, params={"limit": 0}).status_code == 422
    assert api.get(url, params={"limit": 501}).status_code == 422
    r = api.get(url, params={"limit": 2, "cursor": "nothing"})
    assert r.status_code == 422 and r.json()["code"] == "invalid_cursor", r.text
    after = api.get(url, params={"cursor": f"{sid}:m0"}).json()
    assert [m["text"] for m in after["messages"]] == ["m1", "m2"] and after["next_cursor"] is None
    page = api.get(url, params={"limit": 2}).json()
    assert [m["text"] for m in page["messages"]] == ["m0", "m1"]
    assert page["next_cursor"] == f"{sid}:m1"
    rest = api.get(url, params={"limit": 500, "cursor": page["next_cursor"]}).json()
    assert [m["text"] for m in rest["messages"]] == ["m2"] and rest["next_cursor"] is None


def test_an_unpaged_transcript_gets_the_default_page(settings: Settings, api: httpx.Client) -> None:
    """Without limit: DEFAULT_TRANSCRIPT_PAGE messages of DEFAULT+1 with a next_cursor to the
    last one; exactly DEFAULT messages come in one page with no next_cursor."""
    from baton.storage.db import make_engine

    n = sessions.DEFAULT_TRANSCRIPT_PAGE
    engine = make_engine(settings.database_url)
    try:
        over, exact = _session(engine, n + 1), _session(engine, n)
    finally:
        engine.dispose()
    first = api.get(f"/v1/sessions/{over}/transcript").json()
    assert len(first["messages"]) == n and first["next_cursor"] == f"{over}:m{n - 1}"
    rest = api.get(f"/v1/sessions/{over}/transcript", params={"cursor": first["next_cursor"]})
    assert [m["text"] for m in rest.json()["messages"]] == [f"m{n}"]
    whole = api.get(f"/v1/sessions/{exact}/transcript").json()
    assert len(whole["messages"]) == n and whole["next_cursor"] is None


def test_the_cli_follows_transcript_pages(settings: Settings, api: httpx.Client) -> None:
    """The CLI's transcript reads 501 messages as two pages of its 500: all, in order."""
    from baton.storage.db import make_engine
    from cli.sessions import transcript_messages

    engine = make_engine(settings.database_url)
    try:
        sid = _session(engine, 501)
    finally:
        engine.dispose()
    status, messages = transcript_messages(api, sid)
    assert status == "running" and [m["text"] for m in messages] == [f"m{i}" for i in range(501)]


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> Iterator[OpenAIStub]:
    """An instant OpenAI-compatible model answering ``ok``, the provider pointed at it."""
    fake = OpenAIStub(reply="ok")
    server, thread, base = serve(fake.app)
    monkeypatch.setenv("OPENAI_BASE_URL", f"{base}/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    try:
        yield fake
    finally:
        server.should_exit = True
        thread.join(timeout=10)


async def test_a_model_call_reads_the_window_after_the_system_prompt(
    temporal_env: WorkflowEnvironment, db_engine: Engine, stub: OpenAIStub
) -> None:
    """With a window of 4, the 4th turn sends the system prompt then u3 a3 u4 (a2 trimmed,
    as it answers a cut-off question), not the whole transcript."""
    publish(db_engine, "long", model="openai-chat:stub-model", system_prompt="Be brief.")
    worker = build_worker(
        temporal_env.client, engine=db_engine, task_queue=f"tq-{uuid.uuid4()}", context_messages=4
    )
    async with worker:
        launched = await launch(temporal_env.client, db_engine, worker, "long", "u1")
        for prompt in ("u2", "u3", "u4"):
            await send_message(
                temporal_env.client,
                db_engine,
                session_id=launched.session_id,
                prompt=prompt,
                sync=True,
            )
    sent = stub.requests[-1]["messages"]
    assert sent[0] == {"role": "system", "content": "Be brief."}
    assert [(m["role"], m["content"]) for m in sent[1:]] == [
        ("user", "u3"),
        ("assistant", "ok"),
        ("user", "u4"),
    ]
    assert len(stub.requests[0]["messages"]) == 2  # the first turn: system + u1
