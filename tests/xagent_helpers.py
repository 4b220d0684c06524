"""Helpers for the X-Agent and policy tests: playbooks, policy rows, review polling."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import select
from temporalio.client import Client

from baton import policies
from baton.contracts import ReviewDecision
from baton.db import AuditRow, ReviewRow, session_scope
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
    engine: Engine, operation: str, decision: str, *, target: str | None = None
) -> None:
    """Store one policy row for ``caller``."""
    with session_scope(engine) as s:
        policies.save_policy(
            s, caller="caller", operation=operation, target=target, decision=decision
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


async def decide(client: Client, review: ReviewRow, decision: str, **extra: Any) -> None:
    """Send Signal ``review_decision`` to the review's session."""
    await client.get_workflow_handle(review.session_id).signal(
        "review_decision",
        ReviewDecision(review_id=review.id, decision=decision, **extra),  # type: ignore[arg-type]
    )


def tool_result(text: str) -> Any:
    """The JSON a scripted caller echoed as ``RESULT <tool output>``."""
    return json.loads(text.removeprefix("RESULT "))
