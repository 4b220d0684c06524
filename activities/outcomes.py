"""Outcomes every activity records the same way: a tool call's result stored once as the
``tool`` message the model reads (and forwarded to the run's root), the outcome an earlier
attempt stored, and heartbeats while a body runs.

Shared by the model-turn, cross-agent, delegation, MCP and inquiry activities, so it
imports none of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from sqlmodel import Session
from temporalio import activity

from baton.contracts.activity_io import ToolInput, ToolMessage, ToolOutcome
from baton.contracts.tool_args import CLAIM_CHECK
from baton.runs import run_tree, session_store

#: Characters of a result kept in the ToolOutcome the workflow sees (the full text is in
#: the transcript: claim-check).
PREVIEW_CHARS = 200


def cancel_requested() -> bool:
    """Whether this attempt was cancelled because its workflow asked: an interrupting
    message, a cancelled session, step or eval. False for an attempt that was cut off
    instead (its heartbeat timed out, its worker is shutting down, it was not found):
    the retry redoes its work, so such an attempt must leave nothing behind that the
    retry would take for done (a half-streamed reply, a cancelled run)."""
    details = activity.cancellation_details()
    return details is not None and details.cancel_requested


def _beat_interval() -> float:
    """Half the activity's heartbeat timeout in seconds (STYLE 5), 10 s without one."""
    timeout = activity.info().heartbeat_timeout
    return timeout.total_seconds() / 2 if timeout else 10.0


@contextlib.asynccontextmanager
async def heartbeating(details: Callable[[], tuple[Any, ...]] = tuple) -> AsyncIterator[None]:
    """Heartbeat at half the heartbeat timeout while the body runs (even with no output).

    ``details()`` is sent with each beat: what a retry on another worker reads back
    from ``activity.info().heartbeat_details`` (model_turn: its provider failures).
    """
    interval = _beat_interval()

    async def beat() -> None:
        # The first beat waits an interval: a quick call then sends none at all.
        while True:
            await asyncio.sleep(interval)
            activity.heartbeat(*details())

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.contextmanager
def heartbeating_thread() -> Iterator[None]:
    """:func:`heartbeating` for a sync activity: a thread beats while the body runs, so a
    lost worker's tool call is retried after the heartbeat timeout, not its start-to-close.
    ``activity.heartbeat`` is thread-safe in sync activities; the
    thread runs in a copy of the activity's context to find it."""
    interval = _beat_interval()
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(interval):
            activity.heartbeat()

    thread = threading.Thread(
        target=contextvars.copy_context().run, args=(beat,), name="baton-heartbeat", daemon=True
    )
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def stored_outcome(s: Session, message_id: str) -> ToolOutcome | None:
    """The result stored for ``message_id`` by an earlier attempt, if any."""
    done = session_store.get_message(s, message_id=message_id)
    if done is None:
        return None
    return ToolOutcome(message_id=done.id, ok=not done.is_error, preview=done.text[:PREVIEW_CHARS])


def cancelled_outcome(tool: ToolMessage) -> ToolOutcome:
    """The outcome of a tool call whose session closed before its result was written."""
    return ToolOutcome(message_id=tool.message_id, ok=False, preview="cancelled")


def store_result(
    s: Session,
    tool: ToolMessage,
    text: str,
    *,
    ok: bool,
    duration_ms: int | None = None,
    tool_args: dict[str, Any] | None = None,
) -> ToolOutcome:
    """Store a tool call's result (or error) as the ``tool`` message the model will read,
    and forward it to the run's root when the session runs a delegation. ``tool_args``:
    what the message keeps of the call's arguments (default: the call's own).

    Writes nothing once the session is cancelled or failed: a running activity learns of
    a cancel only at its next heartbeat, and nothing may land after ``cancelled``.
    """
    if session_store.is_closed(s, session_id=tool.session_id):
        return cancelled_outcome(tool)
    session_store.add_message(
        s,
        message_id=tool.message_id,
        session_id=tool.session_id,
        position=tool.position,
        role="tool",
        agent_slug=tool.agent_slug,
        text=text,
        tool_name=tool.call.name,
        tool_call_id=tool.call.id,
        tool_args=tool.call.args if tool_args is None else tool_args,
        is_error=not ok,
    )
    run_tree.forward(
        s,
        tool.session_id,
        "tool_result",
        {
            "tool": tool.call.name,
            "tool_call_id": tool.call.id,
            "content": text[:PREVIEW_CHARS],
            "success": ok,
            "duration_ms": duration_ms,
        },
    )
    return ToolOutcome(message_id=tool.message_id, ok=ok, preview=text[:PREVIEW_CHARS])


def call_message(inp: ToolInput) -> ToolMessage:
    """Where the result of the call a ``run_tool`` or ``workspace_tool`` input names goes."""
    return ToolMessage(
        session_id=inp.session_id,
        agent_slug=inp.agent_slug,
        message_id=inp.message_id,
        position=inp.position,
        call=inp.call,
    )


def store_call_result(
    s: Session,
    inp: ToolInput,
    text: str,
    *,
    ok: bool,
    duration_ms: int | None = None,
    tool_args: dict[str, Any] | None = None,
) -> ToolOutcome:
    """:func:`store_result` for the call a ``run_tool`` or ``workspace_tool`` input names."""
    return store_result(
        s, call_message(inp), text, ok=ok, duration_ms=duration_ms, tool_args=tool_args
    )


def claimed_args(s: Session, inp: ToolInput) -> dict[str, Any]:
    """The whole arguments of a claim-checked call (``present_exhibit``, ``write_file``:
    :data:`~baton.contracts.tool_args.CLAIM_CHECKED`): those its assistant message stored,
    found by the claim-check id and the call's id and name in this session, else the
    arguments as they came (a check of them names what is wrong; a call recorded before
    its tool was claim-checked carries them whole)."""
    ref = inp.call.args.get(CLAIM_CHECK)
    row = session_store.get_message(s, message_id=ref) if isinstance(ref, str) else None
    if row is None or row.session_id != inp.session_id:
        return inp.call.args
    for call in row.tool_calls or []:
        if call.get("id") == inp.call.id and call.get("name") == inp.call.name:
            return dict(call.get("args") or {})
    return inp.call.args
