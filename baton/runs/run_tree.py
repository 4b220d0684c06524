"""Delegations: the edges of a run's tree, the events forwarded to the root session,
run-wide limits and the trace (AgentX Agent Teams 'Execution & Streaming', docs/teams.md).

A run is the tree of sessions under one root session. Every delegation
(invoke_agent, delegate_to, task, a team route, an @mention) is a row here, so
the trace, ``max_spawns`` and ``token_budget`` read the tree from the database.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import Table, bindparam, func
from sqlalchemy import select as sa_select
from sqlalchemy import update as sa_update
from sqlalchemy.sql.elements import ColumnElement
from sqlmodel import Session, col, select

from baton import temporal_ui
from baton.runs import session_store
from baton.runs.costs import sum_costs
from baton.storage.db import DelegationRow, MessageRow, SessionRow, TokenReservationRow, utcnow

PREVIEW_CHARS = 300
_DELEGATIONS: Table = DelegationRow.__table__  # type: ignore[attr-defined]
_RESERVATIONS: Table = TokenReservationRow.__table__  # type: ignore[attr-defined]
# Built once per process: every model call and forwarded event runs these.
_CONTEXT_OF = sa_select(
    _DELEGATIONS.c.root_session_id, _DELEGATIONS.c.id, _DELEGATIONS.c.target_agent_slug
).where(_DELEGATIONS.c.child_session_id == bindparam("session_id"))
_OPEN_RESERVATION = sa_select(_RESERVATIONS.c.root_session_id).where(
    _RESERVATIONS.c.message_id == bindparam("message_id"), _RESERVATIONS.c.settled_at.is_(None)
)
_SETTLE = (
    sa_update(_RESERVATIONS)
    .where(_RESERVATIONS.c.message_id == bindparam("call"))
    .values(
        actual_input_tokens=bindparam("used_in"),
        actual_tokens=bindparam("used"),
        settled_at=bindparam("now"),
    )
)
#: Cached delegation context per child session: (root, delegation id, target slug).
_CONTEXT: dict[str, tuple[str, str, str] | None] = {}
CONTEXT_CACHE = 4096


def start(
    session: Session,
    *,
    delegation_id: str,
    root_session_id: str,
    parent_session_id: str,
    child_session_id: str | None,
    kind: str,
    caller: str,
    target: str,
    task: str,
    depth: int,
    alias: str | None = None,
    event: dict[str, Any] | None = None,
) -> tuple[DelegationRow, bool]:
    """Record a delegation once (``(row, created)``) and its ``delegation_start`` event."""
    row = session.get(DelegationRow, delegation_id)
    if row is not None:
        return row, False
    row = DelegationRow(
        id=delegation_id,
        root_session_id=root_session_id,
        parent_session_id=parent_session_id,
        child_session_id=child_session_id,
        kind=kind,
        caller_agent_slug=caller,
        target_agent_slug=target,
        alias=alias,
        task=task,
        depth=depth,
    )
    session.add(row)
    session_store.append_event(
        session,
        session_id=root_session_id,
        type="delegation_start",
        data={
            "delegation_id": delegation_id,
            "target_agent_id": target,
            "task": session_store.summarise(task, PREVIEW_CHARS),
            "depth": depth,
            "kind": kind,
            "caller_agent_id": caller,
            "session_id": child_session_id,
            **(event or {}),
        },
        unless_closed=True,
    )
    session.flush()
    return row, True


def finish(
    session: Session,
    *,
    delegation_id: str,
    status: str,
    result: str = "",
    error: str | None = None,
    exhibits: list[dict[str, Any]] | None = None,
) -> None:
    """Mark a delegation completed/failed/cancelled once; emit ``delegation_complete``
    (dropped when the run's root is closed: its stream has already ended), with
    ``exhibits`` (the wires shown inside the delegation, at most 5: docs/exhibits.md)
    when there are any."""
    row = session.get(DelegationRow, delegation_id)
    if row is None or row.finished_at is not None:
        return
    row.status = status
    row.error = error
    row.result_preview = session_store.summarise(result, PREVIEW_CHARS)
    row.finished_at = utcnow()
    session.add(row)
    session_store.append_event(
        session,
        session_id=row.root_session_id,
        type="delegation_complete",
        data={
            "delegation_id": row.id,
            "target_agent_id": row.target_agent_slug,
            "status": status,
            "error": error,
            "result_preview": row.result_preview,
            "session_id": row.child_session_id,
            **({"exhibits": exhibits} if exhibits else {}),
        },
        unless_closed=True,
    )
    session.flush()


def lock_run(session: Session, *, root_session_id: str) -> None:
    """Take the run's write lock until the transaction ends (its root session row), so
    concurrent delegations of one run check their limits one after another."""
    session_store.lock_session(session, session_id=root_session_id)


def context(session: Session, session_id: str) -> tuple[str, str, str] | None:
    """``(root session, delegation id, agent)`` when ``session_id`` runs a delegation."""
    if session_id in _CONTEXT:
        return _CONTEXT[session_id]
    session.flush()  # a delegation row this transaction added is found
    row = session.connection().execute(_CONTEXT_OF, {"session_id": session_id}).first()
    found = (row[0], row[1], row[2]) if row else None
    if len(_CONTEXT) >= CONTEXT_CACHE:
        _CONTEXT.pop(next(iter(_CONTEXT)))
    _CONTEXT[session_id] = found
    return found


def forward(session: Session, session_id: str, kind: str, data: dict[str, Any]) -> None:
    """Mirror a delegated session's event to its run's root as ``delegation_<kind>``."""
    ctx = context(session, session_id)
    if ctx is None:
        return
    root, delegation_id, agent = ctx
    session_store.append_event(
        session,
        session_id=root,
        type=f"delegation_{kind}",
        data={"delegation_id": delegation_id, "target_agent_id": agent, **data},
        unless_closed=True,  # a cancelled run's stream ends with `cancelled`
    )


def forward_top_level(
    session: Session, session_id: str, kind: str, data: dict[str, Any]
) -> str | None:
    """Append a delegated session's ``exhibit`` or ``workspace_attached`` event to its
    run's root unchanged: same type, same data (AgentX Agent Teams, 'Multimodal specialist
    output passes through'). Returns the root it went to; None when ``session_id`` runs
    no delegation."""
    ctx = context(session, session_id)
    if ctx is None:
        return None
    session_store.append_event(session, session_id=ctx[0], type=kind, data=data, unless_closed=True)
    return ctx[0]


def run_sessions(session: Session, *, root_session_id: str) -> list[str]:
    """Every session of the run under ``root_session_id`` (the root included)."""
    children = session.exec(
        select(DelegationRow.child_session_id).where(
            DelegationRow.root_session_id == root_session_id,
            col(DelegationRow.child_session_id).is_not(None),
        )
    ).all()
    return [root_session_id, *(c for c in children if c)]


def run_tokens(session: Session, *, root_session_id: str) -> int:
    """Tokens (in + out) used so far by every session of the run."""
    ids = run_sessions(session, root_session_id=root_session_id)
    total = session.exec(
        select(
            func.coalesce(func.sum(SessionRow.input_tokens + SessionRow.output_tokens), 0)
        ).where(col(SessionRow.id).in_(ids))
    ).one()
    return int(total)


class BudgetExhausted(Exception):
    """The run's ``token_budget`` has no room for what was asked (``limit_exceeded``);
    ``str()`` says what was used, reserved and asked, for the model to read."""


def reserved_tokens(session: Session, *, root_session_id: str, excluding: str | None = None) -> int:
    """Tokens reserved by the run's model calls in flight (unsettled reservations),
    ``excluding`` one call's own (its retry must not count itself)."""
    conditions: list[ColumnElement[bool]] = [
        col(TokenReservationRow.root_session_id) == root_session_id,
        col(TokenReservationRow.settled_at).is_(None),
    ]
    if excluding is not None:
        conditions.append(col(TokenReservationRow.message_id) != excluding)
    total = session.exec(
        select(func.coalesce(func.sum(TokenReservationRow.reserved), 0)).where(*conditions)
    ).one()
    return int(total)


def admit_tokens(
    session: Session,
    *,
    root_session_id: str,
    token_budget: int,
    need: int = 0,
    excluding: str | None = None,
) -> int:
    """The run's ``token_budget`` rule, for every path that may spend (Xema Agent Concepts 'limits',
    enforced): a new delegation (``need`` 0) and a new model call
    (``need`` = its input estimate) are admitted only while
    ``used + reserved + need < token_budget``, so a model call always has room for at
    least one output token. Returns what is left, ``token_budget - used - reserved``.

    ``used`` counts every session of the run (:func:`run_tokens`), ``reserved`` the
    model calls in flight (:func:`reserved_tokens`). Raises BudgetExhausted. A caller
    that admits and then reserves or records must hold :func:`lock_run` throughout.
    """
    used = run_tokens(session, root_session_id=root_session_id)
    reserved = reserved_tokens(session, root_session_id=root_session_id, excluding=excluding)
    if used + reserved + need < token_budget:
        return token_budget - used - reserved
    detail = f"this run used {used} tokens"
    if reserved:
        detail += f" (and model calls in flight reserve {reserved} more)"
    detail += f" of its token_budget {token_budget}"
    if need and used + reserved < token_budget:
        detail += f"; this model call's input alone is about {need} tokens"
    raise BudgetExhausted(detail)


def reserve_tokens(
    session: Session,
    *,
    root_session_id: str,
    session_id: str,
    message_id: str,
    token_budget: int,
    input_estimate: int,
    max_output: int,
) -> int:
    """Admit one model call under the run's ``token_budget`` and reserve what it may
    spend: ``input_estimate + max_tokens``, with ``max_tokens = min(max_output, left -
    input_estimate)`` (``left`` from :func:`admit_tokens`). Returns ``max_tokens`` (≥ 1).

    Keyed by ``message_id`` (the reply's id, chosen by the workflow): a retried call
    (a worker lost mid-call) gets its reservation back unchanged. A session runs one
    model call at a time, so any other open reservation of ``session_id`` belongs to a
    call that will never settle and is released here. Takes the run's lock. Raises
    BudgetExhausted.
    """
    lock_run(session, root_session_id=root_session_id)
    row = session.get(TokenReservationRow, message_id)
    if row is not None and row.settled_at is None:
        return row.max_tokens
    release_tokens(session, session_id=session_id, excluding=message_id)
    left = admit_tokens(
        session,
        root_session_id=root_session_id,
        token_budget=token_budget,
        need=input_estimate,
        excluding=message_id,
    )
    max_tokens = min(max_output, left - input_estimate)
    row = row or TokenReservationRow(
        message_id=message_id, root_session_id=root_session_id, session_id=session_id
    )
    row.input_estimate = input_estimate
    row.max_tokens = max_tokens
    row.reserved = input_estimate + max_tokens
    row.actual_tokens = row.actual_input_tokens = row.settled_at = None
    row.created_at = utcnow()
    session.add(row)
    session.flush()
    return max_tokens


def release_tokens(session: Session, *, session_id: str, excluding: str | None = None) -> int:
    """Release ``session_id``'s open reservations (its turn failed or it closed: the call
    will never be metered). Returns how many. Idempotent."""
    conditions: list[ColumnElement[bool]] = [
        col(TokenReservationRow.session_id) == session_id,
        col(TokenReservationRow.settled_at).is_(None),
    ]
    if excluding is not None:
        conditions.append(col(TokenReservationRow.message_id) != excluding)
    rows = session.exec(select(TokenReservationRow).where(*conditions)).all()
    now = utcnow()
    for row in rows:
        row.settled_at = now
        session.add(row)
    session.flush()
    return len(rows)


def settle_tokens(
    session: Session, *, message_id: str, input_tokens: int, output_tokens: int
) -> None:
    """Settle a model call's reservation to what it used, in the transaction that meters it
    (:func:`baton.runs.metering.record`), under the run's lock so an admission never sees
    the tokens neither reserved nor used. No reservation (no budget): nothing to do."""
    session.flush()
    conn = session.connection()
    # Core statements built once: every metered call runs this check.
    found = conn.execute(_OPEN_RESERVATION, {"message_id": message_id}).first()
    if found is None:
        return
    lock_run(session, root_session_id=found[0])
    used = {"used_in": input_tokens, "used": input_tokens + output_tokens, "now": utcnow()}
    conn.execute(_SETTLE, {"call": message_id, **used})
    loaded = session.identity_map.get(session.identity_key(TokenReservationRow, message_id))
    if loaded is not None:  # a reservation this transaction loaded reloads what changed
        session.expire(loaded, ["actual_input_tokens", "actual_tokens", "settled_at"])


def run_spawns(session: Session, *, root_session_id: str) -> int:
    """Sessions started under the run (delegations that created a session)."""
    return int(
        session.exec(
            select(func.count())
            .select_from(DelegationRow)
            .where(DelegationRow.root_session_id == root_session_id)
        ).one()
    )


def descendants(session: Session, *, session_id: str) -> list[str]:
    """Every session delegated (transitively) from ``session_id``, breadth first."""
    out: list[str] = []
    frontier = [session_id]
    while frontier:
        rows = session.exec(
            select(DelegationRow.child_session_id).where(
                col(DelegationRow.parent_session_id).in_(frontier),
                col(DelegationRow.child_session_id).is_not(None),
            )
        ).all()
        frontier = [r for r in rows if r and r not in out and r != session_id]
        out.extend(frontier)
    return out


def cancel_open(session: Session, *, session_id: str) -> list[str]:
    """Record every unfinished delegation made under ``session_id`` (transitively) as
    cancelled; returns their ids.

    The cancel cascade calls this. A caller's ``delegate`` activity may learn of the
    cancel from a heartbeat and stop before it could record the outcome, so the
    cascade records it.
    """
    parents = [session_id, *descendants(session, session_id=session_id)]
    open_ids = session.exec(
        select(DelegationRow.id).where(
            col(DelegationRow.parent_session_id).in_(parents),
            col(DelegationRow.finished_at).is_(None),
        )
    ).all()
    for delegation_id in open_ids:
        finish(session, delegation_id=delegation_id, status="cancelled")
    return list(open_ids)


class StepUsage(BaseModel):
    """Usage of one session (its own model calls) or of a whole subtree."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"requests": 2, "input_tokens": 120, "output_tokens": 40, "cost_usd": 0.0003}
            ]
        }
    )

    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None
    wall_ms: int = 0


class TraceLinks(Protocol):
    """Where the trace's Temporal UI links point (``baton.settings.Settings``)."""

    def workflow_url(self, workflow_id: str) -> str: ...

    def workflows_url(self, query: str) -> str: ...


class TraceNode(BaseModel):
    """One session in the trace, with the delegations it made."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "session_id": "session-6f1c…",
                    "agent": "lead",
                    "version": 1,
                    "status": "idle",
                    "delegation": None,
                    "usage": {"requests": 2, "input_tokens": 120, "output_tokens": 40},
                    "subtree_usage": {"requests": 4, "input_tokens": 300, "output_tokens": 90},
                    "children": [],
                }
            ]
        }
    )

    session_id: str
    agent: str
    version: int
    status: str
    delegation: dict[str, Any] | None = Field(
        default=None, description="How this session was started (kind, task, depth, status…)."
    )
    usage: StepUsage
    subtree_usage: StepUsage
    workflow_url: str | None = Field(
        default=None, description="This session's page in the Temporal Web UI."
    )
    run_tree_url: str | None = Field(
        default=None,
        description="On the root only: the Temporal UI's list of every session of the run "
        '(`BatonRoot = "…"`).',
    )
    forked_from: str | None = Field(
        default=None, description="A fork: the session it was forked from."
    )
    fork_point: str | None = Field(
        default=None, description="A fork: the original's message it was forked after."
    )
    sandbox: bool = Field(default=False, description="Runs an agent's draft (the sandbox).")
    children: list[TraceNode] = Field(default_factory=list)


def _usage(session: Session, session_id: str) -> StepUsage:
    out = StepUsage()
    rows = session.exec(
        select(MessageRow.usage).where(
            MessageRow.session_id == session_id, col(MessageRow.usage).is_not(None)
        )
    ).all()
    for u in rows:
        if not u:
            continue
        out.requests += int(u.get("requests", 0))
        out.input_tokens += int(u.get("input_tokens", 0))
        out.output_tokens += int(u.get("output_tokens", 0))
        out.wall_ms += int(u.get("wall_ms", 0))
    costs = [u.get("cost_usd") for u in rows if u and int(u.get("requests", 0))]
    out.cost_usd = sum_costs(float(c) if c is not None else None for c in costs)
    return out


def _add(a: StepUsage, b: StepUsage) -> StepUsage:
    cost = sum_costs([a.cost_usd, b.cost_usd])
    return StepUsage(
        requests=a.requests + b.requests,
        input_tokens=a.input_tokens + b.input_tokens,
        output_tokens=a.output_tokens + b.output_tokens,
        cost_usd=cost,
        wall_ms=a.wall_ms + b.wall_ms,
    )


def _wall(start: datetime, end: datetime | None) -> int | None:
    return int((end - start).total_seconds() * 1000) if end else None


def trace(
    session: Session,
    *,
    session_id: str,
    links: TraceLinks | None = None,
    _seen: set[str] | None = None,
) -> TraceNode:
    """The delegation tree under ``session_id`` with usage per step and per subtree.

    ``links`` (``Settings``: ``workflow_url`` and ``workflows_url``) adds each node's
    Temporal UI link and, on the root, the run tree's list.
    Raises SessionNotFound.
    """
    seen = _seen if _seen is not None else set()
    top = _seen is None
    seen.add(session_id)
    row = session_store.get_session(session, session_id=session_id)  # the root must exist
    own = _usage(session, session_id)
    node = TraceNode(
        session_id=row.id,
        agent=row.agent_slug,
        version=row.agent_version,
        status=row.status,
        usage=own,
        subtree_usage=own,
        workflow_url=links.workflow_url(row.id) if links else None,
        forked_from=row.forked_from,
        fork_point=row.fork_point,
        sandbox=row.sandbox,
    )
    if links is not None and top:
        found = context(session, row.id)
        root = found[0] if found else row.id
        node.run_tree_url = links.workflows_url(temporal_ui.tree_query(root))
    edges = session.exec(
        select(DelegationRow)
        .where(DelegationRow.parent_session_id == session_id)
        .order_by(col(DelegationRow.started_at), col(DelegationRow.id))
    ).all()
    for edge in edges:
        info = {
            "delegation_id": edge.id,
            "kind": edge.kind,
            "caller": edge.caller_agent_slug,
            "target": edge.target_agent_slug,
            "alias": edge.alias,
            "task": session_store.summarise(edge.task, PREVIEW_CHARS),
            "depth": edge.depth,
            "status": edge.status,
            "error": edge.error,
            "result_preview": edge.result_preview,
            "started_at": edge.started_at.isoformat(),
            "wall_ms": _wall(edge.started_at, edge.finished_at),
        }
        if edge.child_session_id is None or edge.child_session_id in seen:
            continue
        if session.get(SessionRow, edge.child_session_id) is None:
            continue  # its launch failed: the edge has no session (its error is on the caller)
        child = trace(session, session_id=edge.child_session_id, links=links, _seen=seen)
        child.delegation = info
        node.children.append(child)
        node.subtree_usage = _add(node.subtree_usage, child.subtree_usage)
    return node
