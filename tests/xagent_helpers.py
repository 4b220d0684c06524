"""Helpers for the X-Agent and policy tests: playbooks, policy rows, review polling."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import select
from temporalio.client import Client

from baton.contracts.workflow_io import Provenance, ReviewDecision
from baton.grants import policies
from baton.permissions import reviews as reviews_api
from baton.runs import session_store
from baton.settings import DEV_REVIEW_KEY
from baton.storage.db import (
    AuditRow,
    MessageRow,
    ReviewRow,
    SessionRow,
    XAgentPolicy,
    session_scope,
)
from tests.helpers import publish, wait_for


def caller_playbook(tool: str, args: dict[str, Any], *, when: str = "go") -> list[dict[str, Any]]:
    """A scripted caller: on ``when`` it calls ``tool(args)``, then echoes the tool's result."""
    return [
        {"when": f"^{tool}: ", "reply": "RESULT {last_message}"},
        {"when": when, "reply": "Calling.", "tool_calls": [{"tool": tool, "args": args}]},
    ]


def setup_pair(engine: Engine, tool: str, args: dict[str, Any]) -> None:
    """Publish ``caller`` (calling ``tool``) and ``target`` (a fixed reply)."""
    publish(engine, "target", playbook=[{"reply": "target says hi"}])
    publish(engine, "caller", playbook=caller_playbook(tool, args))


def set_policy(
    engine: Engine,
    operation: str,
    decision: str,
    *,
    target: str | None = None,
    caller: str = "caller",
) -> None:
    """Store one policy row for ``caller`` (default: the agent named ``caller``)."""
    with session_scope(engine) as s:
        policies.save_policy(
            s, caller=caller, operation=operation, target=target, decision=decision
        )


def reviews_of(engine: Engine, session_id: str | None = None) -> list[ReviewRow]:
    """Review rows (of one session), oldest first."""
    with session_scope(engine) as s:
        stmt = select(ReviewRow).order_by(ReviewRow.created_at)  # type: ignore[arg-type]
        if session_id is not None:
            stmt = stmt.where(ReviewRow.session_id == session_id)
        return list(s.exec(stmt).all())


def audit_rows(engine: Engine) -> list[AuditRow]:
    """Every audit row, oldest first."""
    with session_scope(engine) as s:
        return list(s.exec(select(AuditRow).order_by(AuditRow.id)).all())  # type: ignore[arg-type]


async def pending_review(engine: Engine, session_id: str, count: int = 1) -> list[ReviewRow]:
    """Wait until ``session_id`` has ``count`` pending reviews; returns them."""
    await wait_for(
        lambda: len([r for r in reviews_of(engine, session_id) if r.status == "pending"]) >= count
    )
    return [r for r in reviews_of(engine, session_id) if r.status == "pending"]


async def decide(
    client: Client, review: ReviewRow, decision: str, *, proven: bool = True, **extra: Any
) -> None:
    """Send Signal ``review_decision`` to the review's session, proven as the API proves it
    (with the key test workers use, DEV_REVIEW_KEY) unless ``proven=False`` (a raw Signal)."""
    signal = ReviewDecision(review_id=review.id, decision=decision, **extra)
    if proven:
        signal = reviews_api.prove(DEV_REVIEW_KEY, signal)
    await client.get_workflow_handle(review.session_id).signal("review_decision", signal)


def tool_result(text: str) -> Any:
    """The JSON a scripted caller echoed as ``RESULT <tool output>``."""
    return json.loads(text.removeprefix("RESULT "))


# --- Added for tests/test_xagent_policies.py and tests/test_xagent_timeouts.py ------------


def playbook(*rules: tuple[str, str, dict[str, Any]]) -> list[dict[str, Any]]:
    """A caller that echoes every X-Agent tool result and calls ``tool(args)`` on ``when``.

    Each rule is ``(when, tool, args)``; ``when`` is a regex on the user's message.
    """
    echo = [
        {"when": f"^{tool}: ", "reply": "RESULT {last_message}"}
        for tool in (
            "list_agents",
            "create_agent",
            "invoke_agent",
            "get_agent_sessions",
            "get_agent_session_transcript",
        )
    ]
    calls = [
        {"when": when, "reply": "Calling.", "tool_calls": [{"tool": tool, "args": args}]}
        for when, tool, args in rules
    ]
    return echo + calls


def policy_rows(engine: Engine) -> list[tuple[str, str | None, str, str]]:
    """Every stored policy as ``(caller, target, operation, decision)``, sorted."""
    with session_scope(engine) as s:
        rows = s.exec(select(XAgentPolicy)).all()
        return sorted(
            ((r.caller_agent_slug, r.target_agent_slug, r.operation, r.decision) for r in rows),
            key=repr,
        )


def tool_messages(engine: Engine, session_id: str) -> list[MessageRow]:
    """The ``tool`` messages (X-Agent results and errors) of a session, in order."""
    with session_scope(engine) as s:
        return [m for m in session_store.messages(s, session_id=session_id) if m.role == "tool"]


def session_row(engine: Engine, session_id: str) -> SessionRow:
    """The stored session row."""
    with session_scope(engine) as s:
        return session_store.get_session(s, session_id=session_id)


async def open_reviews(
    client: Client, engine: Engine, session_id: str, count: int = 1
) -> list[ReviewRow]:
    """Wait until ``count`` reviews are pending in the DB AND registered by the workflow.

    The row is visible as soon as ``authorize`` commits, a moment before the workflow
    opens the review: waiting for the ``pending_reviews`` Query too makes the
    ``status`` Query and the review state deterministic for the assertions that follow.
    """
    rows = await pending_review(engine, session_id, count)
    handle = client.get_workflow_handle(session_id)
    ids = {r.id for r in rows}
    deadline = asyncio.get_running_loop().time() + 30
    while True:
        listed = {r["review_id"] for r in await handle.query("pending_reviews")}
        if ids <= listed:
            return rows
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"workflow never listed reviews {ids - listed}")
        await asyncio.sleep(0.05)


async def settled(engine: Engine, review_id: str, timeout: float = 30.0) -> ReviewRow:
    """Wait until the review has its outcome; returns the row."""
    await wait_for(lambda: _review_status(engine, review_id) != "pending", timeout=timeout)
    with session_scope(engine) as s:
        return reviews_api.get_review(s, review_id=review_id)


def _review_status(engine: Engine, review_id: str) -> str:
    with session_scope(engine) as s:
        return reviews_api.get_review(s, review_id=review_id).status


def add_session(
    engine: Engine,
    agent: str,
    *,
    status: str = "idle",
    name: str = "",
    created_at: datetime | None = None,
    session_id: str | None = None,
) -> str:
    """Insert a session row of ``agent`` without running a workflow; returns its id."""
    sid = session_id or f"session-{uuid.uuid4()}"
    with session_scope(engine) as s:
        row = session_store.create_session(
            s,
            session_id=sid,
            agent_slug=agent,
            agent_version=1,
            provenance=Provenance(),
            name=name or sid,
        )
        row.status = status
        if created_at is not None:
            row.created_at = created_at
            row.last_activity_at = created_at
        s.add(row)
    return sid


def echoed(reply: str | None, msg: MessageRow) -> bool:
    """Whether a scripted caller's ``RESULT …`` reply echoes the tool message ``msg``.

    A successful result reaches the model verbatim; an error as ``{"error": <text>}``.
    """
    body = (reply or "").removeprefix("RESULT ")
    if not msg.is_error:
        return body == msg.text
    try:
        return bool(json.loads(body) == {"error": msg.text})
    except json.JSONDecodeError:
        return False
