"""Inquiry activities: the ambassador's model calls and its read-only tool belt.

They reuse the session's model-turn machinery (the pydantic-ai model builder, the
scripted model and its playbook, the message rebuilder, the provider error
classification, heartbeating) but read and write only the inquiry's own rows:
nothing here writes a session's messages, events, usage or shared channel (the
no-pollution invariant, AgentX Agent Teams 'Ambassador'; see :mod:`baton.runs.inquiries`).
Activity names are explicit and stable.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from pydantic_ai.direct import model_request_stream
from pydantic_ai.exceptions import ModelAPIError, UserError
from pydantic_ai.messages import TextPart, ToolCallPart
from pydantic_ai.models import ModelRequestParameters
from pydantic_ai.tools import ToolDefinition
from sqlalchemy.engine import Engine
from sqlmodel import Session
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.outcomes import PREVIEW_CHARS, heartbeating
from activities.turns import _classify, _tool_call, reply_usage, to_model_messages
from baton.agents import registry
from baton.contracts.activity_io import (
    InquiryFinish,
    InquiryToolInput,
    InquiryTurnInput,
    ModelTurnResult,
    ToolOutcome,
)
from baton.contracts.values import ResolvedAgent, ToolCall, Usage
from baton.errors import BatonError
from baton.providers.models import build_model, model_name
from baton.runs import inquiries, metering
from baton.storage.db import session_scope

T = TypeVar("T")

_SESSION_ID = {
    "type": "string",
    "pattern": r"^session-[0-9a-f-]{36}$",
    "description": "Defaults to the conversation you were asked about.",
}
#: The tool belt as the model sees it (name, description, JSON Schema).
BELT: list[tuple[str, str, dict[str, Any]]] = [
    (
        "list_conversations",
        "List the newest conversations the person may read.",
        {"type": "object", "properties": {}, "additionalProperties": False},
    ),
    (
        "read_conversation",
        "Read a conversation's transcript, turn by turn.",
        {
            "type": "object",
            "properties": {"session_id": _SESSION_ID},
            "additionalProperties": False,
        },
    ),
    (
        "explore_conversation",
        "Look into one turn: its messages, tool calls with results, and its delegations.",
        {
            "type": "object",
            "properties": {
                "session_id": _SESSION_ID,
                "turn": {"type": "integer", "minimum": 1, "maximum": 1_000_000},
            },
            "required": ["turn"],
            "additionalProperties": False,
        },
    ),
    (
        "summarize_conversation",
        "Summarise a conversation: agents, delegations and their results, totals, last reply.",
        {
            "type": "object",
            "properties": {"session_id": _SESSION_ID},
            "additionalProperties": False,
        },
    ),
    (
        "draft_message",
        "Draft a message the person may review and send to their agents themselves.",
        {
            "type": "object",
            "properties": {
                "text": {"type": "string", "minLength": 1, "maxLength": inquiries.MAX_DRAFT_CHARS}
            },
            "required": ["text"],
            "additionalProperties": False,
        },
    ),
]


def _target(s: Session, inp: InquiryToolInput, args: dict[str, Any]) -> str:
    sid = args.get("session_id") or inp.inquiry.session_id
    if not isinstance(sid, str):
        raise inquiries.BeltError("session_id must be a string")
    inquiries.readable_session(s, session_id=sid, user=inp.inquiry.user, auth_on=inp.inquiry.auth)
    return sid


def _turn(args: dict[str, Any]) -> int:
    turn = args.get("turn")
    if not isinstance(turn, int) or isinstance(turn, bool) or turn < 1:
        raise inquiries.BeltError("turn must be a positive integer (turns count from 1)")
    return turn


def _draft(s: Session, inp: InquiryToolInput, args: dict[str, Any]) -> str:
    text = args.get("text")
    if not isinstance(text, str) or not text.strip():
        raise inquiries.BeltError("text must be a non-empty string")
    inquiries.set_draft(s, inquiry_id=inp.inquiry.inquiry_id, text=text)
    return "drafted; the person can review it and send it themselves"


#: Tool name -> implementation (session, input, args) -> text; reads only, but for the draft.
_BELT_IMPL: dict[str, Callable[[Session, InquiryToolInput, dict[str, Any]], str]] = {
    "list_conversations": lambda s, inp, _a: inquiries.list_conversations(
        s, user=inp.inquiry.user, auth_on=inp.inquiry.auth
    ),
    "read_conversation": lambda s, inp, a: inquiries.read_conversation(
        s, session_id=_target(s, inp, a)
    ),
    "explore_conversation": lambda s, inp, a: inquiries.explore_conversation(
        s, session_id=_target(s, inp, a), turn=_turn(a)
    ),
    "summarize_conversation": lambda s, inp, a: inquiries.summarize_conversation(
        s, session_id=_target(s, inp, a)
    ),
    "draft_message": _draft,
}


class InquiryActivities:
    """Activities of the Inquiry workflow, built with the DB engine by the worker factory."""

    def __init__(self, engine: Engine, *, db_threads: int = 4) -> None:
        self._engine = engine
        self._db = ThreadPoolExecutor(max_workers=db_threads, thread_name_prefix="baton-inq")

    async def _in_db(self, fn: Callable[..., T], *args: Any) -> T:
        # With the activity's context, as asyncio.to_thread does: metering's counters see
        # the activity's metric meter.
        ctx = contextvars.copy_context()
        return await asyncio.get_running_loop().run_in_executor(self._db, ctx.run, fn, *args)

    def _prepare(self, inp: InquiryTurnInput) -> tuple[ModelTurnResult | None, Any, Any]:
        with session_scope(self._engine) as s:
            done = inquiries.get_step(s, step_id=inp.message_id)
            if done is not None:
                calls = [ToolCall.model_validate(c) for c in done.tool_calls or []]
                return ModelTurnResult(message_id=done.id, tool_calls=calls), None, None
            metering.admit_call(s)
            try:
                agent = registry.resolve_agent(s, ref=inp.inquiry.ambassador_pin)
            except BatonError as exc:
                raise ApplicationError(
                    f"{inp.inquiry.ambassador_pin} cannot answer: {exc.detail}",
                    type="agent_unavailable",
                    non_retryable=True,
                ) from exc
            row = inquiries.get(s, inquiry_id=inp.inquiry.inquiry_id)
            return None, agent, inquiries.history(s, inquiry=row)

    def _persist(
        self, inp: InquiryTurnInput, text: str, calls: list[ToolCall], usage: Usage, model: str
    ) -> None:
        with session_scope(self._engine) as s:
            # Metered to the inquiry (its id in usage.session_id) and the ambassador: never
            # to the session it is about, so the session's usage and budget are untouched.
            metering.record(
                s,
                message_id=inp.message_id,
                agent=inp.inquiry.ambassador_pin.partition("@")[0],
                session_id=inp.inquiry.inquiry_id,
                model=model,
                input_tokens=usage.input_tokens,
                output_tokens=usage.output_tokens,
                cost_usd=usage.cost_usd,  # None: unpriced
            )
            inquiries.add_step(
                s,
                step_id=inp.message_id,
                inquiry_id=inp.inquiry.inquiry_id,
                position=inp.position,
                role="assistant",
                text=text,
                tool_calls=[c.model_dump() for c in calls] or None,
            )

    @activity.defn(name="inquiry_turn")
    async def inquiry_turn(self, inp: InquiryTurnInput) -> ModelTurnResult:
        """One model call of the ambassador, offered only its tool belt.

        Idempotent on ``message_id``. The system prompt is the ambassador's own
        followed by :data:`baton.runs.inquiries.SYSTEM_BRIEF`. Raises non-retryable
        ApplicationErrors for a spent balance, an unresolvable ambassador and
        provider refusals (as ``model_turn`` does).
        """
        async with heartbeating():
            done, agent, history = await self._in_db(self._prepare, inp)
            if done is not None:
                return done
            assert isinstance(agent, ResolvedAgent)
            params = ModelRequestParameters(
                function_tools=[
                    ToolDefinition(name=n, description=d, parameters_json_schema=p)
                    for n, d, p in BELT
                ]
            )
            system_prompt = f"{agent.system_prompt}\n\n{inquiries.SYSTEM_BRIEF}".strip()
            name = model_name(agent.model, inp.inquiry.default_model)
            started = time.monotonic()
            try:
                model = build_model(name, playbook=agent.playbook, agent_slug=agent.slug)
                async with model_request_stream(
                    model,
                    to_model_messages(system_prompt, history),
                    model_settings={"max_retries": 0},
                    model_request_parameters=params,
                ) as stream:
                    async for _event in stream:
                        pass  # the answer is returned whole: an inquiry has no event stream
                    response = stream.get()
            except (ModelAPIError, UserError) as exc:
                mapped = _classify(exc)
                if mapped is exc:
                    raise
                raise mapped from exc
            text = "".join(p.content for p in response.parts if isinstance(p, TextPart))
            calls = [_tool_call(p) for p in response.parts if isinstance(p, ToolCallPart)]
            usage = reply_usage(response, inp.inquiry.prices, name, started)
            await self._in_db(self._persist, inp, text, calls, usage, name)
            return ModelTurnResult(
                message_id=inp.message_id,
                preview=text[:PREVIEW_CHARS],
                preview_is_full=len(text) <= PREVIEW_CHARS,
                tool_calls=calls,
                usage=usage,
            )

    @activity.defn(name="inquiry_tool")
    def inquiry_tool(self, inp: InquiryToolInput) -> ToolOutcome:
        """Run one belt tool once; a refused or malformed call becomes an error result the
        ambassador reads (``access_denied`` for a session the person may not read)."""
        with session_scope(self._engine) as s:
            done = inquiries.get_step(s, step_id=inp.message_id)
            if done is not None:
                return ToolOutcome(message_id=done.id, ok=not done.is_error, preview=done.text)
        impl = _BELT_IMPL.get(inp.call.name)
        with session_scope(self._engine) as s:
            try:
                if impl is None:
                    raise inquiries.BeltError(
                        f"unknown tool '{inp.call.name}'; the belt is: "
                        + ", ".join(n for n, _d, _p in BELT)
                    )
                text, ok = impl(s, inp, inp.call.args), True
            except inquiries.BeltError as exc:
                text, ok = str(exc), False
            except BatonError as exc:  # not found / forbidden: told to the model, not raised
                text, ok = f"{exc.code}: {exc.detail}", False
            except Exception as exc:  # a broken tool must reach the model, not stall the loop
                s.rollback()
                text, ok = f"tool '{inp.call.name}' failed: {type(exc).__name__}: {exc}", False
        with session_scope(self._engine) as s:
            inquiries.add_step(
                s,
                step_id=inp.message_id,
                inquiry_id=inp.inquiry.inquiry_id,
                position=inp.position,
                role="tool",
                text=text,
                tool_name=inp.call.name,
                tool_call_id=inp.call.id,
                is_error=not ok,
            )
        return ToolOutcome(message_id=inp.message_id, ok=ok, preview=text[:PREVIEW_CHARS])

    @activity.defn(name="finish_inquiry")
    def finish_inquiry(self, inp: InquiryFinish) -> str:
        """Store the answer (the text of ``answer_message_id``) or the failure; returns the
        inquiry's status (answered | failed). Idempotent."""
        with session_scope(self._engine) as s:
            answer: str | None = None
            if inp.answer_message_id is not None:
                step = inquiries.get_step(s, step_id=inp.answer_message_id)
                answer = step.text if step is not None else ""
                if inp.capped:
                    note = f"(I stopped after {inp.steps} steps, the limit of one inquiry.)"
                    answer = f"{answer}\n\n{note}".strip()
            row = inquiries.finish(
                s, inquiry_id=inp.inquiry_id, answer=answer, steps=inp.steps, error=inp.error
            )
            return row.status
