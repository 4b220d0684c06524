"""Reviews and the audit log (Gamut X-Agent Policies, 'The review flow' and 'Audit trail';
docs/xagent.md, Reviews).

A review row is opened by the ``authorize`` activity and settled exactly once
by ``settle_review`` with the outcome the workflow chose (decision or timeout).
Every settled review and every block gets an audit row.

Decisions are proven: the API (and so ``baton reviews``) and
the worker's policy auto-resolution sign each decision with :func:`prove`; the
``settle_review`` activity credits it with :func:`credit`. A raw Temporal Signal
has no valid proof: it is recorded as :data:`UNVERIFIED`, may allow once or
deny, and never saves a policy in auth mode.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import func
from sqlmodel import Session, col, select

from baton import telemetry
from baton.contracts.values import Decision
from baton.contracts.workflow_io import ReviewDecision
from baton.errors import Conflict, InvalidCursor, NotFound
from baton.storage.db import AuditRow, ReviewRow, page, utcnow
from baton.webhooks import events as webhook_events

ReviewStatus = Literal["pending", "allowed", "denied", "timed_out", "cancelled", "withdrawn"]
AuditOutcome = Literal[
    "allow", "block", "denied_by_user", "review_timeout", "cancelled", "withdrawn"
]


class ReviewNotFound(NotFound):
    """No review with this id."""

    code = "review_not_found"


class ReviewDecided(Conflict):
    """The review already has its outcome; a later decision changes nothing."""

    code = "review_already_decided"


class ReviewPublic(BaseModel):
    """A review as the API shows it (docs/api.md)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": "review-2f0c…",
                    "session_id": "session-6f1c…",
                    "caller": "coordinator",
                    "operation": "invoke",
                    "target": "fact-checker",
                    "preview": "Check: the Q3 revenue grew 12%",
                    "status": "pending",
                    "decision": None,
                    "scope": None,
                    "decided_by": None,
                    "created_at": "2026-11-29T12:00:00Z",
                    "expires_at": "2026-11-29T12:05:00Z",
                    "decided_at": None,
                }
            ]
        }
    )

    id: str
    session_id: str
    caller: str
    operation: str
    target: str | None
    preview: str
    status: ReviewStatus
    decision: str | None
    scope: str | None
    decided_by: str | None
    created_at: datetime
    expires_at: datetime | None = Field(
        description="The deadline a decision must be received by (the session's review "
        "timeout after the review was asked for); a later one is refused with 409 "
        "`review_too_late`. Null for reviews opened before Baton stored it."
    )
    decided_at: datetime | None


class AuditPublic(BaseModel):
    """One audit entry (Gamut X-Agent Policies, 'Audit trail')."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": 7,
                    "session_id": "session-6f1c…",
                    "review_id": "review-2f0c…",
                    "caller": "coordinator",
                    "operation": "invoke",
                    "target": "fact-checker",
                    "outcome": "allow",
                    "decided_by": "local",
                    "reason": "allow_once",
                    "via": "invoke",
                    "at": "2026-11-29T12:00:04Z",
                }
            ]
        }
    )

    id: int
    session_id: str
    review_id: str | None
    caller: str
    operation: str
    target: str | None
    outcome: AuditOutcome
    decided_by: str
    reason: str
    via: str | None = Field(
        default=None,
        description="How the call came: invoke | delegate_to | route | mention | task "
        "(None for list, read and create).",
    )
    at: datetime


def review_public(row: ReviewRow) -> ReviewPublic:
    """The API view of a review row."""
    return ReviewPublic(
        id=row.id,
        session_id=row.session_id,
        caller=row.caller_agent_slug,
        operation=row.operation,
        target=row.target_agent_slug,
        preview=row.preview,
        status=row.status,
        decision=row.decision,
        scope=row.scope,
        decided_by=row.decided_by,
        created_at=row.created_at,
        expires_at=row.expires_at,
        decided_at=row.decided_at,
    )


def audit_public(row: AuditRow) -> AuditPublic:
    """The API view of an audit row."""
    assert row.id is not None
    return AuditPublic(
        id=row.id,
        session_id=row.session_id,
        review_id=row.review_id,
        caller=row.caller_agent_slug,
        operation=row.operation,
        target=row.target_agent_slug,
        outcome=row.outcome,
        decided_by=row.decided_by,
        reason=row.reason,
        via=row.via,
        at=row.at,
    )


def open_review(
    session: Session,
    *,
    review_id: str,
    session_id: str,
    caller: str,
    operation: str,
    target: str | None,
    preview: str,
    expires_at: datetime | None = None,
) -> tuple[ReviewRow, bool]:
    """Insert the review once: ``(row, created)`` (a retried activity finds its row).
    ``expires_at``: the workflow's deadline for a decision (tz-aware). An insert is
    counted (``baton_reviews_opened``) when it commits."""
    row = session.get(ReviewRow, review_id)
    if row is not None:
        return row, False
    row = ReviewRow(
        id=review_id,
        session_id=session_id,
        caller_agent_slug=caller,
        operation=operation,
        target_agent_slug=target,
        preview=preview,
        expires_at=expires_at,
    )
    session.add(row)
    session.flush()
    telemetry.at_commit(session, partial(telemetry.count_review_opened, operation=operation))
    return row, True


def get_review(session: Session, *, review_id: str) -> ReviewRow:
    """The review. Raises ReviewNotFound."""
    row = session.get(ReviewRow, review_id)
    if row is None:
        raise ReviewNotFound(f"no review '{review_id}'")
    return row


def list_reviews(
    session: Session,
    *,
    status: str | None = None,
    session_id: str | None = None,
    callers: list[str] | None = None,
    limit: int = 50,
    offset: int = 0,
) -> tuple[list[ReviewRow], int]:
    """Reviews newest first, filtered; ``status`` None or ``all`` is every status (what
    ``baton reviews list --status all`` asks); ``callers`` limits to those agents (auth mode)."""
    conditions = []
    if status is not None and status != "all":
        conditions.append(col(ReviewRow.status) == status)
    if session_id is not None:
        conditions.append(col(ReviewRow.session_id) == session_id)
    if callers is not None:
        conditions.append(col(ReviewRow.caller_agent_slug).in_(callers))
    newest_first = [col(ReviewRow.created_at).desc(), col(ReviewRow.id)]
    return page(
        session, ReviewRow, where=conditions, order_by=newest_first, limit=limit, offset=offset
    )


def pending_for(session: Session, *, caller: str, operation: str) -> list[ReviewRow]:
    """Pending reviews of ``caller`` for ``operation`` (candidates a new policy may cover)."""
    return list(
        session.exec(
            select(ReviewRow).where(
                ReviewRow.caller_agent_slug == caller,
                ReviewRow.operation == operation,
                ReviewRow.status == "pending",
            )
        ).all()
    )


def pending_in_session(session: Session, *, session_id: str) -> int:
    """How many reviews of ``session_id`` still wait for a decision."""
    return int(
        session.exec(
            select(func.count())
            .select_from(ReviewRow)
            .where(ReviewRow.session_id == session_id, ReviewRow.status == "pending")
        ).one()
    )


def resolved_event(row: ReviewRow) -> dict[str, Any]:
    """The data of a ``review_resolved`` event (and of its forwarded copy)."""
    return {"review_id": row.id, "status": row.status, "decided_by": row.decided_by}


def count_settled(session: Session, row: ReviewRow) -> None:
    """Count ``row``'s outcome (its ``status``) and the seconds from ``created_at`` to
    ``decided_at`` when the transaction that settled it commits
    (:func:`baton.telemetry.count_review`). The one place a settled review is counted:
    ``settle_review`` and :func:`cancel_pending` call it once, as they settle it."""
    decided = row.decided_at or utcnow()
    seconds = (decided - row.created_at).total_seconds()
    telemetry.at_commit(
        session, partial(telemetry.count_review, outcome=row.status, seconds=seconds)
    )


def cancel_pending(session: Session, *, session_id: str, by: str) -> list[ReviewRow]:
    """The one rule for a session that ends with reviews open: each pending review of
    ``session_id`` becomes ``cancelled`` (decided by ``by``: ``cancelled``, ``failed``,
    ``session ended``), with an audit row (outcome ``cancelled``), and so leaves the
    inbox, counted by :func:`count_settled` (in an activity; the API's own call, for a run
    ended from outside, counts nothing), and a ``review.resolved`` webhook event. Returns
    them (flush only; none when nothing was pending, so a retry adds no second audit row,
    count or event)."""
    rows = session.exec(
        select(ReviewRow).where(ReviewRow.session_id == session_id, ReviewRow.status == "pending")
    ).all()
    for row in rows:
        row.status = "cancelled"
        row.decided_by = by
        row.decided_at = utcnow()
        session.add(row)
        count_settled(session, row)
        add_audit(
            session,
            session_id=row.session_id,
            review_id=row.id,
            caller=row.caller_agent_slug,
            operation=row.operation,
            target=row.target_agent_slug,
            outcome="cancelled",
            decided_by=by,
            reason=f"the session ended ({by}) before a decision",
            via="invoke" if row.operation == "invoke" else None,
        )
        webhook_events.review_resolved(session, row)
    session.flush()
    return list(rows)


def audited_path(operation: str, via: str | None = None) -> str | None:
    """The path (``via``) of a cross-agent operation: ``via`` when the caller names one
    (``delegate_to``, ``route``, ``mention``, ``task``), else ``invoke`` for the invoke
    operation (``invoke_agent`` is its own path), else None (list, read and create make no
    agent run). The one rule of every audit row's ``via`` (docs/xagent.md, 'Audit log')."""
    return via or ("invoke" if operation == "invoke" else None)


def add_audit(
    session: Session,
    *,
    session_id: str,
    caller: str,
    operation: str,
    target: str | None,
    outcome: AuditOutcome,
    decided_by: str,
    review_id: str | None = None,
    reason: str = "",
    via: str | None = None,
) -> AuditRow:
    """Append one audit row (flush only). ``via``: the cross-agent path, filled in by
    :func:`audited_path` (an invoke settled by a review is ``invoke`` too)."""
    row = AuditRow(
        session_id=session_id,
        review_id=review_id,
        caller_agent_slug=caller,
        operation=operation,
        target_agent_slug=target,
        outcome=outcome,
        decided_by=decided_by,
        reason=reason[:500],
        via=audited_path(operation, via),
    )
    session.add(row)
    session.flush()
    return row


def audit_conditions(
    *,
    caller: str | None = None,
    target: str | None = None,
    operation: str | None = None,
    outcome: str | None = None,
    session_id: str | None = None,
    via: str | None = None,
    review_id: str | None = None,
    callers: list[str] | None = None,
) -> list[Any]:
    """The WHERE of an audit list: each filter an equality; ``callers`` limits to those
    agents (auth mode)."""
    conditions: list[Any] = []
    for column, value in (
        (AuditRow.caller_agent_slug, caller),
        (AuditRow.target_agent_slug, target),
        (AuditRow.operation, operation),
        (AuditRow.outcome, outcome),
        (AuditRow.session_id, session_id),
        (AuditRow.via, via),
        (AuditRow.review_id, review_id),
    ):
        if value is not None:
            conditions.append(col(column) == value)
    if callers is not None:
        conditions.append(col(AuditRow.caller_agent_slug).in_(callers))
    return conditions


_AUDIT_CURSOR = "audit|"


def audit_cursor(row: AuditRow) -> str:
    """The opaque audit list cursor after ``row`` (its id, base64url)."""
    raw = f"{_AUDIT_CURSOR}{row.id}"
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def audit_cursor_id(cursor: str) -> int:
    """The audit row id an :func:`audit_cursor` names. Raises InvalidCursor."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except ValueError:
        raw = ""
    tail = raw.removeprefix(_AUDIT_CURSOR)
    if raw == tail or not tail.isdigit() or len(tail) > 18:
        raise InvalidCursor(f"cursor '{cursor[:160]}' is not the audit log's", path="cursor")
    return int(tail)


def page_audit(
    session: Session,
    *,
    where: list[Any],
    limit: int = 50,
    offset: int = 0,
    cursor: str | None = None,
) -> tuple[list[AuditRow], int, str | None]:
    """One page of the audit rows matching ``where`` (:func:`audit_conditions`), newest
    first: ``(rows, total matching, next_cursor)``.

    ``cursor`` (a previous page's ``next_cursor``) is keyset paging: the rows older than
    the one it names, one range read of the primary key whatever the depth, disjoint from
    the pages before it however many rows were written since. ``offset`` skips rows
    instead. ``next_cursor`` is set while more rows follow, None on the last page (also
    when the page holds exactly ``limit`` rows and none follow). Raises InvalidCursor.
    """
    total = session.exec(select(func.count()).select_from(AuditRow).where(*where)).one()
    conditions = list(where)
    if cursor is not None:
        conditions.append(col(AuditRow.id) < audit_cursor_id(cursor))
    found = list(
        session.exec(
            select(AuditRow)
            .where(*conditions)
            .order_by(col(AuditRow.id).desc())
            .offset(offset)
            .limit(limit + 1)  # one more tells whether another page follows
        ).all()
    )
    rows = found[:limit]
    next_cursor = audit_cursor(rows[-1]) if len(found) > limit else None
    return rows, int(total), next_cursor


# --- proofs of decisions --------------------------------------------

#: ``decided_by`` of a decision without a valid proof: a raw ``temporal workflow signal``.
UNVERIFIED = "temporal (unverified)"
#: Domain tag of the signed message: a proof made for anything else never verifies here.
_PROOF_TAG = "baton.review_decision.v1"
_DEFAULT_DECIDER = ReviewDecision.model_fields["decided_by"].default


#: The edits a reviewer may make when allowing an operation, by operation (docs/xagent.md,
#: Reviews): an invoke's prompt; a create's name and instructions; nothing of a list or read.
EDITS_OF: dict[str, tuple[str, ...]] = {
    "invoke": ("edited_prompt",),
    "create": ("edited_name", "edited_instructions"),
}
_CREATE_EDITS = EDITS_OF["create"]
#: Every edit a decision may carry.
EDIT_FIELDS = ("edited_prompt", *_CREATE_EDITS)


def decision_proof(key: bytes, decision: ReviewDecision) -> str:
    """HMAC-SHA256 (64 hex characters) over what a decision claims.

    Signed: review id, decision, scope, decided_by, decision_id and received_at (as
    UTC ISO 8601; None included), then the edited prompt when there is one, then each
    edit of a create (``[field, value]`` for ``edited_name``, ``edited_instructions``)
    when there is one (so a proof made before an edit existed still verifies), as one JSON
    array so no two claims share a message. ``key`` is
    :meth:`baton.settings.Settings.review_key`.
    """
    d = decision
    received = d.received_at.astimezone(UTC).isoformat() if d.received_at else None
    claims: list[Any] = [_PROOF_TAG, d.review_id, d.decision, d.scope, d.decided_by]
    claims += [d.decision_id, received]
    if d.edited_prompt is not None:
        claims.append(d.edited_prompt)
    for field in _CREATE_EDITS:
        value = getattr(d, field)
        if value is not None:
            claims.append([field, value])  # tagged: never the same message as a prompt edit
    message = json.dumps(claims, ensure_ascii=False, separators=(",", ":")).encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def prove(key: bytes, decision: ReviewDecision) -> ReviewDecision:
    """``decision`` with its proof: what the API and the worker send."""
    return decision.model_copy(update={"proof": decision_proof(key, decision)})


def is_proven(key: bytes, decision: ReviewDecision) -> bool:
    """Whether ``decision`` carries the proof ``key`` makes for exactly these claims."""
    if decision.proof is None:
        return False
    return hmac.compare_digest(decision.proof, decision_proof(key, decision))


@dataclass(frozen=True)
class Credited:
    """What a decision is credited with: the decision applied (an unproven
    always_allow in auth mode becomes allow_once), who is recorded, and the audit reason."""

    decision: Decision
    decided_by: str
    proven: bool
    reason: str


def edits_of(decision: BaseModel) -> dict[str, str]:
    """The edits ``decision`` (a :class:`ReviewDecision` or the API's decision body)
    carries: ``{field: value}`` for each of :data:`EDIT_FIELDS` it sets."""
    found = {f: getattr(decision, f, None) for f in EDIT_FIELDS}
    return {f: v for f, v in found.items() if v is not None}


def edit_label(field: str) -> str:
    """What an edit field edits, as the audit and the errors name it: ``edited_name`` →
    ``name``."""
    return field.removeprefix("edited_")


def edit_refusal(
    operation: str, decision: Decision, edits: Iterable[str]
) -> tuple[str, str] | None:
    """Why a decision carrying ``edits`` (field names) cannot be made on a review of
    ``operation``: ``(the first edit refused, why)``, or None when it can. The one rule of
    which edits a decision takes (docs/xagent.md, Reviews): a deny takes none (nothing is
    sent), an allow takes only the edits of its operation (:data:`EDITS_OF`). The API
    answers a refusal 422 ``edit_not_allowed``; the worker ignores (and audits) an edit
    a decision cannot carry."""
    edits = list(edits)
    if decision == "deny" and edits:
        return edits[0], f"a deny takes no edit ({', '.join(edits)}): nothing is sent"
    takes = EDITS_OF.get(operation, ())
    wrong = [e for e in edits if e not in takes]
    if not wrong:
        return None
    allowed = " and ".join(takes) or "no edit"
    return wrong[0], f"a {operation} review takes {allowed}, not {', '.join(wrong)}"


def edit_note(by: str, edits: Sequence[tuple[str, str, str]]) -> str:
    """The audit reason's part for a reviewer's edits of an allowed operation: per edit
    ``(what, original, edited)`` (``prompt``; ``name``, ``instructions``), who edited, the
    original and the edited text, each cut so the reason fits its 500 characters."""
    cut = 180 // max(len(edits), 1)  # every original and edit and the rest fit the reason

    def quoted(text: str) -> str:
        return repr(text if len(text) <= cut else text[: cut - 1] + "…")

    return "".join(
        f"; {what} edited by {by}: original {quoted(original)} → edited {quoted(edited)}"
        for what, original, edited in edits
    )


def credit(key: bytes, decision: ReviewDecision, *, auth: bool) -> Credited:
    """The one rule for who a decision is recorded as and what it may do.

    Proven: as claimed. Unproven: ``decided_by`` is :data:`UNVERIFIED` (the claimed
    name goes to the audit reason, marked as a claim); with ``auth`` an
    always_allow is applied as allow_once, since saving a policy is an owner's
    edit and a raw Signal proves no owner. Outside auth mode an unproven
    always_allow still saves its policy (any API caller could, too).
    """
    if is_proven(key, decision):
        return Credited(decision.decision, decision.decided_by, True, decision.decision)
    claimed = decision.decided_by
    claim = f", claimed decided_by {claimed!r}" if claimed != _DEFAULT_DECIDER else ""
    applied: Decision = decision.decision
    if auth and decision.decision == "always_allow":
        applied = "allow_once"
        reason = (
            f"always_allow from an unverified Temporal Signal{claim}, applied as allow_once: "
            "in auth mode only a decision proven by the API saves a policy"
        )
    else:
        reason = f"{decision.decision} from an unverified Temporal Signal{claim}"
    return Credited(applied, UNVERIFIED, False, reason)
