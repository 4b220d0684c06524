"""Record representative SessionWorkflow histories for the replay test.

Run from the repo root when a workflow change is *meant* to change commands
(and gate it with ``workflow.patched``):
``.venv/bin/python -m tests.record_histories TAG [SCENARIO ...]`` (scenarios: base,
legacy-tool-name, legacy-delegation-names, xagent, xagent-reads, delegation, step, step-ends, idle;
default all).
Existing files are kept, so histories from older code stay in the suite.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import tempfile
import uuid
from pathlib import Path

from sqlalchemy.engine import Engine
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from baton.contracts import SEARCH_ATTRIBUTES
from baton.errors import TurnFailed
from baton.runs import launch as launching
from baton.runs import session_store
from baton.storage.db import init_db, make_engine, session_scope
from tests.helpers import TEST_CONFIG, launch, publish
from worker.factory import build_worker

HERE = Path(__file__).parent / "histories"
#: Names this recording: bump it when the workflow's commands change (with a patch),
#: so the older histories stay and keep proving that in-flight runs still replay.
TAG = sys.argv[1] if len(sys.argv) > 1 else "v2"


async def save(client: Client, session_id: str, name: str) -> None:
    """Write every run of ``session_id`` as ``<name>-<TAG>-run<N>.json`` (unless present).

    An open run is terminated first: a history that stops mid-task cannot be replayed.
    """
    handle = client.get_workflow_handle(session_id)
    if (await handle.describe()).status == WorkflowExecutionStatus.RUNNING:
        await handle.terminate("recorded for the replay suite")
    runs = [w async for w in client.list_workflows(f"WorkflowId = '{session_id}'")]
    for n, run in enumerate(sorted(runs, key=lambda r: r.start_time), start=1):
        path = HERE / f"{name}-{TAG}-run{n}.json"
        if path.exists():
            print(f"kept {path.name}")
            continue
        history = await client.get_workflow_handle(session_id, run_id=run.run_id).fetch_history()
        path.write_text(history.to_json())
        print(f"wrote {path.name}")


async def base_scenarios(client: Client, engine: Engine, worker: Worker) -> None:
    """Tool loop, continue-as-new, cancel, failed turn (every tag)."""
    publish(
        engine,
        "adder",
        tools=["calculator"],
        playbook=[
            {"when": "^calculator: ", "reply": "It is {last_message}."},
            {
                "when": "add",
                "reply": "Adding.",
                "tool_calls": [
                    {"tool": "calculator", "args": {"expression": "2 + 3"}},
                    {"tool": "calculator", "args": {"expression": "4 * 5"}},
                ],
            },
        ],
    )
    tools = await launch(client, engine, worker, "adder", "add please")
    await launching.send_message(
        client, engine, session_id=tools.session_id, prompt="add again", sync=True
    )
    await save(client, tools.session_id, "tool-loop")

    publish(engine, "echo", playbook=[])
    config = TEST_CONFIG.model_copy(update={"continue_as_new_after_turns": 1})
    can = await launch(client, engine, worker, "echo", "one", config=config)
    await launching.send_message(client, engine, session_id=can.session_id, prompt="two", sync=True)
    await save(client, can.session_id, "continue-as-new")

    slow = [{"reply": "w " * 30, "chunk_delay_ms": 50}]
    publish(engine, "slow", playbook=slow)
    cancelled = await launch(client, engine, worker, "slow", "go", sync=False)
    await asyncio.sleep(0.5)
    await launching.cancel_session(client, engine, session_id=cancelled.session_id)
    handle = client.get_workflow_handle(cancelled.session_id)
    with contextlib.suppress(Exception):
        await handle.result()
    await save(client, cancelled.session_id, "cancelled")

    publish(engine, "broken", model="nosuchprovider:model")
    with contextlib.suppress(TurnFailed):
        await launch(client, engine, worker, "broken", "hello")
    failed = [w async for w in client.list_workflows("BatonAgent = 'broken'")]
    await save(client, failed[0].id, "failed-turn")


async def legacy_tool_name(client: Client, engine: Engine, worker: Worker) -> None:
    """A model calling a tool named like an X-Agent tool, recorded BEFORE the x-agent-tools
    patch (run on code from before it): replay must keep treating it as an ordinary tool."""
    publish(
        engine,
        "legacy",
        playbook=[
            {"when": "^list_agents: ", "reply": "noted: {last_message}"},
            {"when": "go", "reply": "Listing.", "tool_calls": [{"tool": "list_agents"}]},
        ],
    )
    run = await launch(client, engine, worker, "legacy", "go")
    await save(client, run.session_id, "xagent-name-prepatch")


async def legacy_delegation_names(client: Client, engine: Engine, worker: Worker) -> None:
    """Recorded BEFORE the delegation and routing patches (run on code from before them):
    a model calling tools named delegate_to and task, and a message with an @mention."""
    publish(engine, "helper", playbook=[{"reply": "hi"}])
    publish(
        engine,
        "legacy2",
        playbook=[
            {"when": "^(delegate_to|task): ", "reply": "noted: {last_message}"},
            {
                "when": "go",
                "reply": "Trying.",
                "tool_calls": [
                    {"tool": "delegate_to", "args": {"agent_id": "helper", "task": "x"}},
                    {"tool": "task", "args": {"alias": "a", "prompt": "y"}},
                ],
            },
        ],
    )
    run = await launch(client, engine, worker, "legacy2", "go ask @helper")
    await save(client, run.session_id, "delegation-names-prepatch")


async def xagent_scenarios(client: Client, engine: Engine, worker: Worker) -> None:
    """Review allowed by Signal (with the sync invoke), review timeout, guard refusal."""
    from sqlmodel import select

    from baton.contracts import ReviewDecision
    from baton.storage.db import ReviewRow
    from tests.helpers import wait_for
    from tests.xagent_helpers import caller_playbook

    publish(engine, "target", playbook=[{"reply": "target says hi"}])
    invoke = {"slug": "target", "prompt": "hello", "sync": True}
    publish(engine, "caller", playbook=caller_playbook("invoke_agent", invoke))
    run = await launch(client, engine, worker, "caller", "go", sync=False)

    def pending() -> list[ReviewRow]:
        with session_scope(engine) as s:
            return list(s.exec(select(ReviewRow).where(ReviewRow.status == "pending")).all())

    await wait_for(lambda: bool(pending()))
    review = pending()[0]
    await client.get_workflow_handle(run.session_id).signal(
        "review_decision", ReviewDecision(review_id=review.id, decision="allow_once")
    )
    await wait_for(lambda: _status(engine, run.session_id) == "idle")
    await save(client, run.session_id, "xagent-review-allowed")

    short = TEST_CONFIG.model_copy(update={"review_timeout_s": 1.0})
    timed = await launch(client, engine, worker, "caller", "go", config=short)
    await save(client, timed.session_id, "xagent-review-timeout")

    publish(
        engine,
        "selfish",
        playbook=caller_playbook("invoke_agent", {"slug": "selfish", "prompt": "me"}),
    )
    guard = await launch(client, engine, worker, "selfish", "go")
    await save(client, guard.session_id, "xagent-self-invocation")


async def xagent_read_scenarios(client: Client, engine: Engine, worker: Worker) -> None:
    """list_agents reviewed and allowed by Signal, reviewed and denied, and allowed by a
    stored policy (no review): the calls issue 14 runs as local activities."""
    from sqlmodel import select

    from baton.contracts import ReviewDecision
    from baton.storage.db import ReviewRow
    from tests.helpers import wait_for
    from tests.xagent_helpers import caller_playbook, set_policy

    publish(engine, "target", playbook=[{"reply": "target says hi"}])
    publish(engine, "lister", playbook=caller_playbook("list_agents", {}))

    def pending(session_id: str) -> list[ReviewRow]:
        with session_scope(engine) as s:
            return list(
                s.exec(
                    select(ReviewRow).where(
                        ReviewRow.status == "pending", ReviewRow.session_id == session_id
                    )
                ).all()
            )

    async def reviewed(decision: str, name: str) -> None:
        run = await launch(client, engine, worker, "lister", "go", sync=False)
        await wait_for(lambda: bool(pending(run.session_id)))
        review = pending(run.session_id)[0]
        await client.get_workflow_handle(run.session_id).signal(
            "review_decision", ReviewDecision(review_id=review.id, decision=decision)
        )
        await wait_for(lambda: _status(engine, run.session_id) == "idle")
        await save(client, run.session_id, name)

    await reviewed("allow_once", "xagent-list-reviewed")
    await reviewed("deny", "xagent-list-denied")
    set_policy(engine, "list", "allow", caller="lister")
    allowed = await launch(client, engine, worker, "lister", "go")
    await save(client, allowed.session_id, "xagent-list-allowed")


async def delegation_scenarios(client: Client, engine: Engine, worker: Worker) -> None:
    """A team run fanning out, a team route, and a cancel cascading into a delegation."""
    from tests.test_teams import make_team, team_run

    class _Env:  # team_run takes the environment only for its client
        def __init__(self, client: Client) -> None:
            self.client = client

    make_team(engine, routes=[{"when": "^fact-check:", "to": "checker"}])
    fan = await team_run(_Env(client), engine, worker, "go")  # type: ignore[arg-type]
    await save(client, fan.session_id, "team-fan-out")
    routed = await team_run(_Env(client), engine, worker, "fact-check: sky")  # type: ignore[arg-type]
    await save(client, routed.session_id, "team-route")

    slow = [{"reply": "w " * 40, "chunk_delay_ms": 50}]
    publish(engine, "slowpoke", playbook=slow, delegation={"available_for_delegation": True})
    call = {"tool": "delegate_to", "args": {"agent_id": "slowpoke", "task": "take your time"}}
    publish(engine, "impatient", playbook=[{"when": "go", "tool_calls": [call]}])
    from baton.agents import roster

    roster.clear_cache()
    run = await launch(client, engine, worker, "impatient", "go", sync=False)
    await asyncio.sleep(1.0)
    await launching.cancel_session(client, engine, session_id=run.session_id)
    with contextlib.suppress(Exception):
        await client.get_workflow_handle(run.session_id).result()
    await save(client, run.session_id, "cancel-cascade")


async def step_scenarios(client: Client, engine: Engine, worker: Worker) -> None:
    """A step whose first deliverable fails its schema, then a step approved after revise."""
    from baton.contracts import HandoffDecision, StepRetry
    from baton.storage.db import StepRow
    from tests.test_steps import FIX_ON_FEEDBACK, run_step

    publish(engine, "summariser", playbook=FIX_ON_FEEDBACK)
    retried = await run_step(client, engine, worker.task_queue, "summariser")
    await client.get_workflow_handle(retried).result()
    await save(client, retried, "step-schema-retry")

    def status(step_id: str) -> str:
        with session_scope(engine) as s:
            row = s.get(StepRow, step_id)
            return f"{row.status}:{row.attempts}" if row else ""

    from tests.helpers import wait_for

    handed = await run_step(
        client, engine, worker.task_queue, "summariser", handoff=True, retry=StepRetry()
    )
    await wait_for(lambda: status(handed) == "awaiting_handoff:2")
    handle = client.get_workflow_handle(handed)
    await handle.signal("handoff", HandoffDecision(decision="revise", feedback="shorter"))
    await wait_for(lambda: status(handed) == "awaiting_handoff:3")
    await handle.signal("handoff", HandoffDecision(decision="approve"))
    await handle.result()
    await save(client, handed, "step-handoff")


async def step_end_scenarios(client: Client, engine: Engine, worker: Worker) -> None:
    """Steps that do not complete: invalid deliverables up to max_attempts, a rejected
    handoff, a handoff timeout and the step's own timeout. Recorded on code from before
    the failed-step patch (the workflow completed with the status) and after it (the
    workflow fails with the step's code), so both replay."""
    from temporalio.client import WorkflowFailureError

    from baton.contracts import HandoffDecision, StepInput, StepRetry
    from baton.storage.db import StepRow
    from tests.helpers import wait_for
    from tests.test_steps import VALID, run_step

    async def ended(step_id: str) -> None:
        with contextlib.suppress(WorkflowFailureError):
            await client.get_workflow_handle(step_id).result()

    def status(step_id: str) -> str:
        with session_scope(engine) as s:
            row = s.get(StepRow, step_id)
            return row.status if row else ""

    publish(engine, "stubborn", playbook=[{"reply": "not json at all"}])
    retry = StepRetry(max_attempts=2, initial_interval_s=0.01)
    invalid = await run_step(client, engine, worker.task_queue, "stubborn", retry=retry)
    await ended(invalid)
    await save(client, invalid, "step-invalid")

    publish(engine, "drafter", playbook=[{"reply": VALID}])
    rejected = await run_step(client, engine, worker.task_queue, "drafter", handoff=True)
    await wait_for(lambda: status(rejected) == "awaiting_handoff")
    await client.get_workflow_handle(rejected).signal(
        "handoff", HandoffDecision(decision="reject", feedback="off topic")
    )
    await ended(rejected)
    await save(client, rejected, "step-rejected")

    waited = await run_step(
        client, engine, worker.task_queue, "drafter", handoff=True, handoff_timeout_s=1.0
    )
    await ended(waited)
    await save(client, waited, "step-handoff-timeout")

    publish(engine, "dawdler", playbook=[{"reply": "w " * 40, "chunk_delay_ms": 100}])
    late = f"step-{uuid.uuid4()}"
    await launching.launch_step(
        client,
        engine,
        task_queue=worker.task_queue,
        ref="dawdler",
        inp=StepInput(
            step_id=late, agent_pin="dawdler", input="go", timeout_s=1.0, config=TEST_CONFIG
        ),
    )
    await ended(late)
    await save(client, late, "step-timeout")


async def idle_scenarios(client: Client, engine: Engine, worker: Worker) -> None:
    """A session whose run completes idle, restarted by its next message (update-with-start)
    and completing idle again; an external session completing idle."""
    from tests.test_idle_sessions import completed

    publish(engine, "echo", playbook=[{"reply": "you said {last_message}"}])
    idle = TEST_CONFIG.model_copy(update={"idle_timeout_s": 1.0})
    run = await launch(client, engine, worker, "echo", "one", config=idle)
    await completed(client, run.session_id)
    await launching.send_message(client, engine, session_id=run.session_id, prompt="two", sync=True)
    await completed(client, run.session_id)
    await save(client, run.session_id, "idle-restart")


def _status(engine: Engine, session_id: str) -> str:
    with session_scope(engine) as s:
        return session_store.get_session(s, session_id=session_id).status


SCENARIOS = {
    "base": base_scenarios,
    "legacy-tool-name": legacy_tool_name,
    "legacy-delegation-names": legacy_delegation_names,
    "xagent": xagent_scenarios,
    "xagent-reads": xagent_read_scenarios,
    "delegation": delegation_scenarios,
    "step": step_scenarios,
    "step-ends": step_end_scenarios,
    "idle": idle_scenarios,
}


async def main() -> None:
    HERE.mkdir(exist_ok=True)
    chosen = sys.argv[2:] or list(SCENARIOS)
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(Path(sys.executable).parent / "temporal"),
        search_attributes=list(SEARCH_ATTRIBUTES),
        data_converter=pydantic_data_converter,
    )
    with tempfile.TemporaryDirectory() as tmp:
        engine = make_engine(f"sqlite:///{tmp}/rec.db")
        init_db(engine)
        worker = build_worker(env.client, engine=engine, task_queue=f"rec-{uuid.uuid4()}")
        async with worker:
            for name in chosen:
                await SCENARIOS[name](env.client, engine, worker)
        engine.dispose()
    await env.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
