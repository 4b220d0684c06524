"""The activity calls every part of the session workflow (and the ``AgentStep`` workflow)
makes, as plain functions of explicit inputs: a local DB activity, a refusal, a recorded
failure, the model turn and an ordinary tool, with the ids and positions the workflow
chooses for what they store.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from activities.turns import SessionActivities
    from activities.xagent import XAgentActivities
    from baton.contracts.activity_io import (
        ModelTurnInput,
        RefusalInput,
        StatusChange,
        ToolInput,
        ToolMessage,
        ToolOutcome,
        TurnFailure,
    )
    from baton.contracts.tool_args import PRESENT_EXHIBIT
    from baton.contracts.values import (
        OPERATION_OF,
        ResolvedAgent,
        SessionStatus,
        ToolCall,
        Via,
        position,
    )
    from baton.contracts.workflow_io import SessionConfig

from workflows.options import STORE_RETRY, heartbeat_timeout, store_timeout, tool_timeout


def error_cause(err: ActivityError) -> str:
    """The message of an activity failure's cause (its ApplicationError's, else its text)."""
    cause = err.cause
    return str(cause.message) if isinstance(cause, ApplicationError) else str(cause or err)


def arg_problems(exc: ValidationError) -> str:
    """Up to five argument problems, ``path: message``, for the model to correct."""
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}" for e in exc.errors()[:5]
    )


async def local(fn: Callable[..., Any], arg: Any, cfg: SessionConfig, *, summary: str) -> Any:
    """A short DB activity run as a local activity, with the store options.

    Its failure is raised as :class:`ActivityError` (cause: the activity's error), as an
    ordinary activity's is: this SDK hands a local activity's own ApplicationError over
    unwrapped, and the callers' ``except ActivityError`` must serve both paths.
    """
    try:
        return await workflow.execute_local_activity_method(
            fn,
            arg,
            start_to_close_timeout=store_timeout(cfg),
            retry_policy=STORE_RETRY,
            summary=summary,
        )
    except ApplicationError as err:
        raise ActivityError(
            f"local activity failed: {err.message}",
            scheduled_event_id=0,
            started_event_id=0,
            identity="",
            activity_type=getattr(fn, "__name__", "activity"),
            activity_id="",
            retry_state=None,
        ) from err


async def refuse(
    tool: ToolMessage,
    code: str,
    error: str,
    cfg: SessionConfig,
    *,
    target: str | None = None,
    audit: bool = True,
    via: Via | None = None,
) -> ToolOutcome:
    """Store ``error`` as the tool call's result (the ``refuse_tool`` activity), audited
    unless ``audit`` is False; the model reads it and goes on."""
    return await workflow.execute_activity_method(
        XAgentActivities.refuse_tool,
        RefusalInput(
            tool=tool,
            error=error,
            code=code,
            # Every path that makes another agent run is the `invoke` operation.
            operation=OPERATION_OF.get(tool.call.name) or ("invoke" if via else None),
            target=target,
            audit=audit,
            via=via,
        ),
        start_to_close_timeout=store_timeout(cfg),
        retry_policy=STORE_RETRY,
        summary=f"refuse {tool.call.name}: {code}",
    )


async def record_failure(
    failure: TurnFailure,
    cfg: SessionConfig,
) -> None:
    """Store a failed turn's error message and the session's status after it."""
    await workflow.execute_activity_method(
        SessionActivities.record_failure,
        failure,
        start_to_close_timeout=store_timeout(cfg),
        retry_policy=STORE_RETRY,
        summary="record failure",
    )


def turn_failure(
    session_id: str,
    agent_slug: str,
    message_id: str,
    pos: str,
    error: str,
    final: SessionStatus = "idle",
) -> TurnFailure:
    """The ``record_failure`` input of one failure."""
    return TurnFailure(
        session_id=session_id,
        agent_slug=agent_slug,
        message_id=message_id,
        position=pos,
        error=error,
        final_status=final,
    )


def model_turn_input(
    session_id: str,
    agent_slug: str,
    turn: int,
    step: int,
    cfg: SessionConfig,
    user_text: str | None,
    **extra: Any,
) -> ModelTurnInput:
    """The ``model_turn`` input: the ids and positions the workflow chooses for the reply
    (and, on a turn's first call, its user message), shared by sessions and steps."""
    first = user_text is not None
    return ModelTurnInput(
        session_id=session_id,
        agent_slug=agent_slug,
        turn=turn,
        step=step,
        assistant_message_id=f"{session_id}:t{turn}:s{step}:assistant",
        position=position(turn, step, 1),
        user_message_id=f"{session_id}:t{turn}:user" if first else None,
        user_text=user_text,
        user_position=position(turn, 0, 0) if first else None,
        default_model=cfg.default_model,
        prices=cfg.prices,
        **extra,
    )


def tool_message(
    session_id: str, agent_slug: str, turn: int, step: int, index: int, call: ToolCall
) -> ToolMessage:
    """Where a tool call's result is stored: the id and position the workflow chooses
    (``<session>:t<turn>:s<step>:tool<index>``), shared by sessions and steps."""
    return ToolMessage(
        session_id=session_id,
        agent_slug=agent_slug,
        message_id=f"{session_id}:t{turn}:s{step}:tool{index}",
        position=position(turn, step, 2, index),
        call=call,
    )


def usable_tools(agent: ResolvedAgent) -> list[str]:
    """The tools the ``run_tool`` activity may run for ``agent``: its declared ``tools``
    and the built-in ``present_exhibit`` unless it blocks it (docs/exhibits.md)."""
    builtin = [] if PRESENT_EXHIBIT in agent.blocked_tools else [PRESENT_EXHIBIT]
    return [*agent.tools, *builtin]


async def run_ordinary_tool(
    tool: ToolMessage, allowed: list[str], label: str, cfg: SessionConfig
) -> ToolOutcome:
    """The ``run_tool`` activity for one ordinary tool call (summary ``<tool> · <label>``);
    it heartbeats, so a lost worker's call is retried after the heartbeat timeout."""
    return await run_tool_activity(SessionActivities.run_tool, tool, allowed, label, cfg)


async def run_tool_activity(
    fn: Callable[..., Any], tool: ToolMessage, allowed: list[str], label: str, cfg: SessionConfig
) -> ToolOutcome:
    """Activity ``fn`` (``run_tool``, ``workspace_tool``) for one tool call, its input a
    :class:`ToolInput`, with the tool timeout and the heartbeat timeout (summary ``<tool> ·
    <label>``)."""
    return await workflow.execute_activity_method(
        fn,
        ToolInput(
            session_id=tool.session_id,
            agent_slug=tool.agent_slug,
            message_id=tool.message_id,
            position=tool.position,
            call=tool.call,
            allowed_tools=allowed,
        ),
        start_to_close_timeout=tool_timeout(cfg),
        heartbeat_timeout=heartbeat_timeout(cfg),
        retry_policy=STORE_RETRY,
        summary=f"{tool.call.name} · {label}",
    )


async def store_status(session_id: str, status: SessionStatus, cfg: SessionConfig) -> None:
    """Write the session row's status (the ``set_status`` activity; summary: the status)."""
    await workflow.execute_activity_method(
        SessionActivities.set_status,
        StatusChange(session_id=session_id, status=status),
        start_to_close_timeout=store_timeout(cfg),
        retry_policy=STORE_RETRY,
        summary=status,
    )
