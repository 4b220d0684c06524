"""A published revision's bases are immutable pins (Xema Agent Concepts, 'Agent references':
compile to immutable pins): republishing a base changes no published agent; `rebase` is the
explicit move; the agent's view says when a base moved. On SQLite and PostgreSQL (the
registry suite's `session` fixture), over the API in auth mode, and through migration 0009."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlmodel import Session
from temporalio.testing import WorkflowEnvironment

from baton.agents import registry
from baton.agents.spec import AgentSpec
from baton.errors import AgentInUse, AgentNotPublished, AgentRetired
from baton.storage import migrate
from baton.storage.db import utcnow
from tests.test_api_reviews import agent, final_text, launch, running_stack, settled
from tests.test_auth import Users, grant
from tests.test_auth import registry_auth as registry_auth  # the fixture, re-exported
from tests.test_auth_references import forbidden_at, make, revoke
from tests.test_cli_reviews import Run
from tests.test_cli_reviews import cli as cli  # the fixture, re-exported
from tests.test_migrations import empty_engine as empty_engine  # the fixtures, re-exported
from tests.test_migrations import empty_url as empty_url
from tests.test_registry import put


def pins(session: Session, slug: str, version: int) -> list[str] | None:
    """The stored ``extends_pins`` of ``slug@version``."""
    return registry.get_revision(session, slug=slug, version=version).extends_pins


def view(session: Session, slug: str) -> dict[str, Any]:
    """``GET /v1/agents/{slug}`` as the registry builds it (JSON)."""
    agent = registry.get_agent(session, slug=slug)
    return registry.to_public(session, agent).model_dump(mode="json")


def test_republishing_a_base_does_not_change_a_published_child(session: Session) -> None:
    """child@1 records base@1 and keeps resolving it after base publishes v2; republishing
    the unchanged child is what moves it (its draft follows the live base)."""
    put(session, "base", system_prompt="base one")
    put(session, "child", extends="base", system_prompt="child")
    assert pins(session, "child", 1) == ["base@1"]
    assert pins(session, "base", 1) == []
    put(session, "base", system_prompt="base two")
    resolved = registry.resolve_agent(session, ref="child")
    assert resolved.inheritance == ["child@1", "base@1"]
    assert resolved.system_prompt == "base one\n\nchild"
    assert registry.resolve_agent(session, ref="child@1").system_prompt == "base one\n\nchild"
    # The same draft published again is a new revision: same spec digest, new pins.
    assert put(session, "child", extends="base", system_prompt="child") == (2, True)
    assert pins(session, "child", 2) == ["base@2"]
    assert registry.get_revision(session, slug="child", version=1).digest == (
        registry.get_revision(session, slug="child", version=2).digest
    )
    assert put(session, "child", extends="base", system_prompt="child") == (2, False)


def test_rebase_pins_the_whole_chain_to_the_live_bases(session: Session) -> None:
    """child → mid → base is pinned link by link; after base@2 the view flags base (pinned 1,
    live 2); rebase publishes child@2 on [mid@1, base@2] and leaves the draft alone; a second
    rebase publishes nothing."""
    put(session, "base", system_prompt="base one")
    put(session, "mid", extends="base", system_prompt="mid")
    put(session, "child", extends="mid", system_prompt="child")
    assert pins(session, "child", 1) == ["mid@1", "base@1"]
    shown = view(session, "child")
    assert shown["bases"] == [
        {"agent": "mid", "pinned": 1, "live": 1},
        {"agent": "base", "pinned": 1, "live": 1},
    ]
    assert shown["base_update_available"] is False
    put(session, "base", system_prompt="base two")
    assert view(session, "mid")["bases"] == [{"agent": "base", "pinned": 1, "live": 2}]
    shown = view(session, "child")
    assert shown["bases"][1] == {"agent": "base", "pinned": 1, "live": 2}
    assert shown["base_update_available"] is True
    registry.save_draft(session, slug="child", spec=AgentSpec(system_prompt="work in progress"))
    rev, created = registry.rebase(session, slug="child")
    session.commit()
    assert (rev.version, created, rev.extends_pins) == (2, True, ["mid@1", "base@2"])
    assert AgentSpec.model_validate(rev.spec) == AgentSpec(extends="mid", system_prompt="child")
    assert registry.resolve_agent(session, ref="child").system_prompt == (
        "base two\n\nmid\n\nchild"
    )
    draft = registry.to_public(session, registry.get_agent(session, slug="child")).draft
    assert draft == AgentSpec(system_prompt="work in progress")
    assert view(session, "child")["base_update_available"] is False
    again, created = registry.rebase(session, slug="child")
    assert (again.version, created) == (2, False)
    # mid itself was not rebased: it still means base one.
    assert registry.resolve_agent(session, ref="mid").system_prompt == "base one\n\nmid"


def test_a_session_runs_the_pinned_base_until_a_rebase(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """Over the real stack: after base publishes a new playbook, a session of child still
    answers with base@1's; after POST …/rebase, a new session answers with base@2's."""
    with running_stack(temporal_env, tmp_path / "pins.db") as st:
        http = st.http
        agent(http, "base", [{"reply": "base one"}])
        made = http.post(
            "/v1/agents", json={"slug": "child", "name": "C", "spec": {"extends": "base"}}
        )
        assert made.status_code == 201, made.text
        assert http.post("/v1/agents/child/publish").status_code == 201
        new = http.put("/v1/agents/base/draft", json={"playbook": [{"reply": "base two"}]})
        assert new.status_code == 200 and http.post("/v1/agents/base/publish").status_code == 201
        sid = launch(http, "child")
        settled(http, sid)
        assert final_text(http, sid) == "base one"
        assert http.get("/v1/agents/child").json()["base_update_available"] is True
        rebased = http.post("/v1/agents/child/rebase")
        assert rebased.status_code == 201, rebased.text
        sid = launch(http, "child")
        settled(http, sid)
        assert final_text(http, sid) == "base two"


def test_an_explicit_base_pin_is_no_update(session: Session) -> None:
    """``extends: base@1`` stays base@1: a newer base is not flagged and rebase changes
    nothing."""
    put(session, "base", system_prompt="one")
    put(session, "held", extends="base@1")
    put(session, "base", system_prompt="two")
    assert view(session, "held")["bases"] == [{"agent": "base", "pinned": 1, "live": 1}]
    assert registry.rebase(session, slug="held")[1] is False


def test_rebase_needs_a_live_revision(session: Session) -> None:
    """Rebasing a never-published agent is agent_not_published, a retired one agent_retired."""
    registry.create_agent(session, slug="fresh", name="Fresh")
    session.commit()
    with pytest.raises(AgentNotPublished):
        registry.rebase(session, slug="fresh")
    session.rollback()
    put(session, "gone", system_prompt="x")
    registry.retire(session, slug="gone")
    session.commit()
    with pytest.raises(AgentRetired):
        registry.rebase(session, slug="gone")
    session.rollback()


def test_a_base_pinned_further_down_the_chain_cannot_be_retired(session: Session) -> None:
    """child@1 pins base through mid; once mid stops extending base, base still cannot be
    retired or deleted while child's live revision pins it."""
    put(session, "base", system_prompt="b")
    put(session, "mid", extends="base")
    put(session, "child", extends="mid")
    put(session, "mid", system_prompt="standalone")
    with pytest.raises(AgentInUse) as info:
        registry.retire(session, slug="base")
    assert info.value.extra["dependents"] == ["child@1"]
    session.rollback()
    assert registry.resolve_agent(session, ref="child").inheritance == [
        "child@1",
        "mid@1",
        "base@1",
    ]


def test_a_revoked_base_role_freezes_the_child_at_its_pins(
    registry_auth: tuple[Users, Engine, Path],
) -> None:
    """After bob loses viewer on alice's base, her new base revision never reaches bob's
    agent: it stays on base@1, its view says a newer base exists, and his rebase is 403 at
    `extends` until the role is back; then it pins base@2."""
    users, engine, _ = registry_auth
    alice, bob = users["alice"], users["bob"]
    make(alice, "base", {"system_prompt": "base one"})
    grant(engine, "base", "bob", "viewer")
    make(bob, "mine", {"extends": "base", "system_prompt": "bob's part"})
    revoke(engine, "base", "bob")
    assert alice.put("/v1/agents/base/draft", json={"system_prompt": "base two"}).status_code == 200
    assert alice.post("/v1/agents/base/publish").status_code == 201
    shown = bob.get("/v1/agents/mine").json()
    assert shown["live_version"] == 1 and shown["base_update_available"] is True
    assert shown["bases"] == [{"agent": "base", "pinned": 1, "live": 2}]
    forbidden_at(bob.post("/v1/agents/mine/rebase"), "extends", "base")
    with Session(engine) as s:
        assert registry.resolve_agent(s, ref="mine").system_prompt == "base one\n\nbob's part"
    grant(engine, "base", "bob", "viewer")
    rebased = bob.post("/v1/agents/mine/rebase")
    assert rebased.status_code == 201, rebased.text
    assert (rebased.json()["version"], rebased.json()["extends_pins"]) == (2, ["base@2"])
    assert bob.post("/v1/agents/mine/rebase").status_code == 200
    assert bob.get("/v1/agents/mine/resolved").json()["system_prompt"] == ("base two\n\nbob's part")
    # only the owner rebases: a viewer of the agent is refused like any owner's edit
    grant(engine, "mine", "carol", "viewer")
    assert users["carol"].post("/v1/agents/mine/rebase").status_code == 403


def test_the_cli_shows_a_moved_base_and_rebases_through_the_api(
    registry_auth: tuple[Users, Engine, Path], cli: Callable[[dict[str, str]], Run]
) -> None:
    """`baton show` names the base that moved and the command to follow it; `baton agents
    rebase` (BATON_API_URL, BATON_TOKEN) publishes on it, then says nothing moved."""
    users, _engine, db_file = registry_auth
    bob = users["bob"]
    make(bob, "base", {"system_prompt": "one"})
    make(bob, "mine", {"extends": "base"})
    assert bob.put("/v1/agents/base/draft", json={"system_prompt": "two"}).status_code == 200
    assert bob.post("/v1/agents/base/publish").status_code == 201
    run = cli(
        {
            "BATON_DATABASE_URL": f"sqlite:///{db_file}",
            "BATON_API_URL": str(bob.base_url),
            "BATON_TOKEN": users.tokens["bob"],
        }
    )
    shown = run("show", "mine")
    assert shown.exit_code == 0, shown.output
    assert "base base@1 is pinned; live now: base@2" in shown.output
    assert "baton agents rebase mine" in shown.output
    rebased = run("agents", "rebase", "mine")
    assert rebased.exit_code == 0, rebased.output
    assert "mine@2: published, pinned to base@2" in rebased.output
    again = run("agents", "rebase", "mine")
    assert "mine@2: unchanged" in again.output
    assert "live now" not in run("show", "mine").output
    missing = run("agents", "rebase", "nowhere")
    assert missing.exit_code == 1 and "[forbidden]" in missing.output  # auth mode: as missing


def _insert(conn: sa.Connection, table: str, **values: Any) -> Any:
    """Insert a row into ``table`` as the database has it (reflected), timestamps now."""
    t = sa.Table(table, sa.MetaData(), autoload_with=conn)
    now = {c: utcnow() for c in ("created_at", "updated_at", "published_at") if c in t.c}
    key = conn.execute(t.insert().values(**now, **values)).inserted_primary_key
    return key[0] if key is not None else None


def test_migration_pins_existing_revisions_to_what_they_resolved(empty_engine: Engine) -> None:
    """0009 pins each existing revision's chain as it resolved then: bare slugs to the live
    revision (base@1 after a rollback, not the newer base@2), ``slug@N`` to N, a retired base
    to its newest revision, nothing to []; an unresolvable chain stays NULL."""
    migrate.upgrade(empty_engine, "0008")
    with empty_engine.begin() as conn:
        ids = {
            slug: _insert(
                conn, "agents", slug=slug, name=slug, description="", retired=slug == "old"
            )
            for slug in ("base", "mid", "child", "held", "old", "orphan", "ghost")
        }
        revisions = [
            ("base", 1, {"system_prompt": "one"}),
            ("base", 2, {"system_prompt": "two"}),
            ("mid", 1, {"extends": "base"}),
            ("child", 1, {"extends": "mid"}),
            ("held", 1, {"extends": "base@2"}),
            ("old", 1, {}),
            ("old", 2, {}),
            ("orphan", 1, {"extends": "old"}),
            ("ghost", 1, {"extends": "nowhere"}),
        ]
        for slug, version, spec in revisions:
            _insert(
                conn,
                "agent_revisions",
                agent_id=ids[slug],
                version=version,
                digest="sha256:x",
                spec=spec,
            )
        for slug, version in (("base", 1), ("mid", 1), ("child", 1), ("held", 1)):
            _insert(conn, "agent_live_pointers", agent_id=ids[slug], version=version)
    migrate.upgrade(empty_engine)
    with Session(empty_engine) as s:
        assert pins(s, "base", 1) == [] and pins(s, "base", 2) == []
        assert pins(s, "mid", 1) == ["base@1"]
        assert pins(s, "child", 1) == ["mid@1", "base@1"]
        assert pins(s, "held", 1) == ["base@2"]
        assert pins(s, "orphan", 1) == ["old@2"]
        assert pins(s, "ghost", 1) is None
        assert registry.resolve_agent(s, ref="child").system_prompt == "one"
    assert migrate.model_diff(empty_engine) == []
