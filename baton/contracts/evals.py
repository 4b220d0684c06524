"""The answers of the eval endpoints (docs/change-safely.md, Replay against a candidate):
an eval's counters (:class:`EvalSummary`, what lists show) and with its report
(:class:`EvalReport`, one eval); and the publish gate an eval must meet
(:class:`PublishGate`: a spec field and the ``BATON_PUBLISH_GATE`` setting).

Sandbox-safe: no I/O, no settings, no SQLModel tables.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

#: What an eval id looks like (the eval engine names them ``eval-<uuid>``).
EVAL_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,79}$"
#: An eval's status: ``running`` until every replay finished, then one of the others.
EvalStatus = Literal["running", "completed", "failed", "cancelled"]

_SUMMARY_EXAMPLE: dict[str, Any] = {
    "id": "eval-5f0c9a3e-2b1d-4c8e-9a7f-1d2e3f4a5b6c",
    "agent_slug": "researcher",
    "candidate": "draft",
    "candidate_digest": "sha256:9f2c…",
    "baseline": "live",
    "options": {"tools": "recorded", "sessions": 10},
    "status": "completed",
    "total": 10,
    "done": 10,
    "changed": 2,
    "regressions": 0,
    "error": None,
    "owner": "local",
    "workflow_id": "eval-5f0c9a3e-2b1d-4c8e-9a7f-1d2e3f4a5b6c",
    "created_at": "2026-12-01T09:00:00Z",
    "finished_at": "2026-12-01T09:02:10Z",
}

_REPORT_EXAMPLE: dict[str, Any] = {
    "sessions": [
        {
            "kind": "session",
            "session_id": "sess-1",
            "baseline_session_id": "sess-eval-b1",
            "candidate_session_id": "sess-eval-c1",
            "final": {
                "baseline": "Paris.",
                "candidate": "Paris, France.",
                "same": False,
                "similarity": 0.72,
                "diff": "-Paris.\n+Paris, France.",
                "judge": None,
            },
            "tools": {
                "baseline": ["web_search"],
                "candidate": ["web_search", "fetch"],
                "diff": [{"op": "same", "tool": "web_search"}, {"op": "added", "tool": "fetch"}],
                "same": False,
            },
            "decisions": {"baseline": [], "candidate": [], "same": True},
            "deliverable": {"baseline_valid": None, "candidate_valid": None},
            "usage": {
                "baseline": {"tokens": 120, "cost_usd": 0.0, "latency_ms": 900},
                "candidate": {"tokens": 140, "cost_usd": 0.0, "latency_ms": 1100},
            },
            "errors": {"baseline": None, "candidate": None},
            "changed": True,
            "regression": False,
        }
    ],
    "totals": {
        "sessions": 1,
        "steps": 0,
        "changed": 1,
        "regressions": 0,
        "tools_changed": 1,
        "decisions_changed": 0,
        "deliverable_pass_rate": {"baseline": None, "candidate": None},
        "tokens": {"baseline": 120, "candidate": 140},
        "cost_usd": {"baseline": 0.0, "candidate": 0.0},
        "latency_ms_p50": {"baseline": 900, "candidate": 1100},
        "errors": {"baseline": 0, "candidate": 0},
    },
}


#: Upper bound of each number of a publish gate (sessions an eval replays, sessions it
#: may change or regress).
MAX_GATE_SESSIONS = 1000


class PublishGate(BaseModel):
    """What an eval of the draft must show before the draft may be published
    (docs/change-safely.md, 'The publish gate'): at least ``eval_sessions`` recorded
    sessions replayed, at most ``max_changed`` of them changed and at most
    ``max_regressions`` worse on the draft than on the baseline."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [{"eval_sessions": 10, "max_changed": 2, "max_regressions": 0}]
        },
    )

    eval_sessions: int = Field(
        ge=1, le=MAX_GATE_SESSIONS, description="Fewest sessions the eval must replay."
    )
    max_changed: int = Field(
        ge=0,
        le=MAX_GATE_SESSIONS,
        description="Most sessions whose answer, tools or decisions may change.",
    )
    max_regressions: int = Field(
        default=0,
        ge=0,
        le=MAX_GATE_SESSIONS,
        description="Most sessions the draft may do worse on than the baseline.",
    )

    def stricter(self, other: PublishGate) -> PublishGate:
        """The gate meeting both: the most sessions, the fewest changes and regressions."""
        return PublishGate(
            eval_sessions=max(self.eval_sessions, other.eval_sessions),
            max_changed=min(self.max_changed, other.max_changed),
            max_regressions=min(self.max_regressions, other.max_regressions),
        )

    @classmethod
    def parse(cls, text: str) -> PublishGate | None:
        """A gate from its setting form: JSON (``{"eval_sessions": 10, ...}``) or
        ``eval_sessions=10,max_changed=2,max_regressions=0``; blank = None (no gate).
        Raises ValueError naming what is wrong (bounds as :class:`PublishGate`)."""
        text = text.strip()
        if not text:
            return None
        try:
            if text.startswith("{"):
                return cls.model_validate_json(text)
            fields: dict[str, str] = {}
            for part in text.replace(" ", ",").split(","):
                key, eq, value = part.partition("=")
                if part and (not eq or not key):
                    raise ValueError(f"'{part}' is not name=value")
                if part:
                    fields[key] = value
            return cls.model_validate(fields, strict=False)
        except ValidationError as exc:
            raise ValueError(
                "; ".join(
                    f"{'.'.join(map(str, e['loc'])) or 'gate'}: {e['msg']}" for e in exc.errors()
                )
            ) from None


class EvalSummary(BaseModel):
    """One eval without its report: what it compares and how far it got."""

    model_config = ConfigDict(json_schema_extra={"examples": [_SUMMARY_EXAMPLE]})

    id: str
    agent_slug: str
    candidate: str = Field(description="The agent reference replayed: `draft` or `slug@V`.")
    candidate_digest: str = Field(
        description="`sha256:` digest of the candidate's spec when the eval started; the "
        "publish gate accepts an eval only of the draft with this digest."
    )
    baseline: str = Field(description="The reference compared against: `live` or `slug@V`.")
    options: dict[str, Any] = Field(description="The eval's options as started.")
    status: EvalStatus
    total: int = Field(ge=0, description="Recorded sessions replayed.")
    done: int = Field(ge=0, description="Replays finished so far.")
    changed: int = Field(ge=0, description="Sessions whose answer, tools or decisions changed.")
    regressions: int = Field(ge=0, description="Sessions the candidate did worse on.")
    error: str | None = Field(description="Why the eval failed; null otherwise.")
    owner: str = Field(description="Who started it (`local` with auth off).")
    workflow_id: str = Field(description="The Temporal workflow running the eval.")
    created_at: datetime
    finished_at: datetime | None


class EvalReport(EvalSummary):
    """One eval with its report: per session and in total, baseline against candidate.
    While running, ``report`` holds the sessions finished so far (partial totals)."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{**_SUMMARY_EXAMPLE, "report": _REPORT_EXAMPLE}]}
    )

    report: dict[str, Any] | None = Field(
        description='`{"sessions": [...], "totals": {...}}` (docs/change-safely.md, '
        "The comparison); null before the first replay finished."
    )
