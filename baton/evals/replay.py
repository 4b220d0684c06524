"""Replay recorded sessions against a candidate (docs/change-safely.md, Replay against a
candidate): which recorded sessions an eval picks, the replay sessions it starts, and how a
replay's calls are answered from the recording.

A replay is a session of its own (``eval_id``, ``replay_of`` on its row; BatonKind
``eval``) that is sent the recorded session's user messages, one turn each, on the
candidate or the baseline. Ordinary lists leave it out (:func:`baton.runs.session_store.
list_sessions`). Its calls never reach the outside world unless the eval says so:

- a tool call (an ordinary or an MCP tool): ``tools: recorded`` answers it with the result
  the recorded session got for the same tool and the same arguments; a miss runs it
  (``on_miss: live``) or is refused ``eval_unrecorded`` (``on_miss: fail``). ``tools:
  live`` runs every call.
- a cross-agent call: the policy decision is evaluated as for any session and recorded
  in the audit log (``decided_by`` ``eval:policy``); a ``review`` never asks a person: it is
  answered by the recorded session's review of the same operation and target
  (``eval:recording``, its audit row carrying the recorded outcome: a timeout stays
  ``review_timeout``) and denied without one (``eval:unrecorded``).
- an invoke or another delegation: answered with the recorded session's result of the
  same call, else refused ``eval_unrecorded``; no other agent runs.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, get_args

from sqlalchemy import func
from sqlmodel import Session, col, select

from baton.contracts.codes import EVAL_UNRECORDED
from baton.errors import BatonError
from baton.permissions.reviews import AuditOutcome, add_audit
from baton.runs import session_store
from baton.runs.handoff import REVISE_PROMPT
from baton.storage.db import AuditRow, EvalRow, SessionRow, StepRow, UsageRow

ToolsMode = Literal["recorded", "live"]
OnMiss = Literal["live", "fail"]
Side = Literal["baseline", "candidate"]

#: Most recorded sessions one eval replays (``sessions`` / ``session_ids``).
MAX_EVAL_SESSIONS = 100
#: Most recorded workflow-agent steps one eval replays (``steps`` / ``step_ids``).
MAX_EVAL_STEPS = 100
#: Recorded steps an eval replays when the request names neither a count nor ids: none
#: (an eval of sessions stays what it was; steps are asked for).
DEFAULT_EVAL_STEPS = 0
#: Statuses of a recorded step an eval replays: it has ended.
ENDED_STEP_STATUSES = ("completed", "failed", "rejected")
#: Recorded sessions an eval replays when the request names neither a count nor ids.
DEFAULT_EVAL_SESSIONS = 10
#: ``decided_by`` of the audit rows a replay's cross-agent decisions leave: the policy
#: decided it; a review answered from the recording; a review denied for want of one.
BY_POLICY, BY_RECORDING, BY_UNRECORDED = "eval:policy", "eval:recording", "eval:unrecorded"
#: Characters of a replay's final answer kept in the report.
MAX_FINAL_CHARS = 20_000

_REPLAY_NAMESPACE = uuid.UUID("6c1e9f3a-5b7d-4c2e-9a61-0e2f4b8d7c15")


class NoSessions(BatonError):
    """The eval would replay nothing: the agent has no recorded session the caller reads
    (in the window asked for)."""

    code = "no_sessions"
    status = 422
    title = "No recorded sessions"


class UnknownSessions(BatonError):
    """``session_ids`` names a session that is not a recording of the agent the caller
    reads (unknown, another agent's, an eval's replay or a sandbox fork)."""

    code = "unknown_sessions"
    status = 422
    title = "Unknown sessions"


def pick_sessions(
    s: Session,
    *,
    slug: str,
    visible: list[str] | None,
    sessions: int | None = None,
    session_ids: list[str] | None = None,
    since: datetime | None = None,
) -> list[str]:
    """The recorded sessions an eval of ``slug`` replays, oldest first: ``session_ids`` as
    given, else the newest ``sessions`` (default :data:`DEFAULT_EVAL_SESSIONS`) created at
    or after ``since``. Only what :func:`~baton.runs.session_store.list_sessions` lists for
    ``visible`` (the caller's readable agents, None = all): never a step, an eval's replay
    or a sandbox session. Raises UnknownSessions (422) for an id outside that, NoSessions
    (422) for none at all."""
    limit = len(session_ids) if session_ids else (sessions or DEFAULT_EVAL_SESSIONS)
    rows, _ = session_store.list_sessions(
        s,
        agent=slug,
        agents=visible,
        sandbox=False,
        ids=session_ids,
        since=since,
        limit=limit,
    )
    if session_ids:
        found = {r.id for r in rows}
        missing = [i for i in session_ids if i not in found]
        if missing:
            raise UnknownSessions(
                f"not a recorded session of '{slug}' you can read: {', '.join(missing[:5])}",
                path="session_ids",
            )
        return list(dict.fromkeys(session_ids))
    if not rows:
        raise NoSessions(f"'{slug}' has no recorded session to replay", path="sessions")
    return [r.id for r in reversed(rows)]


class UnknownSteps(BatonError):
    """``step_ids`` names a step that is not a recorded, ended step of the agent the caller
    reads (unknown, another agent's, still running, or an eval's replay)."""

    code = "unknown_steps"
    status = 422
    title = "Unknown steps"


def pick_steps(
    s: Session,
    *,
    slug: str,
    visible: list[str] | None,
    steps: int = DEFAULT_EVAL_STEPS,
    step_ids: list[str] | None = None,
    since: datetime | None = None,
) -> list[str]:
    """The recorded workflow-agent steps an eval of ``slug`` replays, oldest first:
    ``step_ids`` as given, else the newest ``steps`` (0: none) created at or after
    ``since``. Only ended steps (:data:`ENDED_STEP_STATUSES`) of ``slug`` that ``GET
    /v1/steps`` lists for ``visible`` (None = all agents): never an eval's step replay.
    Raises UnknownSteps (422) for an id outside that; an empty pick is no error."""
    if not step_ids and steps <= 0:
        return []
    if visible is not None and slug not in visible:
        rows: list[StepRow] = []
    else:
        query = (
            select(StepRow)
            .where(
                StepRow.agent_slug == slug,
                col(StepRow.status).in_(ENDED_STEP_STATUSES),
                col(StepRow.id).not_in(replay_step_ids()),
            )
            .order_by(col(StepRow.created_at).desc(), col(StepRow.id).desc())
        )
        if step_ids:
            query = query.where(col(StepRow.id).in_(step_ids))
        elif since is not None:
            query = query.where(col(StepRow.created_at) >= since)
        rows = list(s.exec(query.limit(len(step_ids) if step_ids else steps)).all())
    if step_ids:
        found = {r.id for r in rows}
        missing = [i for i in step_ids if i not in found]
        if missing:
            raise UnknownSteps(
                f"not an ended, recorded step of '{slug}' you can read: {', '.join(missing[:5])}",
                path="step_ids",
            )
        return list(dict.fromkeys(step_ids))
    return [r.id for r in reversed(rows)]


def replay_step_ids() -> Any:
    """A subquery of the ids of every eval's step replay (their transcript rows carry the
    ``eval_id``): what ordinary step lists leave out."""
    return select(SessionRow.id).where(
        col(SessionRow.eval_id).is_not(None), col(SessionRow.id).startswith("step-")
    )


def replay_step_id(eval_id: str, recorded: str, side: Side) -> str:
    """The id of recorded step ``recorded``'s replay on ``side`` (the same on every attempt,
    so a retried replay attaches to the step its first attempt started)."""
    return f"step-{uuid.uuid5(_REPLAY_NAMESPACE, f'{eval_id}:{recorded}:{side}')}"


HandoffOutcome = Literal["approved", "revised", "rejected", "none"]


def handoff_outcome(s: Session, *, step: StepRow) -> HandoffOutcome:
    """The last handoff decision recorded step ``step`` received: ``approved`` (it completed
    after a handoff), ``rejected``, ``revised`` (a revise was its last decision: it failed
    or timed out after it), ``none`` (no handoff, or no decision reached it)."""
    if not step.handoff:
        return "none"
    if step.status == "rejected":
        return "rejected"
    if step.status == "completed":
        return "approved"
    segs = session_store.segments(s, session_id=step.id)
    users = session_store.read_messages(s, segs, role="user")
    return "revised" if any(m.text.startswith(REVISE_PROMPT) for m in users) else "none"


def replay_session_id(eval_id: str, recorded: str, side: Side) -> str:
    """The id of ``recorded``'s replay on ``side`` (the same on every attempt, so a retried
    replay continues the session its first attempt started)."""
    return f"session-{uuid.uuid5(_REPLAY_NAMESPACE, f'{eval_id}:{recorded}:{side}')}"


def user_turns(s: Session, *, session_id: str) -> list[str]:
    """The user messages of ``session_id``'s transcript in order (a fork's prefix read
    through): what a replay sends, one turn each."""
    segs = session_store.segments(s, session_id=session_id)
    return [m.text for m in session_store.read_messages(s, segs, role="user")]


@dataclass(frozen=True)
class Replay:
    """What a replay session answers its calls with: its eval's tool mode, and the
    recorded session."""

    eval_id: str
    recorded: str
    tools: ToolsMode
    on_miss: OnMiss


def replay_of(s: Session, *, session_id: str) -> Replay | None:
    """The replay ``session_id`` is, or None for an ordinary session (one primary-key
    read)."""
    row = s.get(SessionRow, session_id)
    if row is None or row.eval_id is None or row.replay_of is None:
        return None
    ev = s.get(EvalRow, row.eval_id)
    options: dict[str, Any] = ev.options if ev is not None else {}
    return Replay(
        eval_id=row.eval_id,
        recorded=row.replay_of,
        tools=options.get("tools", "recorded"),
        on_miss=options.get("on_miss", "fail"),
    )


@dataclass(frozen=True)
class Answer:
    """A replayed call's result: the text the model reads and whether it succeeded."""

    text: str
    ok: bool


def _recorded_result(s: Session, recorded: str, name: str, args: dict[str, Any]) -> Answer | None:
    """The result the recorded session got for ``name`` with exactly ``args`` (its first
    such call), or None."""
    segs = session_store.segments(s, session_id=recorded)
    for m in session_store.read_messages(s, segs, role="tool"):
        if m.tool_name == name and (m.tool_args or {}) == args:
            return Answer(m.text, not m.is_error)
    return None


def unrecorded(name: str) -> Answer:
    """The refusal of a replayed call with no recording to answer it."""
    return Answer(
        f"{EVAL_UNRECORDED}: '{name}' with these arguments was not called in the recorded "
        "session, and this eval runs no unrecorded call",
        False,
    )


def answer_tool(s: Session, *, session_id: str, name: str, args: dict[str, Any]) -> Answer | None:
    """How a replay answers a tool call (the rule in the module's docstring): the recorded
    result, a refusal (a miss under ``on_miss: fail``), or None to run the tool (an
    ordinary session, ``tools: live``, a miss under ``on_miss: live``)."""
    replay = replay_of(s, session_id=session_id)
    if replay is None or replay.tools == "live":
        return None
    hit = _recorded_result(s, replay.recorded, name, args)
    if hit is not None:
        return hit
    return None if replay.on_miss == "live" else unrecorded(name)


def answer_delegation(
    s: Session, *, session_id: str, name: str, args: dict[str, Any]
) -> Answer | None:
    """How a replay answers a call that would make another agent run (an invoke, a
    delegation): the recorded result or a refusal, whatever the tool mode; None for an
    ordinary session."""
    replay = replay_of(s, session_id=session_id)
    if replay is None:
        return None
    return _recorded_result(s, replay.recorded, name, args) or unrecorded(name)


#: The audit outcomes a recorded review can end with; a replay answering a review from the
#: recording carries the recorded one as it is (a timeout stays ``review_timeout``).
_RECORDED_OUTCOMES: dict[str, AuditOutcome] = {o: o for o in get_args(AuditOutcome)}


def recorded_review(s: Session, *, recorded: str, operation: str, target: str | None) -> str | None:
    """The outcome of the recorded session's review of ``operation`` on ``target`` (its
    first: ``allow``, ``denied_by_user``, ``review_timeout``…), or None when it had none."""
    row = s.exec(
        select(AuditRow)
        .where(
            AuditRow.session_id == recorded,
            AuditRow.operation == operation,
            col(AuditRow.review_id).is_not(None),
            AuditRow.target_agent_slug == target,
        )
        .order_by(col(AuditRow.id))
    ).first()
    return row.outcome if row is not None else None


@dataclass
class ReplayFacts:
    """What a finished replay session did, read from its rows: the final answer, the tool
    sequence, the cross-agent decisions, usage and latency, and the last error."""

    final: str
    tools: list[str]
    decisions: list[dict[str, Any]]
    tokens: int
    cost_usd: float
    latency_ms: int
    error: str | None


def decision_of(row: AuditRow) -> dict[str, Any]:
    """One audit row as the report's decision: ``{operation, target, decision: allow |
    review | block, outcome}`` (a review answered or denied by the eval is ``review``)."""
    if row.decided_by in (BY_RECORDING, BY_UNRECORDED) or row.review_id is not None:
        decision = "review"
    else:
        decision = "allow" if row.outcome == "allow" else "block"
    return {
        "operation": row.operation,
        "target": row.target_agent_slug,
        "decision": decision,
        "outcome": row.outcome,
    }


def facts(s: Session, *, session_id: str) -> ReplayFacts:
    """:class:`ReplayFacts` of ``session_id`` (its own messages: a replay has no prefix).
    Latency: from its first message to its last, in milliseconds."""
    rows = session_store.messages(s, session_id=session_id)
    final = next((m.text for m in reversed(rows) if m.role == "assistant"), "")
    errors = [m.text for m in rows if m.role == "error"]
    audits = s.exec(
        select(AuditRow).where(AuditRow.session_id == session_id).order_by(col(AuditRow.id))
    ).all()
    tokens, cost = s.exec(
        select(
            func.coalesce(func.sum(UsageRow.input_tokens + UsageRow.output_tokens), 0),
            func.coalesce(func.sum(UsageRow.cost_usd), 0.0),
        ).where(UsageRow.session_id == session_id)
    ).one()
    latency = (rows[-1].created_at - rows[0].created_at) if rows else None
    return ReplayFacts(
        final=final[:MAX_FINAL_CHARS],
        tools=[m.tool_name or "" for m in rows if m.role == "tool"],
        decisions=[decision_of(a) for a in audits],
        tokens=int(tokens),
        cost_usd=round(float(cost or 0.0), 6),
        latency_ms=int(latency.total_seconds() * 1000) if latency else 0,
        error=errors[-1][:1000] if errors else None,
    )


def eval_sessions(s: Session, *, eval_id: str) -> list[SessionRow]:
    """The replay sessions of ``eval_id``."""
    return list(s.exec(select(SessionRow).where(SessionRow.eval_id == eval_id)).all())


def decide_in_replay(
    s: Session,
    replay: Replay,
    *,
    session_id: str,
    caller: str,
    operation: str,
    target: str | None,
    verdict: Literal["allow", "review"],
) -> Answer | None:
    """A replay's cross-agent decision that the policy allowed or sent to review (a block
    is refused and audited as in any session): recorded in the audit log, and a review
    answered from the recording, never asked of a person (the rule in the module's
    docstring). None: the call goes ahead; else its refusal."""
    if verdict == "allow":
        add_audit(
            s,
            session_id=session_id,
            caller=caller,
            operation=operation,
            target=target,
            outcome="allow",
            decided_by=BY_POLICY,
        )
        return None
    outcome = recorded_review(s, recorded=replay.recorded, operation=operation, target=target)
    add_audit(
        s,
        session_id=session_id,
        caller=caller,
        operation=operation,
        target=target,
        # The recorded outcome as it is (allow, denied_by_user, review_timeout…); block
        # with none to answer from (or an outcome no audit row carries today).
        outcome=_RECORDED_OUTCOMES.get(outcome or "", "block"),
        decided_by=BY_RECORDING if outcome else BY_UNRECORDED,
        reason=f"review answered from the recording: {outcome}"
        if outcome
        else "review denied: the recording has no review of this call",
    )
    if outcome == "allow":
        return None
    if outcome is None:
        return Answer(
            f"{EVAL_UNRECORDED}: this call needs a review, and the recorded session has "
            "none to answer it with; an eval never asks a person",
            False,
        )
    return Answer(f"denied: the recorded review of this call ended '{outcome}'", False)
