"""``Idempotency-Key`` on the HTTP API (docs/api.md, Idempotency): the same key and request
answer the first answer again, another request is 422, one still running is 409, keys are
per caller and kept for ``BATON_IDEMPOTENCY_TTL`` seconds."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from fastapi.routing import APIRoute
from sqlalchemy import func, select
from sqlalchemy.engine import Engine
from sqlmodel import select as sm_select
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from api.app import create_app
from api.idempotency import (
    HEADER,
    IdempotencyKeyInFlight,
    IdempotencyKeyReused,
    Stored,
    claim_key,
    fingerprint,
    store_answer,
)
from baton.contracts.workflow_io import StepInput
from baton.runs.launch import launch_step
from baton.settings import Settings
from baton.storage.db import (
    IdempotencyKeyRow,
    StepRow,
    init_db,
    make_engine,
    session_scope,
    utcnow,
)
from tests.conftest import serve
from tests.helpers import publish
from tests.test_api_reviews import (
    INVOKE_SYNC,
    Stack,
    agent,
    launch,
    pending,
    running_stack,
    settled,
    target,
)
from tests.test_auth import USERS, Users, add_user
from tests.xagent_helpers import caller_playbook
from worker.stack import free_port

AGENT = {"slug": "once", "name": "Once"}


def _key(value: str) -> dict[str, str]:
    return {HEADER: value}


def _agents(http: httpx.Client) -> list[str]:
    return [a["slug"] for a in http.get("/v1/agents").json()["data"]]


def test_the_same_key_and_body_answer_the_first_answer_again(api: httpx.Client) -> None:
    """A repeated POST with the same key and body is not run again: the same 201 and body,
    marked Idempotent-Replayed; JSON written with other spacing and key order is the same."""
    first = api.post("/v1/agents", json=AGENT, headers=_key("k-1"))
    assert first.status_code == 201, first.text
    assert "idempotent-replayed" not in first.headers
    again = api.post(
        "/v1/agents",
        content=b'{ "name": "Once",  "slug": "once" }',
        headers={**_key("k-1"), "content-type": "application/json"},
    )
    assert again.status_code == 201
    assert again.json() == first.json()
    assert again.headers["idempotent-replayed"] == "true"
    assert _agents(api) == ["once"]
    # Without the key the route runs: the slug is taken.
    assert api.post("/v1/agents", json=AGENT).json()["code"] == "agent_exists"


def test_the_same_key_with_another_request_is_422(api: httpx.Client) -> None:
    """The key of one request sent with another body, or to another route, is 422
    idempotency_key_reused, and nothing runs."""
    assert api.post("/v1/agents", json=AGENT, headers=_key("k-2")).status_code == 201
    other = api.post("/v1/agents", json={**AGENT, "slug": "twice"}, headers=_key("k-2"))
    assert other.status_code == 422 and other.json()["code"] == "idempotency_key_reused"
    elsewhere = api.post("/v1/agents/once/publish", headers=_key("k-2"))
    assert elsewhere.status_code == 422 and elsewhere.json()["code"] == "idempotency_key_reused"
    assert _agents(api) == ["once"]
    assert api.get("/v1/agents/once").json()["live_version"] is None


def test_a_key_is_1_to_255_visible_ascii_characters(api: httpx.Client) -> None:
    """255 characters are taken, 256 refused, as are an empty key and one with a space
    (422 invalid_idempotency_key)."""
    ok = api.post("/v1/agents", json=AGENT, headers=_key("k" * 255))
    assert ok.status_code == 201, ok.text
    for bad in ("k" * 256, "", "a b", "ключ"):
        resp = api.post(
            "/v1/agents", json={**AGENT, "slug": "other"}, headers={HEADER.encode(): bad.encode()}
        )
        assert resp.status_code == 422, bad
        assert resp.json()["code"] == "invalid_idempotency_key"
    assert _agents(api) == ["once"]


def test_a_conflict_is_not_kept_so_the_retry_runs_again(api: httpx.Client) -> None:
    """A 409 answers "not now", not the outcome: the same key later runs the request."""
    assert api.post("/v1/agents", json=AGENT).status_code == 201
    taken = api.post("/v1/agents", json=AGENT, headers=_key("k-3"))
    assert taken.status_code == 409 and taken.json()["code"] == "agent_exists"
    assert api.delete("/v1/agents/once").status_code == 204
    retried = api.post("/v1/agents", json=AGENT, headers=_key("k-3"))
    assert retried.status_code == 201 and "idempotent-replayed" not in retried.headers


def test_every_changing_post_takes_the_header_in_the_openapi_document(
    api: httpx.Client,
) -> None:
    """Every POST under /v1 documents Idempotency-Key and its 409 and 422, except the
    multipart voice inquiry (its form body is read before any dependency runs)."""
    document = api.get("/openapi.json").json()
    posts = {
        path: ops["post"]
        for path, ops in document["paths"].items()
        if path.startswith("/v1/") and "post" in ops
    }
    missing = [
        path
        for path, op in posts.items()
        if not any(p["name"] == HEADER and p["in"] == "header" for p in op.get("parameters", []))
    ]
    assert missing == ["/v1/sessions/{session_id}/inquiries/voice"]
    for path, op in posts.items():
        if path not in missing:
            assert "idempotency_key_in_flight" in op["responses"]["409"]["description"], path
            assert "idempotency_key_reused" in op["responses"]["422"]["description"], path
    assert len(posts) >= 14  # sessions, messages, cancel, steps, handoff, decisions, agents, …


def test_no_get_route_declares_the_header() -> None:
    """The header is for requests that change something: no GET, PUT or DELETE takes it."""
    app = create_app(Settings(database_url="sqlite://"))
    for route in app.routes:
        if isinstance(route, APIRoute) and "POST" not in (route.methods or set()):
            names = [p.alias for p in route.dependant.header_params] + [
                p.alias for d in route.dependant.dependencies for p in d.header_params
            ]
            assert HEADER not in names, route.path


# --- per caller (auth mode) ------------------------------------------------------------


@pytest.fixture
def auth_api(tmp_path: Path) -> Iterator[Users]:
    """The API alone in auth mode with users alice…dave."""
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'idem-auth.db'}",
        auth="on",
        temporal_address=f"127.0.0.1:{free_port()}",
    )
    engine = make_engine(settings.database_url)
    init_db(engine)
    tokens = {u: add_user(engine, u) for u in USERS}
    engine.dispose()
    server, thread, base = serve(create_app(settings))
    users = Users(base, tokens)
    try:
        yield users
    finally:
        users.close()
        server.should_exit = True
        thread.join(timeout=10)


def test_one_users_key_never_answers_another_user(auth_api: Users) -> None:
    """Alice's key and body sent by Bob run as Bob's request (409 agent_exists: the slug
    is Alice's), never replay Alice's 201; Alice's retry still replays hers."""
    alice, bob = auth_api["alice"], auth_api["bob"]
    first = alice.post("/v1/agents", json=AGENT, headers=_key("shared"))
    assert first.status_code == 201, first.text
    theirs = bob.post("/v1/agents", json=AGENT, headers=_key("shared"))
    assert theirs.status_code == 409 and theirs.json()["code"] == "agent_exists"
    assert "idempotent-replayed" not in theirs.headers
    mine = alice.post("/v1/agents", json=AGENT, headers=_key("shared"))
    assert mine.status_code == 201 and mine.headers["idempotent-replayed"] == "true"
    unknown = auth_api.anonymous.post("/v1/agents", json=AGENT, headers=_key("shared"))
    assert unknown.status_code == 401


# --- the table: lease and ttl at their edges -------------------------------------------


def _rows(engine: Engine) -> int:
    with session_scope(engine) as s:
        return int(s.execute(select(func.count()).select_from(IdempotencyKeyRow)).scalar_one())


def test_a_key_is_held_for_its_lease_and_kept_for_its_ttl(engine: Engine) -> None:
    """In flight: 409 until the lease lapses, taken over at it; answered: replayed until
    one second before the ttl, purged and claimed afresh at it. SQLite and PostgreSQL."""
    t0 = utcnow()
    lease, ttl = timedelta(seconds=15), timedelta(seconds=3600)
    fp = fingerprint("POST", "/v1/agents", b"{}")

    def claim(at: timedelta, fp: str = fp) -> Stored | None:
        return claim_key(
            engine, scope="local", key="k", fingerprint=fp, now=t0 + at, ttl=ttl, lease=lease
        )

    assert claim(timedelta()) is None
    with pytest.raises(IdempotencyKeyInFlight):
        claim(lease - timedelta(milliseconds=1))
    with pytest.raises(IdempotencyKeyReused):
        claim(timedelta(seconds=1), fingerprint("POST", "/v1/agents", b'{"a": 1}'))
    assert claim(lease) is None  # the holder stopped renewing: taken over
    with pytest.raises(IdempotencyKeyInFlight):
        claim(lease + timedelta(seconds=1))
    store_answer(
        engine, scope="local", key="k", status=201, media_type="application/json", body=b"{}"
    )
    assert claim(ttl - timedelta(seconds=1)) == Stored(201, "application/json", "{}")
    assert claim(ttl) is None  # purged at its ttl: a new request
    assert _rows(engine) == 1
    with pytest.raises(IdempotencyKeyInFlight):
        claim(ttl + timedelta(seconds=1))


# --- with the engine: sessions, messages -----------------------------------------------


def _publish(http: httpx.Client, slug: str, playbook: list[dict[str, object]]) -> None:
    created = http.post(
        "/v1/agents", json={"slug": slug, "name": slug, "spec": {"playbook": playbook}}
    )
    assert created.status_code == 201, created.text
    assert http.post(f"/v1/agents/{slug}/publish").status_code == 201


SLOW = [{"reply": " ".join(f"w{i}" for i in range(30)), "chunk_delay_ms": 60}]


def test_a_session_and_a_message_run_once_per_key(live_api: httpx.Client) -> None:
    """POST /v1/sessions with a key while the first (sync) request runs is 409
    idempotency_key_in_flight; after it, the same 201 again; one session. The same for a
    message: its retry replays the first answer and the transcript holds it once."""
    _publish(live_api, "slow", SLOW)
    body = {"agent": "slow", "prompt": "go", "sync": True}
    answers: list[httpx.Response] = []
    first = threading.Thread(
        target=lambda: answers.append(live_api.post("/v1/sessions", json=body, headers=_key("s")))
    )
    first.start()
    deadline = time.monotonic() + 60
    while live_api.get("/v1/sessions").json()["count"] == 0:
        assert time.monotonic() < deadline and first.is_alive(), "the first request never ran"
        time.sleep(0.02)
    busy = live_api.post("/v1/sessions", json=body, headers=_key("s"))
    first.join(timeout=120)
    assert busy.status_code == 409 and busy.json()["code"] == "idempotency_key_in_flight"
    (created,) = answers
    assert created.status_code == 201, created.text
    again = live_api.post("/v1/sessions", json=body, headers=_key("s"))
    assert (again.status_code, again.json()) == (201, created.json())
    assert live_api.get("/v1/sessions").json()["count"] == 1

    sid = created.json()["session_id"]
    message = {"prompt": "more", "sync": True}
    sent = live_api.post(f"/v1/sessions/{sid}/messages", json=message, headers=_key("m"))
    assert sent.status_code == 200, sent.text
    resent = live_api.post(f"/v1/sessions/{sid}/messages", json=message, headers=_key("m"))
    assert (resent.status_code, resent.json()) == (200, sent.json())
    assert resent.headers["idempotent-replayed"] == "true"
    other = live_api.post(
        f"/v1/sessions/{sid}/messages", json={"prompt": "else"}, headers=_key("m")
    )
    assert other.status_code == 422 and other.json()["code"] == "idempotency_key_reused"
    users = [
        m["text"]
        for m in live_api.get(f"/v1/sessions/{sid}/transcript").json()["messages"]
        if m["role"] == "user"
    ]
    assert users == ["go", "more"]


def test_a_step_runs_once_per_key(live_api: httpx.Client) -> None:
    """POST /v1/steps twice with one key: the same 202 and step id, one step stored; the
    step id is derived from the key, so another caller-side key gives another step."""
    _publish(live_api, "writer", [{"reply": "done"}])
    body = {"agent": "writer", "input": "write"}
    first = live_api.post("/v1/steps", json=body, headers=_key("step-1"))
    assert first.status_code == 202, first.text
    again = live_api.post("/v1/steps", json=body, headers=_key("step-1"))
    assert (again.status_code, again.json()) == (202, first.json())
    other = live_api.post("/v1/steps", json=body, headers=_key("step-2"))
    assert other.status_code == 202 and other.json()["step_id"] != first.json()["step_id"]
    assert live_api.get("/v1/steps").json()["count"] == 2


async def test_a_keyed_step_launched_again_attaches_to_the_first(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """launch_step twice with one keyed step id, as a retry taking over a killed replica's
    request does (the second after the first step finished): no error, one step row, one
    workflow run."""
    publish(db_engine, "writer", playbook=[{"reply": "done"}])
    inp = StepInput(step_id=f"step-{uuid.uuid4()}", agent_pin="writer", input="write")
    for _ in range(2):
        pinned = await launch_step(
            temporal_env.client,
            db_engine,
            task_queue=worker.task_queue,
            inp=inp,
            ref="writer",
            keyed=True,
        )
        assert pinned == ("writer", 1)
        await temporal_env.client.get_workflow_handle(inp.step_id).result()
    with session_scope(db_engine) as s:
        assert len(s.exec(sm_select(StepRow)).all()) == 1
    runs = [r async for r in temporal_env.client.list_workflows(f"WorkflowId = '{inp.step_id}'")]
    assert len(runs) == 1


@pytest.fixture
def review_stack(temporal_env: WorkflowEnvironment, tmp_path: Path) -> Iterator[Stack]:
    """API + worker with the default review timeout, as tests/test_api_reviews.py runs."""
    with running_stack(temporal_env, tmp_path / "reviews.db") as s:
        yield s


def test_a_decision_retried_with_its_key_replays_its_answer(review_stack: Stack) -> None:
    """A review decision sent again with its key answers its first 200 again (the settled
    review), not 409 review_already_decided; the same decision under another key is that
    409, as any later decision is."""
    http = review_stack.http
    target(http)
    agent(http, "caller", caller_playbook("invoke_agent", INVOKE_SYNC))
    sid = launch(http, "caller")
    (review,) = pending(http)
    path, decision = f"/v1/reviews/{review['id']}/decision", {"decision": "allow_once"}
    first = http.post(path, json=decision, headers=_key("d-1"))
    assert first.status_code == 200, first.text
    again = http.post(path, json=decision, headers=_key("d-1"))
    assert (again.status_code, again.json()) == (200, first.json())
    assert again.headers["idempotent-replayed"] == "true"
    later = http.post(path, json=decision, headers=_key("d-2"))
    assert later.status_code == 409 and later.json()["code"] == "review_already_decided"
    settled(http, sid)


def test_an_external_sessions_proxy_token_is_never_stored(
    live_api: httpx.Client, tmp_path: Path
) -> None:
    """The keyed answer creating an external session (its proxy token, shown once) is not
    kept: no key row holds it, and the key runs again (a new session, a new token)."""
    _publish(live_api, "outside", [])
    body = {"agent": "outside", "external": True}
    first = live_api.post("/v1/sessions", json=body, headers=_key("x-1"))
    assert first.status_code == 201, first.text
    engine = make_engine(f"sqlite:///{tmp_path / 'e2e.db'}")
    try:
        assert _rows(engine) == 0
    finally:
        engine.dispose()
    again = live_api.post("/v1/sessions", json=body, headers=_key("x-1"))
    assert again.status_code == 201 and "idempotent-replayed" not in again.headers
    assert again.json()["proxy_token"] != first.json()["proxy_token"]
