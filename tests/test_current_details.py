"""The session workflow's current details: what the Temporal UI shows
an operator about a session now. Real dev server and worker, read the way the UI reads
them (the SDK's built-in ``__temporal_workflow_metadata`` Query)."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime, timedelta

from sqlalchemy.engine import Engine
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from tests.helpers import TEST_CONFIG, launch, publish, wait_for
from tests.test_idle_sessions import completed
from tests.xagent_helpers import decide, pending_review, setup_pair, tool_messages

INVOKE = {"slug": "target", "prompt": "hello target", "sync": True}


async def details(client: Client, session_id: str) -> str:
    """The workflow's current details, as the Temporal UI asks for them."""
    meta: WorkflowMetadata = await client.get_workflow_handle(session_id).query(
        "__temporal_workflow_metadata", result_type=WorkflowMetadata
    )
    return str(meta.current_details)


async def test_details_show_status_pin_turn_and_the_last_message(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """After a turn: the status, the agent pin, the turn and the reply's preview (cut to
    80 characters); after the run completes idle, a line saying the next message
    starts the next run."""
    client = temporal_env.client
    publish(db_engine, "echo", playbook=[{"reply": "you said {last_message} " + "x" * 100}])
    config = TEST_CONFIG.model_copy(update={"idle_timeout_s": 1.0})
    sid = (await launch(client, db_engine, worker, "echo", "one", config=config)).session_id
    shown = await details(client, sid)
    first, last = shown.splitlines()
    assert first == "**idle** · `echo@1` · turn 1"
    assert last.startswith("- last: echo: you said one xxx") and last.endswith("…")
    assert len(last.removeprefix("- last: ")) == 80
    await completed(client, sid)
    assert (await details(client, sid)).splitlines()[1] == (
        "- this run completed idle; the next message starts the next run"
    )


async def test_details_show_the_pending_review_with_its_deadline(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """While a review waits: ``awaiting_input``, the review's id, operation and target, the
    time it times out (its creation + the 300 s review timeout) and the command that
    approves it; once decided the review line is gone."""
    client = temporal_env.client
    setup_pair(db_engine, "invoke_agent", INVOKE)
    sid = (await launch(client, db_engine, worker, "caller", "go", sync=False)).session_id
    (review,) = await pending_review(db_engine, sid)
    shown = ""

    async def review_shown() -> bool:
        nonlocal shown
        shown = await details(client, sid)
        return shown.startswith("**awaiting_input**")

    for _ in range(200):
        if await review_shown():
            break
        await asyncio.sleep(0.05)
    lines = shown.splitlines()
    assert lines[0] == "**awaiting_input** · `caller@1` · turn 1"
    found = re.fullmatch(
        rf"- review `{review.id}`: invoke → target, decide by (.+) UTC "
        rf"\(`baton reviews approve {review.id}`\)",
        lines[1],
    )
    assert found, lines
    deadline = datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
    expected = review.created_at.replace(tzinfo=UTC) + timedelta(seconds=300)
    assert abs(deadline - expected) < timedelta(seconds=5), (deadline, expected)
    assert lines[2] == "- last: local: go"

    await decide(client, review, "allow_once")
    await wait_for(lambda: len(tool_messages(db_engine, sid)) == 1)
    for _ in range(200):
        shown = await details(client, sid)
        if shown.startswith("**idle**"):
            break
        await asyncio.sleep(0.05)
    assert "review" not in shown and shown.splitlines()[-1].startswith("- last: caller: RESULT")
