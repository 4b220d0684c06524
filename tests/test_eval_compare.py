"""The comparison of two replays (docs/change-safely.md, The comparison): text diff and
similarity, the tool sequence's LCS diff, changed and regression, and the totals."""

from __future__ import annotations

from baton.contracts.activity_io import ReplayOutcome
from baton.evals import compare

INVOKE = {"operation": "invoke", "target": "t", "decision": "review", "outcome": "allow"}
BLOCK = {"operation": "invoke", "target": "t", "decision": "review", "outcome": "block"}


def outcome(**fields: object) -> ReplayOutcome:
    """A replay's outcome with ``fields`` over an empty one."""
    return ReplayOutcome.model_validate({"session_id": "session-x", **fields})


def test_equal_texts_are_the_same_with_no_diff_and_similarity_one() -> None:
    """Equal finals (empty ones too): similarity 1.0 and an empty diff."""
    assert compare.similarity("", "") == 1.0 and compare.text_diff("a\nb", "a\nb") == ""
    assert compare.similarity("abc", "abc") == 1.0


def test_changed_texts_have_a_unified_diff_and_a_ratio_below_one() -> None:
    """A changed final: a unified diff baseline → candidate and difflib's ratio."""
    diff = compare.text_diff("one\ntwo", "one\nthree")
    assert diff.splitlines()[:2] == ["--- baseline", "+++ candidate"]
    assert "-two" in diff and "+three" in diff
    assert compare.similarity("abcd", "abce") == 0.75
    assert compare.similarity("abc", "") == 0.0


def test_the_tool_diff_is_a_longest_common_subsequence() -> None:
    """a b c d against a c e d keeps a, c, d (the LCS); b removed, e added, in order."""
    diff = compare.sequence_diff(["a", "b", "c", "d"], ["a", "c", "e", "d"])
    assert diff == [
        {"op": "same", "tool": "a"},
        {"op": "removed", "tool": "b"},
        {"op": "same", "tool": "c"},
        {"op": "added", "tool": "e"},
        {"op": "same", "tool": "d"},
    ]
    assert compare.sequence_diff([], ["x"]) == [{"op": "added", "tool": "x"}]
    assert compare.sequence_diff(["x"], []) == [{"op": "removed", "tool": "x"}]


def test_a_session_changes_on_its_final_its_tools_or_its_decisions() -> None:
    """Same everything: unchanged; a different final, tool sequence or decision list each
    make the session changed (and only a new block, error or failed deliverable a
    regression)."""
    base = outcome(final="hi", tools=["a"], decisions=[INVOKE])
    assert not compare.compare_session("r", base, base)["changed"]
    for other in (
        outcome(final="ho", tools=["a"], decisions=[INVOKE]),
        outcome(final="hi", tools=["a", "a"], decisions=[INVOKE]),
        outcome(final="hi", tools=["a"], decisions=[]),
    ):
        item = compare.compare_session("r", base, other)
        assert item["changed"] and not item["regression"]
    blocked = compare.compare_session(
        "r", base, outcome(final="hi", tools=["a"], decisions=[BLOCK])
    )
    assert blocked["regression"]
    errored = compare.compare_session("r", base, outcome(final="hi", error="boom"))
    assert errored["regression"] and errored["errors"] == {"baseline": None, "candidate": "boom"}
    failed = compare.compare_session(
        "r", outcome(deliverable_valid=True), outcome(deliverable_valid=False)
    )
    assert failed["regression"] and failed["deliverable"]["candidate_valid"] is False
    both_errored = compare.compare_session("r", outcome(error="x"), outcome(error="y"))
    assert not both_errored["regression"]


def test_totals_count_sum_and_take_the_median_latency() -> None:
    """Totals: counts, per-side tokens and cost summed, the median latency, errors,
    deliverable pass rates (None with no deliverable)."""
    sessions = [
        compare.compare_session(
            "r1",
            outcome(tokens=10, cost_usd=0.5, latency_ms=100),
            outcome(tokens=12, latency_ms=300),
        ),
        compare.compare_session(
            "r2", outcome(tokens=5, latency_ms=200), outcome(tokens=5, latency_ms=100, error="e")
        ),
        compare.compare_session("r3", outcome(latency_ms=900), outcome(latency_ms=200)),
    ]
    totals = compare.totals(sessions)
    assert totals["sessions"] == 3 and totals["regressions"] == 1
    assert totals["tokens"] == {"baseline": 15, "candidate": 17}
    assert totals["cost_usd"] == {"baseline": 0.5, "candidate": 0.0}
    assert totals["latency_ms_p50"] == {"baseline": 200, "candidate": 200}
    assert totals["errors"] == {"baseline": 0, "candidate": 1}
    assert totals["deliverable_pass_rate"] == {"baseline": None, "candidate": None}
    assert compare.totals([])["latency_ms_p50"] == {"baseline": 0, "candidate": 0}


def test_the_report_shape_is_the_contracts() -> None:
    """Every key of the report's session and totals is there, nothing else."""
    item = compare.compare_session("r", outcome(), outcome())
    assert set(item) == {
        "kind",
        "session_id",
        "baseline_session_id",
        "candidate_session_id",
        "final",
        "tools",
        "decisions",
        "deliverable",
        "usage",
        "errors",
        "changed",
        "regression",
    }
    assert set(item["final"]) == {"baseline", "candidate", "same", "similarity", "diff", "judge"}
    assert set(compare.report([item])) == {"sessions", "totals"}


def test_a_step_item_compares_deliverables_per_side_with_the_recorded_handoff() -> None:
    """A step item: kind "step", each side's schema pass, attempts and deliverable, the
    recorded handoff outcome; the candidate failing the schema where the baseline passed
    is a changed regression, an equal deliverable is neither, and the pass rate counts
    steps only."""
    passed = outcome(deliverable_valid=True, deliverable={"a": 1}, attempts=1, final='{"a": 1}')
    failed = outcome(deliverable_valid=False, attempts=3, final="nope", error="invalid_deliverable")
    item = compare.compare_step("step-r", "approved", passed, failed)
    assert (item["kind"], item["step_id"], item["session_id"]) == ("step", "step-r", "step-r")
    assert item["deliverable"] == {
        "baseline_valid": True,
        "candidate_valid": False,
        "baseline": {"valid": True, "attempts": 1, "value": {"a": 1}},
        "candidate": {"valid": False, "attempts": 3, "value": None},
        "recorded_handoff": "approved",
        "same": False,
    }
    assert (item["changed"], item["regression"]) == (True, True)
    alike = compare.compare_step("step-s", "none", passed, passed)
    assert (alike["changed"], alike["regression"], alike["deliverable"]["same"]) == (
        False,
        False,
        True,
    )
    better = compare.compare_step("step-t", "rejected", failed, passed)
    assert (better["changed"], better["regression"]) == (True, False)
    session = compare.compare_session("session-r", outcome(), outcome())
    totals = compare.totals([item, alike, better, session])
    assert (totals["sessions"], totals["steps"], totals["regressions"]) == (4, 3, 1)
    assert totals["deliverable_pass_rate"] == {"baseline": 0.6667, "candidate": 0.6667}
