"""Webhook subscriptions and their delivery log (docs/webhooks.md): the API's shapes, the
rules a subscription must pass, and the keyword-only data access shared by the API, the
CLI and the delivery activity.

A receiver URL is checked with the one outbound rule (:mod:`baton.outbound`): in auth mode
an address that is loopback, link-local, private or otherwise not public is refused unless
``BATON_OUTBOUND_ALLOW`` lists it, here at creation and again on every connection the
delivery makes (a name may resolve elsewhere later).
"""

from __future__ import annotations

import base64
import secrets
import socket
import uuid
from datetime import datetime
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.config import JsonDict
from sqlmodel import Session, col, select

from baton.agents import teams
from baton.agents.registry import get_agent
from baton.errors import BatonError, NotFound
from baton.outbound import OutboundPolicy, OutboundRefused
from baton.storage.db import WebhookDeliveryRow, WebhookRow, page

#: Every event a subscription may ask for.
Event = Literal[
    "review.opened",
    "review.resolved",
    "handoff.opened",
    "handoff.resolved",
    "session.failed",
    "step.failed",
    "balance.low",
]
#: The event a test-send delivers (never subscribed to: every subscription gets it on ask).
TEST_EVENT = "webhook.test"
DeliveryStatus = Literal[
    "pending", "delivering", "retrying", "delivered", "failed", "refused", "cancelled"
]
#: Statuses after which nothing is attempted again.
FINAL = ("delivered", "failed", "refused", "cancelled")
#: Default of ``balance_low_usd`` when ``balance.low`` is asked for without one.
DEFAULT_BALANCE_LOW_USD = 1.0
#: Subscriptions one owner may hold.
MAX_WEBHOOKS_PER_OWNER = 100
#: Test deliveries of one subscription that may be in flight at once (a test-send is no
#: way to make Baton flood a receiver).
MAX_PENDING_TESTS = 5
SECRET_PREFIX = "whsec_"


class WebhookNotFound(NotFound):
    """No webhook with this id (or not the caller's, in auth mode)."""

    code = "webhook_not_found"


class InvalidWebhook(BatonError):
    """A subscription that cannot be delivered to as asked (422)."""

    code = "invalid_webhook"
    status = 422
    title = "Invalid webhook"


class WebhookUrlRefused(BatonError):
    """The receiver URL reaches an address auth mode never connects to (422)."""

    code = "webhook_url_refused"
    status = 422
    title = "Receiver address refused"


class TooManyWebhooks(BatonError):
    """The owner holds :data:`MAX_WEBHOOKS_PER_OWNER` subscriptions already (409)."""

    code = "too_many_webhooks"
    status = 409
    title = "Too many webhooks"


class TooManyTests(BatonError):
    """:data:`MAX_PENDING_TESTS` test deliveries of the subscription are still in flight (429)."""

    code = "too_many_pending_tests"
    status = 429
    title = "Too many tests in flight"


class WebhookIn(BaseModel):
    """``POST /v1/webhooks``: where to send which events, optionally only those of one agent
    or one team."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "url": "https://hooks.example.com/baton",
                    "events": ["review.opened", "handoff.opened"],
                    "agent": "coordinator",
                }
            ]
        },
    )

    url: str = Field(min_length=8, max_length=2048, description="An http:// or https:// URL.")
    events: list[Event] = Field(min_length=1, max_length=7)
    agent: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9][a-z0-9-]{0,62}$",
        description="Only events of this agent (a review's caller or target, a session's or "
        "step's agent).",
    )
    team: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9][a-z0-9-]{0,62}$",
        description="Only events of this team's runs (a step belongs to no team).",
    )
    balance_low_usd: float | None = Field(
        default=None,
        ge=0,
        le=1_000_000,
        description="balance.low fires when a charge takes the balance from above this "
        f"amount (USD) to at or below it; default {DEFAULT_BALANCE_LOW_USD:g}.",
    )
    description: str = Field(default="", max_length=500)

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL with a host")
        if parts.username or parts.password:
            raise ValueError("must not carry credentials (the signature authenticates Baton)")
        if parts.fragment:
            raise ValueError("must not have a #fragment")
        return value

    @field_validator("events")
    @classmethod
    def _distinct(cls, value: list[Event]) -> list[Event]:
        return list(dict.fromkeys(value))

    @model_validator(mode="after")
    def _coherent(self) -> WebhookIn:
        if self.agent and self.team:
            raise ValueError("give agent or team, not both")
        if self.balance_low_usd is not None and "balance.low" not in self.events:
            raise ValueError("balance_low_usd applies only with the balance.low event")
        return self


#: A subscription as the API answers it (the examples of the schemas below).
_HOOK_EXAMPLE: JsonDict = {
    "id": "webhook-7f0c…",
    "url": "https://hooks.example.com/baton",
    "events": ["review.opened"],
    "agent": "coordinator",
    "team": None,
    "balance_low_usd": None,
    "description": "",
    "owner": "local",
    "created_at": "2026-12-01T09:00:00Z",
}


class WebhookPublic(BaseModel):
    """A subscription as the API shows it (never its secret)."""

    model_config = ConfigDict(json_schema_extra={"examples": [_HOOK_EXAMPLE]})

    id: str
    url: str
    events: list[str]
    agent: str | None
    team: str | None
    balance_low_usd: float | None
    description: str
    owner: str
    created_at: datetime


class WebhookCreated(WebhookPublic):
    """The answer to ``POST /v1/webhooks``: the subscription and, this once, its secret."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{**_HOOK_EXAMPLE, "secret": "whsec_MfKQ9r8GKYqrTw…"}]}
    )

    secret: str = Field(
        description="`whsec_` + base64 of 32 random bytes: the HMAC-SHA256 key of every "
        "delivery's `webhook-signature`. Shown only now; store it with the receiver."
    )


class DeliveryPublic(BaseModel):
    """One delivery in the log (``GET /v1/webhooks/{id}/deliveries``)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": "delivery-5b1e…",
                    "webhook_id": "webhook-7f0c…",
                    "event": "review.opened",
                    "status": "delivered",
                    "attempts": 1,
                    "last_error": None,
                    "last_status_code": 204,
                    "created_at": "2026-12-01T09:05:00Z",
                    "last_attempt_at": "2026-12-01T09:05:00Z",
                    "delivered_at": "2026-12-01T09:05:00Z",
                }
            ]
        }
    )

    id: str = Field(description="The `webhook-id` header and the payload's `id`: dedup by it.")
    webhook_id: str
    event: str
    status: DeliveryStatus
    attempts: int
    last_error: str | None
    last_status_code: int | None
    created_at: datetime
    last_attempt_at: datetime | None
    delivered_at: datetime | None


class TestSent(BaseModel):
    """The answer to ``POST /v1/webhooks/{id}/test``: the delivery queued."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"delivery_id": "delivery-5b1e…", "status": "pending"}]}
    )

    delivery_id: str
    status: DeliveryStatus


def webhook_public(row: WebhookRow) -> WebhookPublic:
    """The API view of a subscription row."""
    return WebhookPublic(
        id=row.id,
        url=row.url,
        events=list(row.events),
        agent=row.agent_slug,
        team=row.team,
        balance_low_usd=row.balance_low_usd,
        description=row.description,
        owner=row.owner,
        created_at=row.created_at,
    )


def delivery_public(row: WebhookDeliveryRow) -> DeliveryPublic:
    """The API view of a delivery row."""
    return DeliveryPublic(
        id=row.id,
        webhook_id=row.webhook_id,
        event=row.event,
        status=row.status,
        attempts=row.attempts,
        last_error=row.last_error,
        last_status_code=row.last_status_code,
        created_at=row.created_at,
        last_attempt_at=row.last_attempt_at,
        delivered_at=row.delivered_at,
    )


def check_receiver(url: str, policy: OutboundPolicy) -> None:
    """Refuse ``url`` when ``policy`` (auth mode) permits none of its host's addresses.

    The host is resolved here as a connection would resolve it; a host that does not
    resolve is refused too (422 ``invalid_webhook``): nothing could be delivered. Raises
    :class:`WebhookUrlRefused` naming the host, its addresses and ``BATON_OUTBOUND_ALLOW``.
    Outside auth mode nothing is checked (the local user reaches those addresses anyway).
    """
    if not policy.restricted:
        return
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise InvalidWebhook(f"url: {host} does not resolve ({exc})", path="url") from exc
    try:
        policy.choose(host, [str(info[4][0]) for info in infos])
    except OutboundRefused as exc:
        raise WebhookUrlRefused(f"url: {exc}", path="url") from exc


def new_secret() -> str:
    """A subscription secret: ``whsec_`` + base64 of 32 random bytes (Standard Webhooks)."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def create_webhook(
    session: Session, *, body: WebhookIn, owner: str, policy: OutboundPolicy
) -> WebhookCreated:
    """Store a subscription of ``owner`` and return it with its secret (flush only).

    Refused: a receiver :func:`check_receiver` refuses, an agent or team filter naming
    nothing (404 ``agent_not_found`` / ``team_not_found``), more than
    :data:`MAX_WEBHOOKS_PER_OWNER` (``WebhookIn`` refuses both filters at once and a
    ``balance_low_usd`` without ``balance.low``).
    The caller checks the owner may see the filtered agent or team (auth mode).
    """
    if body.agent:
        get_agent(session, slug=body.agent)
    if body.team:
        teams.get_team(session, team_id=body.team)
    held = len(session.exec(select(WebhookRow.id).where(WebhookRow.owner == owner)).all())
    if held >= MAX_WEBHOOKS_PER_OWNER:
        raise TooManyWebhooks(
            f"{owner} holds {held} webhooks already (the most is {MAX_WEBHOOKS_PER_OWNER})"
        )
    check_receiver(body.url, policy)
    low = body.balance_low_usd
    if low is None and "balance.low" in body.events:
        low = DEFAULT_BALANCE_LOW_USD
    row = WebhookRow(
        id=f"webhook-{uuid.uuid4()}",
        url=body.url,
        events=list(body.events),
        agent_slug=body.agent,
        team=body.team,
        balance_low_usd=low,
        description=body.description,
        secret=new_secret(),
        owner=owner,
    )
    session.add(row)
    session.flush()
    return WebhookCreated(**webhook_public(row).model_dump(), secret=row.secret)


def get_webhook(session: Session, *, webhook_id: str, owner: str | None) -> WebhookRow:
    """The subscription; ``owner`` None = anyone's (auth off). Raises WebhookNotFound, also
    for another owner's, so an answer never tells someone else's exists."""
    row = session.get(WebhookRow, webhook_id)
    if row is None or (owner is not None and row.owner != owner):
        raise WebhookNotFound(f"no webhook '{webhook_id}'")
    return row


def list_webhooks(
    session: Session, *, owner: str | None, limit: int = 50, offset: int = 0
) -> tuple[list[WebhookRow], int]:
    """Subscriptions newest first; ``owner`` None = everyone's (auth off)."""
    where = [] if owner is None else [col(WebhookRow.owner) == owner]
    order = [col(WebhookRow.created_at).desc(), col(WebhookRow.id)]
    return page(session, WebhookRow, where=where, order_by=order, limit=limit, offset=offset)


def delete_webhook(session: Session, *, webhook_id: str, owner: str | None) -> None:
    """Delete the subscription; its deliveries still in flight end ``cancelled`` at their
    next attempt (the log stays). Raises WebhookNotFound."""
    session.delete(get_webhook(session, webhook_id=webhook_id, owner=owner))
    session.flush()


def require_test_room(session: Session, *, webhook_id: str) -> None:
    """Raise :class:`TooManyTests` when :data:`MAX_PENDING_TESTS` test deliveries of the
    subscription are not final yet."""
    in_flight = session.exec(
        select(WebhookDeliveryRow.id).where(
            WebhookDeliveryRow.webhook_id == webhook_id,
            WebhookDeliveryRow.event == TEST_EVENT,
            col(WebhookDeliveryRow.status).not_in(FINAL),
        )
    ).all()
    if len(in_flight) >= MAX_PENDING_TESTS:
        msg = (
            f"{len(in_flight)} test deliveries of {webhook_id} are still in flight (the most "
            f"is {MAX_PENDING_TESTS}); see its deliveries"
        )
        raise TooManyTests(msg)


def list_deliveries(
    session: Session, *, webhook_id: str, limit: int = 50, offset: int = 0
) -> tuple[list[WebhookDeliveryRow], int]:
    """A subscription's deliveries newest first."""
    where = [col(WebhookDeliveryRow.webhook_id) == webhook_id]
    order = [col(WebhookDeliveryRow.created_at).desc(), col(WebhookDeliveryRow.id)]
    return page(
        session, WebhookDeliveryRow, where=where, order_by=order, limit=limit, offset=offset
    )
