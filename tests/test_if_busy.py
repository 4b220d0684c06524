"""Messages sent while a turn runs (docs/sessions.md, Messages while a turn runs), over real
HTTP: uvicorn + a real worker + the dev server + SQLite.

A turn is kept running by a review nobody has decided (no wall clock involved), or by a
scripted model streaming slowly for the interrupt of a model call.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlmodel import select
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowUpdateStage
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from baton.contracts.workflow_io import IfBusy, TurnOutcome, UserMessage
from baton.storage.db import EventRow, UsageRow, session_scope
from tests.helpers import STEADY_CONFIG
from tests.test_api_agents import assert_problem
from tests.test_api_reviews import Stack, agent, launch, pending, poll, running_stack, target
from tests.test_cli_reviews import Run, cli  # noqa: F401 (the fixture)
from tests.xagent_helpers import audit_rows

#: Calls invoke_agent on "hold" (the default policy reviews it), echoes the tool result,
#: and answers any other message with ``got <message>``.
HOLDER: list[dict[str, Any]] = [
    {"when": "^invoke_agent: ", "reply": "RESULT {last_message}"},
    {
        "when": "^hold",
        "reply": "Asking.",
        "tool_calls": [{"tool": "invoke_agent", "args": {"slug": "target", "prompt": "hi"}}],
    },
    {"reply": "got {last_message}"},
]
#: 200 words, 300 ms apart: a model call that is still streaming when the test interrupts.
#: Its rule matches "talk" alone: the next turn's request may carry "talk" and "stop"
#: together (the partial reply is stored once the cancelled call learns of the cancel).
SLOW_REPLY = " ".join(f"w{i}" for i in range(200))


@pytest.fixture
def stack(temporal_env: WorkflowEnvironment, tmp_path: Path) -> Iterator[Stack]:
    """API + worker holding at most two messages per session. No worker is killed here, so
    the heartbeat timeout is far: under a second suite's load a 5 s one cuts a streaming
    model call off, and a cut-off call keeps nothing for an interrupt to find."""
    with running_stack(
        temporal_env,
        tmp_path / "busy.db",
        max_queued_messages=2,
        heartbeat_timeout=STEADY_CONFIG.heartbeat_timeout_s,
    ) as s:
        target(s.http)
        agent(s.http, "holder", HOLDER)
        agent(
            s.http,
            "talker",
            [{"when": "^talk$", "reply": SLOW_REPLY, "chunk_delay_ms": 300}, *HOLDER[2:]],
        )
        yield s


def send(http: httpx.Client, sid: str, prompt: str, **extra: Any) -> httpx.Response:
    return http.post(f"/v1/sessions/{sid}/messages", json={"prompt": prompt, **extra})


def messages(http: httpx.Client, sid: str) -> list[dict[str, Any]]:
    resp = http.get(f"/v1/sessions/{sid}/transcript")
    assert resp.status_code == 200, resp.text
    found: list[dict[str, Any]] = resp.json()["messages"]
    return found


def texts(http: httpx.Client, sid: str, role: str) -> list[str]:
    return [m["text"] for m in messages(http, sid) if m["role"] == role]


def decide(http: httpx.Client, review_id: str, decision: str) -> None:
    resp = http.post(f"/v1/reviews/{review_id}/decision", json={"decision": decision})
    assert resp.status_code in (200, 202), resp.text


def test_enqueue_runs_queued_messages_in_order_after_the_running_turn(stack: Stack) -> None:
    """Two messages enqueued while a turn waits run after it, each as its own turn, in order."""
    sid = launch(stack.http, "holder", "hold")
    (review,) = pending(stack.http)
    for prompt in ("second", "third"):
        sent = send(stack.http, sid, prompt, if_busy="enqueue")
        assert sent.status_code == 200, sent.text
    assert texts(stack.http, sid, "user") == ["hold"]  # held in the workflow, not stored
    decide(stack.http, review["id"], "allow_once")
    poll(lambda: "got third" in texts(stack.http, sid, "assistant"), "the third reply")
    assert texts(stack.http, sid, "user") == ["hold", "second", "third"]
    replies = texts(stack.http, sid, "assistant")
    assert replies.index("got second") < replies.index("got third")
    assert replies[-1] == "got third"


def test_queue_takes_its_bound_and_refuses_one_more_while_reject_stays_busy(
    stack: Stack,
) -> None:
    """With room for two, two enqueued messages are taken, a third is 409 queue_full, and a
    message without if_busy is 409 session_busy as before."""
    sid = launch(stack.http, "holder", "hold")
    (review,) = pending(stack.http)
    assert_problem(send(stack.http, sid, "plain"), 409, "session_busy")
    assert_problem(send(stack.http, sid, "plain", if_busy="reject"), 409, "session_busy")
    for prompt in ("one", "two"):
        assert send(stack.http, sid, prompt, if_busy="enqueue").status_code == 200
    assert_problem(send(stack.http, sid, "three", if_busy="enqueue"), 409, "queue_full")
    assert_problem(send(stack.http, sid, "four", if_busy="interrupt"), 409, "queue_full")
    decide(stack.http, review["id"], "deny")
    poll(lambda: "got two" in texts(stack.http, sid, "assistant"), "the queue drained")
    assert texts(stack.http, sid, "user") == ["hold", "one", "two"]


def test_interrupt_withdraws_the_pending_review_and_runs_the_new_message(stack: Stack) -> None:
    """An interrupt settles the turn's open review ``withdrawn`` (audited), the caller reads
    that as the tool result, and the new message is answered."""
    sid = launch(stack.http, "holder", "hold")
    (review,) = pending(stack.http)
    sent = send(stack.http, sid, "never mind", if_busy="interrupt", sync=True)
    assert sent.status_code == 200, sent.text
    # The model reads the withdrawn call's result and the new message in one request.
    assert sent.json()["response"].endswith("never mind")
    row = stack.http.get(f"/v1/reviews/{review['id']}").json()
    assert row["status"] == "withdrawn" and row["decided_by"] == "interrupted"
    audited = [a for a in audit_rows(stack.engine) if a.review_id == review["id"]]
    assert [(a.outcome, a.decided_by) for a in audited] == [("withdrawn", "interrupted")]
    tool = [m for m in messages(stack.http, sid) if m["role"] == "tool"]
    assert "withdrawn" in tool[0]["text"]
    errors = texts(stack.http, sid, "error")
    assert any(e.startswith("interrupted") for e in errors), errors
    assert_problem(
        stack.http.post(f"/v1/reviews/{review['id']}/decision", json={"decision": "allow_once"}),
        409,
        "review_already_decided",
    )


def test_an_interrupt_runs_ahead_of_the_enqueued_messages(stack: Stack) -> None:
    """An interrupt sent after an enqueued message stops the turn and runs first; the
    enqueued message runs after it."""
    sid = launch(stack.http, "holder", "hold")
    pending(stack.http)
    assert send(stack.http, sid, "queued", if_busy="enqueue").status_code == 200
    assert send(stack.http, sid, "urgent", if_busy="interrupt").status_code == 200
    poll(lambda: "got queued" in texts(stack.http, sid, "assistant"), "the queued reply")
    assert texts(stack.http, sid, "user") == ["hold", "urgent", "queued"]


def test_a_queued_message_never_runs_after_a_cancel(stack: Stack) -> None:
    """Cancelling a session with a message queued ends it: the queued message never runs
    (no turn after the cancel) and its review is cancelled."""
    sid = launch(stack.http, "holder", "hold")
    (review,) = pending(stack.http)
    assert send(stack.http, sid, "later", if_busy="enqueue").status_code == 200
    assert stack.http.post(f"/v1/sessions/{sid}/cancel").status_code == 202
    poll(
        lambda: stack.http.get(f"/v1/sessions/{sid}").json()["status"] == "cancelled",
        "the cancel",
    )
    poll(
        lambda: stack.http.get(f"/v1/reviews/{review['id']}").json()["status"] == "cancelled",
        "the review cancelled",
    )
    assert texts(stack.http, sid, "user") == ["hold"]
    assert_problem(send(stack.http, sid, "more", if_busy="enqueue"), 409, "session_closed")


def _chunks(stack: Stack, sid: str) -> int:
    with session_scope(stack.engine) as s:
        rows = s.exec(
            select(EventRow).where(EventRow.session_id == sid, EventRow.type == "chunk")
        ).all()
        return len(rows)


def test_interrupt_cancels_a_slow_model_call_and_keeps_its_partial_reply(stack: Stack) -> None:
    """A model call still streaming is cancelled by an interrupt: the words it streamed stay
    as its reply (metered), marked interrupted, and the new message gets its own turn."""
    sid = launch(stack.http, "talker", "talk")
    poll(lambda: _chunks(stack, sid), "the first streamed words")
    sent = send(stack.http, sid, "stop", if_busy="interrupt", sync=True)
    assert sent.status_code == 200, sent.text
    assert sent.json()["response"].endswith("stop")  # "talk" may come along (see above)
    first = f"{sid}:t1:s1:assistant"
    partial = poll(
        lambda: next((m for m in messages(stack.http, sid) if m["id"] == first), None),
        "the partial reply",
    )
    assert partial["text"].startswith("w0 ") and len(partial["text"]) < len(SLOW_REPLY)
    with session_scope(stack.engine) as s:  # metered as a cut stream: estimated tokens
        usage = s.exec(select(UsageRow).where(UsageRow.message_id == first)).one()
        assert usage.output_tokens > 0
    assert texts(stack.http, sid, "user") == ["talk", "stop"]
    order = [(m["role"], m["text"][:11]) for m in messages(stack.http, sid)]
    marker = order.index(("error", "interrupted"))
    assert order.index(("user", "stop")) > marker > order.index(("user", "talk"))


def test_the_same_message_id_twice_is_one_queued_message(
    stack: Stack, temporal_env: WorkflowEnvironment
) -> None:
    """An enqueued message sent twice under one Idempotency-Key (the API replays it), or
    twice as the same Update id (a takeover after a lost API process), is stored once."""
    sid = launch(stack.http, "holder", "hold")
    (review,) = pending(stack.http)
    key = {"Idempotency-Key": "queued-once"}
    for _ in range(2):
        resp = stack.http.post(
            f"/v1/sessions/{sid}/messages",
            json={"prompt": "again", "if_busy": "enqueue"},
            headers=key,
        )
        assert resp.status_code == 200, resp.text
    asyncio.run(_send_twice(temporal_env.client.service_client.config.target_host, sid))
    decide(stack.http, review["id"], "allow_once")
    poll(lambda: "got direct" in texts(stack.http, sid, "assistant"), "the queue drained")
    assert texts(stack.http, sid, "user") == ["hold", "again", "direct"]


async def _send_twice(
    address: str, sid: str, prompt: str = "direct", if_busy: IfBusy = "enqueue"
) -> None:
    """Deliver one message twice under one Update id (a client of its own: this test is
    synchronous and runs it on a loop of its own)."""
    client = await Client.connect(address, data_converter=pydantic_data_converter)
    handle = client.get_workflow_handle(sid)
    for _ in range(2):
        await handle.start_update(
            "send_message",
            UserMessage(prompt=prompt, if_busy=if_busy),
            id=f"{sid}:message-{prompt}",
            wait_for_stage=WorkflowUpdateStage.ACCEPTED,
            result_type=TurnOutcome,
        )


def test_the_same_interrupt_twice_is_one_message(
    stack: Stack, temporal_env: WorkflowEnvironment
) -> None:
    """An interrupt sent twice under one Idempotency-Key (the API replays it), or twice as
    the same Update id, stops its turn once and is stored and answered once."""
    sid = launch(stack.http, "holder", "hold")
    (first,) = pending(stack.http)
    key = {"Idempotency-Key": "interrupt-once"}
    for _ in range(2):
        resp = stack.http.post(
            f"/v1/sessions/{sid}/messages",
            json={"prompt": "never mind", "if_busy": "interrupt"},
            headers=key,
        )
        assert resp.status_code == 200, resp.text
    poll(lambda: _answered(stack, sid, "never mind"), "the interrupt's reply")
    assert send(stack.http, sid, "hold again").status_code == 200
    second = poll(
        lambda: [r for r in pending(stack.http) if r["id"] != first["id"]], "the second review"
    )[0]
    address = temporal_env.client.service_client.config.target_host
    asyncio.run(_send_twice(address, sid, "stop it", "interrupt"))
    poll(lambda: _answered(stack, sid, "stop it"), "the second interrupt's reply")
    assert _accepted_updates(address, sid, f"{sid}:message-stop it") == 1
    assert texts(stack.http, sid, "user") == ["hold", "never mind", "hold again", "stop it"]
    interrupted = [e for e in texts(stack.http, sid, "error") if e.startswith("interrupted")]
    assert len(interrupted) == 2
    for review in (first, second):
        row = stack.http.get(f"/v1/reviews/{review['id']}").json()
        assert (row["status"], row["decided_by"]) == ("withdrawn", "interrupted")
    withdrawn = [a for a in audit_rows(stack.engine) if a.outcome == "withdrawn"]
    assert len(withdrawn) == 2 and {a.review_id for a in withdrawn} == {first["id"], second["id"]}


def _answered(stack: Stack, sid: str, prompt: str) -> bool:
    """Whether the transcript's last message is a reply after the user message ``prompt``."""
    order = [(m["role"], m["text"]) for m in messages(stack.http, sid)]
    return (
        ("user", prompt) in order
        and order[-1][0] == "assistant"
        and (order.index(("user", prompt)) < len(order) - 1)
    )


def test_cli_run_session_if_busy_enqueue(
    stack: Stack,
    cli: Callable[[dict[str, str]], Run],  # noqa: F811  (the fixture imported above)
    temporal_env: WorkflowEnvironment,
) -> None:
    """`baton run --session ID --if-busy enqueue TEXT` waits its turn and prints its reply;
    without --if-busy the CLI reports session_busy."""
    run = cli({"BATON_API_URL": stack.url, "BATON_DATABASE_URL": stack.settings.database_url})
    address = temporal_env.client.service_client.config.target_host
    sid = launch(stack.http, "holder", "hold")
    (review,) = pending(stack.http)
    busy = run("run", "--session", sid, "plain")
    assert busy.exit_code == 1 and "[session_busy]" in busy.stderr
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        queued = pool.submit(run, "run", "--session", sid, "--if-busy", "enqueue", "later")
        before = _accepted_updates(address, sid)
        poll(lambda: _accepted_updates(address, sid) > before, "the queued message")
        decide(stack.http, review["id"], "allow_once")
        sent = queued.result(timeout=120)
    assert sent.exit_code == 0, sent.output
    assert "got later" in sent.stdout


def _accepted_updates(address: str, sid: str, update_id: str | None = None) -> int:
    """How many Updates the session's run has accepted (all, or those with ``update_id``)
    (its history, read on a loop and a client of its own: this test is synchronous)."""

    async def count() -> int:
        client = await Client.connect(address, data_converter=pydantic_data_converter)
        history = await client.get_workflow_handle(sid).fetch_history()
        accepted = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
        return sum(
            e.event_type == accepted
            and update_id
            in (None, e.workflow_execution_update_accepted_event_attributes.protocol_instance_id)
            for e in history.events
        )

    return asyncio.run(count())
