"""AgentStepWorkflow: one published agent run as a workflow-agent step (issue 6; Xema Agent
Concepts, 'One Agent, two execution experiences'; docs/steps.md).

The step is pinned at launch. Each attempt is a model call (with its ordinary tool
loop) whose final message must validate against the step's JSON Schema; an invalid
deliverable is retried with the validation errors fed back, after the request's
backoff, up to ``max_attempts``, then the step fails with ``invalid_deliverable``.
With handoff the step waits for Signal ``handoff`` (approve | revise | reject) up to
its handoff timeout. The transcript lives in the DB under the step's id, like a
session's, so ``model_turn`` and ``run_tool`` are shared unchanged.
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError

with workflow.unsafe.imports_passed_through():
    from activities.steps import StepActivities
    from activities.turns import SessionActivities
    from baton.contracts import (
        ATTEMPT_FAILED,
        HANDOFF_TIMEOUT,
        INVALID_DELIVERABLE,
        SA_AGENT,
        SA_STATUS,
        STEP_REJECTED,
        STEP_TIMEOUT,
        TOO_MANY_ATTEMPTS,
        DeliverableCheck,
        HandoffDecision,
        LoadAgentInput,
        ResolvedAgent,
        StepInput,
        StepStatus,
        StepUpdate,
    )
    from baton.temporal_ui import md_text
    from workflows.options import STORE_RETRY, heartbeat_timeout, store_timeout
    from workflows.session_base import model_turn_input, run_ordinary_tool, tool_message

#: Attempts a step may make in all, revisions included (a handoff loop ends here).
MAX_TOTAL_ATTEMPTS = 50
#: Characters of the last output shown in the step's current details.
DETAILS_PREVIEW_CHARS = 200

#: Patch ids (workflow.patched): each gates a command change for runs already in flight.
#: Issue 12, item 4: BatonStatus follows the step's status (an upsert per change)...
PATCH_STATUS_ATTRIBUTE = "step-status-search-attribute"
#: ...and a failed or rejected step fails its workflow (ApplicationError with its code).
PATCH_FAILED_WORKFLOW = "failed-step-fails-workflow"


@workflow.defn(name="AgentStep")
class AgentStepWorkflow:
    """A workflow-agent step. Input: :class:`StepInput`; result: the final status."""

    @workflow.init
    def __init__(self, inp: StepInput) -> None:
        self._inp = inp
        self._status: StepStatus = "running"
        self._attempts = 0
        self._decision: HandoffDecision | None = None
        # What the current details show (issue 12, item 3): the last output's preview and,
        # while a handoff waits, its deadline.
        self._last_output = ""
        self._handoff_deadline: datetime | None = None
        self._error: str | None = None

    @workflow.query(name="status")
    def status(self) -> dict[str, Any]:
        """``{status, attempts}``."""
        return {"status": self._status, "attempts": self._attempts}

    @workflow.signal(name="handoff")
    def handoff(self, decision: HandoffDecision) -> None:
        """A human's decision on the deliverable; only while it awaits one (first wins)."""
        if self._status == "awaiting_handoff" and self._decision is None:
            self._decision = decision

    @workflow.run
    async def run(self, inp: StepInput) -> str:
        """Run attempts until a deliverable is accepted, rejected, or the step fails."""
        try:
            if inp.timeout_s is not None:
                return await asyncio.wait_for(self._run(inp), timeout=inp.timeout_s)
            return await self._run(inp)
        except TimeoutError:
            return await self._finish(
                "failed", STEP_TIMEOUT, error=f"timeout: the step took over {inp.timeout_s:g} s"
            )

    async def _run(self, inp: StepInput) -> str:
        self._show()
        try:
            agent = await workflow.execute_activity_method(
                SessionActivities.load_agent,
                LoadAgentInput(session_id=inp.step_id, agent_pin=inp.agent_pin),
                start_to_close_timeout=store_timeout(self._inp.config),
                retry_policy=STORE_RETRY,
                summary=f"load {inp.agent_pin}",
            )
        except ActivityError as err:
            _reraise_cancel(err)
            return await self._finish("failed", ATTEMPT_FAILED, error=error_cause(err))
        prompt = _first_prompt(inp)
        while True:
            self._attempts += 1
            if self._attempts > MAX_TOTAL_ATTEMPTS:
                return await self._finish("failed", TOO_MANY_ATTEMPTS, error="too many attempts")
            self._show()
            try:
                message_id = await self._attempt(agent, self._attempts, prompt)
            except ActivityError as err:
                _reraise_cancel(err)
                return await self._finish("failed", ATTEMPT_FAILED, error=error_cause(err))
            except ApplicationError as err:
                return await self._finish("failed", ATTEMPT_FAILED, error=str(err.message))
            try:
                checked = await workflow.execute_activity_method(
                    StepActivities.check_deliverable,
                    DeliverableCheck(
                        step_id=inp.step_id, message_id=message_id, output_schema=inp.output_schema
                    ),
                    start_to_close_timeout=store_timeout(self._inp.config),
                    retry_policy=STORE_RETRY,
                    summary=f"check deliverable · attempt {self._attempts}",
                )
            except ActivityError as err:
                _reraise_cancel(err)
                return await self._finish("failed", ATTEMPT_FAILED, error=error_cause(err))
            if not checked.ok:
                errors = "\n".join(f"- {e}" for e in checked.errors)
                if self._attempts >= inp.retry.max_attempts:
                    return await self._finish(
                        "failed",
                        INVALID_DELIVERABLE,
                        error=f"{INVALID_DELIVERABLE}: after {self._attempts} attempts:\n{errors}",
                    )
                await self._update("running")
                await workflow.sleep(
                    inp.retry.delay(self._attempts),
                    summary=f"backoff after attempt {self._attempts}",
                )
                prompt = (
                    "Your deliverable does not validate against the required JSON Schema:\n"
                    f"{errors}\nReply again with only the corrected JSON."
                )
                continue
            if not inp.handoff:
                return await self._finish("completed", deliverable=checked.deliverable)
            # Clear before the write: once the row says awaiting_handoff, a decision can land.
            self._decision = None
            wait = timedelta(seconds=inp.handoff_timeout_s)
            self._handoff_deadline = workflow.now() + wait
            await self._update("awaiting_handoff", deliverable=checked.deliverable)
            try:
                await workflow.wait_condition(
                    lambda: self._decision is not None, timeout=wait, timeout_summary="handoff"
                )
                timed_out = False
            except TimeoutError:
                timed_out = True
            self._handoff_deadline = None
            if timed_out:
                return await self._finish(
                    "failed",
                    HANDOFF_TIMEOUT,
                    deliverable=checked.deliverable,
                    error=f"{HANDOFF_TIMEOUT}: no decision within {inp.handoff_timeout_s:g} s",
                )
            decision = self._decision
            assert decision is not None
            if decision.decision == "approve":
                return await self._finish("completed", deliverable=checked.deliverable)
            if decision.decision == "reject":
                return await self._finish(
                    "rejected",
                    STEP_REJECTED,
                    deliverable=checked.deliverable,
                    error=decision.feedback,
                )
            self._status = "running"
            await self._update("running", deliverable=checked.deliverable)
            prompt = f"Revise your deliverable. Feedback: {decision.feedback or '(none given)'}"

    async def _attempt(self, agent: ResolvedAgent, attempt: int, prompt: str) -> str:
        """One attempt: model calls and their tools until a final message; its id."""
        inp = self._inp
        sid = inp.step_id
        cfg = inp.config
        retry = RetryPolicy(
            initial_interval=timedelta(seconds=max(inp.retry.initial_interval_s, 0.001)),
            backoff_coefficient=inp.retry.backoff_coefficient,
            maximum_interval=timedelta(seconds=max(60.0, inp.retry.initial_interval_s)),
            # Worker losses do not spend the request's attempts: model_turn counts provider
            # failures itself and fails for good after max_attempts of them (issue 10).
            maximum_attempts=max(inp.retry.max_attempts, cfg.model_attempts),
        )
        user: str | None = prompt  # stored with the attempt's first model call
        for step in range(1, cfg.max_steps_per_message + 1):
            result = await workflow.execute_activity_method(
                SessionActivities.model_turn,
                model_turn_input(
                    sid,
                    agent.slug,
                    attempt,
                    step,
                    cfg,
                    user,
                    provider_failures=inp.retry.max_attempts,
                ),
                start_to_close_timeout=timedelta(seconds=cfg.model_turn_timeout_s),
                heartbeat_timeout=heartbeat_timeout(cfg),
                retry_policy=retry,
                summary=f"attempt {attempt}" + (f".{step}" if step > 1 else "") + f" · {agent.pin}",
            )
            user = None
            if result.preview:
                self._last_output = result.preview
                self._show()
            if not result.tool_calls:
                return result.message_id
            await asyncio.gather(
                *(
                    run_ordinary_tool(
                        tool_message(sid, agent.slug, attempt, step, i, call),
                        agent.tools,
                        f"attempt {attempt}",
                        cfg,
                    )
                    for i, call in enumerate(result.tool_calls[: cfg.max_tool_calls_per_reply])
                )
            )
        raise ApplicationError(
            f"attempt {attempt} stopped after {cfg.max_steps_per_message} model calls",
            non_retryable=True,
        )

    async def _update(
        self, status: StepStatus, *, deliverable: Any = None, error: str | None = None
    ) -> None:
        self._status = status
        self._error = error
        self._show()
        # Upsert only where the starter set Baton's attributes (so they are registered): an
        # unregistered attribute would fail every workflow task and wedge the step.
        if (
            workflow.info().typed_search_attributes.get(SA_AGENT) is not None
            and workflow.patched(PATCH_STATUS_ATTRIBUTE)
            and workflow.info().typed_search_attributes.get(SA_STATUS) != status
        ):
            workflow.upsert_search_attributes([SA_STATUS.value_set(status)])
        await workflow.execute_activity_method(
            StepActivities.update_step,
            StepUpdate(
                step_id=self._inp.step_id,
                status=status,
                attempts=self._attempts,
                deliverable=deliverable,
                error=error,
            ),
            start_to_close_timeout=store_timeout(self._inp.config),
            retry_policy=STORE_RETRY,
            summary=status,
        )

    async def _finish(
        self,
        status: StepStatus,
        code: str | None = None,
        *,
        deliverable: Any = None,
        error: str | None = None,
    ) -> str:
        """Store the step's end; a ``failed`` or ``rejected`` one then fails the workflow.

        The row is written first, so the API reports the same status, deliverable and
        error as before the patch (it reads the row, never the workflow's result). The
        failure is an ``ApplicationError`` whose type is ``code`` (``invalid_deliverable``,
        ``handoff_timeout``, ``step_timeout``, ``step_rejected``, ``too_many_attempts``,
        ``attempt_failed``), non-retryable, with ``{step_id, status, attempts}`` as details:
        the Temporal UI lists the step under ExecutionStatus = "Failed" (issue 12, item 4).
        """
        await self._update(status, deliverable=deliverable, error=error)
        if status != "completed" and workflow.patched(PATCH_FAILED_WORKFLOW):
            raise ApplicationError(
                error or status,
                {"step_id": self._inp.step_id, "status": status, "attempts": self._attempts},
                type=code or status,
                non_retryable=True,
            )
        return status

    def _show(self) -> None:
        """Set the current details the Temporal UI shows (issue 12, item 3): status and
        attempt, the last output's preview, the pending handoff with its deadline, the
        error of a failed step. Metadata, not a command: no patch needed."""
        inp = self._inp
        head = f"**{self._status}**"
        if self._attempts:
            head += f" · attempt {self._attempts} of {inp.retry.max_attempts}"
        lines = [f"{head} · `{inp.agent_pin}`"]
        if self._handoff_deadline is not None:
            deadline = self._handoff_deadline.strftime("%Y-%m-%d %H:%M:%S UTC")
            lines.append(
                f"**Awaiting handoff** until {deadline}: approve, revise or reject "
                f"(`baton step approve {inp.step_id}`)."
            )
        if self._last_output:
            lines.append(f"Last output: {md_text(self._last_output[:DETAILS_PREVIEW_CHARS])}")
        if self._error and self._status != "completed":
            lines.append(f"Error: {md_text(self._error[:DETAILS_PREVIEW_CHARS])}")
        workflow.set_current_details("\n\n".join(lines))


def _first_prompt(inp: StepInput) -> str:
    if inp.output_schema is None:
        return inp.input
    schema = json.dumps(inp.output_schema, ensure_ascii=False)
    return (
        f"{inp.input}\n\nReply with only a JSON value (no prose) that validates against "
        f"this JSON Schema:\n{schema}"
    )


def _reraise_cancel(err: ActivityError) -> None:
    """A cancelled activity (the step's timeout cancelled it) ends the step as a timeout."""
    if isinstance(err.cause, CancelledError):
        raise asyncio.CancelledError() from err


def error_cause(err: ActivityError) -> str:
    cause = err.cause
    return str(cause.message) if isinstance(cause, ApplicationError) else str(cause or err)
