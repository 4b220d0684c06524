"""Auth mode side doors: a deleted agent's history cannot be taken
over through ``create_agent``, and specs may reference only agents the user may read or run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.engine import Engine

from baton.agents import registry
from baton.agents.spec import AgentSpec
from baton.errors import AgentExists
from baton.grants import auth
from baton.storage.db import session_scope
from tests.test_api_agents import assert_problem
from tests.test_api_reviews import Stack, decide, pending, result_of, settled
from tests.test_api_reviews import launch as api_launch
from tests.test_auth import Users, acl_of, create_agent, grant
from tests.test_auth import live_auth as live_auth  # the fixtures, re-exported for pytest
from tests.test_auth import registry_auth as registry_auth
from tests.xagent_helpers import add_session, playbook

# --- one creation path, one check --------------------------------------------------


def _delete_with_history(alice: Any, slug: str) -> str:
    """Create ``slug`` as alice, run one session of it, cancel it, delete the agent."""
    create_agent(alice, slug, [{"reply": f"{slug} secret"}])
    sid = api_launch(alice, slug)
    settled(alice, sid)
    assert alice.post(f"/v1/sessions/{sid}/cancel").status_code == 202
    settled(alice, sid, "cancelled")
    assert alice.delete(f"/v1/agents/{slug}").status_code == 204
    return sid


def test_create_agent_tool_cannot_take_over_a_deleted_agents_history(
    live_auth: tuple[Users, Stack],
) -> None:
    """The create_agent tool treats a slug with leftover sessions as taken (-2), a clean one not."""
    users, st = live_auth
    alice, bob = users["alice"], users["bob"]
    old = _delete_with_history(alice, "gone")
    create_agent(alice, "empty")
    assert alice.delete("/v1/agents/empty").status_code == 204  # deleted, but no history
    rules = playbook(
        ("go", "create_agent", {"name": "Gone"}), ("again", "create_agent", {"name": "Empty"})
    )
    create_agent(bob, "maker", rules)
    sid = api_launch(bob, "maker")
    (review,) = pending(bob)
    assert decide(bob, review["id"], "allow_once").status_code == 200
    settled(bob, sid)
    assert result_of(bob, sid)["slug"] == "gone-2"
    assert acl_of(st.engine, "gone") == {}
    assert_problem(bob.get(f"/v1/sessions/{old}"), 403, "forbidden")
    assert_problem(bob.get(f"/v1/sessions/{old}/transcript"), 403, "forbidden")
    assert bob.get("/v1/sessions", params={"agent": "gone"}).json()["count"] == 0
    # the edge on the other side: a deleted slug without sessions is free again
    sent = bob.post(f"/v1/sessions/{sid}/messages", json={"prompt": "again"})
    assert sent.status_code in (200, 202), sent.text
    (review,) = pending(bob)
    assert decide(bob, review["id"], "allow_once").status_code == 200
    settled(bob, sid)
    assert result_of(bob, sid)["slug"] == "empty"
    assert acl_of(st.engine, "empty") == {"bob": "owner"}


@pytest.mark.parametrize("auth_mode", [True, False])
def test_a_slug_with_history_counts_as_taken_in_auth_mode_only(
    engine: Engine, auth_mode: bool
) -> None:
    """registry.free_slug skips a deleted slug with sessions in auth mode; create refuses it."""
    with session_scope(engine) as s:
        registry.create_agent(s, slug="gone", name="Gone")
    add_session(engine, "gone", status="cancelled")
    with session_scope(engine) as s:
        registry.delete_agent(s, slug="gone")
        registry.create_agent(s, slug="gone-2", name="Taken")
    with session_scope(engine) as s:
        picked = registry.free_slug(s, base="gone", auth=auth_mode)
    assert picked == ("gone-3" if auth_mode else "gone")
    with session_scope(engine) as s:
        if auth_mode:
            with pytest.raises(AgentExists, match="session history"):
                registry.create_agent(s, slug="gone", name="Mine", user="bob")
        else:
            registry.create_agent(s, slug="gone", name="Mine")


# --- references need roles; the resolved view shows only what the caller reads --

SECRET = "alice's secret prompt"
SECRET_RULE = "alice's secret rule"


def make(http: httpx.Client, slug: str, spec: dict[str, Any] | None = None) -> None:
    """Create ``slug`` with ``spec`` as ``http``'s user and publish it."""
    created = http.post("/v1/agents", json={"slug": slug, "name": slug.title(), "spec": spec or {}})
    assert created.status_code == 201, created.text
    published = http.post(f"/v1/agents/{slug}/publish")
    assert published.status_code == 201, published.text


def secret_spec(**more: Any) -> dict[str, Any]:
    """A spec whose prompt and playbook only its owner's viewers may read."""
    return {"system_prompt": SECRET, "playbook": [{"reply": SECRET_RULE}], **more}


def forbidden_at(resp: httpx.Response, path: str, agent: str) -> None:
    """``resp`` is 403 ``forbidden`` naming the reference ``path`` and ``agent``, no secret."""
    body = assert_problem(resp, 403, "forbidden")
    assert (body["path"], body["agent"]) == (path, agent), body
    assert SECRET not in resp.text and SECRET_RULE not in resp.text


def revoke(engine: Engine, agent: str, user_id: str) -> None:
    """Remove ``user_id``'s role on ``agent``."""
    with session_scope(engine) as s:
        auth.revoke(s, agent=agent, user_id=user_id)


def test_extends_needs_the_viewer_role_on_the_base(
    registry_auth: tuple[Users, Engine, Path],
) -> None:
    """Saving a draft that extends an agent needs viewer on it (no role: 403, missing alike)."""
    users, engine, _ = registry_auth
    alice, bob = users["alice"], users["bob"]
    make(alice, "base", secret_spec())
    body = {"slug": "mine", "name": "Mine", "spec": {"extends": "base"}}
    forbidden_at(bob.post("/v1/agents", json=body), "spec.extends", "base")
    missing = body | {"spec": {"extends": "nowhere"}}
    forbidden_at(bob.post("/v1/agents", json=missing), "spec.extends", "nowhere")
    assert bob.post("/v1/agents", json={"slug": "mine", "name": "Mine"}).status_code == 201
    forbidden_at(bob.put("/v1/agents/mine/draft", json={"extends": "base@1"}), "extends", "base")
    grant(engine, "base", "bob", "viewer")  # the bound: viewer is enough to extend
    assert bob.put("/v1/agents/mine/draft", json={"extends": "base"}).status_code == 200
    assert bob.post("/v1/agents/mine/publish").status_code == 201
    resolved = bob.get("/v1/agents/mine/resolved")
    assert resolved.status_code == 200, resolved.text
    assert resolved.json()["system_prompt"] == SECRET
    assert resolved.json()["inheritance"] == ["mine@1", "base@1"]
    # naming the agent being created is no ACL question: the resolver refuses the cycle
    selfish = {"slug": "loop", "name": "Loop", "spec": {"extends": "loop"}}
    assert bob.post("/v1/agents", json=selfish).status_code == 201
    assert_problem(bob.post("/v1/agents/loop/publish"), 400, "inheritance_cycle")


def test_a_subagent_needs_the_user_role_on_the_agent_it_runs(
    registry_auth: tuple[Users, Engine, Path],
) -> None:
    """A subagent node at any depth needs user on its agent (viewer: 403), at save and publish."""
    users, engine, _ = registry_auth
    alice, bob = users["alice"], users["bob"]
    make(alice, "helper", secret_spec())
    make(bob, "leaf")
    grant(engine, "helper", "bob", "viewer")  # reads it, may not run it
    top = {"subagents": [{"alias": "h", "agent": "helper"}]}
    body = {"slug": "tree", "name": "Tree", "spec": top}
    forbidden_at(bob.post("/v1/agents", json=body), "spec.subagents[0].agent", "helper")
    nested = {"subagents": [{"alias": "l", "agent": "leaf", "subagents": top["subagents"]}]}
    assert bob.post("/v1/agents", json={"slug": "tree", "name": "Tree"}).status_code == 201
    forbidden_at(
        bob.put("/v1/agents/tree/draft", json=nested), "subagents[0].subagents[0].agent", "helper"
    )
    grant(engine, "helper", "bob", "user")  # the bound: user may put it in a tree
    assert bob.put("/v1/agents/tree/draft", json=nested).status_code == 200
    assert bob.post("/v1/agents/tree/publish").status_code == 201
    assert bob.put("/v1/agents/tree/draft", json=top).status_code == 200
    assert bob.post("/v1/agents/tree/publish").status_code == 201
    # reading needs viewer only; writing it again needs user
    grant(engine, "helper", "bob", "viewer")
    assert bob.get("/v1/agents/tree/resolved").status_code == 200
    assert bob.put("/v1/agents/tree/draft", json={}).status_code == 200
    forbidden_at(
        bob.post("/v1/agents/tree/rollback", json={"version": 1}),
        "subagents[0].subagents[0].agent",
        "helper",
    )
    forbidden_at(
        bob.post("/v1/agents/tree/restore", json={"version": 2}), "subagents[0].agent", "helper"
    )
    assert bob.post("/v1/agents/tree/publish").status_code == 201  # v3: no reference left
    # a draft saved while bob could run helper is re-checked at publish
    grant(engine, "helper", "bob", "user")
    assert bob.put("/v1/agents/tree/draft", json=top).status_code == 200
    grant(engine, "helper", "bob", "viewer")
    forbidden_at(bob.post("/v1/agents/tree/publish"), "subagents[0].agent", "helper")
    assert bob.get("/v1/agents/tree").json()["live_version"] == 3


def test_the_resolved_view_never_shows_a_base_the_caller_cannot_read(
    registry_auth: tuple[Users, Engine, Path],
) -> None:
    """Once bob loses viewer on the base, /resolved is 403 for every version; revisions
    show only his own spec; restoring or rolling back to the extending revision is 403."""
    users, engine, _ = registry_auth
    alice, bob, carol = users["alice"], users["bob"], users["carol"]
    make(alice, "base", secret_spec())
    grant(engine, "base", "bob", "viewer")
    make(bob, "mine", {"extends": "base", "system_prompt": "bob's part"})
    assert bob.put("/v1/agents/mine/draft", json={"system_prompt": "standalone"}).status_code == 200
    assert bob.post("/v1/agents/mine/publish").status_code == 201  # v2: no base
    assert bob.post("/v1/agents/mine/rollback", json={"version": 1}).status_code == 200
    assert SECRET in bob.get("/v1/agents/mine/resolved").json()["system_prompt"]
    revoke(engine, "base", "bob")
    forbidden_at(bob.get("/v1/agents/mine/resolved"), "inheritance[1]", "base")
    forbidden_at(
        bob.get("/v1/agents/mine/resolved", params={"version": 1}), "inheritance[1]", "base"
    )
    assert bob.get("/v1/agents/mine/resolved", params={"version": 2}).status_code == 200
    for view in ("/v1/agents/mine/revisions", "/v1/agents/mine/revisions/1", "/v1/agents/mine"):
        resp = bob.get(view)
        assert resp.status_code == 200 and SECRET not in resp.text, resp.text
    forbidden_at(bob.post("/v1/agents/mine/restore", json={"version": 1}), "extends", "base")
    forbidden_at(bob.post("/v1/agents/mine/rollback", json={"version": 1}), "extends", "base")
    # another reader of bob's agent needs viewer on the base as well
    grant(engine, "mine", "carol", "viewer")
    forbidden_at(carol.get("/v1/agents/mine/resolved"), "inheritance[1]", "base")
    grant(engine, "base", "carol", "viewer")
    assert SECRET in carol.get("/v1/agents/mine/resolved").json()["system_prompt"]


def test_bases_of_bases_and_their_subagents_need_roles_too(
    registry_auth: tuple[Users, Engine, Path],
) -> None:
    """At publish every base in the chain needs viewer and every inherited node user; the
    resolved view needs viewer on each node's agent and that agent's own bases."""
    users, engine, _ = registry_auth
    alice, bob = users["alice"], users["bob"]
    make(alice, "root", secret_spec())
    make(alice, "helper")
    make(alice, "mid", {"extends": "root", "subagents": [{"alias": "h", "agent": "helper"}]})
    grant(engine, "mid", "bob", "user")
    forbidden_at(bob.get("/v1/agents/mid/resolved"), "inheritance[1]", "root")
    # the draft names only mid (bob may read it); publish resolves the chain behind it
    assert (
        bob.post(
            "/v1/agents", json={"slug": "mine", "name": "M", "spec": {"extends": "mid"}}
        ).status_code
        == 201
    )
    forbidden_at(bob.post("/v1/agents/mine/publish"), "mid@1:extends", "root")
    grant(engine, "root", "bob", "viewer")
    forbidden_at(bob.post("/v1/agents/mine/publish"), "mid@1:subagents[0].agent", "helper")
    grant(engine, "helper", "bob", "user")
    assert bob.post("/v1/agents/mine/publish").status_code == 201
    # a node's agent is run, not read, at publish; but its prompt folds in its bases
    make(bob, "boss", {"subagents": [{"alias": "m", "agent": "mid"}]})
    assert bob.get("/v1/agents/boss/resolved").status_code == 200
    revoke(engine, "root", "bob")
    forbidden_at(bob.get("/v1/agents/boss/resolved"), "subagents[0].agent", "root")


def test_reference_roles_are_checked_by_the_registry_on_both_backends(engine: Engine) -> None:
    """registry writes with a user check reference roles; without one (baton apply) they don't."""
    with session_scope(engine) as s:
        auth.create_user(s, user_id="bob")
        registry.create_agent(s, slug="base", name="Base")
        registry.publish(s, slug="base")
        registry.create_agent(s, slug="mine", name="Mine", user="bob")
        auth.grant(s, agent="mine", user_id="bob", role="owner")
    extends = AgentSpec(extends="base")
    with session_scope(engine) as s, pytest.raises(auth.Forbidden) as refused:
        registry.save_draft(s, slug="mine", spec=extends, user="bob")
    assert (refused.value.path, refused.value.extra["agent"]) == ("extends", "base")
    with session_scope(engine) as s:
        registry.save_draft(s, slug="mine", spec=extends)  # the admin path: no ACL
    with session_scope(engine) as s, pytest.raises(auth.Forbidden):
        registry.publish(s, slug="mine", user="bob")
    with session_scope(engine) as s:
        auth.grant(s, agent="base", user_id="bob", role="viewer")
        registry.publish(s, slug="mine", user="bob")
        assert registry.resolve_agent(s, ref="mine", user="bob").inheritance == [
            "mine@1",
            "base@1",
        ]
        auth.revoke(s, agent="base", user_id="bob")
    with session_scope(engine) as s, pytest.raises(auth.Forbidden):
        registry.resolve_agent(s, ref="mine", user="bob")
    with session_scope(engine) as s:
        assert registry.resolve_agent(s, ref="mine").inheritance == ["mine@1", "base@1"]
