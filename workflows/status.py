"""What a session shows outside its state: the ``BatonStatus`` search attribute and the
current details of the Temporal UI (docs/operations.md, The run in the Temporal UI).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from baton.contracts.search import SA_AGENT, SA_STATUS
    from baton.contracts.values import SessionStatus

#: Characters of the last message shown in the current details.
DETAILS_PREVIEW = 80


def searchable_status(status: SessionStatus) -> str:
    """``BatonStatus`` of a session in ``status``: coarse on purpose, ``running`` while the
    session is open (idle included) and ``awaiting_input`` / ``cancelled`` / ``failed``
    when an operator must act or it ended. Flipping it running <-> idle on every turn cost
    two visibility writes per turn (bench/); the exact state is the ``status`` Query and
    the sessions table."""
    return "running" if status == "idle" else status


def publish_status(status: SessionStatus) -> None:
    """Upsert ``BatonStatus`` when its value changes. Only where the starter set Baton's
    attributes (so they are registered): an unregistered attribute would fail every
    workflow task and wedge the session."""
    attrs = workflow.info().typed_search_attributes
    if attrs.get(SA_AGENT) is None:
        return
    searchable = searchable_status(status)
    if attrs.get(SA_STATUS) != searchable:
        workflow.upsert_search_attributes([SA_STATUS.value_set(searchable)])


def session_details(
    *,
    state: str,
    pin: str,
    turn: int,
    completed_idle: bool,
    reviews: dict[str, dict[str, Any]],
    expiry: dict[str, datetime],
    last_message: str,
) -> str:
    """The current details in markdown: state, agent pin and turn; each open review
    (``reviews``: id -> {operation, target}) with its deadline and the command that
    decides it; the last message, cut to :data:`DETAILS_PREVIEW` characters."""
    lines = [f"**{state}** · `{pin}` · turn {turn}"]
    if completed_idle:
        lines.append("- this run completed idle; the next message starts the next run")
    for rid, review in reviews.items():
        target = f" → {review['target']}" if review["target"] else ""
        deadline = expiry.get(rid)
        by = deadline.strftime("%Y-%m-%d %H:%M:%S UTC") if deadline else "?"
        lines.append(
            f"- review `{rid}`: {review['operation']}{target}, decide by "
            f"{by} (`baton reviews approve {rid}`)"
        )
    if last_message:
        text = " ".join(last_message.split())
        cut = text if len(text) <= DETAILS_PREVIEW else text[: DETAILS_PREVIEW - 1] + "…"
        lines.append(f"- last: {cut}")
    return "\n".join(lines)
