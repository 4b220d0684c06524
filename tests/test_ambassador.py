"""The ambassador (AgentX Agent Teams 'Ambassador'): inquiries beside a session, its
read-only tool belt, the step cap, drafts sent by a person, and the no-pollution invariant."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select
from temporalio.testing import WorkflowEnvironment

from activities.inquiry import InquiryActivities
from baton.contracts.activity_io import InquiryToolInput
from baton.contracts.values import ToolCall
from baton.contracts.workflow_io import InquiryInput
from baton.grants import auth
from baton.permissions import gate
from baton.runs import inquiries, session_store
from baton.settings import Settings
from baton.storage.db import (
    ChannelMemory,
    EventRow,
    InquiryRow,
    InquiryStepRow,
    MessageRow,
    UsageRow,
    make_engine,
    session_scope,
)
from tests.conftest import migrated, serve
from tests.helpers import publish
from tests.test_api_agents import assert_problem
from tests.test_api_teams import live_team
from tests.test_resolver import Catalog
from tests.voice_stub import TRANSCRIPT, VoiceStub
from worker.stack import ServicesThread, free_port

#: Seconds the live stack's inquiries may take (the slow ambassador takes 10 s).
INQUIRY_TIMEOUT = 4.0
#: The step cap the live stack runs with (the edge tests use it).
MAX_STEPS = 4

#: A scripted ambassador: summarise, look into turn 1, draft, then answer.
BRIEFER_PLAYBOOK: list[dict[str, Any]] = [
    {
        "when": "^summarize_conversation: ",
        "reply": "Looking closer.",
        "tool_calls": [{"tool": "explore_conversation", "args": {"turn": 1}}],
    },
    {
        "when": "^explore_conversation: ",
        "reply": "Drafting.",
        "tool_calls": [{"tool": "draft_message", "args": {"text": "Please cite the checker."}}],
    },
    {
        "when": "^draft_message: ",
        "reply": "Your lead asked checker and writer; both finished. I drafted a follow-up.",
    },
    {
        "when": "decide",
        "reply": "Let me see.",
        "tool_calls": [{"tool": "summarize_conversation", "args": {}}],
    },
]


@pytest.fixture(scope="module")
def voice_stub() -> Iterator[tuple[VoiceStub, str]]:
    """The voice stub under uvicorn on loopback, and its base URL."""
    stub = VoiceStub()
    server, thread, base = serve(stub.app)
    try:
        yield stub, f"{base}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def stack(
    temporal_env: WorkflowEnvironment,
    tmp_path_factory: pytest.TempPathFactory,
    voice_stub: tuple[VoiceStub, str],
) -> Iterator[tuple[httpx.Client, Engine]]:
    """One real API + worker + dev server + SQLite file for the module, with the default
    ambassador ``briefer``, a step cap of :data:`MAX_STEPS` and voice on the stub."""
    db = tmp_path_factory.mktemp("amb") / "amb.db"
    settings = Settings(
        database_url=migrated(f"sqlite:///{db}"),
        temporal_address=temporal_env.client.service_client.config.target_host,
        task_queue=f"tq-{uuid.uuid4()}",
        default_ambassador="briefer",
        inquiry_max_steps=MAX_STEPS,
        voice_base_url=voice_stub[1],
        inquiry_timeout=INQUIRY_TIMEOUT,
    )
    services = ServicesThread(settings, api_port=free_port())
    services.start()
    engine = make_engine(settings.database_url)
    try:
        with httpx.Client(base_url=services.api_url, timeout=60) as client:
            live_team(client)
            for slug, spec in (
                (
                    "slow",
                    {
                        "kind": "ambassador",
                        "playbook": [
                            {
                                "reply": "one two three four five six seven eight nine ten",
                                "chunk_delay_ms": 1000,
                            }
                        ],
                    },
                ),
                ("briefer", {"kind": "ambassador", "playbook": BRIEFER_PLAYBOOK}),
                (
                    "looper",
                    {
                        "kind": "ambassador",
                        "playbook": [
                            {
                                "reply": "again",
                                "tool_calls": [{"tool": "list_conversations", "args": {}}],
                            }
                        ],
                    },
                ),
                (
                    "quick",
                    {
                        "kind": "ambassador",
                        "playbook": [
                            {"when": "^list_conversations: ", "reply": "ok"},
                            {
                                "reply": "listing",
                                "tool_calls": [{"tool": "list_conversations", "args": {}}],
                            },
                        ],
                    },
                ),
            ):
                body = {"slug": slug, "name": slug, "spec": spec}
                assert client.post("/v1/agents", json=body).status_code == 201
                assert client.post(f"/v1/agents/{slug}/publish").status_code == 201
            yield client, engine
    finally:
        engine.dispose()
        services.stop()


def _team_run(api: httpx.Client) -> str:
    resp = api.post("/v1/sessions", json={"team": "desk", "prompt": "go", "sync": True})
    assert resp.status_code == 201, resp.text
    return str(resp.json()["session_id"])


def _footprint(engine: Engine, root: str) -> dict[str, Any]:
    """Everything of a run's sessions an inquiry must never touch: messages, events,
    usage and the team's shared channel."""
    with Session(engine) as s:
        ids = [root, *[r for r in _children(s, root)]]
        return {
            "messages": s.exec(
                select(MessageRow.id, MessageRow.text).where(col(MessageRow.session_id).in_(ids))
            ).all(),
            "events": s.exec(
                select(EventRow.id, EventRow.type).where(col(EventRow.session_id).in_(ids))
            ).all(),
            "usage": s.exec(
                select(UsageRow.message_id, UsageRow.input_tokens).where(
                    col(UsageRow.session_id).in_(ids)
                )
            ).all(),
            "channel": s.exec(select(ChannelMemory.id, ChannelMemory.agent_slug)).all(),
        }


def _children(s: Session, root: str) -> list[str]:
    from baton.runs import run_tree

    return run_tree.run_sessions(s, root_session_id=root)


def test_ambassador_briefs_on_a_team_run_without_entering_it(
    stack: tuple[httpx.Client, Engine],
) -> None:
    """An inquiry about a finished team run answers from the belt in the second person,
    names the agents, keeps a draft; the run's messages, events, usage and shared channel
    are unchanged and its usage is metered to the inquiry and the ambassador."""
    api, engine = stack
    sid = _team_run(api)
    before = _footprint(engine, sid)

    resp = api.post(f"/v1/sessions/{sid}/inquiries", json={"question": "What did they decide?"})
    assert resp.status_code == 201, resp.text
    body = resp.json()
    assert body["status"] == "answered" and body["ambassador"] == "briefer"
    assert body["answer"].startswith("Your lead asked checker and writer")
    assert body["draft"] == "Please cite the checker." and body["steps"] == 4

    assert _footprint(engine, sid) == before
    with Session(engine) as s:
        steps = s.exec(select(UsageRow).where(UsageRow.session_id == body["id"])).all()
        tool_texts = [
            t.text
            for t in s.exec(
                select(InquiryStepRow).where(
                    InquiryStepRow.inquiry_id == body["id"],
                    InquiryStepRow.role == "tool",
                )
            ).all()
        ]
    assert len(steps) == 4 and {u.agent_slug for u in steps} == {"briefer"}
    # The belt really read the run: the summary names the delegations, the turn its tools.
    assert "lead delegated to checker" in tool_texts[0] and "CHECKED" in tool_texts[0]
    assert "tool delegate_to" in tool_texts[1]
    assert "delegation (delegate_to) lead → checker: task 'check the claim'" in tool_texts[1]

    thread = api.get(f"/v1/sessions/{sid}/inquiries").json()
    assert thread["count"] == 1 and thread["data"][0]["id"] == body["id"]


def test_a_draft_is_sent_by_the_person_as_a_user_turn_once(
    stack: tuple[httpx.Client, Engine],
) -> None:
    """from_draft sends the draft's text as the caller's user message; a second send is
    409 draft_already_sent; another session's inquiry is 404 inquiry_not_found."""
    api, _ = stack
    sid = _team_run(api)
    inquiry = api.post(f"/v1/sessions/{sid}/inquiries", json={"question": "decide?"}).json()
    assert inquiry["draft"]

    sent = api.post(
        f"/v1/sessions/{sid}/messages", json={"from_draft": inquiry["id"], "sync": True}
    )
    assert sent.status_code == 200, sent.text
    msgs = api.get(f"/v1/sessions/{sid}/transcript").json()["messages"]
    users = [m["text"] for m in msgs if m["role"] == "user"]
    assert users == ["go", "Please cite the checker."]
    assert api.get(f"/v1/sessions/{sid}/inquiries").json()["data"][0]["sent_message_id"]

    again = api.post(f"/v1/sessions/{sid}/messages", json={"from_draft": inquiry["id"]})
    assert_problem(again, 409, "draft_already_sent")
    other = _team_run(api)
    elsewhere = api.post(f"/v1/sessions/{other}/messages", json={"from_draft": inquiry["id"]})
    assert_problem(elsewhere, 404, "inquiry_not_found")
    both = api.post(
        f"/v1/sessions/{other}/messages", json={"from_draft": inquiry["id"], "prompt": "hi"}
    )
    assert both.status_code == 422


def test_step_cap_ends_the_loop_at_the_bound(stack: tuple[httpx.Client, Engine]) -> None:
    """An ambassador answering before the cap is not cut (the briefer answers on exactly
    the last allowed step, above); one that keeps calling tools stops after exactly the
    step cap, and says so."""
    api, _ = stack
    sid = _team_run(api)
    quick = api.post(
        f"/v1/sessions/{sid}/inquiries", json={"question": "x", "ambassador": "quick"}
    ).json()
    assert quick["status"] == "answered" and quick["steps"] == 2 and quick["answer"] == "ok"
    looped = api.post(
        f"/v1/sessions/{sid}/inquiries", json={"question": "x", "ambassador": "looper"}
    ).json()
    assert looped["status"] == "answered" and looped["steps"] == MAX_STEPS
    assert f"stopped after {MAX_STEPS} steps" in looped["answer"]
    # Both are in the thread, in order, after nothing else of this session.
    thread = api.get(f"/v1/sessions/{sid}/inquiries").json()["data"]
    assert [t["ambassador"] for t in thread] == ["quick", "looper"]


def test_inquiry_refusals(stack: tuple[httpx.Client, Engine]) -> None:
    """An agent of kind agent is 422 not_an_ambassador; an unknown session 404; a blank
    question 422; an ambassador cannot be a team member (422 invalid_team) nor a session's
    agent (422 not_invocable)."""
    api, _ = stack
    sid = _team_run(api)
    wrong = api.post(f"/v1/sessions/{sid}/inquiries", json={"question": "x", "ambassador": "lead"})
    assert_problem(wrong, 422, "not_an_ambassador")
    missing = api.post(f"/v1/sessions/session-{uuid.uuid4()}/inquiries", json={"question": "x"})
    assert missing.status_code == 404
    assert api.post(f"/v1/sessions/{sid}/inquiries", json={"question": "  "}).status_code == 422
    team = {
        "id": "with-amb",
        "name": "x",
        "supervisor_agent_id": "lead",
        "members": [
            {"agent_id": "lead", "role": "supervisor"},
            {"agent_id": "briefer", "role": "specialist"},
        ],
    }
    assert_problem(api.post("/v1/teams", json=team), 422, "invalid_team")
    launch = api.post("/v1/sessions", json={"agent": "briefer", "prompt": "hi"})
    assert_problem(launch, 422, "not_invocable")


def test_no_ambassador_named_nor_default_is_a_clear_422(live_api: httpx.Client) -> None:
    """With no ambassador named and BATON_DEFAULT_AMBASSADOR unset: 422 no_ambassador
    (before any workflow starts: the thread stays empty)."""
    body = {"slug": "a", "name": "a", "spec": {"playbook": [{"reply": "hi"}]}}
    assert live_api.post("/v1/agents", json=body).status_code == 201
    assert live_api.post("/v1/agents/a/publish").status_code == 201
    sid = live_api.post("/v1/sessions", json={"agent": "a", "prompt": "x", "sync": True}).json()[
        "session_id"
    ]
    resp = live_api.post(f"/v1/sessions/{sid}/inquiries", json={"question": "x"})
    assert_problem(resp, 422, "no_ambassador")
    assert live_api.get(f"/v1/sessions/{sid}/inquiries").json()["count"] == 0
    # Voice is off without a provider: both voice routes say so.
    spoken = live_api.post(
        f"/v1/sessions/{sid}/inquiries/voice", files={"audio": ("q.webm", b"xx", "audio/webm")}
    )
    assert_problem(spoken, 404, "voice_off")
    speech = live_api.get(f"/v1/sessions/{sid}/inquiries/inquiry-{uuid.uuid4()}/speech")
    assert_problem(speech, 404, "voice_off")


def test_every_path_that_runs_an_ambassador_is_refused(engine: Engine) -> None:
    """The one permission decision refuses invoke, delegate_to, route, mention and task to
    an ambassador with not_invocable; reading it stays possible."""
    publish(engine, "amb", kind="ambassador", delegation={"available_for_delegation": True})
    publish(engine, "caller")
    with session_scope(engine) as s:
        for via in ("invoke", "delegate_to", "route", "mention", "task"):
            req = gate.Request(
                caller="caller", operation="invoke", target="amb", user="u", auth=False, via=via
            )
            got = gate.decide(s, req)
            assert (got.verdict, got.code) == ("refuse", "not_invocable"), via
        read = gate.Request(caller="caller", operation="read", target="amb", user="u", auth=False)
        assert gate.decide(s, read).code != "not_invocable"


def test_kind_is_inherited_and_the_most_derived_wins() -> None:
    """kind: unset inherits the base's; a derived value wins; default agent."""
    cat = Catalog()
    cat.add("base", kind="ambassador")
    cat.add("child", extends="base")
    cat.add("plain", extends="base", kind="agent")
    cat.add("none")
    assert cat.resolve("child").kind == "ambassador"
    assert cat.resolve("plain").kind == "agent"
    assert cat.resolve("none").kind == "agent"


def test_belt_reads_only_what_the_asker_may_read(engine: Engine) -> None:
    """In auth mode a belt tool on a session whose agent the asker cannot view returns an
    access error to the ambassador (forbidden), and works once the asker is a viewer."""
    publish(engine, "secret", playbook=[{"reply": "hidden"}])
    with session_scope(engine) as s:
        auth.create_user(s, user_id="ann")
        row = session_store.create_session(
            s,
            session_id=f"session-{uuid.uuid4()}",
            agent_slug="secret",
            agent_version=1,
            provenance=_provenance(),
            name="x",
        )
        inquiries.create(
            s,
            inquiry_id=f"inquiry-{uuid.uuid4()}",
            session_id=row.id,
            user="ann",
            ambassador="briefer",
            version=1,
            question="?",
        )
        sid = row.id
        iid = s.exec(select(InquiryRow.id)).one()
    inp = InquiryInput(
        inquiry_id=iid, session_id=sid, user="ann", auth=True, ambassador_pin="b@1", question="?"
    )
    acts = InquiryActivities(engine)

    def call(n: int) -> Any:
        return acts.inquiry_tool(
            InquiryToolInput(
                inquiry=inp,
                message_id=f"{iid}:s{n}:tool:c",
                position=f"{n}",
                call=ToolCall(id="c", name="read_conversation", args={}),
            )
        )

    refused = call(1)
    assert not refused.ok and refused.preview.startswith("forbidden")
    with session_scope(engine) as s:
        auth.grant(s, agent="secret", user_id="ann", role="viewer")
    assert call(2).ok


def _provenance() -> Any:
    from baton.contracts.workflow_io import Provenance

    return Provenance(created_by_user="ann")


def test_a_failing_inquiry_is_stored_failed_and_the_session_is_untouched(
    stack: tuple[httpx.Client, Engine],
) -> None:
    """With the balance spent the ambassador's model call is refused (non-retryable): the
    inquiry answers 201 with status failed and the reason, at once, and the thread keeps it."""
    api, engine = stack
    sid = _team_run(api)
    before = _footprint(engine, sid)
    assert api.put("/v1/balance", json={"balance": 0}).status_code == 200
    try:
        resp = api.post(f"/v1/sessions/{sid}/inquiries", json={"question": "decide?"})
    finally:
        assert api.put("/v1/balance", json={"balance": None}).status_code == 200
    assert resp.status_code == 201, resp.text
    body = resp.json()
    assert body["status"] == "failed" and "balance_exhausted" in body["error"]
    assert body["answer"] is None and body["steps"] == 1
    assert _footprint(engine, sid) == before
    assert api.get(f"/v1/sessions/{sid}/inquiries").json()["data"][-1]["status"] == "failed"


def test_voice_a_spoken_question_is_answered_and_the_answer_spoken(
    stack: tuple[httpx.Client, Engine], voice_stub: tuple[VoiceStub, str]
) -> None:
    """With a voice provider, an uploaded question is transcribed (/audio/transcriptions)
    and answered through the same core (same belt, same thread); its answer is spoken as
    MP3 (/audio/speech); oversized audio is 413 audio_too_large before the provider."""
    api, _ = stack
    stub, _base = voice_stub
    sid = _team_run(api)
    resp = api.post(
        f"/v1/sessions/{sid}/inquiries/voice",
        files={"audio": ("q.webm", b"spoken-bytes", "audio/webm")},
    )
    assert resp.status_code == 201, resp.text
    body = resp.json()
    assert body["question"] == TRANSCRIPT and body["draft"] == "Please cite the checker."
    assert stub.requests[-1] == {
        "path": "transcriptions",
        "model": "whisper-1",
        "audio": b"spoken-bytes",
    }
    audio = api.get(f"/v1/sessions/{sid}/inquiries/{body['id']}/speech")
    assert audio.status_code == 200 and audio.headers["content-type"] == "audio/mpeg"
    assert audio.content == b"FAKEMP3:" + body["answer"].encode()
    assert stub.requests[-1]["model"] == "tts-1" and stub.requests[-1]["voice"] == "alloy"
    heard = len(stub.requests)
    from baton.providers.voice import MAX_AUDIO_BYTES

    ok = api.post(
        f"/v1/sessions/{sid}/inquiries/voice",
        files={"audio": ("q.webm", b"x" * MAX_AUDIO_BYTES, "audio/webm")},
    )
    assert ok.status_code == 201, ok.text
    big = api.post(
        f"/v1/sessions/{sid}/inquiries/voice",
        files={"audio": ("q.webm", b"x" * (MAX_AUDIO_BYTES + 1), "audio/webm")},
    )
    assert_problem(big, 413, "audio_too_large")
    assert len(stub.requests) == heard + 1  # only the one at the bound reached the provider


def test_an_inquiry_past_its_timeout_is_504_and_stored_failed(
    stack: tuple[httpx.Client, Engine],
) -> None:
    """An ambassador slower than BATON_INQUIRY_TIMEOUT: 504 inquiry_timeout, and the
    thread shows that inquiry failed (no row is left running)."""
    api, _ = stack
    sid = _team_run(api)
    resp = api.post(f"/v1/sessions/{sid}/inquiries", json={"question": "x", "ambassador": "slow"})
    assert_problem(resp, 504, "inquiry_timeout")
    (row,) = api.get(f"/v1/sessions/{sid}/inquiries").json()["data"]
    assert row["status"] == "failed" and "did not answer within 4 s" in row["error"]
