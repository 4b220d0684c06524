"""Auth mode (BATON_AUTH=on): bearer tokens, agent ACLs, and ACL before policy (Gamut
X-Agent Policies)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.engine import Engine
from sqlmodel import select
from temporalio.testing import WorkflowEnvironment

from api.app import create_app
from baton.grants import auth
from baton.settings import Settings
from baton.storage.db import ApiToken, ReviewRow, init_db, make_engine, session_scope
from tests.conftest import serve
from tests.test_api_agents import assert_problem
from tests.test_api_reviews import (
    DEFAULT_POLICIES,
    INVOKE_SYNC,
    UNKNOWN_REVIEW,
    Stack,
    decide,
    launch,
    messages,
    pending,
    result_of,
    running_stack,
    settled,
)
from tests.xagent_helpers import caller_playbook
from worker.stack import free_port

USERS = ("alice", "bob", "carol", "dave")


def add_user(engine: Engine, user_id: str) -> str:
    """Create ``user_id`` with one token; returns the token's plaintext."""
    with session_scope(engine) as s:
        auth.create_user(s, user_id=user_id)
        _, plain = auth.issue_token(s, user_id=user_id)
    return plain


def grant(engine: Engine, agent: str, user_id: str, role: auth.Role) -> None:
    """Give ``user_id`` the ``role`` on ``agent``."""
    with session_scope(engine) as s:
        auth.grant(s, agent=agent, user_id=user_id, role=role)


def acl_of(engine: Engine, agent: str) -> dict[str, str]:
    """``{user: role}`` of ``agent``."""
    with session_scope(engine) as s:
        return auth.acl(s, agent=agent)


def create_agent(
    http: httpx.Client, slug: str, playbook: list[dict[str, Any]] | None = None
) -> None:
    """Create and publish ``slug`` as ``http``'s user (who becomes its owner)."""
    spec = {"playbook": playbook or []}
    created = http.post("/v1/agents", json={"slug": slug, "name": slug.title(), "spec": spec})
    assert created.status_code == 201, created.text
    published = http.post(f"/v1/agents/{slug}/publish")
    assert published.status_code == 201, published.text


class Users:
    """A client per user, all against one auth-mode API."""

    def __init__(self, url: str, tokens: dict[str, str]) -> None:
        self.tokens = tokens
        self._clients = {
            u: httpx.Client(base_url=url, timeout=60, headers={"Authorization": f"Bearer {t}"})
            for u, t in tokens.items()
        }
        self.anonymous = httpx.Client(base_url=url, timeout=60)

    def __getitem__(self, user: str) -> httpx.Client:
        return self._clients[user]

    def close(self) -> None:
        for c in self._clients.values():
            c.close()
        self.anonymous.close()


@pytest.fixture
def registry_auth(tmp_path: Path) -> Iterator[tuple[Users, Engine, Path]]:
    """The API alone in auth mode (Temporal is a closed port), with users alice…dave."""
    db_file = tmp_path / "auth.db"
    settings = Settings(
        database_url=f"sqlite:///{db_file}",
        auth="on",
        temporal_address=f"127.0.0.1:{free_port()}",
    )
    engine = make_engine(settings.database_url)
    init_db(engine)
    tokens = {u: add_user(engine, u) for u in USERS}
    server, thread, base = serve(create_app(settings))
    users = Users(base, tokens)
    try:
        yield users, engine, db_file
    finally:
        users.close()
        server.should_exit = True
        thread.join(timeout=10)
        engine.dispose()


@pytest.fixture
def live_auth(temporal_env: WorkflowEnvironment, tmp_path: Path) -> Iterator[tuple[Users, Stack]]:
    """API + worker + dev server in auth mode, with users alice…dave."""
    tokens: dict[str, str] = {}

    def prepare(engine: Engine) -> None:
        tokens.update({u: add_user(engine, u) for u in USERS})

    with running_stack(temporal_env, tmp_path / "live-auth.db", prepare, auth="on") as st:
        users = Users(st.url, tokens)
        try:
            yield users, st
        finally:
            users.close()


# --- tokens ----------------------------------------------------------------------------


def test_missing_malformed_invalid_and_revoked_tokens_are_401(
    registry_auth: tuple[Users, Engine, Path],
) -> None:
    """No token, a non-bearer scheme, an unknown or revoked token → 401 unauthorized problem."""
    users, engine, _ = registry_auth
    alice = users["alice"]
    assert alice.get("/v1/agents").status_code == 200
    token = users.tokens["alice"]
    for headers in (
        {},
        {"Authorization": ""},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer \t x"},
        {"Authorization": f"Basic {token}"},
        {"Authorization": token},
        {"Authorization": "Bearer baton_not-a-real-token"},
        {"Authorization": f"Bearer {token}x"},
        {"Authorization": f"Bearer {token[:-1]}"},
    ):
        resp = users.anonymous.get("/v1/agents", headers=headers)
        assert_problem(resp, 401, "unauthorized")
    for method, path in (
        ("GET", "/v1/reviews"),
        ("GET", f"/v1/reviews/{UNKNOWN_REVIEW}"),
        ("GET", "/v1/audit"),
        ("GET", "/v1/sessions"),
        ("GET", "/v1/agents/x/policies"),
        ("PUT", "/v1/agents/x/policies"),
        ("POST", "/v1/agents"),
    ):
        resp = users.anonymous.request(method, path, json={})
        assert_problem(resp, 401, "unauthorized")
    # the scheme is case-insensitive
    assert users.anonymous.get(
        "/v1/agents", headers={"Authorization": f"bearer {token}"}
    ).is_success
    with session_scope(engine) as s:
        (row,) = auth.list_tokens(s, user_id="alice")
        auth.revoke_token(s, token_id=row.id or 0)
    assert_problem(alice.get("/v1/agents"), 401, "unauthorized")
    assert users["bob"].get("/v1/agents").status_code == 200
    assert users.anonymous.get("/healthz").json() == {"status": "ok"}


def test_unauthorized_header_names_the_bearer_scheme(
    registry_auth: tuple[Users, Engine, Path],
) -> None:
    """A 401 carries `WWW-Authenticate: Bearer` (RFC 9110 §11.6.1 requires the challenge)."""
    users, _, _ = registry_auth
    resp = users.anonymous.get("/v1/agents")
    assert resp.status_code == 401
    assert resp.headers.get("www-authenticate", "").lower().startswith("bearer")


def test_unauthenticated_requests_are_refused_before_temporal_is_touched(
    registry_auth: tuple[Users, Engine, Path],
) -> None:
    """Without a token, Temporal-backed routes answer 401, not 503 (Temporal is down here)."""
    users, _, _ = registry_auth
    sid = "session-00000000-0000-0000-0000-000000000000"
    for path, body in (
        ("/v1/sessions", {"agent": "x", "prompt": "hi"}),
        (f"/v1/sessions/{sid}/messages", {"prompt": "hi"}),
        (f"/v1/sessions/{sid}/cancel", None),
        (f"/v1/reviews/{UNKNOWN_REVIEW}/decision", {"decision": "deny"}),
    ):
        assert_problem(users.anonymous.post(path, json=body), 401, "unauthorized")


def test_tokens_are_stored_as_sha256_digests_only(
    registry_auth: tuple[Users, Engine, Path],
) -> None:
    """The DB keeps a token's SHA-256 and a short prefix, never the plaintext."""
    users, engine, db_file = registry_auth
    with session_scope(engine) as s:
        second_row, second = auth.issue_token(s, user_id="alice", name="laptop")
        second_id = second_row.id
    assert users.anonymous.get(
        "/v1/agents", headers={"Authorization": f"Bearer {second}"}
    ).is_success
    with session_scope(engine) as s:
        rows = s.exec(select(ApiToken)).all()
        by_id = {r.id: r for r in rows}
        stored = [(r.token_hash, r.prefix, r.name) for r in rows]
    assert len(rows) == len(USERS) + 1
    for user, plain in [*users.tokens.items(), ("alice", second)]:
        assert plain.startswith("baton_") and len(plain) >= 40
        digest = hashlib.sha256(plain.encode()).hexdigest()
        (match,) = [r for r in by_id.values() if r.token_hash == digest]
        assert match.user_id == user and match.prefix == plain[:12]
        for token_hash, prefix, name in stored:
            assert plain not in (token_hash, prefix, name)
    assert by_id[second_id].name == "laptop"
    engine.dispose()  # flush everything to the file before reading its bytes
    raw = b"".join(p.read_bytes() for p in db_file.parent.glob(db_file.name + "*"))
    for plain in [*users.tokens.values(), second]:
        secret_part = plain.removeprefix("baton_")
        assert secret_part.encode() not in raw
        assert hashlib.sha256(plain.encode()).hexdigest().encode() in raw


# --- ACL on the API ----------------------------------------------------------------------


def test_agent_list_shows_only_agents_the_user_holds_a_role_on(
    registry_auth: tuple[Users, Engine, Path],
) -> None:
    """GET /v1/agents is filtered to the caller's roles; the count is the filtered total."""
    users, engine, _ = registry_auth
    for slug in ("a1", "a2"):
        create_agent(users["alice"], slug)
    for slug in ("b1", "b2", "b3"):
        create_agent(users["bob"], slug)
    grant(engine, "b1", "alice", "viewer")
    grant(engine, "b3", "carol", "user")

    def listed(user: str, **params: Any) -> tuple[list[str], int]:
        body = users[user].get("/v1/agents", params=params).json()
        return [a["slug"] for a in body["data"]], body["count"]

    assert listed("alice") == (["a1", "a2", "b1"], 3)
    assert listed("bob") == (["b1", "b2", "b3"], 3)
    assert listed("carol") == (["b3"], 1)
    assert listed("dave") == ([], 0)
    assert listed("alice", limit=1, offset=2) == (["b1"], 3)


def test_creating_an_agent_makes_the_creator_its_owner(
    registry_auth: tuple[Users, Engine, Path],
) -> None:
    """POST /v1/agents gives the creator the owner role; others get 403 until granted."""
    users, engine, _ = registry_auth
    create_agent(users["alice"], "mine")
    assert acl_of(engine, "mine") == {"alice": "owner"}
    alice, bob = users["alice"], users["bob"]
    assert alice.put("/v1/agents/mine/draft", json={"system_prompt": "v2"}).status_code == 200
    assert alice.put("/v1/agents/mine/policies", json={}).status_code == 200
    for method, path, body in (
        ("GET", "/v1/agents/mine", None),
        ("GET", "/v1/agents/mine/policies", None),
        ("PUT", "/v1/agents/mine/policies", {}),
        ("PUT", "/v1/agents/mine/draft", {"system_prompt": "evil"}),
        ("POST", "/v1/agents/mine/publish", None),
        ("DELETE", "/v1/agents/mine", None),
    ):
        assert_problem(bob.request(method, path, json=body), 403, "forbidden")
    grant(engine, "mine", "bob", "viewer")
    assert bob.get("/v1/agents/mine").status_code == 200
    assert bob.get("/v1/agents/mine/policies").json() == DEFAULT_POLICIES
    # changing an agent needs the owner role; viewer (and user) is not enough
    assert_problem(bob.put("/v1/agents/mine/policies", json={}), 403, "forbidden")
    grant(engine, "mine", "bob", "user")
    assert_problem(bob.delete("/v1/agents/mine"), 403, "forbidden")
    assert alice.delete("/v1/agents/mine").status_code == 204
    assert acl_of(engine, "mine") == {}


def test_policies_hide_targets_the_user_cannot_see(
    registry_auth: tuple[Users, Engine, Path],
) -> None:
    """GET policies omits per-target rows for agents the reader holds no role on."""
    users, engine, _ = registry_auth
    alice, bob = users["alice"], users["bob"]
    create_agent(alice, "caller")
    create_agent(alice, "open")
    create_agent(bob, "secret")
    grant(engine, "caller", "carol", "owner")
    grant(engine, "open", "carol", "viewer")
    grant(engine, "secret", "carol", "viewer")
    doc = {"targets": {"open": {"read": "allow"}, "secret": {"invoke": "allow"}}}
    assert users["carol"].put("/v1/agents/caller/policies", json=doc).status_code == 200
    assert sorted(users["carol"].get("/v1/agents/caller/policies").json()["targets"]) == [
        "open",
        "secret",
    ]
    assert list(alice.get("/v1/agents/caller/policies").json()["targets"]) == ["open"]


def test_policy_round_trip_keeps_rows_of_targets_the_owner_cannot_see(
    registry_auth: tuple[Users, Engine, Path],
) -> None:
    """An owner's GET→PUT of policies leaves per-target rows hidden from them untouched."""
    users, engine, _ = registry_auth
    alice, carol = users["alice"], users["carol"]
    create_agent(alice, "caller")
    create_agent(alice, "open")
    create_agent(users["bob"], "secret")
    grant(engine, "caller", "carol", "owner")
    grant(engine, "open", "carol", "viewer")
    grant(engine, "secret", "carol", "viewer")
    doc = {"targets": {"open": {"read": "allow"}, "secret": {"invoke": "block"}}}
    assert carol.put("/v1/agents/caller/policies", json=doc).status_code == 200
    # alice edits what she can see and writes it back
    seen = alice.get("/v1/agents/caller/policies").json()
    seen["global"]["list"] = "allow"
    assert alice.put("/v1/agents/caller/policies", json=seen).status_code == 200
    after = carol.get("/v1/agents/caller/policies").json()
    assert after["global"]["list"] == "allow"
    assert after["targets"].get("secret") == {"read": "review", "invoke": "block"}


# --- ACL on sessions and X-Agent calls (real worker) -----------------------------------------


def test_viewer_cannot_launch_a_session_user_can(live_auth: tuple[Users, Stack]) -> None:
    """viewer may read an agent but launching needs the user role (403 forbidden); user may."""
    users, st = live_auth
    bob, alice, carol = users["bob"], users["alice"], users["carol"]
    create_agent(bob, "helper", [{"reply": "helped"}])
    grant(st.engine, "helper", "alice", "viewer")
    assert alice.get("/v1/agents/helper").status_code == 200
    assert alice.get("/v1/agents/helper/revisions").json()["count"] == 1
    body = {"agent": "helper", "prompt": "hi", "sync": True}
    assert_problem(alice.post("/v1/sessions", json=body), 403, "forbidden")
    assert_problem(alice.post("/v1/sessions", json=body | {"agent": "helper@1"}), 403, "forbidden")
    assert_problem(carol.post("/v1/sessions", json=body), 403, "forbidden")
    assert bob.get("/v1/sessions").json()["count"] == 0
    grant(st.engine, "helper", "alice", "user")
    resp = alice.post("/v1/sessions", json=body)
    assert resp.status_code == 201, resp.text
    assert resp.json()["response"] == "helped"
    sid = resp.json()["session_id"]
    detail = alice.get(f"/v1/sessions/{sid}").json()
    assert detail["created_by_user"] == "alice"
    assert bob.get(f"/v1/sessions/{sid}").status_code == 200
    # no role: the session, its transcript and messages are forbidden, the list is empty
    assert_problem(carol.get(f"/v1/sessions/{sid}"), 403, "forbidden")
    assert_problem(carol.get(f"/v1/sessions/{sid}/transcript"), 403, "forbidden")
    assert_problem(
        carol.post(f"/v1/sessions/{sid}/messages", json={"prompt": "x"}), 403, "forbidden"
    )
    assert carol.get("/v1/sessions").json()["count"] == 0
    # a viewer can read but not send messages
    grant(st.engine, "helper", "carol", "viewer")
    assert carol.get(f"/v1/sessions/{sid}/transcript").status_code == 200
    assert_problem(
        carol.post(f"/v1/sessions/{sid}/messages", json={"prompt": "x"}), 403, "forbidden"
    )
    assert_problem(carol.post(f"/v1/sessions/{sid}/cancel"), 403, "forbidden")


def test_acl_refuses_an_invoke_before_any_policy_or_review(live_auth: tuple[Users, Stack]) -> None:
    """A session user without the user role on the target gets access_denied, no review."""
    users, st = live_auth
    alice, bob = users["alice"], users["bob"]
    create_agent(bob, "target", [{"reply": "target says hi"}])
    create_agent(alice, "caller", caller_playbook("invoke_agent", INVOKE_SYNC))
    grant(st.engine, "target", "alice", "viewer")  # viewer < user: still not enough to invoke
    assert alice.get("/v1/agents/caller/policies").json() == DEFAULT_POLICIES

    def refused_once() -> dict[str, Any]:
        sid = launch(alice, "caller")
        settled(alice, sid)
        tool = [m for m in messages(alice, sid) if m["role"] == "tool"]
        assert len(tool) == 1 and tool[0]["text"].startswith("access_denied: "), tool
        error: dict[str, Any] = result_of(alice, sid)
        assert "access_denied" in error["error"] and "user" in error["error"]
        return error

    refused_once()  # no policy: without the ACL this would open a review
    with session_scope(st.engine) as s:
        assert s.exec(select(ReviewRow)).all() == []
    assert alice.get("/v1/reviews").json()["count"] == 0
    # even an allow policy cannot override the ACL
    allow = {"targets": {"target": {"invoke": "allow"}}}
    assert alice.put("/v1/agents/caller/policies", json=allow).status_code == 200
    refused_once()
    audit = alice.get("/v1/audit", params={"caller": "caller"}).json()
    assert audit["count"] == 2
    for row in audit["data"]:
        assert (row["operation"], row["target"], row["outcome"], row["decided_by"]) == (
            "invoke",
            "target",
            "block",
            "acl",
        )
    assert bob.get("/v1/sessions", params={"agent": "target"}).json()["count"] == 0
    # with the user role the ACL passes and the policy decides: back to review
    assert alice.put("/v1/agents/caller/policies", json={}).status_code == 200
    grant(st.engine, "target", "alice", "user")
    sid = launch(alice, "caller")
    (review,) = pending(alice)
    assert review["session_id"] == sid
    assert decide(alice, review["id"], "allow_once").status_code == 200
    settled(alice, sid)
    invoked = result_of(alice, sid)
    assert invoked["response"] == "target says hi"
    detail = bob.get(f"/v1/sessions/{invoked['session_id']}").json()
    assert (detail["created_by_user"], detail["invoked_by_agent"]) == ("alice", "caller")


def test_list_agents_tool_shows_only_agents_the_user_can_access(
    live_auth: tuple[Users, Stack],
) -> None:
    """list_agents in auth mode lists the other live agents the session user holds a role on."""
    users, st = live_auth
    alice, bob = users["alice"], users["bob"]
    create_agent(alice, "lister", caller_playbook("list_agents", {}))
    create_agent(alice, "mine")
    create_agent(bob, "shared")
    create_agent(bob, "hidden")
    assert alice.post("/v1/agents", json={"slug": "drafty", "name": "Drafty"}).status_code == 201
    grant(st.engine, "shared", "alice", "viewer")
    allow = {"global": {"list": "allow"}}
    assert alice.put("/v1/agents/lister/policies", json=allow).status_code == 200
    sid = launch(alice, "lister")
    settled(alice, sid)
    listed = result_of(alice, sid)["agents"]
    assert [a["slug"] for a in listed] == ["mine", "shared"]
    assert set(listed[0]) == {"slug", "name", "description"}


def test_only_users_of_the_caller_agent_see_and_decide_its_reviews(
    live_auth: tuple[Users, Stack],
) -> None:
    """Deciding needs the user role on the caller agent: others get 403 and do not see it."""
    users, st = live_auth
    alice, bob, carol, dave = (users[u] for u in USERS)
    create_agent(alice, "target", [{"reply": "target says hi"}])
    create_agent(alice, "caller", caller_playbook("invoke_agent", INVOKE_SYNC))
    grant(st.engine, "caller", "carol", "viewer")
    grant(st.engine, "caller", "dave", "user")
    sid = launch(alice, "caller")
    (review,) = pending(alice)
    rid = review["id"]
    for outsider in (bob, carol):
        assert outsider.get("/v1/reviews").json() == {"data": [], "count": 0}
        assert outsider.get("/v1/reviews", params={"status": "pending"}).json()["count"] == 0
        assert_problem(outsider.get(f"/v1/reviews/{rid}"), 403, "forbidden")
        for decision in ("allow_once", "deny"):
            assert_problem(decide(outsider, rid, decision), 403, "forbidden")
    assert alice.get(f"/v1/reviews/{rid}").json()["status"] == "pending"
    assert dave.get("/v1/reviews", params={"status": "pending"}).json()["count"] == 1
    resp = decide(dave, rid, "allow_once")
    assert resp.status_code == 200, resp.text
    assert (resp.json()["status"], resp.json()["decided_by"]) == ("allowed", "dave")
    settled(alice, sid)
    assert result_of(alice, sid)["response"] == "target says hi"
    (row,) = alice.get("/v1/audit").json()["data"]
    assert (row["outcome"], row["decided_by"]) == ("allow", "dave")
    # the audit log follows read access: viewer carol sees it, bob does not
    assert carol.get("/v1/audit").json()["count"] == 1
    assert bob.get("/v1/audit").json()["count"] == 0


def test_create_agent_in_auth_mode_copies_the_acl_and_owns_it_to_the_session_user(
    live_auth: tuple[Users, Stack],
) -> None:
    """An approved create_agent copies the caller's ACL and makes the session user owner."""
    users, st = live_auth
    alice, bob, dave = users["alice"], users["bob"], users["dave"]
    create_agent(alice, "maker", caller_playbook("create_agent", {"name": "Helper Bot"}))
    grant(st.engine, "maker", "carol", "viewer")
    grant(st.engine, "maker", "dave", "user")
    sid = launch(dave, "maker")
    (review,) = pending(alice)
    assert review["operation"] == "create"
    assert_problem(decide(alice, review["id"], "always_allow"), 422, "invalid_decision")
    assert decide(alice, review["id"], "allow_once").status_code == 200
    settled(dave, sid)
    assert result_of(dave, sid)["slug"] == "helper-bot"
    assert acl_of(st.engine, "helper-bot") == {"alice": "owner", "carol": "viewer", "dave": "owner"}
    assert dave.get("/v1/agents/helper-bot").json()["live_version"] == 1
    assert "helper-bot" in [a["slug"] for a in dave.get("/v1/agents").json()["data"]]
    assert_problem(bob.get("/v1/agents/helper-bot"), 403, "forbidden")
    # the session user may use the new agent at once
    made = dave.post("/v1/sessions", json={"agent": "helper-bot", "prompt": "hi", "sync": True})
    assert made.status_code == 201, made.text
    assert made.json()["agent"] == "helper-bot" and made.json()["version"] == 1


# --- teams ------------------------------------------------------------------------------


def test_team_access_follows_its_members_acl(registry_auth: tuple[Users, Engine, Path]) -> None:
    """Writing a team needs user on every member; seeing it needs viewer on every member
    (a hidden team answers 404, as a missing one)."""
    users, engine, _ = registry_auth
    for slug in ("lead", "helper"):
        create_agent(users["alice"], slug)
    grant(engine, "lead", "bob", "user")
    grant(engine, "helper", "bob", "viewer")
    grant(engine, "lead", "carol", "viewer")
    team = {
        "id": "desk",
        "name": "Desk",
        "supervisor_agent_id": "lead",
        "members": [{"agent_id": "lead", "role": "supervisor"}, {"agent_id": "helper"}],
    }
    # bob may only view helper: he cannot compose it into a team; nothing is stored.
    assert_problem(users["bob"].post("/v1/teams", json=team), 403, "forbidden")
    assert users["alice"].get("/v1/teams/desk").status_code == 404
    assert users["alice"].post("/v1/teams", json=team).status_code == 201
    # Seeing: every member needs viewer. bob sees both; carol sees only the lead.
    assert users["bob"].get("/v1/teams/desk").status_code == 200
    assert_problem(users["carol"].get("/v1/teams/desk"), 404, "team_not_found")
    assert users["bob"].get("/v1/teams").json()["count"] == 1
    assert users["carol"].get("/v1/teams").json() == {"data": [], "count": 0}
    # Replacing or deleting: user on every old and new member.
    lead_only = {**team, "members": team["members"][:1]}
    assert_problem(users["bob"].put("/v1/teams/desk", json=lead_only), 403, "forbidden")
    assert_problem(users["bob"].delete("/v1/teams/desk"), 403, "forbidden")
    assert len(users["alice"].get("/v1/teams/desk").json()["members"]) == 2
    grant(engine, "helper", "bob", "user")  # at the bound: user on every member is enough
    assert users["bob"].put("/v1/teams/desk", json=lead_only).status_code == 200
    assert users["bob"].delete("/v1/teams/desk").status_code == 204
    # A hidden team's id is taken: PUT answers as POST would, without naming members.
    assert users["alice"].post("/v1/teams", json=team).status_code == 201
    taken = users["carol"].put("/v1/teams/desk", json=team)
    assert_problem(taken, 409, "team_exists")
    assert "lead" not in taken.json()["detail"] and "helper" not in taken.json()["detail"]


def test_a_team_run_of_a_hidden_team_is_404_like_a_missing_one(
    live_auth: tuple[Users, Stack],
) -> None:
    """POST /v1/sessions {team} answers 404 team_not_found for a team the user cannot see."""
    users, st = live_auth
    create_agent(users["alice"], "boss", [{"reply": "led"}])
    team = {
        "id": "scouting",
        "name": "Scouting",
        "supervisor_agent_id": "boss",
        "members": [{"agent_id": "boss", "role": "supervisor"}],
    }
    assert users["alice"].post("/v1/teams", json=team).status_code == 201
    for team_id in ("scouting", "no-such-team"):
        refused = users["bob"].post("/v1/sessions", json={"team": team_id, "prompt": "hi"})
        assert_problem(refused, 404, "team_not_found")
        assert "boss" not in refused.json()["detail"]
    grant(st.engine, "boss", "bob", "viewer")  # sees it now: launching needs the user role
    assert_problem(
        users["bob"].post("/v1/sessions", json={"team": "scouting", "prompt": "hi"}),
        403,
        "forbidden",
    )
    ran = users["alice"].post(
        "/v1/sessions", json={"team": "scouting", "prompt": "hi", "sync": True}
    )
    assert ran.status_code == 201 and ran.json()["response"] == "led", ran.text


# --- balance and usage --------------------------------------------------------------------


def test_balance_is_not_set_over_the_api_and_usage_is_filtered(
    registry_auth: tuple[Users, Engine, Path],
) -> None:
    """Auth mode: PUT /v1/balance is 403 admin_only for every user; /v1/usage shows only the
    model calls of agents the caller holds a role on."""
    from baton.runs import metering

    users, engine, _ = registry_auth
    create_agent(users["alice"], "a1")
    create_agent(users["bob"], "b1")
    with session_scope(engine) as s:
        for i, agent in enumerate(("a1", "b1", "b1")):
            metering.record(
                s,
                message_id=f"m{i}",
                agent=agent,
                session_id=f"session-{agent}",
                model="m",
                input_tokens=10,
                output_tokens=1,
                cost_usd=0.5,
            )
    for user in ("alice", "bob"):
        assert_problem(users[user].put("/v1/balance", json={"balance": 100.0}), 403, "admin_only")
    assert users["alice"].get("/v1/balance").json() == {"balance": None}

    def keys(user: str, by: str) -> dict[str, int]:
        body = users[user].get("/v1/usage", params={"group_by": by}).json()
        return {g["key"]: g["requests"] for g in body["data"]}

    assert keys("alice", "agent") == {"a1": 1}
    assert keys("bob", "session") == {"session-b1": 2}
    assert keys("carol", "agent") == {}
    grant(engine, "b1", "carol", "viewer")  # viewer is enough to see an agent's spend
    assert keys("carol", "agent") == {"b1": 2}
