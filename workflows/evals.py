"""EvalWorkflow: replay recorded sessions on a candidate and a baseline (docs/change-safely.md,
Replay against a candidate).

Each recorded session is replayed twice, on the candidate and on the baseline (the
faithful baseline: the unchanged agent run again, so that noise shows), each replay a
``replay`` activity that drives a session of its own; each recorded workflow-agent step
(``recorded_steps``) likewise, a ``replay_step`` activity running its input as a step of
its own (no handoff); at most ``concurrency`` replays run at
once. When both replays of a session are done their comparison is written into the eval's
report (``record_replays``) before that session counts as done, so a worker lost mid-eval
costs only the replays in flight: Temporal's history holds the finished ones, and a
retried replay continues its own session. A cancel cancels the replays in flight and their
sessions, and ends the eval ``cancelled``.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Literal

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.evals import EvalActivities
    from baton.contracts.activity_io import (
        EvalEnd,
        JudgeInput,
        ReplayInput,
        ReplayOutcome,
        ReplayPair,
    )
    from baton.contracts.values import ResolvedAgent
    from baton.contracts.workflow_io import EvalInput

from workflows.calls import error_cause
from workflows.options import STORE_RETRY, heartbeat_timeout, store_timeout

#: A replay sends a whole recorded conversation: its start-to-close.
REPLAY_TIMEOUT = timedelta(hours=6)
#: Replays attach to what an earlier attempt started (ids derive from the eval), so a
#: retry is safe; a lost worker's replay is retried after the heartbeat timeout.
REPLAY_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=20,
)

#: One judge call (a model request) and its retries: a reply that is no verdict, or a
#: provider's failure, is asked again a few times, then the eval fails.
JUDGE_TIMEOUT = timedelta(minutes=5)
JUDGE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=3,
    non_retryable_error_types=["unknown_judge"],
)


class _Replays:
    """The replays of one eval: each recorded item replayed on both sides, at most
    ``inp.concurrency`` replays at once, then its comparison written (and judged)."""

    def __init__(self, inp: EvalInput) -> None:
        self._inp = inp
        self._slots = asyncio.Semaphore(inp.concurrency)
        self._writing = asyncio.Lock()  # one writer of the report at a time (read, then write)

    async def replay(
        self, recorded: str, side: str, ref: str, agent: ResolvedAgent | None, kind: str
    ) -> ReplayOutcome:
        """One side's replay of ``recorded`` (a ``replay_step`` for a step), once a slot is
        free."""
        inp = self._inp
        method = EvalActivities.replay_step if kind == "step" else EvalActivities.replay
        async with self._slots:
            outcome: ReplayOutcome = await workflow.execute_activity_method(
                method,
                ReplayInput(
                    eval_id=inp.eval_id,
                    recorded=recorded,
                    side=side,
                    ref=ref,
                    agent=agent,
                    user=inp.user,
                    task_queue=inp.task_queue,
                    config=inp.config,
                ),
                start_to_close_timeout=REPLAY_TIMEOUT,
                heartbeat_timeout=heartbeat_timeout(inp.config),
                retry_policy=REPLAY_RETRY,
                cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
                summary=f"{side} · {recorded}",
            )
            return outcome

    async def compare(self, recorded: str, kind: Literal["session", "step"] = "session") -> None:
        """Replay ``recorded`` on the baseline and the candidate together, then write the
        pair into the report and, when the eval has a judge, have it judged."""
        inp = self._inp
        baseline, candidate = await asyncio.gather(
            self.replay(recorded, "baseline", inp.baseline, inp.baseline_agent, kind),
            self.replay(recorded, "candidate", inp.candidate, inp.candidate_agent, kind),
        )
        async with self._writing:
            await workflow.execute_activity_method(
                EvalActivities.record_replays,
                ReplayPair(
                    eval_id=inp.eval_id,
                    recorded=recorded,
                    baseline=baseline,
                    candidate=candidate,
                    kind=kind,
                ),
                start_to_close_timeout=store_timeout(inp.config),
                retry_policy=STORE_RETRY,
                summary=f"record · {recorded}",
            )
            if inp.judge is not None:
                # 👉 Only an eval asked for a judge issues this command (`judge`
                # defaults to None), so earlier evals replay unchanged: no patch.
                await self.judge(recorded, inp.judge)

    async def judge(self, recorded: str, model: str) -> None:
        """Have ``model`` judge the written comparison of ``recorded``."""
        inp = self._inp
        await workflow.execute_activity_method(
            EvalActivities.judge_replays,
            JudgeInput(
                eval_id=inp.eval_id,
                recorded=recorded,
                agent_slug=inp.baseline.partition("@")[0],
                judge=model,
                prices=inp.config.prices,
            ),
            start_to_close_timeout=JUDGE_TIMEOUT,
            heartbeat_timeout=heartbeat_timeout(inp.config),
            retry_policy=JUDGE_RETRY,
            summary=f"judge · {recorded}",
        )


@workflow.defn(name="Eval")
class EvalWorkflow:
    """An eval. Input: :class:`EvalInput`; result: its final status."""

    @workflow.run
    async def run(self, inp: EvalInput) -> str:
        """Replay every recorded session on both sides, record each, end the eval."""
        replays = _Replays(inp)
        try:
            # 👉 Step replays are commands only an eval that recorded steps issues: an
            # eval started before them has none (`recorded_steps` defaults to empty), so
            # its history replays unchanged and no patch gate is needed.
            await asyncio.gather(
                *(replays.compare(r) for r in inp.recorded),
                *(replays.compare(r, "step") for r in inp.recorded_steps),
            )
        except (asyncio.CancelledError, ActivityError) as err:
            # A cancel of this workflow reaches here as whatever the first replay to stop
            # raised: a cancelled activity's ActivityError, or a replay that failed while
            # the cancel was under way. The cancel request, not the error, decides.
            if workflow.cancellation_reason() is None:
                if not isinstance(err, ActivityError):
                    raise
                await self._end(inp, "failed", error_cause(err))
                return "failed"
            await workflow.execute_activity_method(
                EvalActivities.cancel_replays,
                inp.eval_id,
                start_to_close_timeout=timedelta(minutes=2),
                retry_policy=STORE_RETRY,
                summary="cancel replays",
            )
            await self._end(inp, "cancelled", None)
            raise asyncio.CancelledError("the eval was cancelled") from err
        await self._end(inp, "completed", None)
        return "completed"

    async def _end(self, inp: EvalInput, status: str, error: str | None) -> None:
        await workflow.execute_activity_method(
            EvalActivities.finish_eval,
            EvalEnd(eval_id=inp.eval_id, status=status, error=error),
            start_to_close_timeout=store_timeout(inp.config),
            retry_policy=STORE_RETRY,
            summary=status,
        )
