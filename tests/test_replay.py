"""Replay checked-in histories against today's workflow code (docs/development.md, determinism)."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from workflows.session import SessionWorkflow
from workflows.step import AgentStepWorkflow

HERE = Path(__file__).parent / "histories"
HISTORIES = sorted(HERE.glob("*.json"))


def test_histories_are_checked_in() -> None:
    """The replay suite has histories to replay (tool loop, continue-as-new, cancel, failure,
    X-Agent reviews and guards, and the local-activity runs of issue 14, list and read
    calls included)."""
    names = {p.name.rsplit("-run", 1)[0] for p in HISTORIES}
    # v1: before the coarse-status patch; v2: after it; v3: after the cancel-turn patch;
    # v4: after the x-agent-tools patch.
    for tag in ("v1", "v2", "v3", "v4"):
        expected = {f"{kind}-{tag}" for kind in ("tool-loop", "continue-as-new", "cancelled")}
        assert expected | {f"failed-turn-{tag}"} <= names
    # A tool named like an X-Agent tool, called before the patch, stays an ordinary tool.
    assert "xagent-name-prepatch-v3" in names
    for kind in ("review-allowed", "review-timeout", "self-invocation"):
        assert f"xagent-{kind}-v4" in names
    # v5: after the delegation, routing and cancel-cascade patches.
    assert {"team-fan-out-v5", "team-route-v5", "cancel-cascade-v5"} <= names
    # Tools named delegate_to/task and an @mention, before those patches: still ordinary.
    assert "delegation-names-prepatch-v4" in names
    # AgentStepWorkflow: a schema retry and a revise-then-approve handoff.
    assert {"step-schema-retry-v6", "step-handoff-v6"} <= names
    # Steps that end failed or rejected, before the patches (v6: the workflow completed
    # with the status) and after (v7: BatonStatus upserts, the workflow fails with the
    # step's code; completed steps too, with their upserts).
    ends = ("step-invalid", "step-rejected", "step-handoff-timeout", "step-timeout")
    assert {f"{kind}-{tag}" for kind in ends for tag in ("v6", "v7")} <= names
    assert {"step-schema-retry-v7", "step-handoff-v7"} <= names
    # v7: after the idle-completion patch (an idle timer after each turn): the base and
    # X-Agent runs, and a run completing idle then restarted by its next message.
    for kind in ("tool-loop", "continue-as-new", "cancelled", "failed-turn"):
        assert f"{kind}-v7" in names
    assert {"xagent-review-allowed-v7", "xagent-review-timeout-v7", "idle-restart-v7"} <= names
    assert (HERE / "idle-restart-v7-run2.json").exists()
    # perf14: load_agent and settle_review as local activities (issue 14).
    for kind in ("tool-loop", "continue-as-new", "cancelled", "failed-turn"):
        assert f"{kind}-perf14" in names
    assert {"xagent-review-allowed-perf14", "xagent-review-timeout-perf14"} <= names
    # v8: the merged code of issues 12, 14 and 16 (idle completion, local activities, the
    # failed-step patch and the SessionWorkflow split into sections) recorded as one.
    v8 = ("tool-loop", "continue-as-new", "cancelled", "failed-turn", "idle-restart")
    assert {f"{kind}-v8" for kind in v8} <= names
    assert {"xagent-review-allowed-v8", "step-invalid-v8", "step-timeout-v8"} <= names
    # v9: runs born with every patch (no markers) and with their resolved agent (no
    # load_agent), issue 14; tests/test_born_patched.py replays them at other levels too.
    v9 = ("tool-loop", "continue-as-new", "cancelled", "failed-turn", "idle-restart")
    assert {f"{kind}-v9" for kind in v9} <= names
    assert {"xagent-review-allowed-v9", "team-fan-out-v9", "cancel-cascade-v9"} <= names
    # A list_agents call reviewed and allowed, reviewed and denied, and allowed by a policy:
    # v8 with xagent_tool an ordinary activity; perf14read (runs without a patch level) and
    # v10 (born at level 1) with the xagent-read-local-activity marker and the list a local
    # activity (inside settle_review after a review).
    for kind in ("list-reviewed", "list-denied", "list-allowed"):
        assert {f"xagent-{kind}-{tag}" for tag in ("v8", "perf14read", "v10")} <= names


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_history_replays_without_nondeterminism(path: Path) -> None:
    """A recorded run replays cleanly: the workflow code still issues the same commands."""
    replayer = Replayer(
        workflows=[SessionWorkflow, AgentStepWorkflow], data_converter=pydantic_data_converter
    )
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    await replayer.replay_workflow(history)
