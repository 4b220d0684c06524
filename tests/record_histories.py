"""Record the histories the replay suite replays (tests/test_replay.py): every ending of
each workflow type, on the code of one release (docs/development.md, Workflow changes).

``.venv/bin/python -m tests.record_histories TAG [SCENARIO ...]`` from the repo root, TAG
the release (``1.0.0``; on unreleased code the next one, docs/development.md); scenarios:
base, unloadable, xagent, xagent-reads, delegation, idle, external, step, step-ends,
step-edited, inquiry, webhook, workspace, workspace-1.0.0 (the workspace gate's old
branch, named 1.0.0 whatever TAG), exhibit, failed-reply, eval, review-ends
(default all).
Existing files are kept, so the histories of older releases stay in the suite while their
gates live.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

from sqlalchemy.engine import Engine
from temporalio import workflow
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from baton.contracts.search import SEARCH_ATTRIBUTES
from baton.contracts.values import DeliveryConfig
from baton.contracts.workflow_io import Provenance, SessionInput
from baton.errors import TurnFailed
from baton.runs import launch as launching
from baton.runs import session_store
from baton.storage.db import init_db, make_engine, session_scope
from baton.workspaces.store import WorkspaceLimits, WorkspaceStore
from tests.helpers import TEST_CONFIG, launch, publish
from worker.factory import build_worker

HERE = Path(__file__).parent / "histories"
#: Names this recording: the release whose code recorded it.
TAG = sys.argv[1] if len(sys.argv) > 1 else "1.0.0"


async def save(client: Client, session_id: str, name: str, release: str | None = None) -> None:
    """Write every run of ``session_id`` as ``<name>-<release>-run<N>.json`` (unless
    present), ``release`` TAG unless a scenario records an older release's commands.

    An open run is terminated first: a history that stops mid-task cannot be replayed.
    """
    handle = client.get_workflow_handle(session_id)
    if (await handle.describe()).status == WorkflowExecutionStatus.RUNNING:
        await handle.terminate("recorded for the replay suite")
    runs = [w async for w in client.list_workflows(f"WorkflowId = '{session_id}'")]
    for n, run in enumerate(sorted(runs, key=lambda r: r.start_time), start=1):
        path = HERE / f"{name}-{release or TAG}-run{n}.json"
        if path.exists():
            print(f"kept {path.name}")
            continue
        history = await client.get_workflow_handle(session_id, run_id=run.run_id).fetch_history()
        path.write_text(history.to_json())
        print(f"wrote {path.name}")


async def base_scenarios(client: Client, engine: Engine, worker: Worker) -> None:
    """A tool loop, continue-as-new, a cancel mid-turn, a failed model call."""
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


async def xagent_scenarios(client: Client, engine: Engine, worker: Worker) -> None:
    """A review allowed by Signal (with the sync invoke), one denied, one timed out, and
    the self-invocation guard's refusal."""
    from sqlmodel import select

    from baton.contracts.workflow_io import ReviewDecision
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

    denied = await launch(client, engine, worker, "caller", "go", sync=False)
    await wait_for(lambda: any(r.session_id == denied.session_id for r in pending()))
    review = next(r for r in pending() if r.session_id == denied.session_id)
    await client.get_workflow_handle(denied.session_id).signal(
        "review_decision", ReviewDecision(review_id=review.id, decision="deny")
    )
    await wait_for(lambda: _status(engine, denied.session_id) == "idle")
    await save(client, denied.session_id, "xagent-review-denied")

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
    stored policy (no review): the reads that run as local activities."""
    from sqlmodel import select

    from baton.contracts.workflow_io import ReviewDecision
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
    """A team run fanning out, a team route, an ad-hoc delegate_to, a subagent task, a
    member refused re-delegation, and a cancel cascading into a delegation."""
    from tests.test_teams import make_team, team_run

    class _Env:  # team_run takes the environment only for its client
        def __init__(self, client: Client) -> None:
            self.client = client

    make_team(engine, routes=[{"when": "^fact-check:", "to": "checker"}])
    fan = await team_run(_Env(client), engine, worker, "go")  # type: ignore[arg-type]
    await save(client, fan.session_id, "team-fan-out")
    routed = await team_run(_Env(client), engine, worker, "fact-check: sky")  # type: ignore[arg-type]
    await save(client, routed.session_id, "team-route")

    from baton.agents import roster

    publish(engine, "helper", playbook=[{"reply": "helped"}], delegation=_DELEGABLE)
    ask = {"tool": "delegate_to", "args": {"agent_id": "helper", "task": "help"}}
    publish(
        engine,
        "asker",
        playbook=[{"when": "^delegate_to: ", "reply": "got {last_message}"}, {"tool_calls": [ask]}],
    )
    roster.clear_cache()
    adhoc = await launch(client, engine, worker, "asker", "go")
    await save(client, adhoc.session_id, "delegate-adhoc")

    sub = {"tool": "task", "args": {"alias": "sums", "prompt": "add things"}}
    publish(
        engine,
        "planner",
        playbook=[{"when": "^task: ", "reply": "planned {last_message}"}, {"tool_calls": [sub]}],
        subagents=[{"alias": "sums", "agent": "helper"}],
    )
    task = await launch(client, engine, worker, "planner", "go")
    await save(client, task.session_id, "delegate-task")

    member = await team_run(
        _Env(client),  # type: ignore[arg-type]
        engine,
        worker,
        "go",
        provenance=Provenance(team_member=True),
    )
    await save(client, member.session_id, "team-member-redelegation")

    slow = [{"reply": "w " * 40, "chunk_delay_ms": 50}]
    publish(engine, "slowpoke", playbook=slow, delegation={"available_for_delegation": True})
    call = {"tool": "delegate_to", "args": {"agent_id": "slowpoke", "task": "take your time"}}
    publish(engine, "impatient", playbook=[{"when": "go", "tool_calls": [call]}])
    roster.clear_cache()
    run = await launch(client, engine, worker, "impatient", "go", sync=False)
    await asyncio.sleep(1.0)
    await launching.cancel_session(client, engine, session_id=run.session_id)
    with contextlib.suppress(Exception):
        await client.get_workflow_handle(run.session_id).result()
    await save(client, run.session_id, "cancel-cascade")


async def step_scenarios(client: Client, engine: Engine, worker: Worker) -> None:
    """A step whose first deliverable fails its schema, then a step approved after revise."""
    from baton.contracts.workflow_io import HandoffDecision, StepRetry
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


async def step_edited_scenario(client: Client, engine: Engine, worker: Worker) -> None:
    """A handoff approved with an edited deliverable (sent as a raw Signal); one whose first
    edit the output schema refuses (recorded once the workflow checks edits)."""
    from baton.contracts.workflow_io import HandoffDecision
    from tests.helpers import wait_for
    from tests.test_steps import VALID, run_step, step_row

    publish(engine, "editor", playbook=[{"reply": VALID}])
    handed = await run_step(client, engine, worker.task_queue, "editor", handoff=True)
    await wait_for(lambda: step_row(engine, handed).status == "awaiting_handoff")
    edit = HandoffDecision(decision="approve", edited_deliverable={"summary": "edited"})
    await client.get_workflow_handle(handed).signal("handoff", edit)
    await client.get_workflow_handle(handed).result()
    await save(client, handed, "step-handoff-edited")

    # An edit the schema refuses is ignored (the workflow's check); the next one completes.
    refused = await run_step(client, engine, worker.task_queue, "editor", handoff=True)
    await wait_for(lambda: step_row(engine, refused).status == "awaiting_handoff")
    handle = client.get_workflow_handle(refused)
    await handle.signal("handoff", {"decision": "approve", "edited_deliverable": {"summary": 3}})
    while not (await handle.query("status"))["refused_edits"]:
        await asyncio.sleep(0.05)
    await handle.signal("handoff", edit)
    await handle.result()
    await save(client, refused, "step-handoff-edit-refused")


async def step_end_scenarios(client: Client, engine: Engine, worker: Worker) -> None:
    """Steps that do not complete: invalid deliverables up to max_attempts, a rejected
    handoff, a handoff timeout and the step's own timeout (each fails the workflow with
    the step's code)."""
    from temporalio.client import WorkflowFailureError

    from baton.contracts.workflow_io import HandoffDecision, StepInput, StepRetry
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
    and completing idle again."""
    from tests.test_idle_sessions import completed

    publish(engine, "echo", playbook=[{"reply": "you said {last_message}"}])
    idle = TEST_CONFIG.model_copy(update={"idle_timeout_s": 1.0})
    run = await launch(client, engine, worker, "echo", "one", config=idle)
    await completed(client, run.session_id)
    await launching.send_message(client, engine, session_id=run.session_id, prompt="two", sync=True)
    await completed(client, run.session_id)
    await save(client, run.session_id, "idle-restart")


async def unloadable_scenario(client: Client, engine: Engine, worker: Worker) -> None:
    """A run whose pin does not load (a revision that does not exist): the session fails."""
    publish(engine, "ghost", playbook=[])
    session_id = f"session-{uuid.uuid4()}"
    with session_scope(engine) as s:
        session_store.create_session(
            s,
            session_id=session_id,
            agent_slug="ghost",
            agent_version=1,
            provenance=Provenance(),
            name="unloadable",
        )
    handle = await client.start_workflow(
        "Session",
        SessionInput(session_id=session_id, agent_pin="ghost@9", config=TEST_CONFIG),
        id=session_id,
        task_queue=worker.task_queue,
    )
    await handle.result()
    await save(client, session_id, "unloadable")


async def external_scenario(client: Client, engine: Engine, worker: Worker) -> None:
    """An external session: an X-Agent call and a posted message by Update, then the run
    completes idle."""
    from baton.contracts.activity_io import ToolOutcome
    from baton.contracts.workflow_io import (
        EXTERNAL_MESSAGE,
        EXTERNAL_TOOL_CALL,
        ExternalMessage,
        ExternalToolCall,
    )
    from baton.runs import external
    from tests.test_idle_sessions import completed
    from tests.xagent_helpers import set_policy

    publish(engine, "outsider", playbook=[])
    set_policy(engine, "list", "allow", caller="outsider")
    idle = TEST_CONFIG.model_copy(update={"idle_timeout_s": 1.0})
    opened = await external.open_external_session(
        client,
        engine,
        task_queue=worker.task_queue,
        config=idle,
        ref="outsider",
        provenance=Provenance(),
    )
    handle = client.get_workflow_handle(opened.session_id)
    await handle.execute_update(
        EXTERNAL_TOOL_CALL,
        ExternalToolCall(call_id="c1", name="list_agents", args={}),
        result_type=ToolOutcome,
    )
    await handle.execute_update(EXTERNAL_MESSAGE, ExternalMessage(text="listed the agents"))
    await completed(client, opened.session_id)
    await save(client, opened.session_id, "external-idle")


async def inquiry_scenario(client: Client, engine: Engine, worker: Worker) -> None:
    """An inquiry answered after one tool call, and one capped at its step limit."""
    from baton.contracts.workflow_io import InquiryInput, InquiryResult
    from baton.runs import inquiries

    publish(engine, "echo", playbook=[{"reply": "you said {last_message}"}])
    about = await launch(client, engine, worker, "echo", "hello")
    listing = {"tool": "list_conversations", "args": {}}
    publish(
        engine,
        "briefer",
        kind="ambassador",
        playbook=[{"when": "^list_conversations: ", "reply": "ok"}, {"tool_calls": [listing]}],
    )
    publish(engine, "looper", kind="ambassador", playbook=[{"tool_calls": [listing]}])
    for slug, name in (("briefer", "inquiry-answered"), ("looper", "inquiry-capped")):
        inquiry_id = f"inquiry-{uuid.uuid4()}"
        with session_scope(engine) as s:
            inquiries.create(
                s,
                inquiry_id=inquiry_id,
                session_id=about.session_id,
                user="local",
                ambassador=slug,
                version=1,
                question="what happened?",
            )
        await client.execute_workflow(
            "Inquiry",
            InquiryInput(
                inquiry_id=inquiry_id,
                session_id=about.session_id,
                user="local",
                ambassador_pin=f"{slug}@1",
                question="what happened?",
                max_steps=2,
                config=TEST_CONFIG,
            ),
            id=inquiry_id,
            task_queue=worker.task_queue,
            result_type=InquiryResult,
        )
        await save(client, inquiry_id, name)


async def webhook_scenario(client: Client, engine: Engine, worker: Worker) -> None:
    """A webhook delivery answered 204, and one the receiver fails until its attempts run
    out (logged failed by ``fail_delivery``)."""
    import http.server
    import threading

    from activities.webhooks import DeliveryStarter
    from baton.outbound import OPEN
    from baton.webhooks import events, subscriptions

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", 0)))
            self.send_response(204 if self.path == "/ok" else 500)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"

    async def same_client() -> Client:
        return client

    # Deliveries committed here (outside any activity) start on the recording's queue.
    config = DeliveryConfig(max_attempts=2, retry_initial_s=0.1, retry_max_s=0.2)
    loop = asyncio.get_running_loop()
    DeliveryStarter(same_client, loop=loop, config=config, task_queue=worker.task_queue).install(
        engine
    )

    def send_test(url: str) -> str:
        with session_scope(engine) as s:
            body = subscriptions.WebhookIn(url=url, events=["review.opened"])
            created = subscriptions.create_webhook(s, body=body, owner="local", policy=OPEN)
            hook = subscriptions.get_webhook(s, webhook_id=created.id, owner="local")
            return events.send_test(s, hook)

    try:
        for path, name in (("/ok", "webhook-delivered"), ("/fail", "webhook-failed")):
            delivery = await asyncio.to_thread(send_test, base + path)
            await client.get_workflow_handle(delivery).result()
            await save(client, delivery, name)
    finally:
        server.shutdown()


#: An agent others may delegate to ad hoc.
_DELEGABLE = {"available_for_delegation": True}


async def workspace_scenario(client: Client, engine: Engine, worker: Worker) -> None:
    """The workspace tools (behind their patch gate): a write, a read, a refusal."""
    publish(
        engine,
        "filer",
        playbook=[
            {"when": "^read_file: ", "reply": "Read it."},
            {
                "when": "^write_file: ",
                "reply": "Reading.",
                "tool_calls": [
                    {"tool": "read_file", "args": {"path": "notes.txt"}},
                    {"tool": "write_file", "args": {"path": "../out.txt", "content": "x"}},
                ],
            },
            {
                "reply": "Writing.",
                "tool_calls": [
                    {"tool": "write_file", "args": {"path": "notes.txt", "content": "hello"}}
                ],
            },
        ],
    )
    done = await launch(client, engine, worker, "filer", "keep a note")
    await save(client, done.session_id, "workspace-tools")


@contextlib.contextmanager
def gate_off(patch_id: str) -> Iterator[None]:
    """``workflow.patched(patch_id)`` answers False, as on the release before the gate: new
    runs take the gate's old branch and record no marker (other gates answer as usual)."""
    real = workflow.patched

    def patched(candidate: str) -> bool:
        return False if candidate == patch_id else real(candidate)

    # The sandbox passes temporalio through, so the workflow code sees this module object.
    with mock.patch.object(workflow, "patched", patched):
        yield


async def workspace_before_scenario(client: Client, engine: Engine, worker: Worker) -> None:
    """The workspace scenario on the gate's old branch (1.0.0's commands): each call named
    like a workspace tool schedules ``run_tool``, which refuses it as an unknown tool."""
    from workflows.dispatch import WORKSPACE_TOOLS_PATCH

    with gate_off(WORKSPACE_TOOLS_PATCH):
        publish(
            engine,
            "old-filer",
            playbook=[
                {"when": "^write_file: ", "reply": "Could not write."},
                {
                    "reply": "Writing.",
                    "tool_calls": [
                        {"tool": "write_file", "args": {"path": "notes.txt", "content": "hello"}}
                    ],
                },
            ],
        )
        done = await launch(client, engine, worker, "old-filer", "keep a note")
        await save(client, done.session_id, "workspace-tools", release="1.0.0")


async def exhibit_scenario(client: Client, engine: Engine, worker: Worker) -> None:
    """Exhibits: a markdown exhibit and a refused one, and a delegation whose specialist
    shows one (forwarded to the root; the delegator's result says it is displayed)."""
    from baton.agents import roster

    note = {"kind": "markdown", "title": "Note", "text": "# shown"}
    bad = {"kind": "image", "title": "Bad", "media_type": "image/svg+xml", "data": "PHN2Zy8+"}
    shows = {"tool": "present_exhibit", "args": note}
    publish(
        engine,
        "shower",
        playbook=[
            {"when": "^present_exhibit: ", "reply": "Shown."},
            {"tool_calls": [shows, {"tool": "present_exhibit", "args": bad}]},
        ],
        delegation=_DELEGABLE,
    )
    done = await launch(client, engine, worker, "shower", "show it")
    await save(client, done.session_id, "exhibit")
    ask = {"tool": "delegate_to", "args": {"agent_id": "shower", "task": "show it"}}
    publish(
        engine,
        "exhibit-lead",
        playbook=[{"when": "^delegate_to: ", "reply": "got {last_message}"}, {"tool_calls": [ask]}],
    )
    roster.clear_cache()
    done = await launch(client, engine, worker, "exhibit-lead", "go")
    await save(client, done.session_id, "exhibit-delegated")


async def failed_reply_scenario(client: Client, engine: Engine, worker: Worker) -> None:
    """A reply whose ordinary tool call fails for good while its invoke's review is pending:
    the review's wait is cancelled, the failure recorded (the failed-reply gate's marker)."""
    from tests.helpers import wait_for
    from tests.test_xagent_local import INVOKE, FailToolOnceReviewed
    from tests.xagent_helpers import reviews_of

    publish(engine, "target", playbook=[{"reply": "target says hi"}])
    calls = [{"tool": "invoke_agent", "args": INVOKE}, {"tool": "clock", "args": {}}]
    publish(engine, "caller", playbook=[{"when": "go", "reply": "Both.", "tool_calls": calls}])
    failing = build_worker(
        client,
        engine=engine,
        task_queue=f"rec-{uuid.uuid4()}",
        interceptors=[FailToolOnceReviewed(engine)],
    )
    async with failing:
        run = await launch(client, engine, failing, "caller", "go", sync=False)
        await wait_for(lambda: any(r.status == "cancelled" for r in reviews_of(engine)))
        await wait_for(lambda: _status(engine, run.session_id) == "idle")
    await save(client, run.session_id, "failed-reply")


async def review_end_scenarios(client: Client, engine: Engine, worker: Worker) -> None:
    """A review withdrawn by an interrupting message (the next turn runs), and one whose
    session is cancelled while it waits."""
    from tests.helpers import wait_for
    from tests.xagent_helpers import caller_playbook, reviews_of

    publish(engine, "target", playbook=[{"reply": "target says hi"}])
    invoke = {"slug": "target", "prompt": "hello", "sync": True}
    playbook = [*caller_playbook("invoke_agent", invoke), {"reply": "plain: {last_message}"}]
    publish(engine, "hesitant", playbook=playbook)

    async def waiting(session_id: str) -> None:
        """Until the workflow waits on the review (its row stored, its timer started)."""
        handle = client.get_workflow_handle(session_id)
        await wait_for(lambda: any(r.status == "pending" for r in reviews_of(engine, session_id)))
        while not await handle.query("pending_reviews"):
            await asyncio.sleep(0.05)

    run = await launch(client, engine, worker, "hesitant", "go", sync=False)
    await waiting(run.session_id)
    await launching.send_message(
        client,
        engine,
        session_id=run.session_id,
        prompt="never mind",
        sync=True,
        if_busy="interrupt",
    )
    await wait_for(lambda: _status(engine, run.session_id) == "idle")
    await save(client, run.session_id, "xagent-review-withdrawn")

    run = await launch(client, engine, worker, "hesitant", "go", sync=False)
    await waiting(run.session_id)
    await launching.cancel_session(client, engine, session_id=run.session_id)
    with contextlib.suppress(Exception):
        await client.get_workflow_handle(run.session_id).result()
    await save(client, run.session_id, "xagent-review-cancelled")


async def eval_scenarios(client: Client, engine: Engine, worker: Worker) -> None:
    """Evals: one completed (a recorded session and a recorded step replayed on both sides,
    each recorded and judged; nothing changed, so the judge asks no model), one cancelled
    while its step replays run, one failed (its recorded step gone before its replay)."""
    from baton.contracts.workflow_io import EvalInput
    from tests.eval_helpers import insert_eval
    from tests.helpers import wait_for
    from tests.test_steps import VALID, run_step

    async def run(
        slug: str, recorded: list[str], steps: list[str], judge: str | None = None
    ) -> str:
        eval_id = insert_eval(engine, slug, status="running", total=len(recorded) + len(steps))
        await launching.launch_eval(
            client,
            task_queue=worker.task_queue,
            inp=EvalInput(
                eval_id=eval_id,
                recorded=recorded,
                recorded_steps=steps,
                candidate=f"{slug}@1",
                baseline=f"{slug}@1",
                user="local",
                concurrency=2,
                task_queue=worker.task_queue,
                config=TEST_CONFIG,
                judge=judge,
            ),
            slug=slug,
            owner="local",
            summary=f"Eval of {slug}",
        )
        return eval_id

    publish(engine, "evaluee", playbook=[{"reply": VALID}])
    session = await launch(client, engine, worker, "evaluee", "hello")
    step = await run_step(client, engine, worker.task_queue, "evaluee")
    await client.get_workflow_handle(step).result()
    done = await run("evaluee", [session.session_id], [step], judge="openai-chat:stub-model")
    assert await client.get_workflow_handle(done).result() == "completed"
    await save(client, done, "eval-completed")

    # Cancelled while its step replays wait for their steps (a replay's wait on its step's
    # result takes the cancel as such, so the eval's cancel path runs).
    publish(engine, "ponderer", playbook=[{"reply": "w " * 40, "chunk_delay_ms": 100}])
    slow = await run_step(client, engine, worker.task_queue, "ponderer", schema=None)
    await client.get_workflow_handle(slow).result()
    cancelled = await run("ponderer", [], [slow])
    await wait_for(lambda: _replays_started(engine, cancelled, slow))
    await launching.cancel_run(client, workflow_id=cancelled)
    with contextlib.suppress(Exception):
        await client.get_workflow_handle(cancelled).result()
    await save(client, cancelled, "eval-cancelled")

    failed = await run("evaluee", [], [f"step-{uuid.uuid4()}"])
    assert await client.get_workflow_handle(failed).result() == "failed"
    await save(client, failed, "eval-failed")


def _replays_started(engine: Engine, eval_id: str, step_id: str) -> bool:
    """Whether both replays of recorded step ``step_id`` in ``eval_id`` are stored."""
    from baton.evals.replay import replay_step_id
    from baton.storage.db import StepRow

    with session_scope(engine) as s:
        return all(
            s.get(StepRow, replay_step_id(eval_id, step_id, side)) is not None
            for side in ("baseline", "candidate")
        )


def _status(engine: Engine, session_id: str) -> str:
    with session_scope(engine) as s:
        return session_store.get_session(s, session_id=session_id).status


SCENARIOS = {
    "base": base_scenarios,
    "unloadable": unloadable_scenario,
    "xagent": xagent_scenarios,
    "xagent-reads": xagent_read_scenarios,
    "delegation": delegation_scenarios,
    "idle": idle_scenarios,
    "external": external_scenario,
    "step": step_scenarios,
    "step-ends": step_end_scenarios,
    "step-edited": step_edited_scenario,
    "inquiry": inquiry_scenario,
    "webhook": webhook_scenario,
    "workspace": workspace_scenario,
    "workspace-1.0.0": workspace_before_scenario,
    "exhibit": exhibit_scenario,
    "failed-reply": failed_reply_scenario,
    "eval": eval_scenarios,
    "review-ends": review_end_scenarios,
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
        worker = build_worker(
            env.client,
            engine=engine,
            task_queue=f"rec-{uuid.uuid4()}",
            webhooks=DeliveryConfig(max_attempts=2, retry_initial_s=0.1, retry_max_s=0.2),
            workspaces=WorkspaceStore(f"{tmp}/workspaces", WorkspaceLimits(1024, 10, 4096)),
        )
        async with worker:
            for name in chosen:
                await SCENARIOS[name](env.client, engine, worker)
        engine.dispose()
    await env.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
