"""External sessions (docs/mcp.md): an outside process takes the turns and reaches Baton
over MCP. Each X-Agent call arrives as Update ``external_tool_call`` and runs through
:func:`workflows.dispatch.dispatch`, the road of a model's tool call, under a message id
the workflow chooses; each message it posts is Update ``external_message``. These are the
checks of those Updates and the message's record.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities.external import ExternalActivities
    from baton.contracts.activity_io import ExternalMessageInput
    from baton.contracts.codes import INVALID_PROMPT, NOT_EXTERNAL, SESSION_CLOSED, UNKNOWN_TOOL
    from baton.contracts.values import XAGENT_TOOLS, position
    from baton.contracts.workflow_io import (
        ExternalMessage,
        ExternalMessageOutcome,
        ExternalToolCall,
        SessionInput,
    )

from workflows.options import STORE_RETRY, store_timeout


def check_external(inp: SessionInput, closed: bool) -> None:
    """Refuse an external Update on a closed or non-external session (``session_closed``,
    ``not_external``: the validator's ApplicationError, so nothing is recorded)."""
    if closed:
        raise ApplicationError("the session is closed", type=SESSION_CLOSED)
    if not inp.provenance.external:
        raise ApplicationError(
            "this session is not external (its turns are the model's)", type=NOT_EXTERNAL
        )


def check_external_call(inp: SessionInput, closed: bool, req: ExternalToolCall) -> None:
    """:func:`check_external`, and only X-Agent tools (``unknown_tool``)."""
    check_external(inp, closed)
    if req.name not in XAGENT_TOOLS:
        raise ApplicationError(
            f"unknown tool '{req.name[:64]}'; the tools are {', '.join(XAGENT_TOOLS)}",
            type=UNKNOWN_TOOL,
        )


def check_external_message(inp: SessionInput, closed: bool, msg: ExternalMessage) -> None:
    """:func:`check_external`, and no blank text (``invalid_prompt``)."""
    check_external(inp, closed)
    if not msg.text.strip():
        raise ApplicationError("text must not be blank", type=INVALID_PROMPT)


async def record_message(
    inp: SessionInput, agent_slug: str, turn: int, msg: ExternalMessage
) -> ExternalMessageOutcome:
    """Store ``msg`` as turn ``turn``'s message (``<session>:t<turn>:<role>``), so other
    agents read what the external process did and was asked in the transcript."""
    sid = inp.session_id
    message_id = f"{sid}:t{turn}:{msg.role}"
    await workflow.execute_activity_method(
        ExternalActivities.record_external_message,
        ExternalMessageInput(
            session_id=sid,
            agent_slug=agent_slug,
            message_id=message_id,
            position=position(turn, 0, 0 if msg.role == "user" else 1),
            role=msg.role,
            text=msg.text,
        ),
        start_to_close_timeout=store_timeout(inp.config),
        retry_policy=STORE_RETRY,
        summary=f"external {msg.role} message",
    )
    return ExternalMessageOutcome(message_id=message_id)
