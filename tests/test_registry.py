"""Registry semantics on SQLite and on a real PostgreSQL (Xema Agent Concepts, 'Identity,
drafts, …')."""

from __future__ import annotations

import threading
from datetime import UTC
from typing import Any

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from baton.agents import registry
from baton.agents.spec import AgentSpec
from baton.errors import (
    AgentExists,
    AgentInUse,
    AgentNotFound,
    AgentNotPublished,
    AgentRetired,
    BatonError,
    DuplicateAlias,
    InheritanceCycle,
    InheritanceTooDeep,
    RevisionNotFound,
    TreeTooDeep,
    TreeTooLarge,
    UnknownAgent,
)
from baton.storage.db import AgentRevision, DelegationRow, session_scope


def put(session: Session, slug: str, **spec: Any) -> tuple[int, bool]:
    """Create-or-update ``slug``'s draft to ``spec``, publish, commit; (version, created)."""
    parsed = AgentSpec.model_validate(spec)
    try:
        registry.get_agent(session, slug=slug)
        registry.save_draft(session, slug=slug, spec=parsed)
    except AgentNotFound:
        registry.create_agent(session, slug=slug, name=slug.title(), spec=parsed)
    try:
        rev, created = registry.publish(session, slug=slug)
    except BatonError:
        session.rollback()
        raise
    session.commit()
    return rev.version, created


def revision_count(session: Session) -> int:
    return len(session.exec(select(AgentRevision)).all())


def live(session: Session, slug: str) -> int | None:
    return registry.to_public(session, registry.get_agent(session, slug=slug)).live_version


def test_publish_numbers_revisions_and_moves_the_live_pointer(session: Session) -> None:
    """Each publish of new content is version N+1 with a sha256 digest, and becomes live."""
    assert put(session, "a", system_prompt="one") == (1, True)
    assert put(session, "a", system_prompt="two") == (2, True)
    assert put(session, "a", system_prompt="three") == (3, True)
    assert live(session, "a") == 3
    revs = registry.list_revisions(session, slug="a")
    assert [r.version for r in revs] == [3, 2, 1]
    assert len({r.digest for r in revs}) == 3
    assert all(r.digest.startswith("sha256:") for r in revs)


def test_identical_republish_creates_nothing(session: Session) -> None:
    """Publishing content identical to the live revision returns it and writes no revision."""
    put(session, "a", system_prompt="same", tools=["x"])
    before = revision_count(session)
    assert put(session, "a", tools=["x"], system_prompt="same") == (1, False)
    assert revision_count(session) == before


def test_republishing_old_content_is_a_new_version(session: Session) -> None:
    """Content equal to a non-live older revision is published as a new version."""
    put(session, "a", system_prompt="one")
    put(session, "a", system_prompt="two")
    assert put(session, "a", system_prompt="one") == (3, True)


def test_pins_stay_stable_after_a_newer_publish(session: Session) -> None:
    """`slug@1` keeps resolving revision 1 after revision 2 is live; `slug` follows the pointer."""
    put(session, "a", system_prompt="first")
    put(session, "a", system_prompt="second")
    assert registry.resolve_agent(session, ref="a@1").system_prompt == "first"
    assert registry.resolve_agent(session, ref="a").system_prompt == "second"
    assert registry.resolve_agent(session, ref="a").version == 2


def test_restore_copies_into_the_draft_only(session: Session) -> None:
    """restore(v) puts revision v in the draft and leaves the live pointer alone."""
    put(session, "a", system_prompt="first")
    put(session, "a", system_prompt="second")
    registry.restore(session, slug="a", version=1)
    session.commit()
    public = registry.to_public(session, registry.get_agent(session, slug="a"))
    assert public.draft.system_prompt == "first"
    assert public.live_version == 2
    assert revision_count(session) == 2


def test_rollback_moves_the_pointer_without_new_content(session: Session) -> None:
    """rollback(v) makes v live and creates no revision."""
    put(session, "a", system_prompt="first")
    put(session, "a", system_prompt="second")
    registry.rollback(session, slug="a", version=1)
    session.commit()
    assert live(session, "a") == 1
    assert revision_count(session) == 2
    assert registry.resolve_agent(session, ref="a").system_prompt == "first"


def test_rollback_to_a_missing_revision_is_refused(session: Session) -> None:
    """rollback to a version that was never published raises revision_not_found."""
    put(session, "a", system_prompt="first")
    with pytest.raises(RevisionNotFound):
        registry.rollback(session, slug="a", version=2)


def test_retire_refuses_launches_until_published_again(session: Session) -> None:
    """retire clears the pointer; slug and slug@v are refused with agent_retired."""
    put(session, "a", system_prompt="first")
    registry.retire(session, slug="a")
    session.commit()
    assert live(session, "a") is None
    for ref in ("a", "a@1"):
        with pytest.raises(AgentRetired):
            registry.resolve_ref(session, ref=ref)
    assert registry.get_revision(session, slug="a", version=1).version == 1
    assert put(session, "a", system_prompt="back") == (2, True)
    assert registry.resolve_agent(session, ref="a").system_prompt == "back"


def test_unresolvable_references(session: Session) -> None:
    """Unknown slug/version → agent/revision_not_found; nothing live → agent_not_published."""
    registry.create_agent(session, slug="draft-only", name="Draft")
    session.commit()
    put(session, "a", system_prompt="x")
    with pytest.raises(AgentNotFound):
        registry.resolve_ref(session, ref="ghost")
    with pytest.raises(RevisionNotFound):
        registry.resolve_ref(session, ref="a@9")
    with pytest.raises(AgentNotPublished):
        registry.resolve_ref(session, ref="draft-only")


def test_duplicate_slug_is_refused(session: Session) -> None:
    """Creating an existing slug raises agent_exists."""
    registry.create_agent(session, slug="a", name="A")
    session.commit()
    with pytest.raises(AgentExists):
        registry.create_agent(session, slug="a", name="Again")


def test_self_extension_is_a_cycle_of_length_one(session: Session) -> None:
    """`a extends a` is refused with inheritance_cycle and nothing is written."""
    put(session, "a", system_prompt="x")
    before = revision_count(session)
    with pytest.raises(InheritanceCycle):
        put(session, "a", system_prompt="y", extends="a")
    assert revision_count(session) == before
    assert live(session, "a") == 1


def test_cycle_of_length_three(session: Session) -> None:
    """a → b → c → a is refused when the closing link is published."""
    put(session, "c", system_prompt="c")
    put(session, "b", extends="c")
    put(session, "a", extends="b")
    with pytest.raises(InheritanceCycle) as info:
        put(session, "c", extends="a")
    assert info.value.path == "extends"
    assert live(session, "c") == 1


def chain(session: Session, links: int) -> None:
    """Publish c0 … c<links>, each extending the previous one."""
    put(session, "c0", system_prompt="root")
    for i in range(1, links + 1):
        put(session, f"c{i}", extends=f"c{i - 1}")


def test_inheritance_chain_of_32_links_is_allowed(session: Session) -> None:
    """An agent 32 extends-links from its root publishes and resolves."""
    chain(session, 32)
    assert len(registry.resolve_agent(session, ref="c32").inheritance) == 33


def test_inheritance_chain_of_33_links_is_refused(session: Session) -> None:
    """A 33rd link raises inheritance_too_deep."""
    chain(session, 32)
    with pytest.raises(InheritanceTooDeep):
        put(session, "c33", extends="c32")


def test_unknown_references_are_refused_at_publish(session: Session) -> None:
    """extends or a node naming a missing agent, or a missing revision, → unknown_agent + path."""
    put(session, "real", system_prompt="x")
    cases: dict[str, dict[str, Any]] = {
        "extends": {"extends": "ghost"},
        "subagents[0].agent": {"subagents": [{"alias": "g", "agent": "ghost"}]},
        "subagents[1].agent": {
            "subagents": [{"alias": "r", "agent": "real"}, {"alias": "v", "agent": "real@7"}]
        },
    }
    for path, spec in cases.items():
        with pytest.raises(UnknownAgent) as info:
            put(session, "lead", **spec)
        assert info.value.path == path


def test_tree_bounds_apply_at_draft_save_and_publish(session: Session) -> None:
    """A 7-level tree is refused when saved; an inherited tree that grows past 64 at publish."""
    put(session, "leaf", system_prompt="leaf")
    node: dict[str, Any] = {"alias": "n7", "agent": "leaf"}
    for level in range(6, 0, -1):
        node = {"alias": f"n{level}", "agent": "leaf", "subagents": [node]}
    registry.create_agent(session, slug="deep", name="Deep")
    with pytest.raises(TreeTooDeep):
        registry.save_draft(
            session, slug="deep", spec=AgentSpec.model_validate({"subagents": [node]})
        )
    session.rollback()
    put(session, "base", subagents=[{"alias": f"b{i}", "agent": "leaf"} for i in range(40)])
    put(
        session,
        "ok",
        extends="base",
        subagents=[{"alias": f"d{i}", "agent": "leaf"} for i in range(24)],
    )
    with pytest.raises(TreeTooLarge):
        put(
            session,
            "big",
            extends="base",
            subagents=[{"alias": f"d{i}", "agent": "leaf"} for i in range(25)],
        )


def test_rollback_resolves_through_the_revisions_own_pins(session: Session) -> None:
    """Rolling back to a revision extending b uses its pin b@1, so b extending a since then
    closes no cycle; the rolled-back revision means what it meant."""
    put(session, "b", system_prompt="b")
    put(session, "a", extends="b")
    put(session, "a", system_prompt="standalone")
    put(session, "b", extends="a")
    registry.rollback(session, slug="a", version=1)
    session.commit()
    assert live(session, "a") == 1
    assert registry.resolve_agent(session, ref="a").inheritance == ["a@1", "b@1"]
    assert registry.resolve_agent(session, ref="b").inheritance == ["b@2", "a@2"]


def test_referenced_agents_cannot_be_retired_or_deleted(session: Session) -> None:
    """retire/delete of an agent a live revision references raises agent_in_use naming it."""
    put(session, "base", system_prompt="b")
    put(session, "child", extends="base")
    for action in (registry.retire, registry.delete_agent):
        with pytest.raises(AgentInUse) as info:
            action(session, slug="base")
        assert info.value.extra["dependents"] == ["child@1"]
        session.rollback()


def test_delete_removes_everything_and_frees_the_slug(session: Session) -> None:
    """delete removes identity, draft, revisions and pointer; the slug can be reused."""
    put(session, "a", system_prompt="one")
    put(session, "a", system_prompt="two")
    registry.delete_agent(session, slug="a")
    session.commit()
    assert revision_count(session) == 0
    with pytest.raises(AgentNotFound):
        registry.get_agent(session, slug="a")
    assert put(session, "a", system_prompt="fresh") == (1, True)


def test_timestamps_are_tz_aware_utc(session: Session) -> None:
    """Timestamps read back from the database carry the UTC zone."""
    put(session, "a", system_prompt="x")
    session.expire_all()
    agent = registry.get_agent(session, slug="a")
    rev = registry.get_revision(session, slug="a", version=1)
    assert agent.created_at.tzinfo == UTC and rev.published_at.tzinfo == UTC


def test_delete_is_refused_while_an_old_revision_references_it(session: Session) -> None:
    """A non-live revision that references the agent also blocks delete (the pin would repoint)."""
    put(session, "q1", system_prompt="q1")
    put(session, "q2", extends="q1")
    put(session, "q2", system_prompt="standalone")
    with pytest.raises(AgentInUse) as info:
        registry.delete_agent(session, slug="q1")
    assert info.value.extra["dependents"] == ["q2@1"]
    session.rollback()
    registry.retire(session, slug="q1")
    session.commit()


def all_live_resolve(engine_session: Session) -> list[str]:
    """Pins of live agents that fail to resolve (should be empty)."""
    broken = []
    agents, _ = registry.list_agents(engine_session, limit=1000)
    for agent in agents:
        pub = registry.to_public(engine_session, agent)
        if pub.live_version is None:
            continue
        try:
            registry.resolve_agent(engine_session, ref=agent.slug)
        except BatonError:
            broken.append(f"{agent.slug}@{pub.live_version}")
    return broken


def test_a_base_change_cannot_break_a_pinned_dependent(session: Session) -> None:
    """A base whose new nodes clash with a derived agent's publishes: the derived agent keeps
    its pinned base; rebasing it onto the new base is refused (duplicate alias)."""
    put(session, "leaf", system_prompt="leaf")
    put(session, "ia", system_prompt="base")
    put(session, "ib", extends="ia", subagents=[{"alias": "x", "agent": "leaf"}])
    assert put(session, "ia", subagents=[{"alias": "x", "agent": "leaf"}]) == (2, True)
    assert all_live_resolve(session) == []
    assert registry.resolve_agent(session, ref="ib").inheritance == ["ib@1", "ia@1"]
    with pytest.raises(DuplicateAlias):
        registry.rebase(session, slug="ib")
    session.rollback()
    assert live(session, "ib") == 1


def test_lengthening_a_chain_under_live_agents_leaves_their_pins(session: Session) -> None:
    """A root that starts extending another agent leaves a 32-link chain pinned as it was;
    rebasing its last agent onto 33 links is refused."""
    chain(session, 32)
    put(session, "extra", system_prompt="x")
    put(session, "c0", extends="extra")
    assert len(registry.resolve_agent(session, ref="c32").inheritance) == 33
    with pytest.raises(InheritanceTooDeep):
        registry.rebase(session, slug="c32")
    session.rollback()


def test_closing_a_cycle_over_a_long_chain_is_a_cycle(session: Session) -> None:
    """A cycle is reported as a cycle even when the chain is also at its length bound."""
    chain(session, 32)
    with pytest.raises(InheritanceCycle):
        put(session, "c0", extends="c32")


def test_retired_agent_pinning_itself_can_be_published_back(session: Session) -> None:
    """An agent whose spec pins its own older revision can come back from retirement."""
    put(session, "selfp", system_prompt="one")
    put(session, "selfp", subagents=[{"alias": "me", "agent": "selfp@1"}])
    registry.retire(session, slug="selfp")
    session.commit()
    registry.rollback(session, slug="selfp", version=2)
    session.commit()
    assert live(session, "selfp") == 2


def test_concurrent_writers_never_leave_a_broken_live_graph(engine: Engine) -> None:
    """Mutual extends published at once, and retire racing a dependent publish, stay consistent."""
    import threading

    with Session(engine) as s:
        put(s, "ma", system_prompt="a")
        put(s, "mb", system_prompt="b")
        put(s, "ra", system_prompt="ra")
        registry.create_agent(s, slug="rb", name="Rb", spec=AgentSpec(extends="ra"))
        s.commit()

    def run(action: Any) -> None:
        with Session(engine) as s:
            try:
                action(s)
                s.commit()
            except BatonError:
                s.rollback()

    def publish_ext(slug: str, base: str) -> Any:
        def go(s: Session) -> None:
            registry.save_draft(s, slug=slug, spec=AgentSpec(extends=base))
            registry.publish(s, slug=slug)

        return go

    actions = [
        publish_ext("ma", "mb"),
        publish_ext("mb", "ma"),
        lambda s: registry.publish(s, slug="rb"),
        lambda s: registry.retire(s, slug="ra"),
    ]
    threads = [threading.Thread(target=run, args=(a,)) for a in actions]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    with Session(engine) as s:
        assert all_live_resolve(s) == []
        ra_retired = registry.get_agent(s, slug="ra").retired
        rb_live = live(s, "rb")
        assert not (ra_retired and rb_live is not None)


def test_closed_session_status_is_terminal(session: Session) -> None:
    """Once cancelled (or failed), a late status write cannot reopen a session."""
    from baton.contracts.workflow_io import Provenance
    from baton.runs import session_store as store

    put(session, "a", system_prompt="x")
    store.create_session(
        session, session_id="s1", agent_slug="a", agent_version=1, provenance=Provenance(), name="n"
    )
    store.set_status(session, session_id="s1", status="cancelled")
    store.set_status(session, session_id="s1", status="idle")
    assert store.get_session(session, session_id="s1").status == "cancelled"


def test_closed_check_holds_off_a_concurrent_cancel(engine: Engine) -> None:
    """A writer that saw the session open commits its event before a racing cancel's status."""
    from baton.contracts.workflow_io import Provenance
    from baton.runs import session_store as store
    from baton.storage.db import session_scope

    with session_scope(engine) as s:
        put(s, "a", system_prompt="x")
        store.create_session(
            s, session_id="s1", agent_slug="a", agent_version=1, provenance=Provenance(), name="n"
        )
        store.set_status(s, session_id="s1", status="running")
    cancelled = threading.Event()

    def cancel() -> None:
        with session_scope(engine) as s:
            store.set_status(s, session_id="s1", status="cancelled")
        cancelled.set()

    with session_scope(engine) as s:
        assert not store.is_closed(s, session_id="s1")
        racer = threading.Thread(target=cancel)
        racer.start()
        # The cancel must wait for this transaction's lock, however long it takes.
        assert not cancelled.wait(0.5)
        store.append_event(s, session_id="s1", type="chunk", data={"text": "late"})
    racer.join(10)
    assert cancelled.is_set()
    with session_scope(engine) as s:
        kinds = [e.type for e in store.events_after(s, session_id="s1")]
        assert kinds[-2:] == ["chunk", "status"]
        assert store.is_closed(s, session_id="s1")


def test_event_stream_never_skips_a_late_commit(engine: Engine) -> None:
    """A reader paging by event id sees an event whose transaction began first, committed last."""
    from baton.contracts.workflow_io import Provenance
    from baton.runs import session_store as store
    from baton.storage.db import session_scope

    with session_scope(engine) as s:
        put(s, "a", system_prompt="x")
        store.create_session(
            s, session_id="s1", agent_slug="a", agent_version=1, provenance=Provenance(), name="n"
        )
    first_written, second_committed, read_between = (threading.Event() for _ in range(3))

    def slow_writer() -> None:
        with session_scope(engine) as s:
            store.append_event(s, session_id="s1", type="slow", data={})
            s.flush()
            first_written.set()
            read_between.wait(10)  # commit only once the reader has read the other event

    def fast_writer() -> None:
        first_written.wait(10)
        with session_scope(engine) as s:
            store.append_event(s, session_id="s1", type="fast", data={})
        second_committed.set()

    with session_scope(engine) as s:
        cursor = max([e.id or 0 for e in store.events_after(s, session_id="s1")], default=0)
    seen: list[str] = []

    def read() -> None:
        nonlocal cursor
        with session_scope(engine) as s:
            for e in store.events_after(s, session_id="s1", after=cursor):
                seen.append(e.type)
                cursor = e.id or cursor

    threads = [threading.Thread(target=slow_writer), threading.Thread(target=fast_writer)]
    for t in threads:
        t.start()
    # PostgreSQL: the fast writer commits first. SQLite: it waits for the write lock.
    second_committed.wait(2)
    read()
    read_between.set()
    for t in threads:
        t.join(10)
    read()
    assert sorted(seen) == ["fast", "slow"]


def edge(s: Session, delegation_id: str, *, parent: str, child: str) -> None:
    """Record a delegate_to delegation ``parent`` → ``child`` in the run rooted at ``root``."""
    from baton.runs import run_tree

    run_tree.start(
        s,
        delegation_id=delegation_id,
        root_session_id="root",
        parent_session_id=parent,
        child_session_id=child,
        kind="delegate_to",
        caller="a",
        target="b",
        task="t",
        depth=1,
    )


def test_a_forward_never_lands_after_the_roots_cancel(engine: Engine) -> None:
    """A forwarded event racing its root's cancel is written before the cancel or not at all."""
    from baton.contracts.workflow_io import Provenance
    from baton.runs import run_tree
    from baton.runs import session_store as store
    from baton.storage.db import session_scope

    with session_scope(engine) as s:
        put(s, "a", system_prompt="x")
        for sid in ("root", "child"):
            store.create_session(
                s,
                session_id=sid,
                agent_slug="a",
                agent_version=1,
                provenance=Provenance(),
                name=sid,
            )
        store.set_status(s, session_id="root", status="running")
        edge(s, "d-race", parent="root", child="child")
    forwarded, cancelled = threading.Event(), threading.Event()

    def forwarder() -> None:
        with session_scope(engine) as s:
            run_tree.forward(s, "child", "chunk", {"content": "late"})
            s.flush()
            forwarded.set()
            cancelled.wait(2)  # PostgreSQL: the cancel commits first; SQLite: it waits for us

    racer = threading.Thread(target=forwarder)
    racer.start()
    assert forwarded.wait(10)
    with session_scope(engine) as s:
        store.set_status(s, session_id="root", status="cancelled")
    cancelled.set()
    racer.join(10)
    with session_scope(engine) as s:
        kinds = [e.type for e in store.events_after(s, session_id="root")]
    assert kinds[-1] == "status" and kinds.count("delegation_chunk") <= 1


def test_cancel_records_every_open_delegation_under_the_session(engine: Engine) -> None:
    """cancel_open marks unfinished delegations at every depth cancelled, finished ones kept."""
    from baton.runs import run_tree

    with session_scope(engine) as s:
        for did, parent, child in (("d1", "root", "c1"), ("d2", "c1", "c2"), ("d3", "root", "c3")):
            edge(s, did, parent=parent, child=child)
        run_tree.finish(s, delegation_id="d3", status="completed", result="done")
    with session_scope(engine) as s:
        assert sorted(run_tree.cancel_open(s, session_id="root")) == ["d1", "d2"]
    with session_scope(engine) as s:
        rows = {r.id: r.status for r in s.exec(select(DelegationRow)).all()}
        assert rows == {"d1": "cancelled", "d2": "cancelled", "d3": "completed"}
        assert run_tree.cancel_open(s, session_id="root") == []


def test_a_rolled_back_savepoint_drops_only_its_own_events(engine: Engine) -> None:
    """Events of a rolled-back savepoint are not written; the enclosing transaction's are."""
    from baton.contracts.workflow_io import Provenance
    from baton.runs import session_store as store

    with session_scope(engine) as s:
        put(s, "a", system_prompt="x")
        store.create_session(
            s, session_id="s1", agent_slug="a", agent_version=1, provenance=Provenance(), name="n"
        )
    with session_scope(engine) as s:
        store.append_event(s, session_id="s1", type="outer", data={})
        dropped = s.begin_nested()
        store.append_event(s, session_id="s1", type="dropped", data={})
        dropped.rollback()
        with s.begin_nested():
            store.append_event(s, session_id="s1", type="kept", data={})
        store.append_event(s, session_id="s1", type="last", data={})
    with session_scope(engine) as s:
        kinds = [e.type for e in store.events_after(s, session_id="s1")]
    assert [k for k in kinds if k != "status"] == ["outer", "kept", "last"]


def test_memories_match_on_meaningful_words_and_each_text_once(engine: Engine) -> None:
    """A memory sharing only words like "the" is not relevant; duplicate texts come once."""
    from baton.agents import teams

    with session_scope(engine) as s:
        put(s, "lead", system_prompt="x")
        desk = {"id": "desk", "name": "Desk", "supervisor_agent_id": "lead"}
        members = [{"agent_id": "lead", "role": "supervisor"}]
        teams.create_team(s, team=teams.TeamIn.model_validate({**desk, "members": members}))
        texts = ("the scout found nothing", "the scout found nothing", "prices rose in the north")
        for i, text in enumerate(texts):
            teams.remember(
                s, team_id="desk", channel="_team_desk", agent="a", text=text, delegation_id=f"d{i}"
            )
    with session_scope(engine) as s:

        def relevant(task: str) -> list[str]:
            found = teams.relevant_memories(s, team_id="desk", channel="_team_desk", task=task)
            return [m.text for m in found]

        assert relevant("do the slow thing") == []
        assert relevant("what did the scout find?") == ["the scout found nothing"]
        assert relevant("north prices for the scout") == [
            "prices rose in the north",
            "the scout found nothing",
        ]
