"""Teams and delegation on a real dev server (AgentX Agent Teams; Xema Agent Concepts
subagents; docs/teams.md)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import select
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from baton.agents import roster, teams
from baton.contracts.workflow_io import Provenance, SessionConfig
from baton.runs import run_tree, session_store
from baton.runs.launch import Launched, launch_session
from baton.storage.db import ChannelMemory, EventRow, session_scope
from tests.helpers import TEST_CONFIG, launch, publish, transcript


def make_team(engine: Engine, routes: list[dict[str, str]] | None = None) -> None:
    """A lead with two specialists, each answering with a fixed reply."""
    publish(engine, "checker", playbook=[{"reply": "CHECKED"}])
    publish(engine, "writer", playbook=[{"reply": "WRITTEN"}])
    publish(
        engine,
        "lead",
        playbook=[
            {"when": "^delegate_to: ", "reply": "SYNTH {last_message}"},
            {
                "when": "go",
                "reply": "Fanning out.",
                "tool_calls": [
                    {"tool": "delegate_to", "args": {"agent_id": "checker", "task": "check it"}},
                    {"tool": "delegate_to", "args": {"agent_id": "writer", "task": "write it"}},
                ],
            },
        ],
    )
    with session_scope(engine) as s:
        teams.create_team(
            s,
            team=teams.TeamIn.model_validate(
                {
                    "id": "desk",
                    "name": "Desk",
                    "supervisor_agent_id": "lead",
                    "members": [
                        {"agent_id": "lead", "role": "supervisor"},
                        {"agent_id": "checker", "delegation_hint": "checks"},
                        {"agent_id": "writer", "delegation_hint": "writes"},
                    ],
                    "routes": routes or [],
                }
            ),
        )


async def team_run(
    env: WorkflowEnvironment,
    engine: Engine,
    worker: Worker,
    prompt: str,
    *,
    sync: bool = True,
    config: SessionConfig = TEST_CONFIG,
    provenance: Provenance | None = None,
    team_id: str = "desk",
) -> Launched:
    """Launch a team run of ``team_id`` as the API does."""
    with session_scope(engine) as s:
        snap = teams.snapshot(s, team_id=team_id)
    return await launch_session(
        env.client,
        engine,
        task_queue=worker.task_queue,
        config=config,
        ref=next(m.pin for m in snap.members if m.role == "supervisor"),
        prompt=prompt,
        provenance=provenance or Provenance(team=snap.id),
        sync=sync,
        team=snap,
    )


def events(engine: Engine, session_id: str) -> list[tuple[str, dict[str, Any]]]:
    with session_scope(engine) as s:
        rows = s.exec(
            select(EventRow).where(EventRow.session_id == session_id).order_by(EventRow.id)  # type: ignore[arg-type]
        ).all()
        return [(r.type, r.data) for r in rows]


async def test_team_run_fans_out_to_members_and_synthesises(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """The lead's two delegate_to calls run, both results come back, results land on the channel."""
    make_team(db_engine)
    run = await team_run(temporal_env, db_engine, worker, "go")
    assert run.response is not None and "CHECKED" in run.response and "WRITTEN" in run.response
    kinds = [k for k, _ in events(db_engine, run.session_id)]
    assert kinds.count("delegation_start") == 2 and kinds.count("delegation_complete") == 2
    assert "delegation_chunk" in kinds
    with session_scope(db_engine) as s:
        memories = s.exec(select(ChannelMemory).where(ChannelMemory.channel == "_team_desk")).all()
        tree = run_tree.trace(s, session_id=run.session_id)
    assert sorted(m.text for m in memories) == ["CHECKED", "WRITTEN"]
    assert sorted(c.agent for c in tree.children) == ["checker", "writer"]
    assert all(c.delegation and c.delegation["kind"] == "delegate_to" for c in tree.children)
    assert tree.subtree_usage.requests == tree.usage.requests + 2
    # Members are isolated: their transcript is only the task.
    child = tree.children[0].session_id
    assert transcript(db_engine, child)[0][0] == "user"
    assert "go" not in transcript(db_engine, child)[0][1].split()


async def test_parallel_delegations_overlap(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """Three delegate_to calls of ~1 s each in one turn run at the same time: every
    child's first message is stored before any child's reply (run one after another,
    the second would start after the first replied), whatever the machine's load."""
    slow = [{"reply": "w " * 10, "chunk_delay_ms": 100}]
    for slug in ("a1", "a2", "a3"):
        publish(db_engine, slug, playbook=slow, delegation={"available_for_delegation": True})
    calls = [
        {"tool": "delegate_to", "args": {"agent_id": s, "task": "t"}} for s in ("a1", "a2", "a3")
    ]
    publish(
        db_engine,
        "boss",
        playbook=[{"when": "^delegate_to: ", "reply": "done"}, {"when": "go", "tool_calls": calls}],
    )
    roster.clear_cache()
    run = await launch(temporal_env.client, db_engine, worker, "boss", "go")
    assert run.response == "done"
    with session_scope(db_engine) as s:
        tree = run_tree.trace(s, session_id=run.session_id)
        spans = []
        for child in tree.children:
            stored = [m.created_at for m in session_store.messages(s, session_id=child.session_id)]
            spans.append((min(stored), max(stored)))
    assert len(spans) == 3
    assert max(first for first, _ in spans) < min(last for _, last in spans), spans


async def test_team_route_sends_the_message_straight_to_the_member(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """A matching team route delegates the message to that member; the lead synthesises."""
    make_team(db_engine, routes=[{"when": "^fact-check:", "to": "checker"}])
    run = await team_run(temporal_env, db_engine, worker, "fact-check: the sky is blue")
    assert run.response == "SYNTH CHECKED"
    roles = transcript(db_engine, run.session_id)
    assert [r for r, _ in roles] == ["user", "assistant", "tool", "assistant"]
    assert roles[1][1] == "(routed to checker by a team route)"
    with session_scope(db_engine) as s:
        tree = run_tree.trace(s, session_id=run.session_id)
    assert [(c.agent, c.delegation and c.delegation["kind"]) for c in tree.children] == [
        ("checker", "route")
    ]


async def test_unmatched_message_is_not_routed(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """A message no route matches reaches the lead as usual."""
    make_team(db_engine, routes=[{"when": "^fact-check:", "to": "checker"}])
    run = await team_run(temporal_env, db_engine, worker, "hello there")
    assert run.response == "[lead] received: hello there"


async def test_mention_routes_a_turn_to_the_mentioned_agent(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """An @agent mention in an ordinary session delegates that turn to the mentioned agent."""
    publish(db_engine, "writer", playbook=[{"reply": "WRITTEN"}])
    publish(
        db_engine, "host", playbook=[{"when": "^delegate_to: ", "reply": "HOST {last_message}"}]
    )
    from tests.helpers import launch

    run = await launch(temporal_env.client, db_engine, worker, "host", "@writer draft a memo")
    assert run.response == "HOST WRITTEN"
    plain = await launch(temporal_env.client, db_engine, worker, "host", "mail me @ noon @nobody")
    assert plain.response == "[host] received: mail me @ noon @nobody"


async def test_a_members_review_is_forwarded_to_the_run_root(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """A review opened inside a delegated member reaches the root's stream, and its outcome too."""
    from tests.helpers import status, wait_for
    from tests.xagent_helpers import caller_playbook, decide, pending_review, reviews_of

    make_team(db_engine)
    publish(db_engine, "checker", playbook=caller_playbook("list_agents", {}, when="check"))
    run = await team_run(temporal_env, db_engine, worker, "go", sync=False)
    await wait_for(lambda: len(reviews_of(db_engine)) == 1)
    [review] = await pending_review(db_engine, reviews_of(db_engine)[0].session_id)
    assert review.session_id != run.session_id and review.caller_agent_slug == "checker"
    forwarded = [d for k, d in events(db_engine, run.session_id) if k.endswith("review_requested")]
    assert [(d["review_id"], d["target_agent_id"]) for d in forwarded] == [(review.id, "checker")]
    await decide(temporal_env.client, review, "allow_once")
    await wait_for(lambda: status(db_engine, run.session_id) == "idle")
    kinds = [k for k, _ in events(db_engine, run.session_id)]
    assert "delegation_review_resolved" in kinds and "review_requested" not in kinds


async def test_cancelling_a_member_directly_reports_cancelled_to_the_root(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """A member cancelled while it waits on a review: its review and its delegation are
    reported cancelled on the root's stream, and the lead's run goes on to an answer."""
    from baton.runs import launch as launch_mod
    from tests.helpers import status, wait_for
    from tests.xagent_helpers import caller_playbook, pending_review, reviews_of

    make_team(db_engine)
    publish(db_engine, "checker", playbook=caller_playbook("list_agents", {}, when="check"))
    run = await team_run(temporal_env, db_engine, worker, "go", sync=False)
    await wait_for(lambda: len(reviews_of(db_engine)) == 1)
    [review] = await pending_review(db_engine, reviews_of(db_engine)[0].session_id)
    await launch_mod.cancel_session(temporal_env.client, db_engine, session_id=review.session_id)
    await wait_for(lambda: status(db_engine, run.session_id) == "idle")
    log = events(db_engine, run.session_id)
    resolved = [d for k, d in log if k == "delegation_review_resolved"]
    assert [(d["review_id"], d["status"]) for d in resolved] == [(review.id, "cancelled")]
    done = {d["target_agent_id"]: d["status"] for k, d in log if k == "delegation_complete"}
    assert done == {"checker": "cancelled", "writer": "completed"}
    with session_scope(db_engine) as s:
        tree = run_tree.trace(s, session_id=run.session_id)
    assert {c.agent: c.delegation and c.delegation["status"] for c in tree.children} == done
