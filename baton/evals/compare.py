"""The comparison of an eval (docs/change-safely.md, Replay against a candidate): one
recorded session's baseline and candidate replays side by side, and the totals.

A session is ``changed`` when its final answer, its tool-call sequence or its cross-agent
decisions differ between the two replays; a ``regression`` when the candidate errored, failed
its deliverable or was blocked where the baseline was not. Both replays run the same user
turns, so what differs between two runs of the unchanged agent (the faithful baseline) is
noise, and what differs here is the candidate's doing or that noise, side by side.
"""

from __future__ import annotations

import difflib
import statistics
from typing import Any

from baton.contracts.activity_io import ReplayOutcome

#: Lines of context in a final answer's unified diff.
DIFF_CONTEXT = 2


def similarity(a: str, b: str) -> float:
    """How alike two texts are, 0.0 to 1.0 (difflib's ratio, no junk heuristic), 1.0 for two
    equal texts (two empty ones too), rounded to 4 places."""
    if a == b:
        return 1.0
    return round(difflib.SequenceMatcher(None, a, b, autojunk=False).ratio(), 4)


def text_diff(a: str, b: str) -> str:
    """The unified diff of ``a`` (baseline) to ``b`` (candidate) by line; '' when equal."""
    if a == b:
        return ""
    lines = difflib.unified_diff(
        a.splitlines(),
        b.splitlines(),
        fromfile="baseline",
        tofile="candidate",
        n=DIFF_CONTEXT,
        lineterm="",
    )
    return "\n".join(lines)


def sequence_diff(a: list[str], b: list[str]) -> list[dict[str, str]]:
    """The longest-common-subsequence diff of two tool sequences: ``[{op: same | removed |
    added, tool}]`` in order, every item of ``a`` and of ``b`` once (removed: only in
    ``a``, the baseline; added: only in ``b``, the candidate)."""
    n, m = len(a), len(b)
    lcs = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            lcs[i][j] = lcs[i + 1][j + 1] + 1 if a[i] == b[j] else max(lcs[i + 1][j], lcs[i][j + 1])
    out: list[dict[str, str]] = []
    i = j = 0
    while i < n and j < m:
        if a[i] == b[j]:
            out.append({"op": "same", "tool": a[i]})
            i, j = i + 1, j + 1
        elif lcs[i + 1][j] >= lcs[i][j + 1]:
            out.append({"op": "removed", "tool": a[i]})
            i += 1
        else:
            out.append({"op": "added", "tool": b[j]})
            j += 1
    out += [{"op": "removed", "tool": t} for t in a[i:]]
    out += [{"op": "added", "tool": t} for t in b[j:]]
    return out


def _blocked(decisions: list[dict[str, Any]]) -> set[tuple[Any, Any]]:
    return {(d["operation"], d["target"]) for d in decisions if d["outcome"] != "allow"}


def _usage(r: ReplayOutcome) -> dict[str, Any]:
    return {"tokens": r.tokens, "cost_usd": r.cost_usd, "latency_ms": r.latency_ms}


def compare_session(
    recorded: str, baseline: ReplayOutcome, candidate: ReplayOutcome
) -> dict[str, Any]:
    """One session of the report (its shape: docs/change-safely.md, The report)."""
    same_final = baseline.final == candidate.final
    same_tools = baseline.tools == candidate.tools
    same_decisions = baseline.decisions == candidate.decisions
    regression = (
        (candidate.error is not None and baseline.error is None)
        or (candidate.deliverable_valid is False and baseline.deliverable_valid is not False)
        or bool(_blocked(candidate.decisions) - _blocked(baseline.decisions))
    )
    return {
        "kind": "session",
        "session_id": recorded,
        "baseline_session_id": baseline.session_id,
        "candidate_session_id": candidate.session_id,
        "final": {
            "baseline": baseline.final,
            "candidate": candidate.final,
            "same": same_final,
            "similarity": similarity(baseline.final, candidate.final),
            "diff": text_diff(baseline.final, candidate.final),
            "judge": None,
        },
        "tools": {
            "baseline": baseline.tools,
            "candidate": candidate.tools,
            "diff": sequence_diff(baseline.tools, candidate.tools),
            "same": same_tools,
        },
        "decisions": {
            "baseline": baseline.decisions,
            "candidate": candidate.decisions,
            "same": same_decisions,
        },
        "deliverable": {
            "baseline_valid": baseline.deliverable_valid,
            "candidate_valid": candidate.deliverable_valid,
        },
        "usage": {"baseline": _usage(baseline), "candidate": _usage(candidate)},
        "errors": {"baseline": baseline.error, "candidate": candidate.error},
        "changed": not (same_final and same_tools and same_decisions),
        "regression": regression,
    }


def compare_step(
    recorded: str, handoff: str, baseline: ReplayOutcome, candidate: ReplayOutcome
) -> dict[str, Any]:
    """One recorded step of the report: the items of :func:`compare_session` (``final`` is
    each side's deliverable as canonical JSON, or its last output when it failed) with
    ``kind`` ``step``, ``step_id`` and ``session_id`` the recorded step's id, and
    ``deliverable`` per side ``{valid, attempts, value}`` beside ``recorded_handoff`` (the
    original step's last handoff decision: approved | revised | rejected | none) and
    ``same``. ``changed``: the deliverables (or the tool sequences) differ;
    ``regression``: the candidate failed the schema or errored where the baseline did
    not."""
    item = compare_session(recorded, baseline, candidate)
    same_deliverable = (
        baseline.deliverable_valid == candidate.deliverable_valid
        and baseline.deliverable == candidate.deliverable
        and (baseline.deliverable_valid or baseline.final == candidate.final)
    )
    item.update(
        kind="step",
        step_id=recorded,
        baseline_step_id=baseline.session_id,
        candidate_step_id=candidate.session_id,
        changed=not (same_deliverable and item["tools"]["same"]),
    )
    item["deliverable"].update(
        {
            side: {"valid": r.deliverable_valid, "attempts": r.attempts, "value": r.deliverable}
            for side, r in (("baseline", baseline), ("candidate", candidate))
        }
    )
    item["deliverable"].update(recorded_handoff=handoff, same=same_deliverable)
    return item


def _pass_rate(values: list[bool | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(sum(known) / len(known), 4) if known else None


def totals(sessions: list[dict[str, Any]]) -> dict[str, Any]:
    """The report's totals over ``sessions`` (:func:`compare_session` and
    :func:`compare_step` items): counts (``sessions`` all items, ``steps`` the steps among
    them), the deliverable pass rate per side (None when no item had a deliverable: only
    steps have one), tokens and
    cost summed, the median latency, errors counted."""

    def side(key: str, s: str) -> list[Any]:
        return [x[key][s] for x in sessions]

    def both(fn: Any) -> dict[str, Any]:
        return {s: fn(s) for s in ("baseline", "candidate")}

    return {
        "sessions": len(sessions),
        "steps": sum(x.get("kind") == "step" for x in sessions),
        "changed": sum(x["changed"] for x in sessions),
        "regressions": sum(x["regression"] for x in sessions),
        "tools_changed": sum(not x["tools"]["same"] for x in sessions),
        "decisions_changed": sum(not x["decisions"]["same"] for x in sessions),
        "deliverable_pass_rate": {
            "baseline": _pass_rate([x["deliverable"]["baseline_valid"] for x in sessions]),
            "candidate": _pass_rate([x["deliverable"]["candidate_valid"] for x in sessions]),
        },
        "tokens": both(lambda s: sum(u["tokens"] for u in side("usage", s))),
        "cost_usd": both(lambda s: round(sum(u["cost_usd"] for u in side("usage", s)), 6)),
        "latency_ms_p50": both(
            lambda s: (
                int(statistics.median(u["latency_ms"] for u in side("usage", s))) if sessions else 0
            )
        ),
        "errors": both(lambda s: sum(e is not None for e in side("errors", s))),
    }


def report(sessions: list[dict[str, Any]]) -> dict[str, Any]:
    """The report: ``{"sessions": [...], "totals": {...}}`` (partial while an eval runs)."""
    return {"sessions": sessions, "totals": totals(sessions)}
