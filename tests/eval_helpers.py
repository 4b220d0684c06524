"""Eval rows as the eval workflow leaves them, written straight into the database (the
read side, the gate and the console read them; the eval engine writes them)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.engine import Engine

from baton.storage.db import EvalRow, session_scope


def session_report(
    n: int, *, baseline: str = "same answer", candidate: str | None = None, regression: bool = False
) -> dict[str, Any]:
    """One session of a report (the eval contract's shape); ``candidate`` None = same."""
    cand = baseline if candidate is None else candidate
    same = cand == baseline
    return {
        "session_id": f"sess-{n}",
        "baseline_session_id": f"sess-b{n}",
        "candidate_session_id": f"sess-c{n}",
        "final": {
            "baseline": baseline,
            "candidate": cand,
            "same": same,
            "similarity": 1.0 if same else 0.5,
            "diff": "" if same else f"-{baseline}\n+{cand}",
            "judge": None,
        },
        "tools": {
            "baseline": ["lookup"],
            "candidate": ["lookup"] if same else ["lookup", "fetch"],
            "diff": [{"op": "same", "tool": "lookup"}]
            + ([] if same else [{"op": "added", "tool": "fetch"}]),
            "same": same,
        },
        "decisions": {
            "baseline": [
                {"operation": "invoke", "target": "helper", "decision": "allow", "outcome": "ok"}
            ],
            "candidate": [
                {
                    "operation": "invoke",
                    "target": "helper",
                    "decision": "allow" if not regression else "block",
                    "outcome": "ok" if not regression else "blocked_by_policy",
                }
            ],
            "same": not regression,
        },
        "deliverable": {"baseline_valid": None, "candidate_valid": None},
        "usage": {
            "baseline": {"tokens": 100, "cost_usd": 0.001, "latency_ms": 800},
            "candidate": {"tokens": 120, "cost_usd": 0.0012, "latency_ms": 900},
        },
        "errors": {"baseline": None, "candidate": None},
        "changed": not same or regression,
        "regression": regression,
    }


def report(sessions: list[dict[str, Any]]) -> dict[str, Any]:
    """A report holding ``sessions`` and their totals."""
    n = len(sessions)
    return {
        "sessions": sessions,
        "totals": {
            "sessions": n,
            "changed": sum(s["changed"] for s in sessions),
            "regressions": sum(s["regression"] for s in sessions),
            "tools_changed": sum(not s["tools"]["same"] for s in sessions),
            "decisions_changed": sum(not s["decisions"]["same"] for s in sessions),
            "deliverable_pass_rate": {"baseline": None, "candidate": None},
            "tokens": {"baseline": 100 * n, "candidate": 120 * n},
            "cost_usd": {"baseline": 0.001 * n, "candidate": 0.0012 * n},
            "latency_ms_p50": {"baseline": 800, "candidate": 900},
            "errors": {"baseline": 0, "candidate": 0},
        },
    }


def insert_eval(
    engine: Engine,
    slug: str,
    *,
    digest: str = "sha256:" + "0" * 64,
    owner: str = "local",
    status: str = "completed",
    total: int = 10,
    done: int | None = None,
    changed: int = 0,
    regressions: int = 0,
    candidate: str = "draft",
    report_body: dict[str, Any] | None = None,
    age_s: float = 0.0,
) -> str:
    """Store an eval of ``slug`` as the eval workflow leaves it; returns its id.
    ``age_s`` dates it that many seconds ago (lists order newest first)."""
    eval_id = f"eval-{uuid.uuid4()}"
    created = datetime.now(UTC) - timedelta(seconds=age_s)
    with session_scope(engine) as s:
        s.add(
            EvalRow(
                id=eval_id,
                agent_slug=slug,
                candidate=candidate,
                candidate_digest=digest,
                baseline="live",
                options={"tools": "recorded"},
                status=status,
                total=total,
                done=total if done is None else done,
                changed=changed,
                regressions=regressions,
                report=report_body,
                owner=owner,
                workflow_id=eval_id,
                created_at=created,
                finished_at=None if status == "running" else created,
            )
        )
    return eval_id
