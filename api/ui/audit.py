"""The console's audit log page (Gamut X-Agent Policies, 'Audit trail'): rows from
:func:`baton.permissions.reviews.page_audit`, the function ``GET /v1/audit`` calls, with
whether the review behind a row saved a policy."""

from __future__ import annotations

from typing import Any, get_args

from sqlmodel import Session, col, func, select

from api.deps import Caller
from baton.contracts.values import Via
from baton.permissions import reviews
from baton.storage.db import AuditRow, MessageRow, ReviewRow

#: Rows per page.
PAGE = 50
OUTCOMES = get_args(reviews.AuditOutcome)
VIAS = get_args(Via)
#: The filters the page takes (query parameters, "" = any), by name.
FILTERS = ("agent", "target", "outcome", "via", "session_id", "review_id")


def audit_view(
    session: Session,
    caller: Caller,
    *,
    filters: dict[str, str],
    offset: int = 0,
    cursor: str | None = None,
) -> dict[str, Any]:
    """One page of the audit log the user may see (auth mode: rows of agents they hold a
    role on, as the API's), paged with the API's cursor (:func:`reviews.page_audit`;
    ``offset`` still skips rows as before). ``filters``: :data:`FILTERS` → value ("" =
    any; ``agent`` is the caller agent). Returns ``{entries, total, first, older, newer}``
    where each entry is the API's audit shape plus ``policy_saved`` (the saved policy's
    scope, ``target`` or ``all``, else null), ``first`` is the 1-based position of the
    page's first row, ``older`` the cursor of the next page (null on the last) and
    ``newer`` the query of the page before (``{}`` for the first page; null on it).
    Raises InvalidCursor."""
    given = {k: (filters.get(k) or None) for k in FILTERS}
    where = reviews.audit_conditions(
        caller=given["agent"],
        target=given["target"],
        outcome=given["outcome"],
        via=given["via"],
        session_id=given["session_id"],
        review_id=given["review_id"],
        callers=caller.visible(session),
    )
    rows, total, older = reviews.page_audit(
        session, where=where, limit=PAGE, offset=offset, cursor=cursor
    )
    ids = {r.review_id for r in rows if r.review_id}
    scopes: dict[str, str | None] = {}
    if ids:
        found = session.exec(select(ReviewRow).where(col(ReviewRow.id).in_(ids))).all()
        scopes = {r.id: r.scope for r in found}
    entries = []
    for row in rows:
        entry = reviews.audit_public(row).model_dump(mode="json")
        entry["policy_saved"] = scopes.get(row.review_id) if row.review_id else None
        entries.append(entry)
    return {
        "entries": entries,
        "total": total,
        "first": offset + _newer_count(session, where, cursor) + 1,
        "older": older,
        "newer": _newer_page(session, where, cursor, offset),
    }


def _newer_count(session: Session, where: list[Any], cursor: str | None) -> int:
    """How many matching rows are newer than a cursor page's first row (0 without one)."""
    if cursor is None:
        return 0
    newest = reviews.audit_cursor_id(cursor)  # the cursor's row and every newer one
    return int(
        session.exec(
            select(func.count()).select_from(AuditRow).where(*where, col(AuditRow.id) >= newest)
        ).one()
    )


def _newer_page(
    session: Session, where: list[Any], cursor: str | None, offset: int
) -> dict[str, Any] | None:
    """The query of the page before this one: ``{"cursor": …}``, ``{}`` (the first page;
    ``{"offset": …}`` when this page came by offset), or None on the first page. Keyset
    paging runs one way, so the cursor of the page before is found from the :data:`PAGE`
    + 1 matching rows just newer than this page."""
    if cursor is None:
        return {"offset": max(0, offset - PAGE)} if offset > 0 else None
    top = reviews.audit_cursor_id(cursor)
    newer = session.exec(
        select(AuditRow)
        .where(*where, col(AuditRow.id) >= top)
        .order_by(col(AuditRow.id))
        .limit(PAGE + 1)
    ).all()
    if len(newer) <= PAGE:
        return {}
    return {"cursor": reviews.audit_cursor(newer[PAGE])}


#: Refused calls the trace lists per session at most.
MAX_REFUSED = 50


def refused_calls(
    session: Session, caller: Caller, session_ids: list[str]
) -> dict[str, list[dict[str, Any]]]:
    """The X-Agent calls of these sessions that did not go through (blocked by a policy or
    a guard, denied by a person, or a review that timed out), oldest first, by session id:
    ``{session_id: [audit entry]}`` in the API's audit shape."""
    out: dict[str, list[dict[str, Any]]] = {}
    for sid in session_ids:
        for outcome in ("block", "denied_by_user", "review_timeout"):
            where = reviews.audit_conditions(
                session_id=sid, outcome=outcome, callers=caller.visible(session)
            )
            rows, _, _ = reviews.page_audit(session, where=where, limit=MAX_REFUSED)
            out.setdefault(sid, []).extend(
                reviews.audit_public(r).model_dump(mode="json") for r in rows
            )
        out[sid].sort(key=lambda e: e["id"])
        if not out[sid]:
            del out[sid]
    return out


#: Pending review cards that get the caller's context (the rest show without it).
MAX_WITH_CONTEXT = 50
#: Characters of each of the caller's last messages a card shows.
CONTEXT_CHARS = 240


def add_review_context(session: Session, cards: list[dict[str, Any]]) -> None:
    """Give each pending review card (the first :data:`MAX_WITH_CONTEXT`) what a person
    needs to decide: ``last_messages`` (the calling session's last two user or assistant
    messages, oldest first, ``[{role, agent, text}]``, text cut at
    :data:`CONTEXT_CHARS`) and ``history`` (how this caller's earlier ``operation`` on
    this target ended in the audit log: ``{allowed, denied}`` counts; denied counts
    blocks, denials and timeouts)."""
    for card in cards[:MAX_WITH_CONTEXT]:
        recent = session.exec(
            select(MessageRow)
            .where(
                col(MessageRow.session_id) == card["session_id"],
                col(MessageRow.role).in_(("user", "assistant")),
                col(MessageRow.text) != "",
            )
            .order_by(col(MessageRow.position).desc(), col(MessageRow.id).desc())
            .limit(2)
        ).all()
        card["last_messages"] = [
            {"role": m.role, "agent": m.agent_slug, "text": m.text[:CONTEXT_CHARS]}
            for m in reversed(recent)
        ]
        counts = session.exec(
            select(AuditRow.outcome, func.count())
            .where(
                col(AuditRow.caller_agent_slug) == card["caller"],
                col(AuditRow.operation) == card["operation"],
                col(AuditRow.target_agent_slug) == card["target"]
                if card["target"] is not None
                else col(AuditRow.target_agent_slug).is_(None),
            )
            .group_by(col(AuditRow.outcome))
        ).all()
        by = dict(counts)
        card["history"] = {
            "allowed": int(by.get("allow", 0)),
            "denied": int(sum(v for k, v in by.items() if k != "allow")),
        }
