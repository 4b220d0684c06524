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
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query, Request, Response, status
from pydantic import BaseModel, ConfigDict
from sqlalchemy.engine import Engine
from temporalio.service import RPCError, RPCStatusCode

from api.deps import Caller, CallerDep, EngineDep, SessionDep, SettingsDep, TemporalDep
from api.problems import problem_responses
from baton.agents.schemas import MAX_OFFSET, Page
from baton.contracts import Decision, ReviewDecision
from baton.errors import BatonError, EngineUnavailable
from baton.permissions import reviews
from baton.storage.db import session_scope
from baton.storage.notify import EventNotifier

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


class InvalidDecision(BatonError):
    """A decision the review cannot take (always_allow on create_agent)."""

    code = "invalid_decision"
    status = 422
    title = "Invalid decision"


class ReviewTooLate(BatonError):
    """The review got its outcome from another decision or the timeout first."""

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


def _decision_id(engine: Engine, review_id: str) -> tuple[str, str | None]:
    with session_scope(engine) as s:
        row = reviews.get_review(s, review_id=review_id)
        return row.status, row.decision_id


@router.get("", responses=problem_responses(422), summary="List reviews")
def list_reviews(
    session: SessionDep,
    caller: CallerDep,
    status_: Annotated[
        Literal["pending", "allowed", "denied", "timed_out", "cancelled"] | None,
        Query(alias="status"),
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
    client: TemporalDep,
    caller: CallerDep,
    settings: SettingsDep,
    response: Response,
    request: Request,
) -> reviews.ReviewPublic:
    """Deliver a proven decision (Signal ``review_decision``) and report what it did.

    200 with the settled review when this decision was applied; 409
    ``review_already_decided`` when the review was settled before the request,
    409 ``review_too_late`` when another decision or the timeout won the race;
    202 when the session has not applied it yet (its worker is busy or down: the
    Signal is durable and will be applied). 422 ``invalid_decision`` for
    always_allow on create_agent (Gamut X-Agent Policies: never stored).
    """
    review = await asyncio.to_thread(_load, engine, caller, review_id)
    if review.status != "pending":
        raise reviews.ReviewDecided(
            f"review '{review_id}' is already {review.status}", review_status=review.status
        )
    if body.decision == "always_allow" and caller.auth:
        # Saving a policy is a policy edit: owners only (deciding once needs the user role).
        await asyncio.to_thread(caller.require_on, engine, review.caller, "owner")
    if body.decision == "always_allow" and review.operation == "create":
        raise InvalidDecision(
            "create_agent always needs a review: it can be allowed once, never always",
            path="decision",
        )
    decision_id = str(uuid.uuid4())
    # Settling writes the session's review_resolved event: the notifier wakes this wait at
    # that commit (issue 14) instead of after the next 50 ms poll, which stays the fallback.
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
                    ),
                ),
            )
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                raise ReviewTooLate(f"the session of review '{review_id}' has ended") from exc
            raise EngineUnavailable(f"Temporal refused the decision: {exc.message}") from exc
        deadline = asyncio.get_running_loop().time() + SETTLE_WAIT_S
        while asyncio.get_running_loop().time() < deadline:
            await settled.wait(timeout=POLL_S)
            settled.clear()
            state, winner = await asyncio.to_thread(_decision_id, engine, review_id)
            if state != "pending":
                if winner != decision_id:
                    raise ReviewTooLate(
                        f"review '{review_id}' was settled ({state}) before this decision arrived",
                        review_status=state,
                    )
                return await asyncio.to_thread(_load, engine, caller, review_id)
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
        Literal["allow", "block", "denied_by_user", "review_timeout"] | None, Query()
    ] = None,
    session_id: Annotated[str | None, Query(pattern=r"^session-[0-9a-f-]{36}$")] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> Page[reviews.AuditPublic]:
    """Every reviewed or blocked X-Agent operation, newest first (Gamut X-Agent Policies,
    'Audit trail')."""
    rows, total = reviews.list_audit(
        session,
        caller=caller_agent,
        target=target,
        operation=operation,
        outcome=outcome,
        session_id=session_id,
        callers=caller.visible(session),
        limit=limit,
        offset=offset,
    )
    return Page(data=[reviews.audit_public(r) for r in rows], count=total)
