"""AgentStepWorkflow: one published agent run as a workflow-agent step (Xema Agent
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
from typing import Any, NoReturn

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError

with workflow.unsafe.imports_passed_through():
    from activities.steps import StepActivities
    from activities.turns import SessionActivities
    from baton.contracts.activity_io import (
        DeliverableCheck,
        DeliverableResult,
        EditCheck,
        LoadAgentInput,
        StepUpdate,
    )
    from baton.contracts.codes import (
        ATTEMPT_FAILED,
        HANDOFF_TIMEOUT,
        INVALID_DELIVERABLE,
        STEP_REJECTED,
        STEP_TIMEOUT,
        TOO_MANY_ATTEMPTS,
    )
    from baton.contracts.search import SA_AGENT, SA_STATUS
    from baton.contracts.values import ResolvedAgent, StepStatus
    from baton.contracts.workflow_io import HandoffDecision, StepInput, from_signal
    from baton.runs.handoff import REVISE_PROMPT, status_after
    from baton.temporal_ui import md_text

from workflows.calls import (
    error_cause,
    model_turn_input,
    run_ordinary_tool,
    tool_message,
    usable_tools,
)
from workflows.options import STORE_RETRY, heartbeat_timeout, store_timeout

#: Attempts a step may make in all, revisions included (a handoff loop ends here).
MAX_TOTAL_ATTEMPTS = 50
#: Characters of the last output shown in the step's current details.
DETAILS_PREVIEW_CHARS = 200
#: Patch id: an approve's edited deliverable is checked against the output schema in the
#: workflow too (a Signal sent straight to Temporal bypasses the API's check). Runs that
#: received an edit before it replay without the check.
EDIT_CHECK_PATCH = "handoff-edit-checked"
#: Refused edits kept for the ``status`` query (the newest).
MAX_REFUSED_EDITS = 10


@workflow.defn(name="AgentStep")
class AgentStepWorkflow:
    """A workflow-agent step. Input: :class:`StepInput`; result: the final status."""

    @workflow.init
    def __init__(self, inp: StepInput) -> None:
        self._inp = inp
        self._status: StepStatus = "running"
        self._attempts = 0
        self._decision: HandoffDecision | None = None
        # What the current details show: the last output's preview and, while a handoff
        # waits, its deadline.
        self._last_output = ""
        self._handoff_deadline: datetime | None = None
        self._error: str | None = None
        # While an approve's edit is checked: the next decision received meanwhile, kept
        # for the wait if the edit is refused (the first one received still wins).
        self._checking = False
        self._next: HandoffDecision | None = None
        #: Edited deliverables refused (newest last): why, for the `status` query.
        self._refused_edits: list[str] = []

    @workflow.query(name="status")
    def status(self) -> dict[str, Any]:
        """``{status, attempts, handoff_deadline, refused_edits}``: the deadline (ISO 8601,
        UTC) of the handoff it waits for, else null; why each of the newest approves whose
        edited deliverable was refused was ignored. A query is no command: no history
        changes."""
        deadline = self._handoff_deadline
        return {
            "status": self._status,
            "attempts": self._attempts,
            "handoff_deadline": deadline.isoformat() if deadline is not None else None,
            "refused_edits": list(self._refused_edits),
        }

    @workflow.signal(name="handoff")
    def handoff(self, raw: Any) -> None:
        """A human's decision on the deliverable; only while it awaits one (first wins).

        ``raw``: the JSON of a :class:`HandoffDecision`, parsed here (a Signal handler never
        raises): fields it does not know are dropped, a bad value ignores the Signal.
        """
        decision = from_signal(HandoffDecision, raw)
        if decision is None:
            workflow.logger.warning("handoff: ignored a Signal that is no decision")
            return
        if self._status == "awaiting_handoff" and self._decision is None:
            self._decision = decision
        elif self._checking and self._next is None:
            self._next = decision  # the wait takes it if the edit being checked is refused

    @workflow.run
    async def run(self, inp: StepInput) -> str:
        """Run attempts until a deliverable is accepted, rejected, or the step fails."""
        try:
            if inp.timeout_s is not None:
                return await asyncio.wait_for(self._run(inp), timeout=inp.timeout_s)
            return await self._run(inp)
        except TimeoutError:
            await self._end(
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
            await self._attempt_failed(err)
        prompt = _first_prompt(inp)
        while True:
            self._attempts += 1
            if self._attempts > MAX_TOTAL_ATTEMPTS:
                await self._end("failed", TOO_MANY_ATTEMPTS, error="too many attempts")
            self._show()
            checked = await self._deliver(agent, prompt)
            if not checked.ok:
                prompt = await self._invalid(checked)
                continue
            if not inp.handoff:
                return await self._complete(checked.deliverable)
            decision = await self._await_handoff(checked.deliverable)
            after = status_after(decision)
            if after == "completed":
                # An approve may carry the reviewer's edit (checked against the output
                # schema by the API and by `_edit_refused`); without one the agent's
                # deliverable stands.
                edited = decision.edited_deliverable
                return await self._complete(checked.deliverable if edited is None else edited)
            if after == "rejected":
                await self._end(
                    "rejected",
                    STEP_REJECTED,
                    deliverable=checked.deliverable,
                    error=decision.feedback,
                )
            self._status = after
            await self._update(after, deliverable=checked.deliverable)
            prompt = f"{REVISE_PROMPT}{decision.feedback or '(none given)'}"

    async def _deliver(self, agent: ResolvedAgent, prompt: str) -> DeliverableResult:
        """One attempt, then its final message checked against the output schema; a
        failed attempt or check ends the step (``attempt_failed``)."""
        inp = self._inp
        try:
            message_id = await self._attempt(agent, self._attempts, prompt)
        except ActivityError as err:
            await self._attempt_failed(err)
        except ApplicationError as err:
            await self._end("failed", ATTEMPT_FAILED, error=str(err.message))
        try:
            checked: DeliverableResult = await workflow.execute_activity_method(
                StepActivities.check_deliverable,
                DeliverableCheck(
                    step_id=inp.step_id, message_id=message_id, output_schema=inp.output_schema
                ),
                start_to_close_timeout=store_timeout(inp.config),
                retry_policy=STORE_RETRY,
                summary=f"check deliverable · attempt {self._attempts}",
            )
        except ActivityError as err:
            await self._attempt_failed(err)
        return checked

    async def _invalid(self, checked: DeliverableResult) -> str:
        """An invalid deliverable: after the request's backoff, the next attempt's prompt
        with the validation errors; after ``max_attempts``, the step ends
        ``invalid_deliverable``."""
        errors = "\n".join(f"- {e}" for e in checked.errors)
        if self._attempts >= self._inp.retry.max_attempts:
            await self._end(
                "failed",
                INVALID_DELIVERABLE,
                error=f"{INVALID_DELIVERABLE}: after {self._attempts} attempts:\n{errors}",
            )
        await self._update("running")
        await workflow.sleep(
            self._inp.retry.delay(self._attempts),
            summary=f"backoff after attempt {self._attempts}",
        )
        return (
            "Your deliverable does not validate against the required JSON Schema:\n"
            f"{errors}\nReply again with only the corrected JSON."
        )

    async def _await_handoff(self, deliverable: Any) -> HandoffDecision:
        """Store ``awaiting_handoff`` and wait for Signal ``handoff`` up to the handoff
        timeout; without a decision by then the step ends ``handoff_timeout``."""
        inp = self._inp
        # Clear before the write: once the row says awaiting_handoff, a decision can land.
        self._decision = None
        wait = timedelta(seconds=inp.handoff_timeout_s)
        self._handoff_deadline = workflow.now() + wait
        await self._update("awaiting_handoff", deliverable=deliverable)
        deadline = self._handoff_deadline
        while True:
            try:
                await workflow.wait_condition(
                    lambda: self._decision is not None, timeout=wait, timeout_summary="handoff"
                )
            except TimeoutError:
                self._handoff_deadline = None
                await self._end(
                    "failed",
                    HANDOFF_TIMEOUT,
                    deliverable=deliverable,
                    error=f"{HANDOFF_TIMEOUT}: no decision within {inp.handoff_timeout_s:g} s",
                )
            assert self._decision is not None
            if not await self._edit_refused(self._decision):
                break
            # Ignored: the step still awaits a decision until the same deadline.
            self._decision, self._next = self._next, None
            wait = max(deadline - workflow.now(), timedelta(milliseconds=1))
        self._handoff_deadline = None
        return self._decision

    async def _edit_refused(self, decision: HandoffDecision) -> bool:
        """Whether ``decision`` is an approve whose edited deliverable the output schema
        refuses (:func:`baton.runs.deliverables.check_edit` in the
        ``check_edited_deliverable`` activity, the check the API makes before it signals):
        a Signal sent straight to Temporal. A refused one is ignored and recorded (the
        ``status`` query's ``refused_edits``, the log, the current details), never the
        step's deliverable; a check that fails for good refuses it too."""
        if decision.decision != "approve" or decision.edited_deliverable is None:
            return False
        if not workflow.patched(EDIT_CHECK_PATCH):
            return False  # received before the check existed: replays as it ran
        self._checking = True
        try:
            checked: DeliverableResult = await workflow.execute_activity_method(
                StepActivities.check_edited_deliverable,
                EditCheck(
                    step_id=self._inp.step_id,
                    decision=decision,
                    output_schema=self._inp.output_schema,
                ),
                start_to_close_timeout=store_timeout(self._inp.config),
                retry_policy=STORE_RETRY,
                summary="check edited deliverable",
            )
        except ActivityError as err:
            _reraise_cancel(err)  # the step's timeout ends it as a timeout, not as a refusal
            checked = DeliverableResult(ok=False, errors=[error_cause(err)])
        finally:
            self._checking = False
        if checked.ok:
            return False
        why = f"an approve's edited deliverable was refused: {'; '.join(checked.errors)}"
        workflow.logger.warning("handoff: %s", why)
        self._refused_edits.append(why[: DETAILS_PREVIEW_CHARS * 2])
        del self._refused_edits[:-MAX_REFUSED_EDITS]
        self._show()
        return True

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
            # failures itself and fails for good after max_attempts of them.
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
                        usable_tools(agent),
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
        attrs = workflow.info().typed_search_attributes
        if attrs.get(SA_AGENT) is not None and attrs.get(SA_STATUS) != status:
            workflow.upsert_search_attributes([SA_STATUS.value_set(status)])
        await workflow.execute_activity_method(
            StepActivities.update_step,
            StepUpdate(
                step_id=self._inp.step_id,
                status=status,
                attempts=self._attempts,
                deliverable=deliverable,
                error=error,
                # An input field, no command: runs in flight replay unchanged.
                handoff_deadline=self._handoff_deadline if status == "awaiting_handoff" else None,
            ),
            start_to_close_timeout=store_timeout(self._inp.config),
            retry_policy=STORE_RETRY,
            summary=status,
        )

    async def _complete(self, deliverable: Any) -> str:
        """Store the step ``completed`` with its deliverable; the workflow's result."""
        await self._update("completed", deliverable=deliverable)
        return "completed"

    async def _end(
        self,
        status: StepStatus,
        code: str,
        *,
        deliverable: Any = None,
        error: str | None = None,
    ) -> NoReturn:
        """Store a ``failed`` or ``rejected`` end, then fail the workflow.

        The row is written first: the API reads the row, never the workflow's result. The
        failure is an ``ApplicationError`` whose type is ``code`` (``invalid_deliverable``,
        ``handoff_timeout``, ``step_timeout``, ``step_rejected``, ``too_many_attempts``,
        ``attempt_failed``), non-retryable, with ``{step_id, status, attempts}`` as details:
        the Temporal UI lists the step under ExecutionStatus = "Failed".
        """
        await self._update(status, deliverable=deliverable, error=error)
        raise ApplicationError(
            error or status,
            {"step_id": self._inp.step_id, "status": status, "attempts": self._attempts},
            type=code,
            non_retryable=True,
        )

    async def _attempt_failed(self, err: ActivityError) -> NoReturn:
        """An activity of the attempt failed for good: the step ends ``attempt_failed``
        (a cancelled one, by the step's timeout, ends it as a timeout)."""
        _reraise_cancel(err)
        await self._end("failed", ATTEMPT_FAILED, error=error_cause(err))

    def _show(self) -> None:
        """Set the current details the Temporal UI shows: status and attempt, the last
        output's preview, the pending handoff with its deadline, the error of a failed
        step. Metadata, not a command."""
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
        if self._refused_edits and self._handoff_deadline is not None:
            lines.append(f"Ignored {md_text(self._refused_edits[-1][:DETAILS_PREVIEW_CHARS])}")
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
