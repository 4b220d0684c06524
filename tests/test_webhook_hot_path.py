"""A charged model call reads the webhook subscriptions only when a ``balance.low``
threshold was crossed (the charge's own statement says so), and a subscription committed
before a charge hears of it: from the next event on, from any process."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlmodel import Session

from baton.outbound import OutboundPolicy
from baton.runs import metering
from baton.storage.db import WebhookDeliveryRow
from baton.webhooks import events
from baton.webhooks.subscriptions import WebhookIn, create_webhook


@pytest.fixture
def statements(engine: Engine) -> Iterator[list[str]]:
    """Every SQL statement ``engine`` runs while the test runs."""
    seen: list[str] = []
    lock = threading.Lock()

    def on(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        with lock:
            seen.append(statement)

    sa.event.listen(engine, "before_cursor_execute", on)
    try:
        yield seen
    finally:
        sa.event.remove(engine, "before_cursor_execute", on)


def _charge(engine: Engine, cost: float) -> list[str]:
    """One metered model call of ``cost`` USD, committed; the balance.low deliveries it wrote."""
    mid = f"session-x:t1:s{uuid.uuid4().hex}:assistant"
    with Session(engine) as s:
        metering.record(
            s,
            message_id=mid,
            agent="a",
            session_id="session-x",
            model="m",
            input_tokens=1,
            output_tokens=1,
            cost_usd=cost,
        )
        ids = list(events.pending_ids(s))  # written by this transaction
        s.commit()  # no starter in this process: the rows stay pending, as the log says
    return ids


def _subscribe(engine: Engine, low: float) -> str:
    with Session(engine) as s:
        hook = create_webhook(
            s,
            body=WebhookIn(
                url="https://example.com/hook", events=["balance.low"], balance_low_usd=low
            ),
            owner="local",
            policy=OutboundPolicy(),
        )
        s.commit()
        return hook.id


def _webhook_reads(statements: list[str]) -> int:
    """Statements that read the subscriptions themselves (not the charge's EXISTS)."""
    return sum(1 for q in statements if q.lstrip().upper().startswith("SELECT") and "webhooks" in q)


def test_a_charge_reads_no_subscription_unless_a_threshold_is_crossed(
    engine: Engine, statements: list[str]
) -> None:
    """Balance 10: charges with no subscription read none; with a threshold at 8, the charge
    10 -> 9 reads none and the one 9 -> 8 (at the bound) writes its delivery; 8 -> 7 none."""
    with Session(engine) as s:
        metering.set_balance(s, amount=11.0)
        s.commit()
    assert _charge(engine, 1.0) == []  # 11 -> 10, no subscription at all
    assert _webhook_reads(statements) == 0
    hook = _subscribe(engine, 8.0)
    statements.clear()
    assert _charge(engine, 1.0) == []  # 10 -> 9: above the threshold still
    assert _webhook_reads(statements) == 0
    crossed = _charge(engine, 1.0)  # 9 -> 8: at the threshold, crossed
    assert len(crossed) == 1 and crossed[0].startswith("delivery-")
    assert _webhook_reads(statements) >= 1
    statements.clear()
    assert _charge(engine, 1.0) == []  # 8 -> 7: already below before it
    assert _webhook_reads(statements) == 0
    with Session(engine) as s:
        row = s.get(WebhookDeliveryRow, crossed[0])
        assert row is not None and row.webhook_id == hook


def test_a_subscription_hears_of_the_next_charge_from_another_connection(engine: Engine) -> None:
    """A threshold subscribed between two charges (its own transaction, as another process
    would) gets the very next charge that crosses it: no cache to wait out."""
    with Session(engine) as s:
        metering.set_balance(s, amount=5.0)
        s.commit()
    assert _charge(engine, 1.0) == []  # 5 -> 4
    _subscribe(engine, 3.5)
    assert len(_charge(engine, 1.0)) == 1  # 4 -> 3: crossed, delivered
