"""``/v1/reviews`` and ``/v1/audit``: decide policy reviews, read the audit log
(docs/xagent.md, Reviews; docs/api.md).

A decision is delivered as the same Signal ``review_decision`` an operator can
send with ``temporal workflow signal``; the workflow applies the first decision
for an open review and settles it exactly once. The API then reads the settled
row: if its ``decision_id`` is this request's, the decision was applied (200);
otherwise another decision or the timeout won and this one was too late (409).

Every decision the API sends carries a proof (``baton.permissions.reviews.prove``, keyed with
``BATON_REVIEW_SECRET``) binding it to the authenticated user: the worker records
it as that user. A raw Signal has none and is recorded as ``temporal (unverified)``.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query, Request, Response, status
from pydantic import BaseModel, ConfigDict, Field, field_validator
from sqlalchemy.engine import Engine
from temporalio.service import RPCError, RPCStatusCode

from api.deps import Caller, CallerDep, EngineDep, SessionDep, SettingsDep, TemporalDep
from api.idempotency import IdempotencyDep
from api.problems import problem_responses
from baton.agents.schemas import MAX_OFFSET, CursorPage, Page
from baton.contracts.text import SafeText
from baton.contracts.tool_args import AgentInstructions, AgentName
from baton.contracts.values import MAX_MESSAGE_CHARS, Decision, Via
from baton.contracts.workflow_io import ReviewDecision, review_in_time
from baton.errors import BatonError, EngineUnavailable, InvalidCursor
from baton.permissions import reviews
from baton.storage.db import session_scope, utcnow
from baton.storage.notify import EventNotifier, Subscription

router = APIRouter(prefix="/v1/reviews", tags=["reviews"])
audit_router = APIRouter(prefix="/v1/audit", tags=["audit"])

ReviewIdPath = Annotated[str, Path(pattern=r"^review-[0-9a-f-]{36}$", examples=["review-2f0c…"])]
SlugQuery = Annotated[str | None, Query(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")]
#: How long a decision request waits for the workflow to settle the review (seconds).
SETTLE_WAIT_S = 10.0
POLL_S = 0.05


class DecisionBody(BaseModel):
    """``POST /v1/reviews/{id}/decision``: deny | allow_once | always_allow (+ scope)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"decision": "always_allow", "scope": "target"}]},
    )

    decision: Decision
    scope: Literal["target", "all"] | None = None
    edited_prompt: SafeText | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_MESSAGE_CHARS,
        description="allow_once or always_allow of an invoke: the prompt the target gets "
        "instead of the caller's; the audit keeps both, the caller is told. 422 "
        "`edit_not_allowed` for deny and for create, list and read reviews.",
    )
    edited_name: AgentName | None = Field(
        default=None,
        description="allow_once of a create: the name the new agent gets instead of the "
        "caller's (bounded as create_agent's `name`); the audit keeps both, the caller is "
        "told. 422 `edit_not_allowed` for deny and for other reviews.",
    )
    edited_instructions: AgentInstructions | None = Field(
        default=None,
        description="allow_once of a create: the instructions (system prompt) the new "
        "agent gets instead of the caller's (bounded as create_agent's `instructions`); "
        "audited and told like `edited_name`.",
    )

    @field_validator("edited_prompt", "edited_name", "edited_instructions")
    @classmethod
    def _not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("an edit says something (blank: omit it)")
        return value


class EditNotAllowed(BatonError):
    """An edit the decision cannot carry (:func:`baton.permissions.reviews.edit_refusal`):
    any edit on a deny, an ``edited_prompt`` on anything but an invoke, an
    ``edited_name`` or ``edited_instructions`` on anything but a create."""

    code = "edit_not_allowed"
    status = 422
    title = "This decision takes no such edit"


class InvalidDecision(BatonError):
    """A decision the review cannot take (always_allow on create_agent)."""

    code = "invalid_decision"
    status = 422
    title = "Invalid decision"


class ReviewTooLate(BatonError):
    """The decision came past the review's deadline, after its timeout, or after its
    session ended."""

    code = "review_too_late"
    status = 409
    title = "Too late"


def _load(engine: Engine, caller: Caller, review_id: str) -> reviews.ReviewPublic:
    with session_scope(engine) as s:
        row = reviews.get_review(s, review_id=review_id)
        # Gamut X-Agent Policies: only a user with access to the caller agent may decide
        # its reviews.
        caller.require(s, row.caller_agent_slug, "user")
        return reviews.review_public(row)


def _cancel_ended(engine: Engine, session_id: str) -> None:
    with session_scope(engine) as s:
        reviews.cancel_pending(s, session_id=session_id, by="session ended")


def _decision_id(engine: Engine, review_id: str) -> tuple[str, str | None]:
    with session_scope(engine) as s:
        row = reviews.get_review(s, review_id=review_id)
        return row.status, row.decision_id


@router.get("", responses=problem_responses(422), summary="List reviews")
def list_reviews(
    session: SessionDep,
    caller: CallerDep,
    status_: Annotated[
        Literal["pending", "allowed", "denied", "timed_out", "cancelled", "withdrawn", "all"]
        | None,
        Query(alias="status", description="One status, or `all` (the default: every one)."),
    ] = None,
    session_id: Annotated[str | None, Query(pattern=r"^session-[0-9a-f-]{36}$")] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> Page[reviews.ReviewPublic]:
    """Reviews newest first; in auth mode only those of agents the user may decide for."""
    rows, total = reviews.list_reviews(
        session,
        status=status_,
        session_id=session_id,
        callers=caller.visible(session, "user"),
        limit=limit,
        offset=offset,
    )
    return Page(data=[reviews.review_public(r) for r in rows], count=total)


@router.get("/{review_id}", responses=problem_responses(403, 404, 422), summary="Get a review")
async def get_review(
    review_id: ReviewIdPath, engine: EngineDep, caller: CallerDep
) -> reviews.ReviewPublic:
    """One review."""
    return await asyncio.to_thread(_load, engine, caller, review_id)


async def _require_decidable(
    engine: Engine,
    caller: Caller,
    review: reviews.ReviewPublic,
    body: DecisionBody,
) -> datetime:
    """The checks a decision passes before it is signalled, and when it was received (now,
    after the other checks): the review is pending (409 ``review_already_decided``), an
    always_allow in auth mode comes from an owner of the caller agent (saving a policy is
    a policy edit; 403), create_agent is never always allowed (422 ``invalid_decision``),
    an edit goes only with an allow of its operation (an invoke's prompt, a create's name
    and instructions: :func:`baton.permissions.reviews.edit_refusal`; 422
    ``edit_not_allowed``), and it is received
    within the review's deadline (409 ``review_too_late``, whether or not its timer has
    fired)."""
    if review.status != "pending":
        raise reviews.ReviewDecided(
            f"review '{review.id}' is already {review.status}", review_status=review.status
        )
    if body.decision == "always_allow" and caller.auth:
        await asyncio.to_thread(caller.require_on, engine, review.caller, "owner")
    if body.decision == "always_allow" and review.operation == "create":
        raise InvalidDecision(
            "create_agent always needs a review: it can be allowed once, never always",
            path="decision",
        )
    edits = reviews.edits_of(body)
    refused = reviews.edit_refusal(review.operation, body.decision, edits)
    if refused is not None:
        raise EditNotAllowed(refused[1], path=refused[0])
    received = utcnow()
    if review.expires_at is not None and not review_in_time(received, review.expires_at):
        # The review's timer may not have fired yet (a loaded worker, Temporal down at the
        # deadline): the deadline holds all the same, and the workflow applies the rule too.
        raise ReviewTooLate(
            f"review '{review.id}' expired at {review.expires_at.isoformat()}",
            review_status=review.status,
        )
    return received


async def _applied(
    engine: Engine, caller: Caller, review_id: str, decision_id: str, settled: Subscription
) -> reviews.ReviewPublic | None:
    """The settled review once decision ``decision_id`` was the one applied, waiting up to
    SETTLE_WAIT_S seconds (woken by the session's events, polled every POLL_S); None when
    the review is still pending then (202). Another outcome first raises 409:
    ``review_too_late`` when the timeout won, ``review_already_decided`` when another
    decision did (of concurrent decisions exactly one applies; the others are told so)."""
    deadline = asyncio.get_running_loop().time() + SETTLE_WAIT_S
    while asyncio.get_running_loop().time() < deadline:
        await settled.wait(timeout=POLL_S)
        settled.clear()
        state, winner = await asyncio.to_thread(_decision_id, engine, review_id)
        if state == "pending":
            continue
        if winner == decision_id:
            return await asyncio.to_thread(_load, engine, caller, review_id)
        if state == "timed_out":
            raise ReviewTooLate(
                f"review '{review_id}' timed out before this decision arrived",
                review_status=state,
            )
        raise reviews.ReviewDecided(
            f"review '{review_id}' was {state} by another decision first", review_status=state
        )
    return None


@router.post(
    "/{review_id}/decision",
    responses={
        202: {"model": reviews.ReviewPublic, "description": "Delivered; not applied yet"},
        **problem_responses(403, 404, 409, 422, 503),
    },
    summary="Decide a review",
)
async def decide(
    review_id: ReviewIdPath,
    body: DecisionBody,
    engine: EngineDep,
    temporal: TemporalDep,
    caller: CallerDep,
    settings: SettingsDep,
    response: Response,
    request: Request,
    claim: IdempotencyDep,
) -> reviews.ReviewPublic:
    """Deliver a proven decision (Signal ``review_decision``) and report what it did.

    200 with the settled review when this decision was applied; 409
    ``review_already_decided`` when the review was settled before the request or
    another decision won the race (of concurrent decisions exactly one applies);
    409 ``review_too_late`` when it is received past the review's ``expires_at``
    (whether or not its timer has fired), when the timeout won the race, or when the
    session has ended (its pending reviews are then cancelled, audited); 202 when the
    session has not applied it yet (its worker is busy or down: the Signal is durable
    and will be applied). 422 ``invalid_decision`` for
    always_allow on create_agent (Gamut X-Agent Policies: never stored).
    """
    review = await asyncio.to_thread(_load, engine, caller, review_id)
    received = await _require_decidable(engine, caller, review, body)
    client = await temporal.client()  # after every check: a bad request is its 4xx
    # Derived from an Idempotency-Key: a retry that takes over a request whose API process
    # was killed sends the same decision, which the settled row then names as the winner.
    decision_id = str(claim.uuid() if claim else uuid.uuid4())
    # Settling writes the session's review_resolved event: the notifier wakes this wait at
    # that commit instead of after the next 50 ms poll, which stays the fallback.
    # Subscribed before the Signal, so the wait comes first: the review cannot be settled
    # before the Signal is delivered, and reading it sooner only takes a thread and a
    # query from the workflow task settling it.
    notifier: EventNotifier = request.app.state.notifier
    with notifier.subscribe(review.session_id) as settled:
        try:
            await client.get_workflow_handle(review.session_id).signal(
                "review_decision",
                reviews.prove(
                    settings.review_key(),
                    ReviewDecision(
                        review_id=review_id,
                        decision=body.decision,
                        scope=body.scope,
                        decided_by=caller.user,
                        decision_id=decision_id,
                        received_at=received,
                        edited_prompt=body.edited_prompt,
                        edited_name=body.edited_name,
                        edited_instructions=body.edited_instructions,
                    ),
                ),
            )
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                # Its run ended without closing it (terminated, timed out): it leaves the inbox.
                await asyncio.to_thread(_cancel_ended, engine, review.session_id)
                raise ReviewTooLate(
                    f"the session of review '{review_id}' has ended: the review is cancelled",
                    review_status="cancelled",
                ) from exc
            raise EngineUnavailable(f"Temporal refused the decision: {exc.message}") from exc
        applied = await _applied(engine, caller, review_id, decision_id, settled)
        if applied is not None:
            return applied
    response.status_code = status.HTTP_202_ACCEPTED
    return await asyncio.to_thread(_load, engine, caller, review_id)


@audit_router.get("", responses=problem_responses(422), summary="Audit log")
def list_audit(
    session: SessionDep,
    caller: CallerDep,
    caller_agent: Annotated[SlugQuery, Query(alias="caller")] = None,
    target: SlugQuery = None,
    operation: Annotated[Literal["list", "read", "invoke", "create"] | None, Query()] = None,
    outcome: Annotated[
        Literal["allow", "block", "denied_by_user", "review_timeout", "cancelled", "withdrawn"]
        | None,
        Query(),
    ] = None,
    session_id: Annotated[str | None, Query(pattern=r"^session-[0-9a-f-]{36}$")] = None,
    via: Annotated[Via | None, Query()] = None,
    review_id: Annotated[str | None, Query(pattern=r"^review-[0-9a-f-]{36}$")] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=200,
            description="A previous page's `next_cursor`: the rows after it, at the cost of "
            "the first page whatever its depth.",
        ),
    ] = None,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> CursorPage[reviews.AuditPublic]:
    """Every reviewed or blocked X-Agent operation, newest first (Gamut X-Agent Policies,
    'Audit trail'); ``next_cursor`` while more follow.

    Keyset paging (``cursor``): each page is one range read, disjoint from the pages before
    it however many rows were written since. 422 ``invalid_cursor`` for a cursor this list
    never gave, or with ``offset``."""
    if cursor is not None and offset:
        raise InvalidCursor("a cursor pages alone: drop offset", path="offset")
    where = reviews.audit_conditions(
        caller=caller_agent,
        target=target,
        operation=operation,
        outcome=outcome,
        session_id=session_id,
        via=via,
        review_id=review_id,
        callers=caller.visible(session),
    )
    rows, total, next_cursor = reviews.page_audit(
        session, where=where, limit=limit, offset=offset, cursor=cursor
    )
    return CursorPage(
        data=[reviews.audit_public(r) for r in rows], count=total, next_cursor=next_cursor
    )
