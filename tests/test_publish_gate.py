"""The publish gate over real HTTP on a real SQLite file (evals written as the eval
workflow leaves them): a gated draft needs a completed eval of itself that meets the
gate, each limit at its edge, the revision records the eval, no gate changes nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.engine import Engine

from api.app import create_app
from baton.agents.apply import ApplyFile, apply_agents
from baton.agents.spec import AgentSpec, spec_digest
from baton.contracts.evals import PublishGate
from baton.errors import BatonError
from baton.settings import Settings
from baton.storage.db import make_engine, session_scope
from tests.conftest import migrated, serve
from tests.eval_helpers import insert_eval
from tests.helpers import refused_start_line
from tests.test_api_agents import assert_problem
from tests.test_cli_steps import invoke

GATE = {"eval_sessions": 10, "max_changed": 2, "max_regressions": 0}


def digest(**spec: Any) -> str:
    """The digest publish computes for a draft with ``spec``."""
    return spec_digest(AgentSpec.model_validate(spec))


def create_published(api: httpx.Client, slug: str, **spec: Any) -> None:
    """Create ``slug`` with ``spec`` and publish it (a first publish is never gated)."""
    created = api.post("/v1/agents", json={"slug": slug, "name": slug, "spec": spec})
    assert created.status_code == 201, created.text
    first = api.post(f"/v1/agents/{slug}/publish")
    assert first.status_code == 201 and first.json()["eval_id"] is None, first.text


def edit(api: httpx.Client, slug: str, **spec: Any) -> str:
    """Replace the draft of ``slug``; returns its digest."""
    assert api.put(f"/v1/agents/{slug}/draft", json=spec).status_code == 200
    return digest(**spec)


def publish(api: httpx.Client, slug: str, eval_id: str | None = None) -> httpx.Response:
    body = {"eval_id": eval_id} if eval_id else None
    return api.post(f"/v1/agents/{slug}/publish", json=body)


def versions(api: httpx.Client, slug: str) -> int:
    return int(api.get(f"/v1/agents/{slug}/revisions").json()["count"])


@pytest.fixture
def engine(settings: Settings, api: httpx.Client) -> Iterator[Engine]:
    """The API's database, to write evals into."""
    eng = make_engine(settings.database_url)
    try:
        yield eng
    finally:
        eng.dispose()


def test_no_gate_publishes_as_before(api: httpx.Client) -> None:
    """Without a gate an edited draft publishes with no eval and records none."""
    create_published(api, "plain", system_prompt="v1")
    edit(api, "plain", system_prompt="v2")
    resp = publish(api, "plain")
    assert resp.status_code == 201 and resp.json()["version"] == 2
    assert resp.json()["eval_id"] is None


def test_a_gated_draft_without_an_eval_is_refused(api: httpx.Client, engine: Engine) -> None:
    """Under a spec's gate an edited draft with no eval (or only a running one, or one of
    another agent) is 409 ``eval_required`` naming the gate, and nothing is published."""
    create_published(api, "gated", system_prompt="v1", publish_gate=GATE)
    d2 = edit(api, "gated", system_prompt="v2", publish_gate=GATE)
    insert_eval(engine, "gated", digest=d2, status="running", done=3)
    insert_eval(engine, "other", digest=d2)
    body = assert_problem(publish(api, "gated"), 409, "eval_required")
    assert body["gate"] == GATE and "baton eval gated" in body["detail"]
    assert versions(api, "gated") == 1


@pytest.mark.parametrize(
    ("limit", "at_bound", "one_past"),
    [
        ("eval_sessions", {"total": 10}, {"total": 9}),
        ("max_changed", {"changed": 2}, {"changed": 3}),
        ("max_regressions", {"regressions": 0}, {"regressions": 1}),
    ],
)
def test_each_limit_is_ok_at_its_bound_and_refused_one_past(
    api: httpx.Client,
    engine: Engine,
    limit: str,
    at_bound: dict[str, Any],
    one_past: dict[str, Any],
) -> None:
    """An eval one past a limit is 409 ``eval_failed`` naming the eval and the limit; one
    at the bound publishes, and the revision (and GET of it) records that eval."""
    create_published(api, "edge", system_prompt="v1", publish_gate=GATE)
    d2 = edit(api, "edge", system_prompt="v2", publish_gate=GATE)
    past = insert_eval(engine, "edge", digest=d2, **{"total": 10, **one_past})
    body = assert_problem(publish(api, "edge", past), 409, "eval_failed")
    assert (body["eval_id"], body["failed"], body["gate"]) == (past, limit, GATE)
    assert versions(api, "edge") == 1
    ok = insert_eval(engine, "edge", digest=d2, age_s=60, **{"total": 10, **at_bound})
    resp = publish(api, "edge", ok)
    assert resp.status_code == 201, resp.text
    assert resp.json()["eval_id"] == ok and resp.json()["version"] == 2
    assert api.get("/v1/agents/edge/revisions/2").json()["eval_id"] == ok


def test_an_eval_of_an_earlier_draft_is_refused(api: httpx.Client, engine: Engine) -> None:
    """A passing eval of the draft before an edit no longer counts: without ``eval_id``
    it is 409 ``eval_required``, named it is 409 ``eval_failed`` (``candidate``)."""
    create_published(api, "moving", system_prompt="v1", publish_gate=GATE)
    d2 = edit(api, "moving", system_prompt="v2", publish_gate=GATE)
    earlier = insert_eval(engine, "moving", digest=d2)
    edit(api, "moving", system_prompt="v3", publish_gate=GATE)
    assert_problem(publish(api, "moving"), 409, "eval_required")
    body = assert_problem(publish(api, "moving", earlier), 409, "eval_failed")
    assert (body["eval_id"], body["failed"]) == (earlier, "candidate")


def test_a_named_eval_must_be_a_completed_eval_of_this_agent(
    api: httpx.Client, engine: Engine
) -> None:
    """A running or failed eval is ``eval_failed`` (``status``), one of another agent
    (``agent``), one of a revision rather than the draft (``candidate``); an unknown id
    is 404 ``eval_not_found``."""
    create_published(api, "named", system_prompt="v1", publish_gate=GATE)
    create_published(api, "else", system_prompt="v1")
    d2 = edit(api, "named", system_prompt="v2", publish_gate=GATE)
    cases = {
        "status": insert_eval(engine, "named", digest=d2, status="running", done=4),
        "agent": insert_eval(engine, "else", digest=d2),
        "candidate": insert_eval(engine, "named", digest=d2, candidate="named@1"),
    }
    failed = insert_eval(engine, "named", digest=d2, status="failed")
    for reason, eval_id in [*cases.items(), ("status", failed)]:
        body = assert_problem(publish(api, "named", eval_id), 409, "eval_failed")
        assert (body["eval_id"], body["failed"]) == (eval_id, reason)
    assert_problem(publish(api, "named", "eval-unknown"), 404, "eval_not_found")
    assert publish(api, "named", "not an id").status_code == 422
    assert versions(api, "named") == 1


def test_without_eval_id_the_newest_completed_eval_of_the_draft_is_used(
    api: httpx.Client, engine: Engine
) -> None:
    """With no ``eval_id`` the newest completed eval of this draft decides: a newer
    failing one refuses even when an older one passes; a newer passing one publishes."""
    create_published(api, "newest", system_prompt="v1", publish_gate=GATE)
    d2 = edit(api, "newest", system_prompt="v2", publish_gate=GATE)
    insert_eval(engine, "newest", digest=d2, age_s=90)
    failing = insert_eval(engine, "newest", digest=d2, changed=3, age_s=60)
    insert_eval(engine, "newest", digest=d2, status="running", age_s=1)
    body = assert_problem(publish(api, "newest"), 409, "eval_failed")
    assert (body["eval_id"], body["failed"]) == (failing, "max_changed")
    passing = insert_eval(engine, "newest", digest=d2, age_s=30)
    resp = publish(api, "newest")
    assert resp.status_code == 201 and resp.json()["eval_id"] == passing


def test_a_draft_cannot_drop_the_gate_in_force_but_can_tighten_it(
    api: httpx.Client, engine: Engine
) -> None:
    """A draft that removes its gate is still gated by the published revision's; a draft
    that tightens it is gated by the stricter one at once."""
    create_published(api, "sly", system_prompt="v1", publish_gate=GATE)
    edit(api, "sly", system_prompt="v2")
    assert_problem(publish(api, "sly"), 409, "eval_required")
    strict = {"eval_sessions": 20, "max_changed": 5, "max_regressions": 0}
    d3 = edit(api, "sly", system_prompt="v3", publish_gate=strict)
    ten = insert_eval(engine, "sly", digest=d3, total=10, changed=2)
    body = assert_problem(publish(api, "sly", ten), 409, "eval_failed")
    assert body["failed"] == "eval_sessions"
    assert body["gate"] == {"eval_sessions": 20, "max_changed": 2, "max_regressions": 0}


def test_a_base_gate_is_inherited_through_extends(api: httpx.Client, engine: Engine) -> None:
    """An agent whose spec sets no gate takes the nearest base's (extends)."""
    create_published(api, "base", system_prompt="b", publish_gate=GATE)
    create_published(api, "derived", extends="base", system_prompt="d1")
    d2 = edit(api, "derived", extends="base", system_prompt="d2")
    assert_problem(publish(api, "derived"), 409, "eval_required")
    passing = insert_eval(engine, "derived", digest=d2)
    assert publish(api, "derived").json()["eval_id"] == passing


def test_the_deployment_gate_applies_and_a_spec_gate_wins(tmp_path: Path) -> None:
    """BATON_PUBLISH_GATE gates agents whose spec sets none; a spec's own gate replaces it."""
    settings = Settings(
        database_url=migrated(f"sqlite:///{tmp_path / 'gate.db'}"),
        publish_gate="eval_sessions=10,max_changed=0",
    )
    server, thread, base = serve(create_app(settings))
    eng = make_engine(settings.database_url)
    try:
        with httpx.Client(base_url=base, timeout=30) as api:
            create_published(api, "any", system_prompt="v1")
            d2 = edit(api, "any", system_prompt="v2")
            assert_problem(publish(api, "any"), 409, "eval_required")
            changed = insert_eval(eng, "any", digest=d2, changed=1)
            body = assert_problem(publish(api, "any", changed), 409, "eval_failed")
            assert body["gate"] == {"eval_sessions": 10, "max_changed": 0, "max_regressions": 0}
            own = {"eval_sessions": 1, "max_changed": 1, "max_regressions": 0}
            create_published(api, "own", system_prompt="v1", publish_gate=own)
            o2 = edit(api, "own", system_prompt="v2", publish_gate=own)
            small = insert_eval(eng, "own", digest=o2, total=1, changed=1)
            assert publish(api, "own").json()["eval_id"] == small
    finally:
        eng.dispose()
        server.should_exit = True
        thread.join(timeout=10)


def test_apply_to_the_database_passes_the_same_gate(api: httpx.Client, engine: Engine) -> None:
    """`baton apply --direct-db`'s publish is gated like the API's: refused without an
    eval (nothing written), published with one."""
    create_published(api, "applied", system_prompt="v1", publish_gate=GATE)
    doc = ApplyFile.model_validate(
        {"agents": [{"slug": "applied", "name": "applied", "spec": {"system_prompt": "v2"}}]}
    )
    with pytest.raises(BatonError) as refused, session_scope(engine) as s:
        apply_agents(s, doc=doc, default_gate=None)
    assert refused.value.code == "eval_required"
    insert_eval(engine, "applied", digest=digest(system_prompt="v2"))
    with session_scope(engine) as s:
        (result,) = apply_agents(s, doc=doc)
    assert (result.version, result.change) == (2, "published")


def test_the_setting_is_refused_when_malformed() -> None:
    """BATON_PUBLISH_GATE: each bound is taken at its edge and refused one past it; a
    malformed value is refused naming what is wrong; blank is no gate."""
    edge = Settings(publish_gate="eval_sessions=1000,max_changed=1000,max_regressions=1000")
    assert edge.publish_gate_config() == PublishGate(
        eval_sessions=1000, max_changed=1000, max_regressions=1000
    )
    assert Settings(publish_gate='{"eval_sessions": 1, "max_changed": 0}').publish_gate_config()
    assert Settings(publish_gate=" ").publish_gate_config() is None
    for bad, says in [
        ("eval_sessions=0,max_changed=0", "eval_sessions"),
        ("eval_sessions=1001,max_changed=0", "eval_sessions"),
        ("eval_sessions=1,max_changed=1001", "max_changed"),
        ("eval_sessions=1,max_changed=-1", "max_changed"),
        ("eval_sessions=1", "max_changed: Field required"),
        ("eval_sessions=1,max_changed=0,typo=1", "typo"),
        ("eval_sessions", "is not name=value"),
        ("{nope", "Invalid JSON"),
    ]:
        with pytest.raises(ValueError, match=says):
            Settings(publish_gate=bad)


def test_a_spec_gate_is_bounded() -> None:
    """A spec's publish_gate: 1000 is taken, 1001 and eval_sessions 0 are refused."""
    at = {"eval_sessions": 1000, "max_changed": 1000, "max_regressions": 1000}
    assert AgentSpec.model_validate({"publish_gate": at}).publish_gate is not None
    for past in ({**at, "max_regressions": 1001}, {**at, "eval_sessions": 0}):
        with pytest.raises(ValueError, match="publish_gate"):
            AgentSpec.model_validate({"publish_gate": past})


def test_baton_agents_publish_takes_the_eval(
    api: httpx.Client, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`baton agents publish SLUG` prints the refusal's code and exits 1 under a gate with
    no eval; with `--eval ID` it publishes and prints the eval passed."""
    monkeypatch.setenv("BATON_API_URL", str(api.base_url))
    monkeypatch.delenv("BATON_TOKEN", raising=False)
    create_published(api, "cli", system_prompt="v1", publish_gate=GATE)
    d2 = edit(api, "cli", system_prompt="v2", publish_gate=GATE)
    refused = invoke("agents", "publish", "cli")
    assert refused.exit_code == 1 and "eval_required" in refused.output
    passing = insert_eval(engine, "cli", digest=d2)
    done = invoke("agents", "publish", "cli", "--eval", passing)
    assert done.exit_code == 0, done.output
    assert f"cli@2: published and live, passed eval {passing}" in " ".join(done.output.split())
    again = invoke("agents", "publish", "cli")
    assert again.exit_code == 0 and "unchanged" in again.output


def test_baton_api_refuses_to_start_with_a_malformed_gate(tmp_path: Path) -> None:
    """`baton api` with a malformed BATON_PUBLISH_GATE stops at start with exit 1 and one
    line naming the setting and the bad field."""
    env = {"BATON_PUBLISH_GATE": "eval_sessions=0,max_changed=1"}
    line = refused_start_line(tmp_path, ["api", "--port", "0"], env)
    assert "BATON_PUBLISH_GATE" in line and "eval_sessions" in line
