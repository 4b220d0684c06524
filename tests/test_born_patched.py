"""A session run is born with its patches and its resolved agent (issue 14): no patch
marker, no ``TemporalChangeVersion`` upsert and no ``load_agent`` in a new session's
history, while histories with markers (older runs, or a run an older worker recorded)
still replay. Real dev server and worker; replays of checked-in histories."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import Engine
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker
from temporalio.workflow import NondeterminismError

from baton.contracts import SESSION_PATCH_LEVEL
from baton.runs import session_store
from baton.runs.launch import send_message
from baton.storage.db import session_scope
from tests.helpers import launch, publish
from workflows.session import SessionWorkflow
from workflows.step import AgentStepWorkflow

HISTORIES = Path(__file__).parent / "histories"


def with_patch_level(path: Path, level: int) -> WorkflowHistory:
    """``path``'s history with its first run's input rewritten to ``patch_level=level``."""
    raw: dict[str, Any] = json.loads(path.read_text())
    started = raw["events"][0]["workflowExecutionStartedEventAttributes"]
    payload = started["input"]["payloads"][0]
    inp = json.loads(base64.b64decode(payload["data"]))
    inp["patch_level"] = level
    payload["data"] = base64.b64encode(json.dumps(inp).encode()).decode()
    return WorkflowHistory.from_json(path.stem, json.dumps(raw))


async def replay(history: WorkflowHistory) -> None:
    replayer = Replayer(
        workflows=[SessionWorkflow, AgentStepWorkflow], data_converter=pydantic_data_converter
    )
    await replayer.replay_workflow(history)


async def test_a_new_session_records_no_patch_marker_and_no_load_agent(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """A new session's run (first turn, a second turn, an idle-status change) has no
    marker and no search-attribute upsert of ``TemporalChangeVersion``: its input says it
    was born with every patch, and carries the agent the launch resolved."""
    publish(db_engine, "born", playbook=[{"reply": "ok"}])
    client = temporal_env.client
    launched = await launch(client, db_engine, worker, "born", "one")
    await send_message(client, db_engine, session_id=launched.session_id, prompt="two", sync=True)
    handle = client.get_workflow_handle(launched.session_id)
    history = await handle.fetch_history()
    kinds = [e.event_type for e in history.events]
    assert EventType.EVENT_TYPE_MARKER_RECORDED not in kinds
    assert kinds.count(EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED) == 2  # two model turns
    upserts = [
        e.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES
    ]
    assert all("TemporalChangeVersion" not in fields for fields in upserts)
    started = history.events[0].workflow_execution_started_event_attributes
    inp = json.loads(started.input.payloads[0].data)
    assert inp["patch_level"] == SESSION_PATCH_LEVEL
    assert inp["agent"]["slug"] == "born" and inp["agent"]["version"] == 1
    with session_scope(db_engine) as s:
        row = session_store.get_session(s, session_id=launched.session_id)
        assert row.resolved_agent == inp["agent"]  # the snapshot load_agent used to record


@pytest.mark.parametrize(
    "name",
    [
        "tool-loop-v8-run1",
        "cancelled-v8-run1",
        "failed-turn-v8-run1",
        "idle-restart-v8-run1",
        "xagent-review-allowed-v8-run1",
        "continue-as-new-v8-run1",
    ],
)
async def test_markers_a_worker_one_release_older_recorded_in_a_born_run_replay(
    name: str,
) -> None:
    """A run launched born-patched but run by a worker of the release before (v8: it has
    every level-1 patch and ignores the field) records patch markers; today's code
    replays them, the SDK's notified patches deciding, so a rolling deploy cannot wedge
    such a run. Fails if the SDK stops exposing its notified patches."""
    await replay(with_patch_level(HISTORIES / f"{name}.json", SESSION_PATCH_LEVEL))


async def test_a_born_run_recorded_by_a_worker_without_the_levels_patches_is_refused() -> None:
    """The limit (docs/deployment.md): a worker older than the level's patches (v5 has
    no one-decision, local-load or idle patches) would run the old branches without
    markers, which a born run cannot replay; so a launcher must not start runs onto
    workers more than one release older."""
    path = HISTORIES / "team-fan-out-v5-run1.json"
    await replay(with_patch_level(path, 0))
    with pytest.raises(NondeterminismError):
        await replay(with_patch_level(path, SESSION_PATCH_LEVEL))


async def test_the_patch_level_decides_the_replay_of_a_run_without_markers() -> None:
    """The negative control: a born run's history (no markers) replayed as if its input
    said level 0 asks ``workflow.patched`` while replaying, takes the old branch and
    is refused as nondeterministic; at its own level it replays."""
    path = HISTORIES / "tool-loop-v9-run1.json"
    await replay(with_patch_level(path, SESSION_PATCH_LEVEL))
    with pytest.raises(NondeterminismError):
        await replay(with_patch_level(path, 0))
