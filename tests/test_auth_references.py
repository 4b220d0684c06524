"""Auth mode side doors (issue 10, items 3 and 4): a deleted agent's history cannot be taken
over through ``create_agent``, and specs may reference only agents the user may read or run."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.engine import Engine

from baton import registry
from baton.db import session_scope
from baton.errors import AgentExists
from tests.test_api_agents import assert_problem
from tests.test_api_reviews import Stack, decide, pending, result_of, settled
from tests.test_api_reviews import launch as api_launch
from tests.test_auth import Users, acl_of, create_agent
from tests.test_auth import live_auth as live_auth  # the fixture, re-exported for pytest
from tests.xagent_helpers import add_session, playbook

# --- item 3: one creation path, one check -----------------------------------------------


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
