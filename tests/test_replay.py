"""Replay checked-in histories against today's workflow code (docs/development.md, Workflow
changes): each was recorded by tests/record_histories.py on the code of a release."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from worker.factory import PASSTHROUGH, WORKFLOWS, workflow_runner

HERE = Path(__file__).parent / "histories"
HISTORIES = sorted(HERE.glob("*.json"))
CHANGELOG = Path(__file__).parent.parent / "CHANGELOG.md"

#: Every ending of each workflow type, recorded on the 1.0.0 baseline.
BASELINE = {
    # Session: tools, continue-as-new, a cancel mid-turn, a failed model call, a pin that
    # does not load, idle completion and the run its next message starts.
    "tool-loop",
    "continue-as-new",
    "cancelled",
    "failed-turn",
    "unloadable",
    "idle-restart",
    "external-idle",
    # X-Agent: reviews of each outcome, the self-invocation guard, reads as local activities.
    "xagent-review-allowed",
    "xagent-review-denied",
    "xagent-review-timeout",
    "xagent-self-invocation",
    "xagent-list-reviewed",
    "xagent-list-denied",
    "xagent-list-allowed",
    # Delegations: a team fan-out and route, ad hoc, a subagent task, a member refused
    # re-delegation, a cancel cascading into a delegation.
    "team-fan-out",
    "team-route",
    "delegate-adhoc",
    "delegate-task",
    "team-member-redelegation",
    "cancel-cascade",
    # AgentStep: completed after a schema retry and after a revised handoff; each failure.
    "step-schema-retry",
    "step-handoff",
    "step-invalid",
    "step-rejected",
    "step-handoff-timeout",
    "step-timeout",
    # Inquiry: answered, and capped at its step limit.
    "inquiry-answered",
    "inquiry-capped",
    # WebhookDelivery: delivered, and failed once its attempts ran out.
    "webhook-delivered",
    "webhook-failed",
}


#: Endings recorded since the baseline, on the unreleased code (named by its next release).
SINCE = {
    # Eval: completed (a session and a step replayed on both sides, recorded and judged),
    # cancelled while its step replays wait, failed (a recorded step gone).
    "eval-completed-1.1.0",
    "eval-cancelled-1.1.0",
    "eval-failed-1.1.0",
    # Reviews: withdrawn by an interrupting message, cancelled with their session.
    "xagent-review-withdrawn-1.1.0",
    "xagent-review-cancelled-1.1.0",
}


def test_the_baseline_histories_are_checked_in() -> None:
    """Every ending the 1.0.0 baseline recorded is in tests/histories/ (with the second run
    of the sessions that continue-as-new or restart after completing idle)."""
    names = {p.name.rsplit("-run", 1)[0] for p in HISTORIES}
    assert {f"{kind}-1.0.0" for kind in BASELINE} <= names
    assert (HERE / "continue-as-new-1.0.0-run2.json").exists()
    assert (HERE / "idle-restart-1.0.0-run2.json").exists()


def test_the_endings_recorded_since_the_baseline_are_checked_in() -> None:
    """The endings added after the baseline (the Eval workflow's, a review withdrawn or
    cancelled) are in tests/histories/, each replayed below."""
    names = {p.name.rsplit("-run", 1)[0] for p in HISTORIES}
    assert names >= SINCE


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def test_history_names_follow_the_release_pattern() -> None:
    """Every history is ``<scenario>-<release>-run<N>.json``, its release one the changelog
    lists or the single next one the unreleased code will ship as (docs/development.md)."""
    released = set(re.findall(r"^## (\d+\.\d+\.\d+)", CHANGELOG.read_text(), re.MULTILINE))
    assert released
    latest = max(released, key=_version)
    pattern = re.compile(r"[a-z][a-z0-9-]*-(\d+\.\d+\.\d+)-run[1-9][0-9]*\.json")
    unreleased = set()
    for path in HISTORIES:
        match = pattern.fullmatch(path.name)
        assert match, path.name
        release = match.group(1)
        if release not in released:
            assert _version(release) > _version(latest), path.name
            unreleased.add(release)
    assert len(unreleased) <= 1, unreleased


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_history_replays_without_nondeterminism(path: Path) -> None:
    """A recorded run replays cleanly: the workflow code still issues the same commands."""
    replayer = Replayer(
        workflows=WORKFLOWS,
        data_converter=pydantic_data_converter,
        workflow_runner=workflow_runner(),  # the worker's sandbox and passthrough list
    )
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    await replayer.replay_workflow(history)


def test_the_edit_check_gate_replays_both_ways() -> None:
    """The handoff-edit-checked gate has a history from before the check (no marker, the
    edit taken as sent) and from after it (marker, an edit refused then one taken)."""
    from workflows.step import EDIT_CHECK_PATCH

    before = (HERE / "step-handoff-edited-1.0.0-run1.json").read_text()
    after = (HERE / "step-handoff-edit-refused-1.1.0-run1.json").read_text()
    assert "MARKER_RECORDED" not in before and "check_edited_deliverable" not in before
    assert "MARKER_RECORDED" in after and after.count("check_edited_deliverable") == 2
    assert EDIT_CHECK_PATCH == "handoff-edit-checked"


def scheduled(path: Path) -> list[tuple[str, str]]:
    """Each activity a history schedules: its type and its summary."""
    out = []
    for event in json.loads(path.read_text())["events"]:
        attrs = event.get("activityTaskScheduledEventAttributes")
        if attrs:
            data = event.get("userMetadata", {}).get("summary", {}).get("data", "")
            out.append((attrs["activityType"]["name"], json.loads(base64.b64decode(data))))
    return out


def test_the_workspace_tools_gate_replays_both_ways() -> None:
    """The workspace-tools gate has a history of its old branch (no marker, ``write_file``
    run by ``run_tool``) and of its new one (marker, the ``workspace_tool`` activity)."""
    from workflows.dispatch import WORKSPACE_TOOLS_PATCH

    before = HERE / "workspace-tools-1.0.0-run1.json"
    after = HERE / "workspace-tools-1.1.0-run1.json"
    assert "MARKER_RECORDED" not in before.read_text()
    assert ("run_tool", "write_file · turn 1") in scheduled(before)
    assert all(kind != "workspace_tool" for kind, _ in scheduled(before))
    assert "MARKER_RECORDED" in after.read_text()
    assert ("workspace_tool", "write_file · turn 1") in scheduled(after)
    assert WORKSPACE_TOOLS_PATCH == "workspace-tools"


def test_the_failed_reply_gate_has_a_history_with_its_marker() -> None:
    """The failed-reply-ends-its-calls gate: a run recorded after it holds its marker, the
    review timer cancelled and the failure recorded; the 1.0.0 histories hold no marker."""
    from workflows.dispatch import FAILED_REPLY_PATCH

    def patches(path: Path) -> list[bytes]:
        history = WorkflowHistory.from_json(path.stem, path.read_text())
        return [
            payload.data
            for e in history.events
            if e.marker_recorded_event_attributes.marker_name == "core_patch"
            for payload in e.marker_recorded_event_attributes.details["patch-data"].payloads
        ]

    after = HERE / "failed-reply-1.1.0-run1.json"
    assert FAILED_REPLY_PATCH == "failed-reply-ends-its-calls"
    assert [FAILED_REPLY_PATCH.encode() in data for data in patches(after)] == [True]
    assert "TIMER_CANCELED" in after.read_text() and "record_failure" in after.read_text()
    older = [p for p in HISTORIES if "1.0.0-" in p.name]
    assert older
    assert not [p for p in older if any(FAILED_REPLY_PATCH.encode() in d for d in patches(p))]


def gate_ids() -> set[str]:
    """The patch id of every ``workflow.patched``/``deprecate_patch`` call in ``workflows/``
    (a string literal, or a module-level constant of a ``workflows`` module)."""
    import ast

    trees = [ast.parse(p.read_text()) for p in (HERE.parent.parent / "workflows").glob("*.py")]
    constants = {
        target.id: node.value.value
        for tree in trees
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    ids: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in {"patched", "deprecate_patch"}
            ):
                arg = node.args[0]
                if isinstance(arg, ast.Name) and arg.id in constants:
                    value = constants[arg.id]
                else:
                    assert isinstance(arg, ast.Constant), ast.dump(arg)
                    value = arg.value
                assert isinstance(value, str), ast.dump(arg)
                ids.add(value)
    return ids


def test_every_gate_is_listed_after_the_baseline() -> None:
    """Each patch id the workflows use is named in the changelog after the 1.0.0 baseline
    (Unreleased or a later release), and the 1.0.0 entry names none: the baseline has no
    gate (docs/development.md, Workflow changes)."""
    text = CHANGELOG.read_text()
    after, baseline = text.split("\n## 1.0.0", 1)
    ids = gate_ids()
    assert ids  # the parser found the gates there are
    assert [i for i in ids if f"`{i}`" not in after] == []
    assert [i for i in ids if f"`{i}`" in baseline] == []


def test_the_passthrough_names_the_activity_modules_the_workflows_import() -> None:
    """The sandbox passes through exactly the ``activities`` modules workflow code imports
    (each listed with its reason in worker/factory.py), and every ``baton`` module workflow
    code imports is under a passthrough entry."""
    import ast

    imported = set()
    for path in (HERE.parent.parent / "workflows").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imported.add(node.module)
            elif isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)

    def passed(module: str) -> bool:
        return any(module == p or module.startswith(p + ".") for p in PASSTHROUGH)

    activity_modules = {m for m in imported if m.split(".")[0] == "activities"}
    assert activity_modules == {p for p in PASSTHROUGH if p.split(".")[0] == "activities"}
    assert [m for m in imported if m.split(".")[0] == "baton" and not passed(m)] == []
