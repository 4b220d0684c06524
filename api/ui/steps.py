"""The console's workflow-agent steps: the list at ``/ui/steps``, a step's page, and the
pending handoffs the inbox shows beside reviews.

Decisions are made in the browser through ``POST /v1/steps/{id}/handoff``, the call
``baton step approve|revise|reject`` makes: this module only reads.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from datetime import timedelta
from typing import Any

from sqlmodel import Session, col, select
from temporalio.client import Client
from temporalio.service import RPCError

from api.deps import Caller
from api.routers.steps import step_public
from baton.evals import replay
from baton.runs import deliverables
from baton.storage.db import StepRow

#: Pending handoffs the inbox lists at most, oldest first (the nearest deadline first).
MAX_HANDOFFS = 200
#: Decided handoffs the inbox keeps showing (their outcome), newest first.
RECENT_HANDOFFS = 20
#: How long the console waits for a step workflow to answer its ``status`` query (s).
QUERY_TIMEOUT_S = 2.0
#: Handoff deadlines remembered, by ``(step_id, attempts)``: a waiting handoff's deadline
#: never changes, so each is asked of Temporal once, not on every inbox refresh.
_DEADLINES: OrderedDict[tuple[str, int], str] = OrderedDict()
MAX_REMEMBERED = 2000
#: Statuses a handoff step ends in; its card in the inbox then shows the outcome.
FINAL = ("completed", "rejected", "failed")


def step_card(row: StepRow) -> dict[str, Any]:
    """A step as the console shows it: the API shape (``GET /v1/steps/{id}``) plus
    ``title`` (the start of its input), ``max_attempts`` and ``deadline`` (ISO 8601, the
    handoff's, filled by :func:`add_deadlines`; null when unknown or not waiting)."""
    public = step_public(row).model_dump(mode="json")
    first = row.input.strip().splitlines()[0] if row.input.strip() else row.id
    public["title"] = first[:80] + ("…" if len(first) > 80 else "")
    public["max_attempts"] = (row.retry or {}).get("max_attempts")
    public["deadline"] = None
    if row.status == "running" and row.timeout_s is not None:
        public["deadline"] = (row.created_at + timedelta(seconds=row.timeout_s)).isoformat()
    return public


def _visible(session: Session, caller: Caller, role: Any) -> list[Any]:
    """The conditions of the steps the console lists: the caller's, never an eval's step
    replay."""
    visible = caller.visible(session, role)
    ordinary = [col(StepRow.id).not_in(replay.replay_step_ids())]
    return ordinary if visible is None else [*ordinary, col(StepRow.agent_slug).in_(visible)]


def handoff_state(session: Session, caller: Caller) -> dict[str, list[dict[str, Any]]]:
    """``{handoffs, recent_handoffs}``: the steps awaiting a handoff the user may decide
    (user role on the step's agent, as ``POST /v1/steps/{id}/handoff`` requires), nearest
    first, and the handoff steps that have ended, newest first."""
    where = _visible(session, caller, "user")
    pending = session.exec(
        select(StepRow)
        .where(col(StepRow.status) == "awaiting_handoff", *where)
        .order_by(col(StepRow.updated_at), col(StepRow.id))
        .limit(MAX_HANDOFFS)
    ).all()
    ended = session.exec(
        select(StepRow)
        .where(col(StepRow.handoff).is_(True), col(StepRow.status).in_(FINAL), *where)
        .order_by(col(StepRow.updated_at).desc(), col(StepRow.id))
        .limit(RECENT_HANDOFFS)
    ).all()
    return {
        "handoffs": [step_card(r) for r in pending],
        "recent_handoffs": [step_card(r) for r in ended],
    }


def list_steps(session: Session, caller: Caller, *, limit: int = 100) -> list[dict[str, Any]]:
    """The newest ``limit`` steps the user may view, as :func:`step_card` shapes."""
    rows = session.exec(
        select(StepRow)
        .where(*_visible(session, caller, "viewer"))
        .order_by(col(StepRow.created_at).desc(), col(StepRow.id))
        .limit(limit)
    ).all()
    return [step_card(r) for r in rows]


def needs_query(cards: list[dict[str, Any]]) -> bool:
    """Whether some card awaits a handoff whose deadline is not remembered yet (only then
    does the console need the Temporal client: a page without one never connects)."""
    return any(
        c["status"] == "awaiting_handoff" and (c["step_id"], c["attempts"]) not in _DEADLINES
        for c in cards
    )


async def add_deadlines(client: Client | None, cards: list[dict[str, Any]]) -> None:
    """Set ``deadline`` on each card awaiting a handoff, from the step workflow's
    ``status`` query (its ``handoff_deadline``), remembered per ``(step_id, attempts)``.
    A workflow that does not answer within :data:`QUERY_TIMEOUT_S` (a busy or absent
    worker) leaves the card without a countdown; the next refresh asks again."""
    for card in cards:
        if card["status"] != "awaiting_handoff":
            continue
        key = (card["step_id"], card["attempts"])
        if key not in _DEADLINES and client is not None:
            try:
                state = await asyncio.wait_for(
                    client.get_workflow_handle(card["step_id"]).query(
                        "status", rpc_timeout=timedelta(seconds=QUERY_TIMEOUT_S)
                    ),
                    timeout=QUERY_TIMEOUT_S + 1,
                )
            except (RPCError, TimeoutError):
                continue
            if (
                isinstance(state, dict)
                and state.get("handoff_deadline")
                and state.get("attempts") == card["attempts"]
            ):
                _DEADLINES[key] = str(state["handoff_deadline"])
                while len(_DEADLINES) > MAX_REMEMBERED:
                    _DEADLINES.popitem(last=False)
        card["deadline"] = _DEADLINES.get(key)


def deliverable_fields(schema: Any, value: Any) -> list[dict[str, str]] | None:
    """The deliverable as labelled fields when its schema is an object with
    ``properties`` (label = the property's ``title`` or name, ``hint`` = its
    ``description``, ``text`` = the value, JSON for a non-string); None otherwise (the
    page then shows the JSON)."""
    if not isinstance(schema, dict) or not isinstance(value, dict):
        return None
    props = schema.get("properties")
    if not isinstance(props, dict) or not props:
        return None
    fields = []
    for name in [*props, *(k for k in value if k not in props)]:
        if name not in value:
            continue
        found = props.get(name)
        prop: dict[str, Any] = found if isinstance(found, dict) else {}
        item = value[name]
        text = item if isinstance(item, str) else json.dumps(item, indent=2, ensure_ascii=False)
        fields.append(
            {
                "label": str(prop.get("title") or name),
                "hint": str(prop.get("description") or ""),
                "text": text,
            }
        )
    return fields


def reply_fields(text: str, schema: Any) -> list[dict[str, str]] | None:
    """A reply read as the step reads it (JSON, a code fence allowed) and rendered as
    :func:`deliverable_fields`; None without a schema or when the reply is not a JSON
    object (the page then shows the reply's text). Not validated: a reply the schema
    refused still renders, and the next attempt shows the errors fed back."""
    if not isinstance(schema, dict):
        return None
    try:
        value = json.loads(deliverables.unfence(text))
    except (ValueError, RecursionError):
        return None
    return deliverable_fields(schema, value)


def attempts_view(messages: list[dict[str, Any]], schema: Any = None) -> list[dict[str, Any]]:
    """The step's transcript grouped by attempt: each user message opens one (the input,
    then what was fed back: the validation errors or the reviewer's revision note), with
    the agent's replies after it. ``[{n, prompt, replies: [text], fields}]``: ``fields``
    is the attempt's last reply (the one the step checks) rendered from ``schema`` by
    :func:`reply_fields`, or None."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "user" or not out:
            out.append({"n": len(out) + 1, "prompt": m["text"] if m["role"] == "user" else ""})
            out[-1]["replies"] = []
            if m["role"] == "user":
                continue
        if m["role"] == "assistant" and m["text"]:
            out[-1]["replies"].append(m["text"])
    for attempt in out:
        replies = attempt["replies"]
        attempt["fields"] = reply_fields(replies[-1], schema) if replies else None
    return out
