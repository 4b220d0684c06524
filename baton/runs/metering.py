"""Usage metering and the balance ceiling (Xema Agent Concepts, 'What bounds a tree':
spend; docs/metering.md).

Every model call is metered (tokens in/out, cost) in the ``usage`` table, in the
same transaction as its message. Cost comes from pydantic-ai's price data
(genai-prices) when the model is known, else from ``BATON_PRICES``
(``{"model": [usd_per_million_input, usd_per_million_output]}``), else 0.

The balance (``GET|PUT /v1/balance``) is an organisation-wide ceiling: each
call's cost is deducted; once it is ≤ 0 a model request is refused before it
reaches the provider (``balance_exhausted``, :func:`admit_call`, which every model
path calls), and a stream is cut when its running cost would take the balance below
zero (:func:`stream_cut`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import Table, bindparam, func
from sqlalchemy import select as sa_select
from sqlalchemy import update as sa_update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.sql.elements import ColumnElement
from sqlmodel import Session, col
from temporalio.exceptions import ApplicationError

from baton import telemetry
from baton.contracts.codes import BALANCE_EXHAUSTED
from baton.runs import run_tree
from baton.runs.costs import sum_costs
from baton.storage.db import BalanceRow, UsageRow, utcnow
from baton.webhooks import events as webhook_events

#: Characters per token when a stream's output must be estimated before the provider
#: reports usage (cutting a stream cannot wait for the final count).
CHARS_PER_TOKEN = 4
#: Input tokens a request costs beyond its text (roles, framing): pydantic-ai's own
#: estimate for OpenAI and Gemini calls, and what its offline test models meter as input.
REQUEST_OVERHEAD_TOKENS = 50


class BalancePublic(BaseModel):
    """``GET|PUT /v1/balance``: USD; null = unlimited; spent when ≤ 0."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"balance": 25.0}]})

    balance: float | None = Field(
        ge=-1e12, le=1e12, allow_inf_nan=False, description="USD; null = unlimited (required)."
    )


class BalanceUpdate(BaseModel):
    """``PUT /v1/balance`` and ``baton balance set``: a non-negative number of USD, or null
    = unlimited.

    Strict: ``false`` (which pydantic reads as 0.0 and so stops every model call),
    ``true`` and ``"5"`` are refused, and so is a negative amount.
    """

    model_config = ConfigDict(
        extra="forbid", strict=True, json_schema_extra={"examples": [{"balance": 25.0}]}
    )

    balance: float | None = Field(
        ge=0, le=1e12, allow_inf_nan=False, description="USD; null = unlimited (required)."
    )


class UsageGroup(BaseModel):
    """Metered usage of one group (an agent, a session, a step or a day)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "key": "researcher",
                    "requests": 12,
                    "input_tokens": 4800,
                    "output_tokens": 900,
                    "cost_usd": 0.0123,
                }
            ]
        }
    )

    key: str
    requests: int
    input_tokens: int
    output_tokens: int
    cost_usd: float | None = Field(
        description="USD; null when a call of the group has no known price (see sum_costs)."
    )


GroupBy = Literal["agent", "session", "step", "day", "model"]
_COLUMN = {
    "agent": UsageRow.agent_slug,
    "session": UsageRow.session_id,
    "step": UsageRow.step_id,
    "day": UsageRow.day,
    "model": UsageRow.model,
}


_USAGE: Table = UsageRow.__table__  # type: ignore[attr-defined]
_BALANCE: Table = BalanceRow.__table__  # type: ignore[attr-defined]
# Built once per process: every model call runs these (see baton.runs.session_store).
#: The usage row of a call not metered yet; a retry's finds its ``message_id`` and writes
#: nothing (both backends' ``ON CONFLICT DO NOTHING`` on the unique key).
#: ``RETURNING id`` tells which (the driver's rowcount does not, once SQLAlchemy adds its
#: own implicit ``RETURNING`` of the primary key on PostgreSQL).
_INSERT_USAGE_ONCE = {
    "sqlite": sqlite_insert(_USAGE)
    .on_conflict_do_nothing(index_elements=["message_id"])
    .returning(_USAGE.c.id),
    "postgresql": pg_insert(_USAGE)
    .on_conflict_do_nothing(index_elements=["message_id"])
    .returning(_USAGE.c.id),
}
_READ_BALANCE = sa_select(_BALANCE.c.amount_usd).where(_BALANCE.c.id == 1)
#: The charge, returning the balance after it and whether a ``balance.low`` subscription's
#: threshold was crossed (so that the subscriptions are read only then).
_CHARGE = (
    sa_update(_BALANCE)
    .where(_BALANCE.c.id == 1, _BALANCE.c.amount_usd.is_not(None))
    .values(amount_usd=_BALANCE.c.amount_usd - bindparam("cost"), updated_at=bindparam("now"))
    .returning(
        _BALANCE.c.amount_usd,
        webhook_events.balance_low_possible(_BALANCE.c.amount_usd, bindparam("cost")),
    )
)


def price_cost(
    prices: dict[str, tuple[float, float]], model: str, input_tokens: int, output_tokens: int
) -> float | None:
    """Cost from the configured price table (USD per million tokens), or None."""
    price = prices.get(model)
    if price is None:
        return None
    return (input_tokens * price[0] + output_tokens * price[1]) / 1_000_000


def get_balance(session: Session) -> float | None:
    """The balance in USD, or None (unlimited). Read before every model call: one Core
    query on the transaction's connection (pending ORM writes flushed first)."""
    session.flush()
    found = session.connection().execute(_READ_BALANCE).first()
    return None if found is None else found[0]


def set_balance(session: Session, *, amount: float | None) -> float | None:
    """Set the balance (None = unlimited). Flushes."""
    row = session.get(BalanceRow, 1) or BalanceRow(id=1)
    row.amount_usd = amount
    row.updated_at = utcnow()
    session.add(row)
    session.flush()
    return amount


def admit_call(session: Session) -> float | None:
    """The balance ceiling, checked before every model call reaches its provider
    (session turns, steps, inquiries; every model path calls this, none checks itself).

    Returns the balance in USD (None = unlimited), which a stream is then cut against
    (:func:`stream_cut`). Raises ``ApplicationError`` of type ``balance_exhausted``,
    non-retryable, when a balance is set and spent (≤ 0): a retry would be refused the
    same way, and nothing is metered for the refused call.
    """
    balance = get_balance(session)
    if balance is not None and balance <= 0:
        raise ApplicationError(
            f"{BALANCE_EXHAUSTED}: the organisation balance is spent "
            f"(${balance:.4f}); raise it with PUT /v1/balance",
            type=BALANCE_EXHAUSTED,
            non_retryable=True,
        )
    return balance


def stream_cut(
    prices: dict[str, tuple[float, float]],
    model: str,
    *,
    input_tokens: int,
    streamed_chars: int,
    balance: float,
) -> float | None:
    """The balance ceiling during a stream: the estimated cost so far (USD) once it
    reaches ``balance``, when the stream must be cut; None while it may go on (or when
    the model has no configured price). Output tokens are estimated from the characters
    streamed (:data:`CHARS_PER_TOKEN`), since the provider reports usage only at the end.
    """
    spent = price_cost(prices, model, input_tokens, streamed_chars // CHARS_PER_TOKEN)
    return spent if spent is not None and spent >= balance else None


def record(
    session: Session,
    *,
    message_id: str,
    agent: str,
    session_id: str,
    model: str,
    input_tokens: int,
    output_tokens: int,
    cost_usd: float | None,
) -> bool:
    """Meter one model call once (keyed by its message id) and charge the balance.

    Returns whether it was recorded now (False: a retry found it). The balance
    update is one atomic ``UPDATE … SET amount = amount - cost``; the call's
    token_budget reservation is settled to these tokens in the same transaction.
    """
    conn = session.connection()
    now = utcnow()
    # One Core INSERT … ON CONFLICT (message_id) DO NOTHING on the transaction's connection,
    # built once: the check for a retry and the write are one statement.
    inserted = conn.execute(
        _INSERT_USAGE_ONCE[conn.dialect.name],
        {
            "message_id": message_id,
            "day": now.date().isoformat(),
            "agent_slug": agent,
            "session_id": session_id,
            "step_id": session_id if session_id.startswith("step-") else None,
            "model": model[:200],
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "cost_usd": cost_usd,
            "at": now,
        },
    )
    if inserted.first() is None:
        return False  # a retry: this call is metered already
    # The call's token_budget reservation becomes its usage in this same transaction.
    run_tree.settle_tokens(
        session, message_id=message_id, input_tokens=input_tokens, output_tokens=output_tokens
    )
    if cost_usd:
        charged = conn.execute(_CHARGE, {"cost": cost_usd, "now": now}).first()
        if charged is not None and charged[0] is not None and charged[1]:
            after = float(charged[0])
            # balance.low for the subscriptions whose threshold this charge crossed.
            webhook_events.balance_charged(
                session, before=after + cost_usd, after=after, charge=message_id
            )
        loaded = session.identity_map.get(session.identity_key(BalanceRow, 1))
        if loaded is not None:  # a balance row this transaction loaded reloads its amount
            session.expire(loaded, ["amount_usd", "updated_at"])
    session.flush()
    telemetry.count_turn(  # once per model call, like the usage row
        agent=agent, input_tokens=input_tokens, output_tokens=output_tokens, cost_usd=cost_usd
    )
    return True


def usage(
    session: Session,
    *,
    group_by: GroupBy,
    agent: str | None = None,
    session_id: str | None = None,
    step_id: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    agents: list[str] | None = None,
) -> list[UsageGroup]:
    """Usage summed per ``group_by`` value, filtered; largest cost first. ``agents``
    (auth mode: what the caller may see) keeps only those agents' model calls."""
    key = _COLUMN[group_by]
    conditions: list[ColumnElement[bool]] = []
    if agents is not None:
        conditions.append(col(UsageRow.agent_slug).in_(agents))
    for column, value in (
        (UsageRow.agent_slug, agent),
        (UsageRow.session_id, session_id),
        (UsageRow.step_id, step_id),
    ):
        if value is not None:
            conditions.append(col(column) == value)
    if since is not None:
        conditions.append(col(UsageRow.at) >= since)
    if until is not None:
        conditions.append(col(UsageRow.at) < until)
    if group_by == "step":
        conditions.append(col(UsageRow.step_id).is_not(None))
    rows = session.execute(
        sa_select(
            col(key),
            func.sum(UsageRow.requests),
            func.sum(UsageRow.input_tokens),
            func.sum(UsageRow.output_tokens),
            func.sum(UsageRow.cost_usd),
            func.count() - func.count(col(UsageRow.cost_usd)),  # calls of unknown cost
        )
        .where(*conditions)
        .group_by(col(key))
        .order_by(func.sum(UsageRow.cost_usd).desc(), col(key))
    ).all()
    return [
        UsageGroup(
            key=str(k),
            requests=int(r or 0),
            input_tokens=int(i or 0),
            output_tokens=int(o or 0),
            cost_usd=sum_costs([float(c or 0.0), None if unknown else 0.0]),
        )
        for k, r, i, o, c, unknown in rows
    ]
