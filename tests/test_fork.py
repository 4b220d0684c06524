"""Forking a session (docs/change-safely.md, Fork a session) on the real stack: uvicorn + worker
+ Temporal dev server + SQLite. A fork holds the original's transcript up to a message by
reference, then runs from there; the original is never touched."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func
from sqlmodel import select
from temporalio.testing import WorkflowEnvironment
from typer.testing import CliRunner

from baton.contracts.values import position
from baton.contracts.workflow_io import Provenance
from baton.runs import session_store
from baton.storage.db import MessageRow, SessionRow, session_scope
from cli.main import app as cli_app
from tests.test_api_agents import assert_problem
from tests.test_api_reviews import (
    Stack,
    agent,
    decide,
    pending,
    running_stack,
    settled,
)
from tests.test_auth import USERS, Users, add_user, create_agent, grant
from tests.xagent_helpers import caller_playbook

ECHO = [{"reply": "echo {last_message}"}]
INVOKE_SYNC = {"slug": "target", "prompt": "hello target", "sync": True}


@pytest.fixture
def stack(temporal_env: WorkflowEnvironment, tmp_path: Path) -> Iterator[Stack]:
    """API + worker on a fresh SQLite file."""
    with running_stack(temporal_env, tmp_path / "fork.db") as s:
        yield s


def converse(http: httpx.Client, slug: str, prompts: list[str]) -> str:
    """A session of ``slug`` that has answered each of ``prompts`` in turn; its id."""
    first = http.post("/v1/sessions", json={"agent": slug, "prompt": prompts[0], "sync": True})
    assert first.status_code == 201, first.text
    sid: str = first.json()["session_id"]
    for prompt in prompts[1:]:
        sent = http.post(f"/v1/sessions/{sid}/messages", json={"prompt": prompt, "sync": True})
        assert sent.status_code == 200, sent.text
    return sid


def paged(http: httpx.Client, sid: str, limit: int = 2) -> list[dict[str, Any]]:
    """Every message of ``sid``'s transcript, read in pages of ``limit``."""
    out: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": limit} | ({"cursor": cursor} if cursor else {})
        body = http.get(f"/v1/sessions/{sid}/transcript", params=params).json()
        out += body["messages"]
        cursor = body["next_cursor"]
        if cursor is None:
            return out


def fork(http: httpx.Client, sid: str, **body: Any) -> httpx.Response:
    """POST the fork of ``sid``."""
    return http.post(f"/v1/sessions/{sid}/fork", json=body)


def started(resp: httpx.Response) -> dict[str, Any]:
    """The fork's answer (201)."""
    assert resp.status_code == 201, resp.text
    body: dict[str, Any] = resp.json()
    return body


def ids(messages: list[dict[str, Any]]) -> list[str]:
    """The ids of ``messages``."""
    return [m["id"] for m in messages]


async def test_fork_after_a_reply_holds_the_prefix_and_runs_a_new_prompt(
    stack: Stack, temporal_env: WorkflowEnvironment
) -> None:
    """A fork after message k pages exactly the original's first k messages, then its own
    turn on the new prompt; the original keeps its messages and status; lineage is in the
    session, the trace and the workflow's static details."""
    http = stack.http
    agent(http, "echo", ECHO)
    sid = converse(http, "echo", ["one", "two", "three"])
    original = paged(http, sid)
    before = http.get(f"/v1/sessions/{sid}").json()
    assert len(original) == 6
    point = original[3]  # the reply to "two"
    assert point["role"] == "assistant"

    body = started(fork(http, sid, after_message_id=point["id"], prompt="fresh", sync=True))
    assert (body["forked_from"], body["fork_point"], body["sandbox"]) == (sid, point["id"], False)
    assert "fresh" in (body["response"] or "")
    fid = body["session_id"]
    forked = paged(http, fid)
    assert ids(forked[:4]) == ids(original[:4])
    assert [(m["role"], m["text"]) for m in forked[4:]] == [
        ("user", "fresh"),
        ("assistant", body["response"]),
    ]
    assert all(m["id"].startswith(fid) for m in forked[4:])
    assert http.get(f"/v1/sessions/{fid}/transcript").json()["messages"] == forked

    assert paged(http, sid) == original  # the original is never touched
    after = http.get(f"/v1/sessions/{sid}").json()
    assert {k: after[k] for k in ("status", "message_count", "last_activity_at")} == {
        k: before[k] for k in ("status", "message_count", "last_activity_at")
    }

    detail = http.get(f"/v1/sessions/{fid}").json()
    assert (detail["forked_from"], detail["fork_point"], detail["message_count"]) == (
        sid,
        point["id"],
        6,
    )
    trace = http.get(f"/v1/sessions/{fid}/trace").json()
    assert (trace["forked_from"], trace["fork_point"]) == (sid, point["id"])
    described = await temporal_env.client.get_workflow_handle(fid).describe()
    details = await described.static_details() or ""
    assert "Forked from" in details and sid in details


def test_fork_without_prompt_sends_the_original_next_user_message_again(stack: Stack) -> None:
    """Without a prompt, a fork after a reply runs the original's next user message."""
    http = stack.http
    agent(http, "echo", ECHO)
    sid = converse(http, "echo", ["one", "two"])
    original = paged(http, sid)
    body = started(fork(http, sid, after_message_id=original[1]["id"], sync=True))
    forked = paged(http, body["session_id"])
    assert ids(forked[:2]) == ids(original[:2])
    assert [(m["role"], m["text"]) for m in forked[2:]] == [
        (m["role"], m["text"]) for m in original[2:]
    ]


def test_fork_after_a_user_message_answers_it_on_another_revision(stack: Stack) -> None:
    """A fork after a user message answers that very message (not stored twice) with the
    chosen revision; a prompt there is refused."""
    http = stack.http
    agent(http, "echo", ECHO)
    sid = converse(http, "echo", ["one", "two"])
    original = paged(http, sid)
    assert http.put("/v1/agents/echo/draft", json={"playbook": [{"reply": "v2"}]}).status_code
    assert http.post("/v1/agents/echo/publish").status_code == 201
    user = original[2]
    assert (user["role"], user["text"]) == ("user", "two")
    assert_problem(
        fork(http, sid, after_message_id=user["id"], prompt="x"), 422, "prompt_after_user_message"
    )
    body = started(fork(http, sid, after_message_id=user["id"], agent="echo@2", sync=True))
    assert (body["version"], body["response"]) == (2, "v2")
    forked = paged(http, body["session_id"])
    assert ids(forked[:3]) == ids(original[:3])
    assert [(m["role"], m["text"]) for m in forked[3:]] == [("assistant", "v2")]


def test_a_draft_runs_only_in_the_sandbox_and_never_as_the_live_agent(stack: Stack) -> None:
    """``slug@draft`` needs ``sandbox: true`` (422 draft_outside_sandbox); the sandbox fork
    runs the draft and is marked, while new sessions of the slug still run the live revision."""
    http = stack.http
    agent(http, "echo", ECHO)
    sid = converse(http, "echo", ["one"])
    point = paged(http, sid)[0]["id"]
    http.put("/v1/agents/echo/draft", json={"playbook": [{"reply": "draft says"}]})
    assert_problem(
        fork(http, sid, after_message_id=point, agent="echo@draft"), 422, "draft_outside_sandbox"
    )
    body = started(
        fork(http, sid, after_message_id=point, agent="echo@draft", sandbox=True, sync=True)
    )
    assert (body["response"], body["version"], body["sandbox"]) == ("draft says", 0, True)
    assert http.get(f"/v1/sessions/{body['session_id']}").json()["sandbox"] is True
    live = http.post("/v1/sessions", json={"agent": "echo", "prompt": "hi", "sync": True})
    assert live.json()["version"] == 1 and live.json()["response"] != "draft says"
    assert_problem(
        http.post("/v1/sessions", json={"agent": "echo@draft", "prompt": "hi"}),
        422,
        "validation_error",
    )


def test_a_review_fires_again_in_the_fork_and_earlier_tool_calls_are_not_rerun(
    stack: Stack,
) -> None:
    """The original's invoke was reviewed and allowed; a fork after its user message asks
    for a new review (no decision carries over); a fork after the final reply runs no tool
    (the target's session count, the invocations' counter, does not move)."""
    http = stack.http
    agent(http, "target", [{"reply": "target says hi"}])
    agent(http, "caller", [*caller_playbook("invoke_agent", INVOKE_SYNC), {"reply": "plain"}])
    sid = http.post("/v1/sessions", json={"agent": "caller", "prompt": "go"}).json()["session_id"]
    (review,) = pending(http)
    assert decide(http, review["id"], "allow_once").status_code == 200
    settled(http, sid)
    original = paged(http, sid)
    assert [m["role"] for m in original] == ["user", "assistant", "tool", "assistant"]

    def invocations() -> int:
        return int(http.get("/v1/sessions", params={"agent": "target"}).json()["count"])

    assert invocations() == 1
    again = started(fork(http, sid, after_message_id=original[0]["id"]))
    (fresh,) = pending(http)
    assert fresh["session_id"] == again["session_id"] and fresh["id"] != review["id"]
    assert decide(http, fresh["id"], "allow_once").status_code == 200
    settled(http, again["session_id"])
    assert invocations() == 2

    later = started(fork(http, sid, after_message_id=original[-1]["id"], prompt="thanks"))
    settled(http, later["session_id"])
    forked = paged(http, later["session_id"])
    assert ids(forked[:4]) == ids(original[:4])
    assert [(m["role"], m["text"]) for m in forked[4:]] == [
        ("user", "thanks"),
        ("assistant", "plain"),
    ]
    assert invocations() == 2
    with session_scope(stack.engine) as s:
        tools = s.exec(
            select(func.count())
            .select_from(MessageRow)
            .where(MessageRow.session_id == later["session_id"], MessageRow.role == "tool")
        ).one()
    assert tools == 0
    assert paged(http, sid) == original


async def test_a_fork_of_ten_thousand_messages_copies_no_row(
    stack: Stack, temporal_env: WorkflowEnvironment
) -> None:
    """Forking after the 10,000th message writes the fork's own messages only (the row count
    grows by its turn's two), its pages reach the prefix by reference, and the model's
    context is the window's newest messages across the fork point."""
    http = stack.http
    agent(http, "echo", ECHO)
    sid = f"session-{uuid.uuid4()}"
    with session_scope(stack.engine) as s:
        session_store.create_session(
            s,
            session_id=sid,
            agent_slug="echo",
            agent_version=1,
            provenance=Provenance(),
            name="long",
        )
        s.add_all(
            MessageRow(
                id=f"{sid}:m{i}",
                session_id=sid,
                position=position(i // 2 + 1, i % 2, i % 2),
                role="user" if i % 2 == 0 else "assistant",
                agent_slug="echo",
                text=f"m{i}",
            )
            for i in range(10_000)
        )
        s.get(SessionRow, sid).status = "idle"  # type: ignore[union-attr]

    def rows() -> int:
        with session_scope(stack.engine) as s:
            return int(s.exec(select(func.count()).select_from(MessageRow)).one())

    before = rows()
    body = started(fork(http, sid, after_message_id=f"{sid}:m9999", prompt="last?", sync=True))
    assert rows() == before + 2
    fid = body["session_id"]
    assert http.get(f"/v1/sessions/{fid}").json()["message_count"] == 10_002
    page = http.get(
        f"/v1/sessions/{fid}/transcript", params={"limit": 3, "cursor": f"{sid}:m9998"}
    ).json()
    assert [m["text"] for m in page["messages"]] == ["m9999", "last?", body["response"]]
    assert page["next_cursor"] is None
    with session_scope(stack.engine) as s:
        window = session_store.history(s, session_id=fid, last=4)
    assert [m.text for m in window] == ["m9998", "m9999", "last?", body["response"]]


def test_bad_fork_requests_are_problems_with_codes(stack: Stack) -> None:
    """Unknown message, another session's message, an unknown agent or revision, nothing to
    run, an unknown session: each a 4xx problem+json with its code; nothing is started."""
    http = stack.http
    agent(http, "echo", ECHO)
    sid = converse(http, "echo", ["one"])
    other = converse(http, "echo", ["other"])
    last = paged(http, sid)[-1]["id"]
    assert_problem(fork(http, sid, after_message_id="nope"), 422, "unknown_message")
    assert_problem(
        fork(http, sid, after_message_id=paged(http, other)[0]["id"]),
        422,
        "message_of_another_session",
    )
    assert_problem(
        fork(http, sid, after_message_id=last, agent="ghost", prompt="x"),
        422,
        "fork_of_other_agent",
    )
    assert_problem(
        fork(http, sid, after_message_id=last, agent="echo@9", prompt="x"),
        404,
        "revision_not_found",
    )
    assert_problem(fork(http, sid, after_message_id=last), 422, "fork_needs_prompt")
    assert_problem(fork(http, sid, after_message_id=last, prompt="  "), 422, "validation_error")
    missing = f"session-{uuid.uuid4()}"
    assert_problem(fork(http, missing, after_message_id=last, prompt="x"), 404, "session_not_found")
    assert http.get("/v1/sessions").json()["count"] == 2


def test_a_keyed_fork_retried_starts_one_session(stack: Stack) -> None:
    """The same Idempotency-Key sent twice answers the same fork."""
    http = stack.http
    agent(http, "echo", ECHO)
    sid = converse(http, "echo", ["one"])
    last = paged(http, sid)[-1]["id"]
    key = {"Idempotency-Key": str(uuid.uuid4())}
    body = {"after_message_id": last, "prompt": "again", "sync": True}
    first = http.post(f"/v1/sessions/{sid}/fork", json=body, headers=key)
    second = http.post(f"/v1/sessions/{sid}/fork", json=body, headers=key)
    assert first.status_code == second.status_code == 201
    assert first.json()["session_id"] == second.json()["session_id"]
    assert http.get("/v1/sessions").json()["count"] == 2


def test_baton_fork_prints_the_lineage_and_trace_shows_it(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``baton fork SESSION --after MSG --prompt TEXT`` starts the fork and streams its reply;
    ``baton trace`` of the fork names the original."""
    http = stack.http
    agent(http, "echo", ECHO)
    sid = converse(http, "echo", ["one"])
    last = paged(http, sid)[-1]["id"]
    monkeypatch.setenv("BATON_API_URL", stack.url)
    out = CliRunner().invoke(cli_app, ["fork", sid, "--after", last, "--prompt", "cli turn"])
    assert out.exit_code == 0, out.output
    assert f"forked from {sid}" in " ".join(out.output.split())
    fid = next(
        s["session_id"] for s in http.get("/v1/sessions").json()["data"] if s["session_id"] != sid
    )
    assert [m["text"] for m in paged(http, fid)][-2] == "cli turn"
    traced = CliRunner().invoke(cli_app, ["trace", fid])
    assert traced.exit_code == 0, traced.output
    assert f"forked from {sid}" in " ".join(traced.output.split())


def test_baton_fork_runs_another_revision_or_the_draft_in_the_sandbox(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``baton fork … --agent echo@2`` runs revision 2 from the fork point; ``--agent
    echo@draft`` is refused ``draft_outside_sandbox`` without ``--sandbox`` and runs the
    draft with it, the fork marked sandbox."""
    http = stack.http
    agent(http, "echo", ECHO)
    sid = converse(http, "echo", ["one"])
    last = paged(http, sid)[-1]["id"]
    assert http.put("/v1/agents/echo/draft", json={"playbook": [{"reply": "v2"}]}).is_success
    assert http.post("/v1/agents/echo/publish").status_code == 201
    draft = {"playbook": [{"reply": "draft says"}]}
    assert http.put("/v1/agents/echo/draft", json=draft).is_success
    monkeypatch.setenv("BATON_API_URL", stack.url)
    base = ["fork", sid, "--after", last, "--prompt", "again"]

    def forked(out: Any) -> dict[str, Any]:
        assert out.exit_code == 0, out.output
        fid = re.search(r"session-[0-9a-f-]{36}", out.output)
        assert fid is not None and fid[0] != sid, out.output
        body: dict[str, Any] = http.get(f"/v1/sessions/{fid[0]}").json()
        return body

    revision = forked(CliRunner().invoke(cli_app, [*base, "--agent", "echo@2"]))
    assert (revision["version"], revision["sandbox"]) == (2, False)
    assert paged(http, revision["session_id"])[-1]["text"] == "v2"

    refused = CliRunner().invoke(cli_app, [*base, "--agent", "echo@draft"])
    assert refused.exit_code != 0 and "draft_outside_sandbox" in refused.output

    sandboxed = forked(CliRunner().invoke(cli_app, [*base, "--agent", "echo@draft", "--sandbox"]))
    assert (sandboxed["version"], sandboxed["sandbox"]) == (0, True)
    assert paged(http, sandboxed["session_id"])[-1]["text"] == "draft says"
    assert paged(http, sid)[-1]["id"] == last  # the original is never touched


@pytest.fixture
def auth_stack(temporal_env: WorkflowEnvironment, tmp_path: Path) -> Iterator[tuple[Users, Stack]]:
    """API + worker in auth mode, with users alice…dave."""
    tokens: dict[str, str] = {}

    def prepare(engine: Any) -> None:
        tokens.update({u: add_user(engine, u) for u in USERS})

    with running_stack(temporal_env, tmp_path / "fork-auth.db", prepare, auth="on") as st:
        users = Users(st.url, tokens)
        try:
            yield users, st
        finally:
            users.close()


def test_forking_needs_read_on_the_session_and_the_right_to_run_the_agent(
    auth_stack: tuple[Users, Stack],
) -> None:
    """A user with no role on the session's agent cannot fork it (403); a viewer may read it
    but not run the agent (403); a user of the agent may fork, but only its owner may run
    the draft in the sandbox."""
    users, st = auth_stack
    bob, alice, carol = users["bob"], users["alice"], users["carol"]
    create_agent(bob, "helper", [{"reply": "helped"}])
    sid = converse(bob, "helper", ["hi"])
    last = paged(bob, sid)[-1]["id"]
    body = {"after_message_id": last, "prompt": "more", "sync": True}
    assert_problem(carol.post(f"/v1/sessions/{sid}/fork", json=body), 403, "forbidden")
    grant(st.engine, "helper", "carol", "viewer")
    assert_problem(carol.post(f"/v1/sessions/{sid}/fork", json=body), 403, "forbidden")
    grant(st.engine, "helper", "alice", "user")
    done = started(alice.post(f"/v1/sessions/{sid}/fork", json=body))
    assert alice.get(f"/v1/sessions/{done['session_id']}").json()["created_by_user"] == "alice"
    sandbox = body | {"agent": "helper@draft", "sandbox": True}
    assert_problem(alice.post(f"/v1/sessions/{sid}/fork", json=sandbox), 403, "forbidden")
    assert started(bob.post(f"/v1/sessions/{sid}/fork", json=sandbox))["sandbox"] is True


def test_no_other_agent_continues_a_sandbox_session(stack: Stack) -> None:
    """``invoke_agent`` with a sandbox session's id is refused (its draft is reached by its
    author only); the sandbox session takes no message from it."""
    http = stack.http
    agent(http, "echo", ECHO)
    sid = converse(http, "echo", ["one"])
    body = {"after_message_id": paged(http, sid)[0]["id"], "agent": "echo@draft", "sandbox": True}
    sandbox = started(fork(http, sid, **body, sync=True))["session_id"]
    call = {"slug": "echo", "session_id": sandbox, "prompt": "hello draft", "sync": True}
    agent(http, "caller", caller_playbook("invoke_agent", call))
    caller = http.post("/v1/sessions", json={"agent": "caller", "prompt": "go"}).json()
    (review,) = pending(http)
    assert decide(http, review["id"], "allow_once").status_code == 200
    settled(http, caller["session_id"])
    assert "sandbox session" in paged(http, caller["session_id"])[-1]["text"]
    assert [m["text"] for m in paged(http, sandbox) if m["role"] == "user"] == ["one"]


def test_a_fork_of_a_fork_reads_through_both_prefixes(stack: Stack) -> None:
    """Forking a fork after its own message holds the original's stretch and the first
    fork's; forking it after a message of its prefix holds the original's only."""
    http = stack.http
    agent(http, "echo", ECHO)
    sid = converse(http, "echo", ["one", "two"])
    original = paged(http, sid)
    first = started(fork(http, sid, after_message_id=original[1]["id"], prompt="a", sync=True))
    one = paged(http, first["session_id"])
    assert len(one) == 4
    second = started(
        fork(http, first["session_id"], after_message_id=one[3]["id"], prompt="b", sync=True)
    )
    two = paged(http, second["session_id"], limit=1)
    assert ids(two[:4]) == ids(one) and [m["text"] for m in two[4:5]] == ["b"]
    assert len(two) == 6
    third = started(fork(http, first["session_id"], after_message_id=original[0]["id"], sync=True))
    three = paged(http, third["session_id"])
    assert ids(three[:1]) == ids(original[:1]) and [m["role"] for m in three[1:]] == ["assistant"]
    assert paged(http, first["session_id"]) == one


def test_a_fork_prefix_pages_and_windows_on_both_databases(engine: Any) -> None:
    """On SQLite and PostgreSQL a fork's pages and its model window run across the fork
    point in order, and a cursor outside its transcript is refused."""

    def add(s: Any, sid: str, i: int, turn: int) -> None:
        session_store.add_message(
            s,
            message_id=f"{sid}:m{i}",
            session_id=sid,
            position=position(turn, i % 2, i % 2),
            role="user" if i % 2 == 0 else "assistant",
            agent_slug="a",
            text=f"{sid[-4:]}-{i}",
        )

    original, forked = f"session-{uuid.uuid4()}", f"session-{uuid.uuid4()}"
    with session_scope(engine) as s:
        for sid in (original, forked):
            session_store.create_session(
                s, session_id=sid, agent_slug="a", agent_version=1, provenance=Provenance(), name=""
            )
        for i in range(6):
            add(s, original, i, i // 2 + 1)
        point = session_store.get_message(s, message_id=f"{original}:m3")
        assert point is not None
        row = session_store.get_session(s, session_id=forked)
        row.fork_prefix = [[original, point.position, point.id]]
        for i in range(4, 8):  # the fork's own turns: 3 and 4
            add(s, forked, i, i // 2 + 1)
    with session_scope(engine) as s:
        texts: list[str] = []
        cursor = None
        while True:
            page = session_store.transcript(s, session_id=forked, limit=3, cursor=cursor)
            texts += [m.text for m in page.messages]
            if (cursor := page.next_cursor) is None:
                break
        wide = [m.text for m in session_store.history(s, session_id=forked, last=6)]
        narrow = [m.text for m in session_store.history(s, session_id=forked, last=5)]
        with pytest.raises(session_store.InvalidCursor):
            session_store.transcript(s, session_id=forked, limit=3, cursor=f"{original}:m4")
    o, f = original[-4:], forked[-4:]
    assert texts == [f"{o}-0", f"{o}-1", f"{o}-2", f"{o}-3", f"{f}-4", f"{f}-5", f"{f}-6", f"{f}-7"]
    assert wide == [f"{o}-2", f"{o}-3", f"{f}-4", f"{f}-5", f"{f}-6", f"{f}-7"]
    assert narrow == [f"{f}-4", f"{f}-5", f"{f}-6", f"{f}-7"]  # from its first user message


def test_budget_and_balance_apply_to_the_fork_as_its_own_run(stack: Stack) -> None:
    """A revision whose token_budget is below what the original's run spent still answers in
    a fork (the prefix's usage stays the original's); with the balance spent the fork's turn
    is refused and recorded in the fork, the original untouched."""
    http = stack.http
    agent(http, "echo", ECHO)
    sid = converse(http, "echo", ["one", "two", "three"])
    original = paged(http, sid)
    spent = http.get(f"/v1/sessions/{sid}").json()
    run = spent["input_tokens"] + spent["output_tokens"]
    budget = {"playbook": ECHO, "limits": {"token_budget": run - 1}}
    assert http.put("/v1/agents/echo/draft", json=budget).status_code == 200
    assert http.post("/v1/agents/echo/publish").status_code == 201
    body = started(
        fork(http, sid, after_message_id=original[-1]["id"], agent="echo@2", prompt="x", sync=True)
    )
    own = http.get(f"/v1/sessions/{body['session_id']}").json()
    assert 0 < own["input_tokens"] + own["output_tokens"] < run
    assert http.put("/v1/balance", json={"balance": 0}).status_code == 200
    try:
        broke = started(fork(http, sid, after_message_id=original[-1]["id"], prompt="y"))
        settled(http, broke["session_id"])
    finally:
        assert http.put("/v1/balance", json={"balance": None}).status_code == 200
    last = paged(http, broke["session_id"])[-1]
    assert last["role"] == "error" and "balance_exhausted" in last["text"]
    assert paged(http, sid) == original
