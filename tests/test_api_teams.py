"""Teams over real HTTP: /v1/teams CRUD and validation, `baton apply` teams, team runs
with a real worker (routing priority, trace, delegation events) (AgentX Agent Teams;
docs/teams.md; docs/api.md)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlmodel import Session, select

from baton.agents import roster
from baton.storage.db import TeamRow, make_engine
from tests.test_api_agents import assert_problem
from tests.test_apply import Api, _serve_api, baton
from tests.test_e2e_sessions import sse


def agent(api: httpx.Client, slug: str, *, publish: bool = True, **spec: Any) -> None:
    resp = api.post("/v1/agents", json={"slug": slug, "name": slug.title(), "spec": spec})
    assert resp.status_code == 201, resp.text
    if publish:
        assert api.post(f"/v1/agents/{slug}/publish").status_code == 201


def team_body(**over: Any) -> dict[str, Any]:
    """A valid team: lead + checker + writer, one route."""
    body: dict[str, Any] = {
        "id": "desk",
        "name": "Desk",
        "description": "A lead and two specialists.",
        "supervisor_agent_id": "lead",
        "members": [
            {"agent_id": "lead", "role": "supervisor"},
            {"agent_id": "checker", "role": "specialist", "delegation_hint": "checks facts"},
            {"agent_id": "writer", "delegation_hint": "writes prose"},
        ],
        "routes": [{"when": "^check:", "to": "checker"}],
    }
    body.update(over)
    return body


def three_agents(api: httpx.Client) -> None:
    for slug in ("lead", "checker", "writer"):
        agent(api, slug, system_prompt=f"I am {slug}.")


# --- CRUD -----------------------------------------------------------------------


def test_create_get_list_delete_team(api: httpx.Client) -> None:
    """POST 201 (shared_channel defaults to _team_<id>), GET one and list, DELETE 204 then 404."""
    three_agents(api)
    created = api.post("/v1/teams", json=team_body())
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["shared_channel"] == "_team_desk"
    assert body["supervisor_agent_id"] == "lead"
    assert [m["role"] for m in body["members"]] == ["supervisor", "specialist", "specialist"]
    assert body["routes"] == [{"when": "^check:", "to": "checker"}]

    got = api.get("/v1/teams/desk")
    assert got.status_code == 200 and got.json()["members"] == body["members"]
    listed = api.get("/v1/teams").json()
    assert listed["count"] == 1 and [t["id"] for t in listed["data"]] == ["desk"]

    assert api.delete("/v1/teams/desk").status_code == 204
    assert_problem(api.get("/v1/teams/desk"), 404, "team_not_found")
    assert_problem(api.delete("/v1/teams/desk"), 404, "team_not_found")
    assert api.get("/v1/teams").json() == {"data": [], "count": 0}


def test_explicit_shared_channel_is_kept(api: httpx.Client) -> None:
    """A given shared_channel is stored as is instead of the default."""
    three_agents(api)
    resp = api.post("/v1/teams", json=team_body(shared_channel="desk_memory"))
    assert resp.status_code == 201 and resp.json()["shared_channel"] == "desk_memory"


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"id": "Bad_Id"}, "id"),
        ({"id": "-desk"}, "id"),
        (
            {
                "members": [
                    {"agent_id": "lead", "role": "specialist"},
                    {"agent_id": "checker"},
                ],
                "routes": [],
            },
            "no supervisor",
        ),
        (
            {
                "members": [
                    {"agent_id": "lead", "role": "supervisor"},
                    {"agent_id": "checker", "role": "supervisor"},
                ],
                "routes": [],
            },
            "two supervisors",
        ),
        ({"supervisor_agent_id": "checker"}, "supervisor mismatch"),
        (
            {
                "members": [
                    {"agent_id": "lead", "role": "supervisor"},
                    {"agent_id": "checker"},
                    {"agent_id": "checker"},
                ],
                "routes": [],
            },
            "duplicate member",
        ),
        ({"routes": [{"when": "^x", "to": "lead"}]}, "route to the supervisor"),
        ({"routes": [{"when": "^x", "to": "ghost"}]}, "route to a non-member"),
        ({"routes": [{"when": "([", "to": "checker"}]}, "bad regex"),
        ({"members": []}, "no members"),
    ],
)
def test_invalid_team_is_422(api: httpx.Client, change: dict[str, Any], where: str) -> None:
    """Each validation rule (id pattern, one supervisor, members, routes) is a 422 problem."""
    three_agents(api)
    body = assert_problem(api.post("/v1/teams", json=team_body(**change)), 422, "validation_error")
    assert body["detail"], where
    assert api.get("/v1/teams").json()["count"] == 0


def test_unknown_member_is_404_and_duplicate_id_is_409(api: httpx.Client) -> None:
    """A member that is not an agent → 404 agent_not_found; a taken id → 409 team_exists."""
    three_agents(api)
    members = [*team_body()["members"], {"agent_id": "ghost"}]
    problem = assert_problem(
        api.post("/v1/teams", json=team_body(members=members)), 404, "agent_not_found"
    )
    assert "ghost" in problem["detail"]
    assert api.post("/v1/teams", json=team_body()).status_code == 201
    assert_problem(api.post("/v1/teams", json=team_body()), 409, "team_exists")


def test_put_creates_then_replaces(api: httpx.Client) -> None:
    """PUT is 201 for a new team, 200 when replacing; a body id differing from the path is 422."""
    three_agents(api)
    first = api.put("/v1/teams/desk", json=team_body())
    assert first.status_code == 201, first.text
    members = [{"agent_id": "lead", "role": "supervisor"}, {"agent_id": "writer"}]
    second = api.put("/v1/teams/desk", json=team_body(name="Desk 2", members=members, routes=[]))
    assert second.status_code == 200, second.text
    assert second.json()["name"] == "Desk 2"
    assert [m["agent_id"] for m in api.get("/v1/teams/desk").json()["members"]] == [
        "lead",
        "writer",
    ]
    assert_problem(api.put("/v1/teams/other", json=team_body()), 422, "invalid_team")
    assert_problem(api.get("/v1/teams/other"), 404, "team_not_found")


def test_renaming_a_member_keeps_the_team_and_members_cannot_be_removed(
    api: httpx.Client,
) -> None:
    """Teams name members by slug: a display-name edit changes nothing; deleting or retiring
    a member is refused with 409 agent_in_use until the team is gone."""
    three_agents(api)
    assert api.post("/v1/teams", json=team_body()).status_code == 201
    renamed = api.patch("/v1/agents/checker", json={"name": "Fact Checker Deluxe"})
    assert renamed.status_code == 200 and renamed.json()["name"] == "Fact Checker Deluxe"
    team = api.get("/v1/teams/desk").json()
    assert [m["agent_id"] for m in team["members"]] == ["lead", "checker", "writer"]
    assert api.put("/v1/teams/desk", json=team_body()).status_code == 200

    for slug in ("checker", "lead"):
        problem = assert_problem(api.delete(f"/v1/agents/{slug}"), 409, "agent_in_use")
        assert "desk" in problem["detail"]
        assert_problem(api.post(f"/v1/agents/{slug}/retire"), 409, "agent_in_use")
    assert api.get("/v1/agents/checker").json()["retired"] is False

    assert api.delete("/v1/teams/desk").status_code == 204
    assert api.post("/v1/agents/checker/retire").status_code == 200
    assert api.delete("/v1/agents/writer").status_code == 204


# --- baton apply ----------------------------------------------------------------

APPLY_FILE = """\
agents:
  - {slug: lead, name: Lead, spec: {system_prompt: lead}}
  - {slug: checker, name: Checker, spec: {system_prompt: check}}
teams:
  - id: desk
    name: Desk
    supervisor_agent_id: lead
    members:
      - {agent_id: lead, role: supervisor}
      - {agent_id: checker, delegation_hint: checks facts}
    routes:
      - {when: "^check:", to: checker}
"""


@pytest.fixture
def apply_api(tmp_path: Path) -> Iterator[Api]:
    """The real API `baton apply` talks to, on its own SQLite file."""
    yield from _serve_api(tmp_path)


def test_apply_creates_a_team_then_reports_it_unchanged(apply_api: Api, tmp_path: Path) -> None:
    """`baton apply` with a teams: section creates the team; applying again leaves it unchanged;
    an edited team is reported updated."""
    db_url = apply_api.db_url
    f = tmp_path / "baton.yaml"
    f.write_text(APPLY_FILE)
    first = baton(apply_api, "apply", "-f", str(f))
    assert first.returncode == 0, first.stderr
    line = next(x for x in first.stdout.splitlines() if "team:desk" in x)
    assert "created" in line
    second = baton(apply_api, "apply", "-f", str(f))
    assert second.returncode == 0, second.stderr
    line = next(x for x in second.stdout.splitlines() if "team:desk" in x)
    assert "unchanged" in line
    assert second.stdout.count("unchanged") == 3

    f.write_text(APPLY_FILE.replace("checks facts", "checks every fact"))
    third = baton(apply_api, "apply", "-f", str(f))
    assert third.returncode == 0, third.stderr
    line = next(x for x in third.stdout.splitlines() if "team:desk" in x)
    assert "updated" in line

    engine = make_engine(db_url)
    try:
        with Session(engine) as s:
            (row,) = s.exec(select(TeamRow)).all()
    finally:
        engine.dispose()
    assert row.shared_channel == "_team_desk" and row.supervisor_agent_id == "lead"
    assert row.members[1]["delegation_hint"] == "checks every fact"


def test_apply_refuses_a_team_with_an_unknown_member(apply_api: Api, tmp_path: Path) -> None:
    """A teams: entry naming an agent that does not exist fails the apply and stores no team."""
    db_url = apply_api.db_url
    f = tmp_path / "baton.yaml"
    f.write_text(
        APPLY_FILE.replace("{agent_id: checker,", "{agent_id: ghost,").replace(
            "to: checker", "to: ghost"
        )
    )
    out = baton(apply_api, "apply", "-f", str(f))
    assert out.returncode != 0
    assert "ghost" in out.stdout + out.stderr
    engine = make_engine(db_url)
    try:
        with Session(engine) as s:
            assert s.exec(select(TeamRow)).all() == []
    finally:
        engine.dispose()


# --- team runs over HTTP (real worker) --------------------------------------------

LEAD_PLAYBOOK = [
    {"when": "^delegate_to: ", "reply": "SYNTH {last_message}"},
    {
        "when": "go",
        "reply": "Delegating.",
        "tool_calls": [
            {"tool": "delegate_to", "args": {"agent_id": "checker", "task": "check the claim"}},
            {"tool": "delegate_to", "args": {"agent_id": "writer", "task": "write the memo"}},
        ],
    },
]


def live_team(api: httpx.Client) -> None:
    agent(api, "checker", playbook=[{"reply": "CHECKED"}])
    agent(api, "writer", playbook=[{"reply": "WRITTEN"}])
    agent(api, "lead", playbook=LEAD_PLAYBOOK)
    agent(api, "solo", playbook=[{"reply": "SOLO here"}])
    assert api.post("/v1/teams", json=team_body(routes=[])).status_code == 201


def test_team_run_over_http_events_and_trace(live_api: httpx.Client) -> None:
    """POST /v1/sessions {team} runs the supervisor; the root's SSE stream carries
    delegation_start/complete with the seed's fields; GET …/trace is the tree with usage."""
    live_team(live_api)
    # A renamed member still runs: teams reference slugs.
    assert live_api.patch("/v1/agents/writer", json={"name": "Scribe"}).status_code == 200
    resp = live_api.post("/v1/sessions", json={"team": "desk", "prompt": "go", "sync": True})
    assert resp.status_code == 201, resp.text
    body = resp.json()
    assert body["agent"] == "lead"
    assert body["response"] == "SYNTH CHECKED\nWRITTEN"
    sid = body["session_id"]

    events = sse(live_api, f"/v1/sessions/{sid}/events?until=idle")
    starts = [e["data"] for e in events if e["event"] == "delegation_start"]
    completes = [e["data"] for e in events if e["event"] == "delegation_complete"]
    assert sorted(s["target_agent_id"] for s in starts) == ["checker", "writer"]
    for start in starts:
        assert start["delegation_id"] and start["depth"] == 1
        assert start["supervisor_agent_id"] == "lead"
        assert start["shared_channel"] == "_team_desk"
        assert start["task"] in ("check the claim", "write the memo")
    assert {c["delegation_id"] for c in completes} == {s["delegation_id"] for s in starts}
    for done in completes:
        assert done["status"] == "completed" and done["error"] is None
        assert done["result_preview"] in ("CHECKED", "WRITTEN")
        assert done["target_agent_id"] in ("checker", "writer")
    chunks = [e["data"] for e in events if e["event"] == "delegation_chunk"]
    assert {c["target_agent_id"] for c in chunks} == {"checker", "writer"}
    assert all(c["content"] and c["delegation_id"] for c in chunks)

    trace = live_api.get(f"/v1/sessions/{sid}/trace")
    assert trace.status_code == 200, trace.text
    tree = trace.json()
    assert tree["session_id"] == sid and tree["agent"] == "lead" and tree["delegation"] is None
    assert tree["usage"]["requests"] == 2
    assert sorted(c["agent"] for c in tree["children"]) == ["checker", "writer"]
    for child in tree["children"]:
        assert child["usage"]["requests"] == 1
        assert child["usage"]["input_tokens"] > 0 and child["usage"]["output_tokens"] > 0
        assert child["subtree_usage"] == child["usage"]
        d = child["delegation"]
        assert d["kind"] == "delegate_to" and d["caller"] == "lead" and d["depth"] == 1
        assert d["status"] == "completed" and isinstance(d["wall_ms"], int)
    subtree = tree["subtree_usage"]
    assert subtree["requests"] == 4
    assert subtree["input_tokens"] == tree["usage"]["input_tokens"] + sum(
        c["usage"]["input_tokens"] for c in tree["children"]
    )
    assert subtree["output_tokens"] == tree["usage"]["output_tokens"] + sum(
        c["usage"]["output_tokens"] for c in tree["children"]
    )
    # The members' messages are attributed to them in their transcripts.
    for child in tree["children"]:
        msgs = live_api.get(f"/v1/sessions/{child['session_id']}/transcript").json()["messages"]
        assert [m["agent"] for m in msgs if m["role"] == "assistant"] == [child["agent"]]
    root_msgs = live_api.get(f"/v1/sessions/{sid}/transcript").json()["messages"]
    assert {m["agent"] for m in root_msgs} == {"lead"}


def test_routing_priority_team_then_target_then_agent(live_api: httpx.Client) -> None:
    """team > target_agent > agent: the session's agent is the team's lead, else the target."""
    live_team(live_api)
    all_three = live_api.post(
        "/v1/sessions",
        json={"team": "desk", "target_agent": "writer", "agent": "solo", "prompt": "hi"},
    )
    assert all_three.status_code == 201, all_three.text
    assert all_three.json()["agent"] == "lead"
    target = live_api.post(
        "/v1/sessions",
        json={"target_agent": "writer", "agent": "solo", "prompt": "hi", "sync": True},
    )
    assert target.status_code == 201 and target.json()["agent"] == "writer"
    assert target.json()["response"] == "WRITTEN"
    plain = live_api.post("/v1/sessions", json={"agent": "solo", "prompt": "hi", "sync": True})
    assert plain.json()["agent"] == "solo" and plain.json()["response"] == "SOLO here"
    assert_problem(
        live_api.post("/v1/sessions", json={"team": "nope", "prompt": "hi"}), 404, "team_not_found"
    )
    assert_problem(live_api.post("/v1/sessions", json={"prompt": "hi"}), 422, "no_agent")
    detail = live_api.get(f"/v1/sessions/{all_three.json()['session_id']}").json()
    assert detail["agent"] == "lead"


def test_solo_is_ignored_for_a_team_run_over_http(live_api: httpx.Client) -> None:
    """disable_delegation with a team still lets the lead delegate (a team run is delegation)."""
    live_team(live_api)
    resp = live_api.post(
        "/v1/sessions",
        json={"team": "desk", "prompt": "go", "sync": True, "disable_delegation": True},
    )
    assert resp.status_code == 201, resp.text
    assert resp.json()["response"] == "SYNTH CHECKED\nWRITTEN"


def test_trace_of_unknown_session_is_404(live_api: httpx.Client) -> None:
    """GET /v1/sessions/{id}/trace of a session that does not exist is 404."""
    missing = "session-00000000-0000-0000-0000-000000000000"
    assert_problem(live_api.get(f"/v1/sessions/{missing}/trace"), 404, "session_not_found")


def test_solo_session_over_http_cannot_delegate(live_api: httpx.Client) -> None:
    """POST /v1/sessions with disable_delegation: the agent's delegate_to is refused
    delegation_unavailable; without it the same call reaches the roster agent."""
    agent(
        live_api,
        "helper",
        playbook=[{"reply": "HELPED"}],
        delegation={"available_for_delegation": True},
    )
    agent(
        live_api,
        "host",
        playbook=[
            {"when": "^delegate_to: ", "reply": "GOT {last_message}"},
            {"tool_calls": [{"tool": "delegate_to", "args": {"agent_id": "helper", "task": "t"}}]},
        ],
    )
    roster.clear_cache()
    team_mode = live_api.post("/v1/sessions", json={"agent": "host", "prompt": "go", "sync": True})
    assert team_mode.status_code == 201, team_mode.text
    assert team_mode.json()["response"] == "GOT HELPED"
    solo = live_api.post(
        "/v1/sessions",
        json={"agent": "host", "prompt": "go", "sync": True, "disable_delegation": True},
    )
    assert solo.status_code == 201, solo.text
    assert "delegation_unavailable" in solo.json()["response"]
    sid = solo.json()["session_id"]
    assert live_api.get(f"/v1/sessions/{sid}/trace").json()["children"] == []
