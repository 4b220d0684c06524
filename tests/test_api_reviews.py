"""Reviews, policies and audit over real HTTP: uvicorn + real worker + dev server + SQLite.

Gamut X-Agent Policies and docs/xagent.md, Reviews: ``GET /v1/reviews``,
``POST /v1/reviews/{id}/decision``,
``GET|PUT /v1/agents/{slug}/policies``, ``GET /v1/audit``, provenance of invoked sessions.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.engine import Engine
from sqlmodel import select
from temporalio.testing import WorkflowEnvironment

from baton.settings import Settings
from baton.storage.db import XAgentPolicy, init_db, make_engine, session_scope
from tests.helpers import READY_TIMEOUT_S
from tests.test_api_agents import assert_problem
from tests.xagent_helpers import caller_playbook
from worker.stack import ServicesThread, free_port

DEFAULT_POLICIES = {
    "global": {"list": "review", "read": "review", "invoke": "review"},
    "targets": {},
}
UNKNOWN_REVIEW = "review-00000000-0000-0000-0000-000000000000"
INVOKE_SYNC = {"slug": "target", "prompt": "hello target", "sync": True}


# --- a live stack (API + worker) per test, with its own settings ---------------------


@dataclass
class Stack:
    """A running API + worker, a client for it, and the SQLite engine behind it."""

    http: httpx.Client
    engine: Engine
    settings: Settings
    url: str

    def client(self, token: str | None = None) -> httpx.Client:
        """Another client for the same API, sending ``token`` as the bearer token."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, timeout=60, headers=headers)


@contextlib.contextmanager
def running_stack(
    temporal_env: WorkflowEnvironment,
    db_file: Path,
    prepare: Callable[[Engine], None] | None = None,
    **overrides: Any,
) -> Iterator[Stack]:
    """Start API + worker on ``db_file`` with ``overrides`` (e.g. auth, review_timeout)."""
    settings = Settings(
        database_url=f"sqlite:///{db_file}",
        temporal_address=temporal_env.client.service_client.config.target_host,
        task_queue=f"tq-{uuid.uuid4()}",
        **overrides,
    )
    engine = make_engine(settings.database_url)
    init_db(engine)
    if prepare is not None:
        prepare(engine)
    services = ServicesThread(settings, api_port=free_port())
    services.start()
    try:
        with httpx.Client(base_url=services.api_url, timeout=60) as http:
            yield Stack(http=http, engine=engine, settings=settings, url=services.api_url)
    finally:
        services.stop()
        engine.dispose()


@pytest.fixture
def stack(temporal_env: WorkflowEnvironment, tmp_path: Path) -> Iterator[Stack]:
    """API + worker with the default review timeout (300 s: no review times out here)."""
    with running_stack(temporal_env, tmp_path / "reviews.db") as s:
        yield s


# --- helpers -----------------------------------------------------------------------------


def agent(http: httpx.Client, slug: str, playbook: list[dict[str, Any]] | None = None) -> None:
    """Create and publish ``slug`` with a scripted ``playbook`` through the API."""
    spec = {"playbook": playbook or []}
    created = http.post("/v1/agents", json={"slug": slug, "name": slug.title(), "spec": spec})
    assert created.status_code == 201, created.text
    published = http.post(f"/v1/agents/{slug}/publish")
    assert published.status_code == 201, published.text


def target(http: httpx.Client, slug: str = "target") -> None:
    """A target agent that always answers ``<slug> says hi``."""
    agent(http, slug, [{"reply": f"{slug} says hi"}])


def launch(http: httpx.Client, slug: str, prompt: str = "go") -> str:
    """Start an async session of ``slug``; returns its id."""
    resp = http.post("/v1/sessions", json={"agent": slug, "prompt": prompt})
    assert resp.status_code == 201, resp.text
    sid: str = resp.json()["session_id"]
    return sid


def poll(predicate: Callable[[], Any], what: str, timeout: float = READY_TIMEOUT_S) -> Any:
    """Poll ``predicate()`` until it returns something truthy; returns that value. The
    default bound is far: the poll ends as soon as the predicate holds, and a second
    suite beside this one can make a turn take many times its usual seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def pending(http: httpx.Client, count: int = 1) -> list[dict[str, Any]]:
    """Wait until ``count`` reviews are pending; returns them (newest first)."""

    def check() -> list[dict[str, Any]] | None:
        body = http.get("/v1/reviews", params={"status": "pending"}).json()
        return body["data"] if body["count"] >= count else None

    found: list[dict[str, Any]] = poll(check, f"{count} pending review(s)")
    return found


def settled(http: httpx.Client, sid: str, status: str = "idle") -> dict[str, Any]:
    """Wait until session ``sid`` has ``status``; returns the session."""

    def check() -> dict[str, Any] | None:
        body: dict[str, Any] = http.get(f"/v1/sessions/{sid}").json()
        return body if body["status"] == status else None

    found: dict[str, Any] = poll(check, f"{sid} to be {status}")
    return found


def messages(http: httpx.Client, sid: str) -> list[dict[str, Any]]:
    """The session's transcript messages."""
    msgs: list[dict[str, Any]] = http.get(f"/v1/sessions/{sid}/transcript").json()["messages"]
    return msgs


def final_text(http: httpx.Client, sid: str) -> str:
    """Text of the session's last message."""
    text: str = messages(http, sid)[-1]["text"]
    return text


def result_of(http: httpx.Client, sid: str) -> Any:
    """The tool output a scripted caller echoed as ``RESULT <output>`` (parsed JSON)."""
    text = final_text(http, sid)
    assert text.startswith("RESULT "), text
    return json.loads(text.removeprefix("RESULT "))


def decide(http: httpx.Client, review_id: str, decision: str, **extra: Any) -> httpx.Response:
    """POST a decision."""
    return http.post(f"/v1/reviews/{review_id}/decision", json={"decision": decision, **extra})


def two_target_caller(http: httpx.Client) -> None:
    """``target``, ``target2`` and a ``caller`` invoking target on ``go1``, target2 on ``go2``."""
    target(http)
    target(http, "target2")
    rules: list[dict[str, Any]] = [{"when": "^invoke_agent: ", "reply": "RESULT {last_message}"}]
    for prompt, slug in (("go1", "target"), ("go2", "target2")):
        call: dict[str, Any] = {"slug": slug, "prompt": f"hello {slug}", "sync": True}
        rules.append(
            {
                "when": f"^{prompt}$",
                "reply": "Calling.",
                "tool_calls": [{"tool": "invoke_agent", "args": call}],
            }
        )
    agent(http, "caller", rules)


# --- the review flow over HTTP -------------------------------------------------------


def test_pending_review_is_listed_and_allow_once_finishes_the_session(stack: Stack) -> None:
    """A waiting invoke review is listed with every field; allow_once → 200, the reply arrives."""
    http = stack.http
    target(http)
    agent(http, "caller", caller_playbook("invoke_agent", INVOKE_SYNC))
    sid = launch(http, "caller")
    (review,) = pending(http)
    assert set(review) >= {
        "id",
        "session_id",
        "caller",
        "operation",
        "target",
        "preview",
        "status",
        "decided_by",
        "created_at",
    }
    assert review["id"].startswith("review-") and review["session_id"] == sid
    assert (review["caller"], review["operation"], review["target"]) == (
        "caller",
        "invoke",
        "target",
    )
    assert review["preview"] == "hello target"
    assert (review["status"], review["decided_by"], review["decision"]) == ("pending", None, None)
    assert http.get(f"/v1/sessions/{sid}").json()["status"] == "awaiting_input"
    assert http.get(f"/v1/reviews/{review['id']}").json() == review
    assert http.get("/v1/reviews", params={"status": "allowed"}).json()["count"] == 0

    resp = decide(http, review["id"], "allow_once")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert (body["status"], body["decision"], body["decided_by"]) == (
        "allowed",
        "allow_once",
        "local",
    )
    assert body["scope"] is None and body["decided_at"] is not None
    settled(http, sid)
    result = result_of(http, sid)
    assert (result["status"], result["response"]) == ("completed", "target says hi")
    # allow_once stores nothing: the policies are still the defaults
    assert http.get("/v1/agents/caller/policies").json() == DEFAULT_POLICIES
    assert http.get("/v1/reviews", params={"status": "pending"}).json()["count"] == 0
    assert http.get("/v1/reviews", params={"session_id": sid}).json()["count"] == 1

    again = decide(http, review["id"], "deny")
    assert_problem(again, 409, "review_already_decided")
    assert http.get(f"/v1/reviews/{review['id']}").json()["status"] == "allowed"


def test_invoked_session_shows_its_provenance(stack: Stack) -> None:
    """GET /v1/sessions/{target session} names the invoking agent, parent session and user."""
    http = stack.http
    target(http)
    agent(http, "caller", caller_playbook("invoke_agent", INVOKE_SYNC))
    sid = launch(http, "caller")
    (review,) = pending(http)
    assert decide(http, review["id"], "allow_once").status_code == 200
    settled(http, sid)
    invoked = result_of(http, sid)["session_id"]
    detail = http.get(f"/v1/sessions/{invoked}").json()
    assert detail["agent"] == "target"
    assert detail["invoked_by_agent"] == "caller"
    assert detail["parent_session_id"] == sid
    assert detail["name"] == "Invoked by caller"
    assert detail["created_by_user"] == "local"
    assert detail["depth"] == 1
    caller_detail = http.get(f"/v1/sessions/{sid}").json()
    assert caller_detail["invoked_by_agent"] is None and caller_detail["parent_session_id"] is None
    listed = http.get("/v1/sessions", params={"agent": "target"}).json()
    assert [s["session_id"] for s in listed["data"]] == [invoked]


def test_deny_returns_a_tool_error_to_the_caller(stack: Stack) -> None:
    """deny → 200 status denied; the caller's transcript holds the tool error, no target runs."""
    http = stack.http
    target(http)
    agent(http, "caller", caller_playbook("invoke_agent", INVOKE_SYNC))
    sid = launch(http, "caller")
    (review,) = pending(http)
    resp = decide(http, review["id"], "deny")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert (body["status"], body["decision"], body["decided_by"]) == ("denied", "deny", "local")
    settled(http, sid)
    tool = [m for m in messages(http, sid) if m["role"] == "tool"]
    assert len(tool) == 1 and tool[0]["tool_name"] == "invoke_agent"
    assert tool[0]["text"] == "the invoke 'target' operation was denied by local"
    # the model reads the refusal as a tool error
    assert result_of(http, sid) == {"error": "the invoke 'target' operation was denied by local"}
    assert http.get("/v1/sessions", params={"agent": "target"}).json()["count"] == 0
    assert_problem(decide(http, review["id"], "allow_once"), 409, "review_already_decided")


def test_malformed_and_unknown_decisions_change_nothing(stack: Stack) -> None:
    """Bad decision bodies are 422 problem+json, unknown ids 404; the review stays pending."""
    http = stack.http
    target(http)
    agent(http, "caller", caller_playbook("invoke_agent", INVOKE_SYNC))
    sid = launch(http, "caller")
    (review,) = pending(http)
    rid = review["id"]
    bodies: list[tuple[Any, str | None]] = [
        ({"decision": "maybe"}, "decision"),
        ({"decision": "deny", "extra": 1}, "extra"),
        ({"decision": "always_allow", "scope": "planet"}, "scope"),
        ({}, "decision"),
        ({"decision": None}, "decision"),
        (["deny"], None),
    ]
    for body, path in bodies:
        problem = assert_problem(
            http.post(f"/v1/reviews/{rid}/decision", json=body), 422, "validation_error"
        )
        if path is not None:
            assert problem["path"] == path, problem
    not_json = http.post(
        f"/v1/reviews/{rid}/decision",
        content=b"{decision",
        headers={"content-type": "application/json"},
    )
    assert_problem(not_json, 422, "validation_error")
    assert_problem(decide(http, UNKNOWN_REVIEW, "deny"), 404, "review_not_found")
    assert_problem(http.get(f"/v1/reviews/{UNKNOWN_REVIEW}"), 404, "review_not_found")
    assert_problem(decide(http, "review-nope", "deny"), 422, "validation_error")
    assert_problem(http.get("/v1/reviews", params={"status": "maybe"}), 422, "validation_error")
    for limit in (0, 201):
        assert_problem(http.get("/v1/reviews", params={"limit": limit}), 422, "validation_error")
    assert http.get("/v1/reviews", params={"limit": 200}).json()["count"] == 1
    assert http.get(f"/v1/reviews/{rid}").json()["status"] == "pending"
    assert http.get(f"/v1/sessions/{sid}").json()["status"] == "awaiting_input"
    assert decide(http, rid, "allow_once").status_code == 200
    settled(http, sid)


def test_create_agent_review_cannot_be_always_allowed(stack: Stack) -> None:
    """always_allow on a create_agent review is 422 invalid_decision; allow_once creates it."""
    http = stack.http
    agent(http, "maker", caller_playbook("create_agent", {"name": "Helper Bot"}))
    sid = launch(http, "maker")
    (review,) = pending(http)
    assert (review["operation"], review["target"]) == ("create", None)
    assert review["preview"] == "create agent 'Helper Bot'"
    for scope in ("target", "all", None):
        resp = decide(http, review["id"], "always_allow", scope=scope)
        assert_problem(resp, 422, "invalid_decision")
    assert http.get(f"/v1/reviews/{review['id']}").json()["status"] == "pending"
    assert_problem(http.get("/v1/agents/helper-bot"), 404, "agent_not_found")
    resp = decide(http, review["id"], "allow_once")
    assert resp.status_code == 200 and resp.json()["status"] == "allowed"
    settled(http, sid)
    assert result_of(http, sid) == {"slug": "helper-bot", "name": "Helper Bot", "version": 1}
    assert http.get("/v1/agents/helper-bot").json()["live_version"] == 1
    # create is never stored as a policy
    assert http.get("/v1/agents/maker/policies").json() == DEFAULT_POLICIES


def test_always_allow_target_saves_a_per_target_policy(stack: Stack) -> None:
    """always_allow scope target saves targets.target.invoke=allow; other targets keep reviewing."""
    http = stack.http
    two_target_caller(http)
    first = launch(http, "caller", "go1")
    pending(http, 1)
    second = launch(http, "caller", "go2")
    reviews = pending(http, 2)
    by_target = {r["target"]: r for r in reviews}
    resp = decide(http, by_target["target"]["id"], "always_allow", scope="target")
    assert resp.status_code == 200, resp.text
    assert (resp.json()["status"], resp.json()["scope"]) == ("allowed", "target")
    policies = http.get("/v1/agents/caller/policies").json()
    assert policies["targets"]["target"]["invoke"] == "allow"
    assert policies["targets"]["target"]["read"] == "review"
    assert policies["global"] == DEFAULT_POLICIES["global"]
    assert list(policies["targets"]) == ["target"]
    settled(http, first)
    assert result_of(http, first)["response"] == "target says hi"
    # the per-target policy does not cover target2: its review still waits
    time.sleep(0.5)
    still = http.get(f"/v1/reviews/{by_target['target2']['id']}").json()
    assert still["status"] == "pending"
    assert http.get(f"/v1/sessions/{second}").json()["status"] == "awaiting_input"
    # a new invoke of target now runs without any review
    third = launch(http, "caller", "go1")
    settled(http, third)
    assert result_of(http, third)["response"] == "target says hi"
    assert http.get("/v1/reviews", params={"session_id": third}).json()["count"] == 0
    assert decide(http, by_target["target2"]["id"], "deny").status_code == 200
    settled(http, second)


def test_global_always_allow_resolves_other_pending_reviews(stack: Stack) -> None:
    """always_allow scope all saves global invoke=allow and settles the other pending review."""
    http = stack.http
    two_target_caller(http)
    first = launch(http, "caller", "go1")
    pending(http, 1)
    second = launch(http, "caller", "go2")
    by_target = {r["target"]: r for r in pending(http, 2)}
    resp = decide(http, by_target["target"]["id"], "always_allow", scope="all")
    assert resp.status_code == 200, resp.text
    assert (resp.json()["status"], resp.json()["scope"]) == ("allowed", "all")
    policies = http.get("/v1/agents/caller/policies").json()
    assert policies == {
        "global": {"list": "review", "read": "review", "invoke": "allow"},
        "targets": {},
    }
    for sid, reply in ((first, "target says hi"), (second, "target2 says hi")):
        settled(http, sid)
        assert result_of(http, sid)["response"] == reply
    other = http.get(f"/v1/reviews/{by_target['target2']['id']}").json()
    assert other["status"] == "allowed"
    assert other["decided_by"] == f"policy (always_allow on {by_target['target']['id']})"
    # the covered review answers a late human decision with 409
    assert_problem(decide(http, other["id"], "deny"), 409, "review_already_decided")


# --- the audit log -------------------------------------------------------------------


def test_audit_log_outcomes_filters_and_pages(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """GET /v1/audit records allow, denied_by_user, review_timeout and block; filters and pages."""
    db_file = tmp_path / "audit.db"
    # The review left to time out is opened through a second API + worker on the same
    # database with a 4 s review timeout; the reviews decided here keep the default 300 s,
    # so no decision races a timer however slow the machine is.
    with (
        running_stack(temporal_env, db_file) as st,
        running_stack(temporal_env, db_file, review_timeout=4.0, review_delivery_grace=0) as quick,
    ):
        http = st.http
        target(http)
        agent(http, "caller", caller_playbook("invoke_agent", INVOKE_SYNC))
        agent(http, "lister", caller_playbook("list_agents", {}))
        agent(http, "selfie", caller_playbook("invoke_agent", {"slug": "selfie", "prompt": "me"}))
        agent(http, "quiet", caller_playbook("invoke_agent", INVOKE_SYNC))
        # three reviews: one allowed, one denied, one left to time out
        sids = [launch(http, "caller") for _ in range(2)]
        allowed, denied = pending(http, 2)
        timed_sid = launch(quick.http, "caller")
        (timed,) = [r for r in pending(http, 3) if r["session_id"] == timed_sid]
        assert decide(http, allowed["id"], "allow_once").status_code == 200
        assert decide(http, denied["id"], "deny").status_code == 200
        for sid in [*sids, timed_sid]:
            settled(http, sid)
        timed_out = http.get(f"/v1/reviews/{timed['id']}").json()
        assert (timed_out["status"], timed_out["decided_by"]) == ("timed_out", "timeout")
        assert result_of(http, timed_sid) == {
            "error": "the review timed out after 4 s without a decision; "
            "the invoke 'target' operation was denied"
        }
        assert_problem(decide(http, timed["id"], "allow_once"), 409, "review_already_decided")
        # blocks: by policy (invoke and list) and by the self-invocation guard
        put = http.put(
            "/v1/agents/caller/policies", json={"targets": {"target": {"invoke": "block"}}}
        )
        assert put.status_code == 200, put.text
        blocked_sid = launch(http, "caller")
        settled(http, blocked_sid)
        assert result_of(http, blocked_sid) == {
            "error": "blocked_by_policy: caller may not invoke 'target'"
        }
        assert http.put(
            "/v1/agents/lister/policies", json={"global": {"list": "block"}}
        ).status_code == (200)
        settled(http, launch(http, "lister"))
        settled(http, launch(http, "selfie"))
        # an operation allowed by policy goes through no review and leaves no audit row
        assert http.put(
            "/v1/agents/quiet/policies", json={"global": {"invoke": "allow"}}
        ).status_code == (200)
        quiet_sid = launch(http, "quiet")
        settled(http, quiet_sid)
        assert result_of(http, quiet_sid)["response"] == "target says hi"

        everything = http.get("/v1/audit").json()
        rows = everything["data"]
        assert everything["count"] == 6 == len(rows)
        assert [r["id"] for r in rows] == sorted((r["id"] for r in rows), reverse=True)
        assert {r["caller"] for r in rows} == {"caller", "lister", "selfie"}
        summary = {
            (r["caller"], r["operation"], r["target"], r["outcome"], r["decided_by"]) for r in rows
        }
        assert summary == {
            ("caller", "invoke", "target", "allow", "local"),
            ("caller", "invoke", "target", "denied_by_user", "local"),
            ("caller", "invoke", "target", "review_timeout", "timeout"),
            ("caller", "invoke", "target", "block", "policy"),
            ("lister", "list", None, "block", "policy"),
            ("selfie", "invoke", "selfie", "block", "guard"),
        }
        by_outcome = {r["outcome"]: r for r in rows if r["caller"] == "caller"}
        assert by_outcome["allow"]["review_id"] == allowed["id"]
        assert by_outcome["denied_by_user"]["review_id"] == denied["id"]
        assert by_outcome["review_timeout"]["session_id"] == timed_sid
        assert by_outcome["block"]["review_id"] is None
        assert {"id", "session_id", "at", "reason"} <= set(rows[0])

        def audit(**params: Any) -> dict[str, Any]:
            resp = http.get("/v1/audit", params=params)
            assert resp.status_code == 200, resp.text
            body: dict[str, Any] = resp.json()
            return body

        assert audit(caller="caller")["count"] == 4
        assert audit(caller="lister")["data"][0]["operation"] == "list"
        assert audit(caller="nobody")["count"] == 0
        assert audit(target="target")["count"] == 4
        assert audit(target="selfie")["data"][0]["reason"] == "self_invocation"
        assert audit(operation="list")["count"] == 1
        assert audit(operation="invoke")["count"] == 5
        assert audit(operation="create")["count"] == 0
        assert audit(outcome="block")["count"] == 3
        for outcome in ("allow", "denied_by_user", "review_timeout"):
            assert audit(outcome=outcome)["count"] == 1
        assert audit(caller="caller", outcome="block")["data"][0]["decided_by"] == "policy"
        assert audit(session_id=timed_sid)["count"] == 1
        # pagination: newest first, count is the total whatever the page
        ids = [r["id"] for r in rows]
        page = audit(limit=2, offset=1)
        assert page["count"] == 6 and [r["id"] for r in page["data"]] == ids[1:3]
        assert [r["id"] for r in audit(limit=1, offset=5)["data"]] == ids[5:]
        assert audit(limit=1, offset=6) == {"data": [], "count": 6, "next_cursor": None}
        assert len(audit(limit=200)["data"]) == 6
        for bad in (
            {"limit": 0},
            {"limit": 201},
            {"offset": -1},
            {"outcome": "maybe"},
            {"operation": "delete"},
            {"caller": "Not A Slug"},
            {"target": "Bad!"},
        ):
            assert_problem(http.get("/v1/audit", params=bad), 422, "validation_error")


# --- the policies API (no Temporal needed) ------------------------------------------------


def registry_agent(api: httpx.Client, slug: str) -> None:
    """Create ``slug`` (a draft is enough for policies)."""
    assert api.post("/v1/agents", json={"slug": slug, "name": slug}).status_code == 201


def test_policies_default_to_review_everywhere(api: httpx.Client) -> None:
    """GET policies of a new agent: every global toggle review, no targets."""
    registry_agent(api, "caller")
    resp = api.get("/v1/agents/caller/policies")
    assert resp.status_code == 200 and resp.json() == DEFAULT_POLICIES


def test_put_policies_round_trips_and_replaces(api: httpx.Client, settings: Settings) -> None:
    """PUT global + per-target values, GET returns them; a second PUT replaces the whole set."""
    for slug in ("caller", "t1", "t2"):
        registry_agent(api, slug)
    doc = {
        "global": {"list": "allow", "read": "block", "invoke": "review"},
        "targets": {
            "t1": {"read": "allow", "invoke": "block"},
            "t2": {"invoke": "allow"},
        },
    }
    want = {
        "global": {"list": "allow", "read": "block", "invoke": "review"},
        "targets": {
            "t1": {"read": "allow", "invoke": "block"},
            "t2": {"read": "review", "invoke": "allow"},
        },
    }
    put = api.put("/v1/agents/caller/policies", json=doc)
    assert put.status_code == 200, put.text
    assert put.json() == want
    assert api.get("/v1/agents/caller/policies").json() == want
    # review is the absence of a row: exactly the five non-review values are stored
    engine = make_engine(settings.database_url)
    try:
        with session_scope(engine) as s:
            rows = s.exec(select(XAgentPolicy)).all()
            stored = {(r.target_agent_slug, r.operation, r.decision) for r in rows}
    finally:
        engine.dispose()
    assert stored == {
        (None, "list", "allow"),
        (None, "read", "block"),
        ("t1", "read", "allow"),
        ("t1", "invoke", "block"),
        ("t2", "invoke", "allow"),
    }
    # an all-review target stores nothing and is not shown
    second = api.put(
        "/v1/agents/caller/policies",
        json={"global": {"invoke": "allow"}, "targets": {"t1": {"read": "review"}}},
    )
    expect = {"global": {"list": "review", "read": "review", "invoke": "allow"}, "targets": {}}
    assert second.json() == expect
    assert api.get("/v1/agents/caller/policies").json() == expect
    assert api.put("/v1/agents/caller/policies", json={}).json() == DEFAULT_POLICIES


def test_put_policies_refuses_bad_documents(api: httpx.Client) -> None:
    """Unknown target → 404, itself → 422 invalid_policy, bad values/fields → 422; nothing saved."""
    for slug in ("caller", "t1"):
        registry_agent(api, slug)
    before = {"global": {"invoke": "allow"}, "targets": {"t1": {"read": "block"}}}
    assert api.put("/v1/agents/caller/policies", json=before).status_code == 200
    saved = api.get("/v1/agents/caller/policies").json()

    unknown = api.put(
        "/v1/agents/caller/policies",
        json={"targets": {"t1": {"read": "allow"}, "ghost": {"invoke": "allow"}}},
    )
    assert assert_problem(unknown, 404, "agent_not_found")["path"] == "targets.ghost"
    itself = api.put("/v1/agents/caller/policies", json={"targets": {"caller": {"read": "allow"}}})
    assert assert_problem(itself, 422, "invalid_policy")["path"] == "targets.caller"
    for doc in (
        {"global": {"invoke": "maybe"}},
        {"targets": {"t1": {"read": "maybe"}}},
        {"global": {"create": "allow"}},
        {"targets": {"t1": {"list": "allow"}}},
        {"global": {"list": "allow"}, "extra": True},
        {"targets": ["t1"]},
    ):
        resp = api.put("/v1/agents/caller/policies", json=doc)
        assert_problem(resp, 422, "validation_error")
    assert api.get("/v1/agents/caller/policies").json() == saved
    for method in ("get", "put"):
        resp = api.request(method.upper(), "/v1/agents/ghost/policies", json={})
        assert_problem(resp, 404, "agent_not_found")
    assert_problem(api.get("/v1/agents/Bad!/policies"), 422, "validation_error")


def test_put_policies_target_count_limit(api: httpx.Client) -> None:
    """A PUT may name up to 1000 targets; 1001 is a 422 before any lookup."""
    registry_agent(api, "caller")
    at_limit = {"targets": {f"t{i}": {"read": "allow"} for i in range(1000)}}
    resp = api.put("/v1/agents/caller/policies", json=at_limit)
    assert_problem(resp, 404, "agent_not_found")  # validated; t0 simply does not exist
    over = {"targets": {f"t{i}": {"read": "allow"} for i in range(1001)}}
    problem = assert_problem(
        api.put("/v1/agents/caller/policies", json=over), 422, "validation_error"
    )
    assert problem["path"] == "targets"


def test_deleting_an_agent_deletes_every_policy_naming_it(
    api: httpx.Client, settings: Settings
) -> None:
    """DELETE /v1/agents/{slug} removes its rows as caller and as target; others stay."""
    for slug in ("a", "b", "c"):
        registry_agent(api, slug)
    assert api.put(
        "/v1/agents/a/policies",
        json={
            "global": {"read": "allow"},
            "targets": {"b": {"invoke": "allow"}, "c": {"invoke": "block"}},
        },
    ).status_code == (200)
    assert api.put(
        "/v1/agents/b/policies",
        json={"global": {"list": "allow"}, "targets": {"a": {"read": "block"}}},
    ).status_code == (200)
    assert api.put(
        "/v1/agents/c/policies", json={"targets": {"b": {"read": "allow"}}}
    ).status_code == (200)
    assert api.delete("/v1/agents/b").status_code == 204
    assert api.get("/v1/agents/a/policies").json() == {
        "global": {"list": "review", "read": "allow", "invoke": "review"},
        "targets": {"c": {"read": "review", "invoke": "block"}},
    }
    assert api.get("/v1/agents/c/policies").json() == DEFAULT_POLICIES
    assert_problem(api.get("/v1/agents/b/policies"), 404, "agent_not_found")
    engine = make_engine(settings.database_url)
    try:
        with session_scope(engine) as s:
            naming_b = [
                r
                for r in s.exec(select(XAgentPolicy)).all()
                if "b" in (r.caller_agent_slug, r.target_agent_slug)
            ]
    finally:
        engine.dispose()
    assert naming_b == []
    # a new agent reusing the slug starts with no inherited policies
    registry_agent(api, "b")
    assert api.get("/v1/agents/b/policies").json() == DEFAULT_POLICIES
    assert "b" not in api.get("/v1/agents/a/policies").json()["targets"]


def test_cancelling_a_session_closes_its_pending_review(stack: Stack) -> None:
    """Cancel during a review marks it cancelled; a decision afterwards is 409, nothing runs."""
    http = stack.http
    target(http)
    agent(http, "caller", caller_playbook("invoke_agent", INVOKE_SYNC))
    sid = launch(http, "caller")
    (review,) = pending(http)
    assert http.post(f"/v1/sessions/{sid}/cancel").status_code == 202
    settled(http, sid, "cancelled")
    closed = poll(
        lambda: (r := http.get(f"/v1/reviews/{review['id']}").json())["status"] != "pending" and r,
        "the review to close",
    )
    assert closed["status"] == "cancelled"
    assert http.get("/v1/reviews", params={"status": "cancelled"}).json()["count"] == 1
    assert_problem(decide(http, review["id"], "allow_once"), 409, "review_already_decided")
    assert http.get("/v1/sessions", params={"agent": "target"}).json()["count"] == 0
