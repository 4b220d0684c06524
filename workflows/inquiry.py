"""InquiryWorkflow: one question to an ambassador, answered durably (AgentX Agent Teams).

Id ``inquiry-<uuid>``. A bounded loop: each model call is the ``inquiry_turn``
activity, each call of its read-only tool belt the ``inquiry_tool`` activity,
until the ambassador answers without tool calls or ``max_steps`` model calls
were made. The answer is stored by ``finish_inquiry``; history carries only ids
and previews. The workflow never touches the session it is about.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.inquiry import InquiryActivities
    from baton.contracts.activity_io import InquiryFinish, InquiryToolInput, InquiryTurnInput
    from baton.contracts.values import ToolCall, position
    from baton.contracts.workflow_io import InquiryInput, InquiryResult

from workflows.options import (
    STORE_RETRY,
    heartbeat_timeout,
    model_retry,
    store_timeout,
    tool_timeout,
)

#: Tool calls of one reply that run; further ones get no result (the model sees them
#: as interrupted), so one reply cannot fan out without bound.
MAX_CALLS_PER_STEP = 8


def _cause(err: ActivityError) -> str:
    cause = err.cause
    return str(cause) if cause is not None else str(err)


@workflow.defn(name="Inquiry")
class InquiryWorkflow:
    """A durable inquiry. Input: :class:`InquiryInput`; result: :class:`InquiryResult`."""

    @workflow.run
    async def run(self, inp: InquiryInput) -> InquiryResult:
        last: str | None = None
        for step in range(1, inp.max_steps + 1):
            message_id = f"{inp.inquiry_id}:s{step}:assistant"
            try:
                result = await workflow.execute_activity_method(
                    InquiryActivities.inquiry_turn,
                    InquiryTurnInput(
                        inquiry=inp,
                        step=step,
                        message_id=message_id,
                        position=position(0, step, 1),
                    ),
                    start_to_close_timeout=timedelta(seconds=inp.model_turn_timeout_s),
                    heartbeat_timeout=heartbeat_timeout(inp.config),
                    retry_policy=model_retry(inp.config),
                    summary=f"inquiry step {step} · {inp.ambassador_pin}",
                )
            except ActivityError as err:
                return await self._finish(
                    inp, InquiryFinish(inquiry_id=inp.inquiry_id, steps=step, error=_cause(err))
                )
            last = message_id
            if not result.tool_calls:
                return await self._finish(
                    inp,
                    InquiryFinish(inquiry_id=inp.inquiry_id, answer_message_id=last, steps=step),
                )
            for index, call in enumerate(result.tool_calls[:MAX_CALLS_PER_STEP]):
                try:
                    await self._tool(inp, step, index, call)
                except ActivityError as err:
                    done = InquiryFinish(inquiry_id=inp.inquiry_id, steps=step, error=_cause(err))
                    return await self._finish(inp, done)
        return await self._finish(
            inp,
            InquiryFinish(
                inquiry_id=inp.inquiry_id, answer_message_id=last, steps=inp.max_steps, capped=True
            ),
        )

    async def _tool(self, inp: InquiryInput, step: int, index: int, call: ToolCall) -> None:
        await workflow.execute_activity_method(
            InquiryActivities.inquiry_tool,
            InquiryToolInput(
                inquiry=inp,
                message_id=f"{inp.inquiry_id}:s{step}:tool:{call.id}",
                position=position(0, step, 2, index),
                call=call,
            ),
            start_to_close_timeout=tool_timeout(inp.config),
            retry_policy=STORE_RETRY,
            summary=f"{call.name}",
        )

    async def _finish(self, inp: InquiryInput, done: InquiryFinish) -> InquiryResult:
        status = await workflow.execute_activity_method(
            InquiryActivities.finish_inquiry,
            done,
            start_to_close_timeout=store_timeout(inp.config),
            retry_policy=STORE_RETRY,
            summary="answer",
        )
        return InquiryResult(
            inquiry_id=inp.inquiry_id,
            status="failed" if status == "failed" else "answered",
            steps=done.steps,
        )
