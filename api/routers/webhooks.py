"""``/v1/webhooks``: subscriptions to review, handoff and failure events, their delivery
log and a test-send (docs/webhooks.md). In auth mode each subscription is its creator's:
another user neither sees nor changes it (404)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response, status

from api.deps import CallerDep, SessionDep, SettingsDep
from api.idempotency import IDEMPOTENT
from api.problems import problem_responses
from baton.agents.schemas import MAX_OFFSET, Page
from baton.webhooks import events
from baton.webhooks import subscriptions as hooks

router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"])

WebhookIdPath = Annotated[str, Path(pattern=r"^webhook-[0-9a-f-]{36}$", examples=["webhook-0b7c…"])]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    responses=problem_responses(403, 404, 409, 422),
    summary="Create a webhook",
    dependencies=IDEMPOTENT,
)
def create_webhook(
    body: hooks.WebhookIn, session: SessionDep, caller: CallerDep, settings: SettingsDep
) -> hooks.WebhookCreated:
    """Subscribe ``url`` to ``events``; the answer carries the signing secret, shown only
    now. 422 ``webhook_url_refused`` in auth mode for a loopback, private or link-local
    receiver not in ``BATON_OUTBOUND_ALLOW``; 404 for an agent or team filter naming
    nothing the caller can see; 403 without the viewer role on the filtered agent."""
    if body.agent:
        caller.require(session, body.agent, "viewer")
    if body.team:
        caller.team_members(session, body.team)
    created = hooks.create_webhook(
        session, body=body, owner=caller.user, policy=settings.outbound_policy()
    )
    session.commit()
    return created


@router.get("", responses=problem_responses(422), summary="List webhooks")
def list_webhooks(
    session: SessionDep,
    caller: CallerDep,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> Page[hooks.WebhookPublic]:
    """Subscriptions newest first (auth mode: the caller's own)."""
    rows, total = hooks.list_webhooks(session, owner=caller.acl_user, limit=limit, offset=offset)
    return Page(data=[hooks.webhook_public(r) for r in rows], count=total)


@router.get("/{webhook_id}", responses=problem_responses(404, 422), summary="Get a webhook")
def get_webhook(
    webhook_id: WebhookIdPath, session: SessionDep, caller: CallerDep
) -> hooks.WebhookPublic:
    """One subscription; 404 ``webhook_not_found`` (also another user's, in auth mode)."""
    row = hooks.get_webhook(session, webhook_id=webhook_id, owner=caller.acl_user)
    return hooks.webhook_public(row)


@router.delete(
    "/{webhook_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses=problem_responses(404, 422),
    summary="Delete a webhook",
)
def delete_webhook(webhook_id: WebhookIdPath, session: SessionDep, caller: CallerDep) -> Response:
    """Delete the subscription: nothing more is queued for it, and deliveries still being
    retried end ``cancelled``. The log stays readable until then."""
    hooks.delete_webhook(session, webhook_id=webhook_id, owner=caller.acl_user)
    session.commit()
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get(
    "/{webhook_id}/deliveries",
    responses=problem_responses(404, 422),
    summary="List a webhook's deliveries",
)
def list_deliveries(
    webhook_id: WebhookIdPath,
    session: SessionDep,
    caller: CallerDep,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> Page[hooks.DeliveryPublic]:
    """The delivery log newest first: each delivery's status (pending | delivering |
    retrying | delivered | failed | refused | cancelled), attempts so far, the last error
    and HTTP status."""
    hooks.get_webhook(session, webhook_id=webhook_id, owner=caller.acl_user)
    rows, total = hooks.list_deliveries(session, webhook_id=webhook_id, limit=limit, offset=offset)
    return Page(data=[hooks.delivery_public(r) for r in rows], count=total)


@router.post(
    "/{webhook_id}/test",
    status_code=status.HTTP_202_ACCEPTED,
    responses=problem_responses(404, 422, 429, 503),
    summary="Send a test delivery",
    dependencies=IDEMPOTENT,
)
def test_webhook(
    webhook_id: WebhookIdPath, session: SessionDep, caller: CallerDep
) -> hooks.TestSent:
    """Queue a signed ``webhook.test`` delivery, retried like any other; follow it in the
    log. 429 ``too_many_pending_tests`` while 5 earlier tests are not final; 503
    ``engine_unavailable`` when Temporal cannot take it (nothing is queued)."""
    row = hooks.get_webhook(session, webhook_id=webhook_id, owner=caller.acl_user)
    hooks.require_test_room(session, webhook_id=row.id)
    delivery = events.send_test(session, row)
    session.commit()
    return hooks.TestSent(delivery_id=delivery, status="pending")
