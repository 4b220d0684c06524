"""Teams in auth mode over real HTTP: a team's channel, membership and visibility never
give one user another user's agents or memories."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy.engine import Engine

from api.app import create_app
from baton.agents import teams
from baton.grants import auth
from baton.settings import Settings
from baton.storage.db import session_scope
from tests.conftest import serve


@pytest.fixture
def auth_api(engine: Engine) -> Iterator[tuple[httpx.Client, dict[str, dict[str, str]]]]:
    """The real API in auth mode on the `engine` database, with users alice and bob."""
    url = engine.url.render_as_string(hide_password=False)
    server, thread, base = serve(create_app(Settings(database_url=url, auth="on")))
    headers: dict[str, dict[str, str]] = {}
    with session_scope(engine) as s:
        for user in ("alice", "bob"):
            auth.create_user(s, user_id=user)
            _, token = auth.issue_token(s, user_id=user)
            headers[user] = {"Authorization": f"Bearer {token}"}
    try:
        with httpx.Client(base_url=base, timeout=30) as client:
            yield client, headers
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def _agent(client: httpx.Client, who: dict[str, str], slug: str) -> None:
    spec = {"playbook": [{"reply": "ok"}]}
    made = client.post("/v1/agents", json={"slug": slug, "name": slug, "spec": spec}, headers=who)
    assert made.status_code == 201
    assert client.post(f"/v1/agents/{slug}/publish", headers=who).status_code == 201


def _team(team_id: str, lead: str, *members: str, channel: str | None = None) -> dict[str, Any]:
    return {
        "id": team_id,
        "name": team_id,
        "supervisor_agent_id": lead,
        "members": [{"agent_id": lead, "role": "supervisor"}, *({"agent_id": m} for m in members)],
        **({"shared_channel": channel} if channel else {}),
    }


def test_a_released_channel_does_not_hand_its_memories_to_another_user(
    engine: Engine, auth_api: tuple[httpx.Client, dict[str, dict[str, str]]]
) -> None:
    """Bob cannot read alice's team memories by claiming the channel her team released."""
    client, h = auth_api
    for slug in ("a-lead", "a-secret"):
        _agent(client, h["alice"], slug)
    for slug in ("b-lead", "b-spy"):
        _agent(client, h["bob"], slug)
    desk = _team("desk", "a-lead", "a-secret")
    assert client.post("/v1/teams", json=desk, headers=h["alice"]).status_code == 201

    def alice_run_remembers(text: str, delegation_id: str) -> None:
        with session_scope(engine) as s:
            teams.remember(
                s,
                team_id="desk",
                channel="_team_desk",
                agent="a-secret",
                text=text,
                delegation_id=delegation_id,
            )

    alice_run_remembers("merger code word", "d1")  # what a past run of alice's team stored
    # alice moves her team to another channel (or deletes it): `_team_desk` is free again
    moved = _team("desk", "a-lead", "a-secret", channel="desk-v2")
    assert client.put("/v1/teams/desk", json=moved, headers=h["alice"]).status_code == 200
    claim = _team("bobs", "b-lead", "b-spy", channel="_team_desk")
    alice_run_remembers("merger code word again", "d2")  # a run still in flight: nothing
    assert client.post("/v1/teams", json=claim, headers=h["bob"]).status_code == 201
    with session_scope(engine) as s:
        leaked = teams.relevant_memories(
            s, team_id="bobs", channel="_team_desk", task="merger code word"
        )
    assert leaked == []


def test_an_owner_is_never_locked_out_of_her_agent_by_someone_elses_team(
    engine: Engine, auth_api: tuple[httpx.Client, dict[str, dict[str, str]]]
) -> None:
    """Alice, owner of `mine`, can still retire it or remove the team bob built around it."""
    client, h = auth_api
    _agent(client, h["alice"], "mine")
    _agent(client, h["bob"], "b-spy")
    with session_scope(engine) as s:
        auth.grant(s, agent="mine", user_id="bob", role="user")
    grief = _team("grief", "mine", "b-spy")
    assert client.post("/v1/teams", json=grief, headers=h["bob"]).status_code == 201
    deleted_team = client.delete("/v1/teams/grief", headers=h["alice"]).status_code == 204
    retired = client.post("/v1/agents/mine/retire", headers=h["alice"]).status_code == 200
    assert deleted_team or retired


def test_a_hidden_team_is_indistinguishable_from_a_missing_one(
    engine: Engine, auth_api: tuple[httpx.Client, dict[str, dict[str, str]]]
) -> None:
    """Bob gets the same answer for alice's team as for a team that does not exist."""
    client, h = auth_api
    _agent(client, h["alice"], "a-lead")
    hidden_team = _team("hidden", "a-lead")
    assert client.post("/v1/teams", json=hidden_team, headers=h["alice"]).status_code == 201
    for method in ("GET", "DELETE"):
        hidden = client.request(method, "/v1/teams/hidden", headers=h["bob"])
        missing = client.request(method, "/v1/teams/no-such-team", headers=h["bob"])
        assert hidden.status_code == missing.status_code
