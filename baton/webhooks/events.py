"""Events into deliveries: the one way a domain change reaches webhook receivers
(docs/webhooks.md).

:func:`emit` runs in the transaction of the change it announces (a review row written, a
step awaiting its handoff, a session failed, a charge): it writes one delivery row per
matching subscription, with the exact body every attempt will send, under an id derived
from the subscription and the event, so a retried activity that emits again writes
nothing new. The delivery workflows (``WebhookDelivery``, workflow id = delivery id) are
started by the process's :data:`Starter` just **before** the transaction commits: once a
delivery row is committed its workflow exists, so no crash between the two loses it, and
a workflow whose row never commits (the transaction rolled back) finds none and ends.

A subscription matches when it asks for the event, its agent or team filter names one of
the event's, and, in auth mode (an owner who is a user), its owner holds the role
the event needs on the event's agent: ``user`` for a review (the role that decides it),
``viewer`` for the rest; ``balance.low`` has no agent and reaches every subscription that
asks for it.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Table
from sqlalchemy import event as sa_event
from sqlalchemy import exists as sa_exists
from sqlalchemy import func as sa_func
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.sql.elements import ColumnElement
from sqlmodel import Session, select
from standardwebhooks.webhooks import Webhook

from baton.grants import auth as access
from baton.storage.db import (
    ReviewRow,
    SessionRow,
    StepRow,
    User,
    WebhookDeliveryRow,
    WebhookRow,
)
from baton.webhooks.subscriptions import TEST_EVENT

log = logging.getLogger("baton.webhooks")

#: ``starter(delivery_ids)`` starts the ``WebhookDelivery`` workflow of each id and returns
#: once Temporal has them (blocking; raises when it cannot, which aborts the commit).
Starter = Callable[[list[str]], None]


@dataclass(frozen=True)
class _Registered:
    starter: Starter
    base_url: str


_STARTERS: weakref.WeakKeyDictionary[Engine, _Registered] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()
#: ``Session.info`` key: deliveries this transaction wrote, started before it commits.
_PENDING = "baton_webhook_deliveries"
#: uuid5 namespace of delivery ids (a subscription and an event name exactly one delivery).
_DELIVERY_NS = uuid.UUID("6c8e0f3a-5d1b-4e0c-9a7f-2b3d4c5e6f70")
#: Characters of a deliverable or an error quoted in a payload.
QUOTE_CHARS = 500


#: Where links point when no starter says (a process that cannot deliver anyway).
DEFAULT_BASE_URL = "http://127.0.0.1:8000"


def register_starter(engine: Engine, starter: Starter, *, base_url: str) -> None:
    """Make ``starter`` start the deliveries written through ``engine`` in this process (the
    worker and the API each register theirs; the last one registered wins); ``base_url``
    (``BATON_PUBLIC_URL``) is what payload links start with."""
    with _LOCK:
        _STARTERS[engine] = _Registered(starter, base_url.rstrip("/"))


def _registered(session: Session) -> _Registered | None:
    engine = _engine_of(session)
    with _LOCK:
        return _STARTERS.get(engine) if engine is not None else None


def _engine_of(session: Session) -> Engine | None:
    bind = session.get_bind()
    if isinstance(bind, Connection):
        return bind.engine
    return bind if isinstance(bind, Engine) else None


@sa_event.listens_for(Session, "before_commit")
def _start_before_commit(session: Session) -> None:
    ids: list[str] | None = session.info.pop(_PENDING, None)
    if not ids:
        return
    registered = _registered(session)
    if registered is None:
        # Only a process with a Temporal client can start workflows; the rows stay pending
        # and a test-send or the log shows it. Every worker and API registers a starter.
        log.error("no webhook starter in this process: deliveries %s stay pending", ids)
        return
    registered.starter(ids)


@sa_event.listens_for(Session, "after_rollback")
def _forget(session: Session) -> None:
    session.info.pop(_PENDING, None)


@dataclass(frozen=True)
class Event:
    """One thing that happened, as receivers are told of it.

    ``key`` names the occurrence (``review.opened:review-…``): with a subscription id it
    makes the delivery id. ``agents``: the agents it is about (filters and ACL), ``team``:
    the run's team, ``role``: what an owner needs on ``agents[0]`` to hear of it,
    ``balance``: for balance.low, the amount before and after the charge.
    """

    type: str
    key: str
    data: dict[str, Any]
    agents: tuple[str, ...] = ()
    team: str | None = None
    role: access.Role = "viewer"
    balance: tuple[float, float] | None = None
    at: datetime = field(default_factory=lambda: datetime.now(UTC))


def delivery_id(webhook_id: str, key: str) -> str:
    """The id of the delivery of event ``key`` to subscription ``webhook_id``: stable, so
    an event emitted again (a retried activity) names the same delivery."""
    return f"delivery-{uuid.uuid5(_DELIVERY_NS, f'{webhook_id}|{key}')}"


def balance_low_crossed(low: Any, before: Any, after: Any) -> Any:
    """The ``balance.low`` rule (docs/webhooks.md): a charge crossed threshold ``low`` (USD)
    when the balance was above it before (``before``) and is at or below it after
    (``after``). Floats give a bool; SQL expressions give the same test as SQL (the charge's
    pre-check, :func:`balance_low_possible`)."""
    return (after <= low) & (low < before)


_WEBHOOKS: Table = WebhookRow.__table__  # type: ignore[attr-defined]


def balance_low_possible(after: Any, cost: Any) -> ColumnElement[bool]:
    """SQL: whether any subscription's threshold (``balance_low_usd``, 0 when unset) was
    crossed by a charge of ``cost`` leaving the balance at ``after`` (SQL expressions).

    The charge's ``UPDATE … RETURNING`` carries it, so a model call reads the subscriptions
    (:func:`balance_charged`) only when one of them may hear of it: no statement of its own,
    and, read in the charge's transaction, it sees every subscription committed before."""
    low = sa_func.coalesce(_WEBHOOKS.c.balance_low_usd, 0.0)
    return sa_exists().where(balance_low_crossed(low, after + cost, after))


def _matches(session: Session, hook: WebhookRow, ev: Event) -> bool:
    if ev.type not in hook.events:
        return False
    if hook.agent_slug is not None and hook.agent_slug not in ev.agents:
        return False
    if hook.team is not None and hook.team != ev.team:
        return False
    if ev.balance is not None:
        before, after = ev.balance
        low = hook.balance_low_usd if hook.balance_low_usd is not None else 0.0
        if not balance_low_crossed(low, before, after):
            return False
    # An owner who is a user (every owner in auth mode, a user named `local` included)
    # hears only of what her roles show her; auth off, the owner `local` is no user.
    if ev.agents and session.get(User, hook.owner) is not None:
        return access.has_role(session, user_id=hook.owner, agent=ev.agents[0], role=ev.role)
    return True


def body_of(delivery: str, ev: Event) -> str:
    """The JSON body of a delivery (Standard Webhooks shape): ``{id, type, timestamp,
    data}``; ``id`` is the delivery id, as in the ``webhook-id`` header."""
    payload = {
        "id": delivery,
        "type": ev.type,
        "timestamp": ev.at.isoformat().replace("+00:00", "Z"),
        "data": ev.data,
    }
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"), default=str)


def _queue(session: Session, hook: WebhookRow, ev: Event) -> str | None:
    did = delivery_id(hook.id, ev.key)
    if session.get(WebhookDeliveryRow, did) is not None:
        return None  # emitted before (a retried activity): that delivery stands
    session.add(
        WebhookDeliveryRow(id=did, webhook_id=hook.id, event=ev.type, payload=body_of(did, ev))
    )
    session.info.setdefault(_PENDING, []).append(did)
    return did


def emit(session: Session, ev: Event) -> list[str]:
    """Write the deliveries of ``ev`` for every matching subscription (flush only); their
    workflows start just before ``session`` commits. Returns the new delivery ids (none for
    an event emitted before). No subscription asks for it: one query, nothing written."""
    hooks = session.exec(select(WebhookRow)).all()
    ids = [d for h in hooks if _matches(session, h, ev) and (d := _queue(session, h, ev))]
    if ids:
        session.flush()
    return ids


def send_test(session: Session, hook: WebhookRow) -> str:
    """Queue a ``webhook.test`` delivery to ``hook`` (started before the commit); its id."""
    ev = Event(
        type=TEST_EVENT,
        key=f"{TEST_EVENT}:{uuid.uuid4()}",
        data={"webhook_id": hook.id, "message": "a test delivery from Baton"},
    )
    did = _queue(session, hook, ev)
    assert did is not None  # a fresh key
    session.flush()
    return did


def sign(secret: str, delivery: str, at: datetime, body: str) -> dict[str, str]:
    """The Standard Webhooks headers of one attempt: ``webhook-id``, ``webhook-timestamp``
    (Unix seconds of ``at``) and ``webhook-signature`` = ``v1,`` + base64 of HMAC-SHA256
    keyed with the secret's bytes (base64 after ``whsec_``) over ``id.timestamp.body``."""
    signature = Webhook(secret).sign(delivery, at, body)
    return {
        "webhook-id": delivery,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": signature,
    }


# --- the events -----------------------------------------------------------------------


def _links(session: Session, /, **paths: str) -> dict[str, str]:
    registered = _registered(session)
    base = registered.base_url if registered is not None else DEFAULT_BASE_URL
    return {name: f"{base}{path}" for name, path in paths.items()}


def _team(session: Session, session_id: str) -> str | None:
    row = session.get(SessionRow, session_id)
    return row.team if row is not None else None


def _review_fields(row: ReviewRow) -> dict[str, Any]:
    """What every review event names: the review, its session, caller, operation, target."""
    return {
        "review_id": row.id,
        "session_id": row.session_id,
        "caller": row.caller_agent_slug,
        "operation": row.operation,
        "target": row.target_agent_slug,
    }


def review_opened(session: Session, row: ReviewRow) -> list[str]:
    """``review.opened``: who asks (caller), for what (operation, target, preview), until
    when (deadline), and where to decide (the console card, the API decision endpoint)."""
    data = {
        **_review_fields(row),
        "preview": row.preview,
        "deadline": row.expires_at,
        "links": _links(
            session,
            console=f"/ui/inbox#{row.id}",
            decision=f"/v1/reviews/{row.id}/decision",
            session=f"/ui/sessions/{row.session_id}",
        ),
    }
    agents = (row.caller_agent_slug, *([row.target_agent_slug] if row.target_agent_slug else []))
    team = _team(session, row.session_id)
    ev = Event("review.opened", f"review.opened:{row.id}", data, agents, team, role="user")
    return emit(session, ev)


def review_resolved(session: Session, row: ReviewRow) -> list[str]:
    """``review.resolved``: the review's outcome (allowed | denied | timed_out | cancelled),
    the decision and who made it."""
    data = {
        **_review_fields(row),
        "status": row.status,
        "decision": row.decision,
        "decided_by": row.decided_by,
        "links": _links(session, session=f"/ui/sessions/{row.session_id}"),
    }
    agents = (row.caller_agent_slug, *([row.target_agent_slug] if row.target_agent_slug else []))
    team = _team(session, row.session_id)
    ev = Event("review.resolved", f"review.resolved:{row.id}", data, agents, team, role="user")
    return emit(session, ev)


def _quoted(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= QUOTE_CHARS else text[:QUOTE_CHARS] + "…"


def step_changed(
    session: Session, row: StepRow, *, before: str, deadline: datetime | None = None
) -> list[str]:
    """The events of a step moving from ``before`` to ``row.status``: ``handoff.opened``
    (now awaiting its handoff), ``handoff.resolved`` (no longer awaiting: approved =
    completed, revised = running, rejected, or failed when it timed out) and
    ``step.failed``. Keyed by the attempt, so a revised step's next handoff is news.
    ``deadline``: when an opened handoff times out."""
    links = _links(session, console=f"/ui/steps/{row.id}", decision=f"/v1/steps/{row.id}/handoff")
    base = {"step_id": row.id, "agent": row.agent_slug, "attempt": row.attempts, "links": links}
    events: list[Event] = []
    if row.status == "awaiting_handoff" and before != "awaiting_handoff":
        data = {**base, "deliverable_preview": _quoted(row.deliverable), "deadline": deadline}
        key = f"handoff.opened:{row.id}:{row.attempts}"
        events.append(Event("handoff.opened", key, data, (row.agent_slug,), role="user"))
    if before == "awaiting_handoff" and row.status != "awaiting_handoff":
        data = {**base, "status": row.status}
        key = f"handoff.resolved:{row.id}:{row.attempts}"
        events.append(Event("handoff.resolved", key, data, (row.agent_slug,), role="user"))
    if row.status == "failed" and before != "failed":
        data = {**base, "error": _quoted(row.error or "")}
        events.append(Event("step.failed", f"step.failed:{row.id}", data, (row.agent_slug,)))
    return [d for ev in events for d in emit(session, ev)]


def session_failed(
    session: Session, session_id: str, error: str, *, failure: str, status: str
) -> list[str]:
    """``session.failed``: a turn of the session failed for good. ``failure``: the id of
    its error message (one event per failed turn), ``status``: the session's status after
    it (``idle``: it takes the next message; ``failed``: it is closed)."""
    row = session.get(SessionRow, session_id)
    if row is None:
        return []
    data = {
        "session_id": session_id,
        "agent": row.agent_slug,
        "status": status,
        "error": _quoted(error),
        "links": _links(session, console=f"/ui/sessions/{session_id}"),
    }
    ev = Event("session.failed", f"session.failed:{failure}", data, (row.agent_slug,), row.team)
    return emit(session, ev)


def balance_charged(session: Session, *, before: float, after: float, charge: str) -> list[str]:
    """``balance.low`` for each subscription whose ``balance_low_usd`` this charge (key
    ``charge``: the metered call) crossed: above it before, at or below it after
    (:func:`balance_low_crossed`). A charge calls it only when :func:`balance_low_possible`
    said so."""
    data = {"balance": after, "before": before, "links": _links(session, balance="/v1/balance")}
    ev = Event("balance.low", f"balance.low:{charge}", data, balance=(before, after))
    return emit(session, ev)


def pending_ids(session: Session) -> tuple[str, ...]:
    """The deliveries this transaction wrote so far (started at its commit)."""
    return tuple(session.info.get(_PENDING, ()))
