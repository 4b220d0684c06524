"""The eval read side over real HTTP: an agent's evals newest first and paged, one eval
with its report, 404 ``eval_not_found`` (missing, another agent's, another user's)."""

from __future__ import annotations

from pathlib import Path

import httpx

from api.app import create_app
from baton.grants import auth
from baton.settings import Settings
from baton.storage.db import init_db, make_engine, session_scope
from tests.conftest import serve
from tests.eval_helpers import insert_eval, report, session_report
from tests.helpers import publish
from tests.test_api_agents import assert_problem


def test_evals_list_newest_first_paged_without_reports(
    api: httpx.Client, settings: Settings
) -> None:
    """The list is newest first, paged by limit/offset with the total in ``count``, and
    carries no report; one eval's answer carries its report."""
    engine = make_engine(settings.database_url)
    publish(engine, "writer", system_prompt="v1")
    publish(engine, "other", system_prompt="v1")
    body = report([session_report(1), session_report(2, candidate="changed")])
    old = insert_eval(engine, "writer", age_s=30, report_body=body, changed=1, total=2)
    new = insert_eval(engine, "writer", age_s=10, status="running", done=1, total=2)
    insert_eval(engine, "other")
    engine.dispose()

    listed = api.get("/v1/agents/writer/evals")
    assert listed.status_code == 200, listed.text
    data = listed.json()
    assert data["count"] == 2 and [e["id"] for e in data["data"]] == [new, old]
    assert all("report" not in e for e in data["data"])
    assert data["data"][0]["status"] == "running" and data["data"][0]["done"] == 1
    second = api.get("/v1/agents/writer/evals", params={"limit": 1, "offset": 1}).json()
    assert second["count"] == 2 and [e["id"] for e in second["data"]] == [old]

    one = api.get(f"/v1/agents/writer/evals/{old}")
    assert one.status_code == 200, one.text
    got = one.json()
    assert got["changed"] == 1 and got["report"] == body
    assert api.get(f"/v1/agents/writer/evals/{new}").json()["report"] is None


def test_an_unknown_or_other_agents_eval_is_not_found(
    api: httpx.Client, settings: Settings
) -> None:
    """A missing eval, and an eval of another agent asked for under this slug, are 404
    ``eval_not_found``; an unknown agent is 404 ``agent_not_found``; a malformed id 422."""
    engine = make_engine(settings.database_url)
    publish(engine, "writer", system_prompt="v1")
    publish(engine, "other", system_prompt="v1")
    theirs = insert_eval(engine, "other")
    engine.dispose()
    assert_problem(api.get("/v1/agents/writer/evals/eval-none"), 404, "eval_not_found")
    assert_problem(api.get(f"/v1/agents/writer/evals/{theirs}"), 404, "eval_not_found")
    assert api.get(f"/v1/agents/other/evals/{theirs}").status_code == 200
    assert_problem(api.get("/v1/agents/ghost/evals"), 404, "agent_not_found")
    assert api.get("/v1/agents/writer/evals/bad%20id").status_code == 422


def test_auth_mode_each_user_reads_her_own_evals_and_owners_read_all(tmp_path: Path) -> None:
    """Auth mode: a viewer of the agent sees only her own evals (another's is 404
    ``eval_not_found`` and absent from the list); the agent's owner reads them all; a
    user with no role on the agent is 403."""
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'auth.db'}", auth="on")
    engine = make_engine(settings.database_url)
    init_db(engine)
    publish(engine, "writer", system_prompt="v1")
    tokens = {}
    with session_scope(engine) as s:
        for user, role in (("alice", "owner"), ("bob", "viewer"), ("carol", "viewer")):
            auth.create_user(s, user_id=user)
            _, tokens[user] = auth.issue_token(s, user_id=user)
            auth.grant(s, agent="writer", user_id=user, role=role)  # type: ignore[arg-type]
        auth.create_user(s, user_id="dave")
        _, tokens["dave"] = auth.issue_token(s, user_id="dave")
    bobs = insert_eval(engine, "writer", owner="bob")
    carols = insert_eval(engine, "writer", owner="carol", age_s=5)
    engine.dispose()
    server, thread, base = serve(create_app(settings))
    try:
        as_ = {
            u: httpx.Client(base_url=base, headers={"Authorization": f"Bearer {t}"})
            for u, t in tokens.items()
        }
        assert as_["bob"].get(f"/v1/agents/writer/evals/{bobs}").status_code == 200
        assert_problem(as_["bob"].get(f"/v1/agents/writer/evals/{carols}"), 404, "eval_not_found")
        assert [e["id"] for e in as_["bob"].get("/v1/agents/writer/evals").json()["data"]] == [bobs]
        owner_view = as_["alice"].get("/v1/agents/writer/evals").json()
        assert owner_view["count"] == 2 and {e["id"] for e in owner_view["data"]} == {bobs, carols}
        assert as_["alice"].get(f"/v1/agents/writer/evals/{carols}").status_code == 200
        assert_problem(as_["dave"].get("/v1/agents/writer/evals"), 403, "forbidden")
        assert_problem(as_["dave"].get(f"/v1/agents/writer/evals/{bobs}"), 403, "forbidden")
        anonymous = httpx.get(f"{base}/v1/agents/writer/evals")
        assert_problem(anonymous, 401, "unauthorized")
        for client in as_.values():
            client.close()
    finally:
        server.should_exit = True
        thread.join(timeout=10)
