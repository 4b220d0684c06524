"""The eval's activities (docs/change-safely.md, Replay against a candidate): a replay of
one recorded session (or one recorded workflow-agent step) on one side, the report
written as each item's two replays end, the eval's end, and the cancel of its replays.

A replay drives a session of its own through the Temporal client, as the API would: its
first user message starts it (update-with-start), each next one is sent once the one
before is answered. The session's id derives from the eval, the recording and the side
(:func:`baton.evals.replay.replay_session_id`), so a retried replay (its worker was lost)
continues the session its first attempt started from the first user message not yet
stored, and never starts a second one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

from pydantic_ai.exceptions import UserError
from pydantic_ai.messages import ModelRequest, SystemPromptPart, UserPromptPart
from pydantic_ai.models import ModelRequestParameters
from sqlalchemy.engine import Engine
from sqlmodel import select
from temporalio import activity
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from activities.outcomes import cancel_requested, heartbeating
from activities.turns import reply_usage
from baton.contracts.activity_io import (
    EvalEnd,
    JudgeInput,
    ReplayInput,
    ReplayOutcome,
    ReplayPair,
)
from baton.contracts.values import CLOSED_STATUSES, Usage
from baton.contracts.workflow_io import Provenance, StepInput, StepRetry
from baton.errors import SessionClosed, TurnFailed
from baton.evals import compare, judge, replay
from baton.providers.models import build_model
from baton.runs import launch, metering, session_store
from baton.storage.db import EvalRow, MessageRow, SessionRow, StepRow, session_scope, utcnow

#: Seconds between two looks at a replay session still answering (a retried replay waits
#: for the turn its lost attempt sent).
SETTLE_POLL_S = 0.2


class EvalActivities:
    """The eval's activities, bound to the database and the Temporal client."""

    def __init__(self, engine: Engine, client: Client) -> None:
        self._engine = engine
        self._client = client

    def _progress(self, session_id: str) -> tuple[str | None, int]:
        """The replay session's status (None: not recorded yet) and its stored user turns."""
        with session_scope(self._engine) as s:
            row = s.get(SessionRow, session_id)
            if row is None:
                return None, 0
            sent = len(
                s.exec(
                    select(MessageRow.id).where(
                        MessageRow.session_id == session_id, MessageRow.role == "user"
                    )
                ).all()
            )
            return row.status, sent

    def _turns_and_name(self, recorded: str) -> tuple[list[str], str]:
        with session_scope(self._engine) as s:
            row = session_store.get_session(s, session_id=recorded)
            return replay.user_turns(s, session_id=recorded), f"Eval · {row.name}"[:200]

    async def _settled(self, session_id: str) -> tuple[str | None, int]:
        """The replay session once no turn of it runs (its status is not ``running``); a
        row recorded by an attempt lost before its workflow started reads as not started."""
        while True:
            status, sent = await asyncio.to_thread(self._progress, session_id)
            if status != "running":
                return status, sent
            if sent == 0 and not await self._started(session_id):
                return None, 0
            await asyncio.sleep(SETTLE_POLL_S)

    async def _started(self, session_id: str) -> bool:
        try:
            await self._client.get_workflow_handle(session_id).describe()
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                return False
            raise
        return True

    @activity.defn(name="replay")
    async def replay(self, inp: ReplayInput) -> ReplayOutcome:
        """Replay ``inp.recorded``'s user turns on ``inp.ref``, one turn after the other, in
        the replay session of this eval and side; what it did (:class:`ReplayOutcome`).
        A turn that fails is recorded in the replay's transcript (its error) and the next
        one is sent; a cancelled eval cancels the replay session. Heartbeats throughout."""
        sid = replay.replay_session_id(inp.eval_id, inp.recorded, inp.side)
        turns, name = await asyncio.to_thread(self._turns_and_name, inp.recorded)
        prov = Provenance(
            created_by_user=inp.user,
            sandbox=inp.agent is not None,
            eval_id=inp.eval_id,
            replay_of=inp.recorded,
        )
        try:
            async with heartbeating():
                status, sent = await self._settled(sid)
                if status not in CLOSED_STATUSES:
                    await self._send(inp, sid, name, prov, turns, sent)
        except asyncio.CancelledError:
            if cancel_requested():  # the eval was cancelled, not this attempt cut off
                with contextlib.suppress(Exception):
                    await launch.cancel_session(self._client, self._engine, session_id=sid)
            raise
        return await asyncio.to_thread(self._facts, sid)

    async def _send(
        self,
        inp: ReplayInput,
        sid: str,
        name: str,
        prov: Provenance,
        turns: list[str],
        sent: int,
    ) -> None:
        """Send ``turns[sent:]`` (``sent``: the user turns the session already stored)."""
        for index in range(sent, len(turns)):
            update_id = f"{sid}:message-{index + 1}"
            try:
                if index == 0:
                    await launch.launch_session(
                        self._client,
                        self._engine,
                        task_queue=inp.task_queue,
                        config=inp.config,
                        ref=inp.ref,
                        prompt=turns[0],
                        provenance=prov,
                        sync=True,
                        name=name,
                        session_id=sid,
                        update_id=update_id,
                        agent=inp.agent,
                    )
                else:
                    await launch.send_message(
                        self._client,
                        self._engine,
                        session_id=sid,
                        prompt=turns[index],
                        sync=True,
                        update_id=update_id,
                        user=inp.user,
                    )
            except TurnFailed:
                continue  # its error is the replay's transcript's; the next turn goes on
            except SessionClosed:
                return

    def _facts(self, sid: str) -> ReplayOutcome:
        with session_scope(self._engine) as s:
            if s.get(SessionRow, sid) is None:  # a recording with no user turn
                return ReplayOutcome(session_id=sid)
            f = replay.facts(s, session_id=sid)
            return ReplayOutcome(
                session_id=sid,
                final=f.final,
                tools=f.tools,
                decisions=f.decisions,
                tokens=f.tokens,
                cost_usd=f.cost_usd,
                latency_ms=f.latency_ms,
                error=f.error,
            )

    def _step_input(self, inp: ReplayInput, sid: str) -> StepInput:
        """The recorded step's input and policy, as a step of this eval's side: no handoff
        (a person is never asked in an eval)."""
        with session_scope(self._engine) as s:
            row = s.get(StepRow, inp.recorded)
            if row is None:
                msg = f"recorded step '{inp.recorded}' is gone"
                raise ApplicationError(msg, type="unknown_steps", non_retryable=True)
            return StepInput(
                step_id=sid,
                agent_pin=inp.ref,
                input=row.input,
                output_schema=row.output_schema,
                retry=StepRetry.model_validate(row.retry or {}),
                handoff=False,
                timeout_s=row.timeout_s,
                config=inp.config,
                user=inp.user,
            )

    @activity.defn(name="replay_step")
    async def replay_step(self, inp: ReplayInput) -> ReplayOutcome:
        """Replay recorded step ``inp.recorded``'s input on ``inp.ref`` as a step of its own
        (its output schema, its attempts with validation feedback, no handoff) and wait for
        it to end; what it did (:class:`ReplayOutcome` with ``deliverable_valid``: it
        completed, so its deliverable passed the schema; ``deliverable``, ``attempts``). The
        step's id derives from the eval, the recording and the side
        (:func:`baton.evals.replay.replay_step_id`), so a retried replay attaches to the
        step its first attempt started, finished or not. A cancelled eval cancels it.
        Heartbeats throughout."""
        sid = replay.replay_step_id(inp.eval_id, inp.recorded, inp.side)
        step = await asyncio.to_thread(self._step_input, inp, sid)
        prov = Provenance(
            created_by_user=inp.user,
            sandbox=inp.agent is not None,
            eval_id=inp.eval_id,
            replay_of=inp.recorded,
        )
        handle = self._client.get_workflow_handle(sid)
        try:
            async with heartbeating():
                await launch.launch_step(
                    self._client,
                    self._engine,
                    task_queue=inp.task_queue,
                    inp=step,
                    ref=inp.ref,
                    keyed=True,
                    provenance=prov,
                    agent=inp.agent,
                )
                with contextlib.suppress(WorkflowFailureError):
                    await handle.result()  # a failed step is a finding, read from its row
        except asyncio.CancelledError:
            if cancel_requested():  # the eval was cancelled, not this attempt cut off
                with contextlib.suppress(Exception):
                    await launch.cancel_run(self._client, workflow_id=sid)
            raise
        return await asyncio.to_thread(self._step_facts, sid)

    def _step_facts(self, sid: str) -> ReplayOutcome:
        with session_scope(self._engine) as s:
            row = s.get(StepRow, sid)
            f = replay.facts(s, session_id=sid)
            if row is None:  # pragma: no cover - launch_step recorded it
                return ReplayOutcome(session_id=sid)
            valid = row.status == "completed"
            final = (
                json.dumps(row.deliverable, ensure_ascii=False, sort_keys=True)
                if valid and row.output_schema is not None
                else f.final
            )
            return ReplayOutcome(
                session_id=sid,
                final=final[: replay.MAX_FINAL_CHARS],
                tools=f.tools,
                decisions=f.decisions,
                deliverable_valid=valid,
                deliverable=row.deliverable if valid else None,
                attempts=row.attempts,
                tokens=f.tokens,
                cost_usd=f.cost_usd,
                latency_ms=f.latency_ms,
                error=None if valid else (row.error or f.error or row.status)[:1000],
            )

    @activity.defn(name="record_replays")
    def record_replays(self, pair: ReplayPair) -> None:
        """Write one recorded session's comparison into the eval's report (in the order of
        the eval's recorded sessions), with partial totals, ``done``, ``changed`` and
        ``regressions``. Idempotent (a session's entry is replaced); nothing once the eval
        has ended."""
        with session_scope(self._engine) as s:
            row = s.get(EvalRow, pair.eval_id)
            if row is None or row.status != "running":
                return
            if pair.kind == "step":
                recorded = s.get(StepRow, pair.recorded)
                outcome = replay.handoff_outcome(s, step=recorded) if recorded else "none"
                item = compare.compare_step(pair.recorded, outcome, pair.baseline, pair.candidate)
            else:
                item = compare.compare_session(pair.recorded, pair.baseline, pair.candidate)
            picked = [*row.options.get("session_ids", []), *row.options.get("step_ids", [])]
            order = {sid: i for i, sid in enumerate(picked)}
            kept = [
                x
                for x in (row.report or {}).get("sessions", [])
                if x["session_id"] != pair.recorded
            ]
            sessions = sorted([*kept, item], key=lambda x: order.get(x["session_id"], len(order)))
            _write(row, sessions)
            s.add(row)

    def _judged_item(self, inp: JudgeInput) -> dict[str, Any] | None:
        """The report item of ``inp.recorded`` when it changed and has no verdict yet, once
        the balance admits the judge's call (:func:`baton.runs.metering.admit_call`)."""
        with session_scope(self._engine) as s:
            row = s.get(EvalRow, inp.eval_id)
            if row is None or row.status != "running":
                return None
            for item in (row.report or {}).get("sessions", []):
                if item["session_id"] == inp.recorded:
                    if not item["changed"] or item["final"].get("judge") is not None:
                        return None
                    metering.admit_call(s)
                    return dict(item)
            return None

    @activity.defn(name="judge_replays")
    async def judge_replays(self, inp: JudgeInput) -> str | None:
        """Ask the judge model (:mod:`baton.evals.judge`) about one changed item of the
        report and write its ``{verdict, reason}`` into ``final.judge`` (a "worse" makes the
        item a regression); the verdict, or None when the item did not change, was judged
        already or the eval has ended. The call is metered to the eval (usage row of
        session id the eval's id, once per item) and charged to the balance. A reply that
        is no verdict fails the activity (Temporal retries it); an unbuildable model fails
        it for good."""
        item = await asyncio.to_thread(self._judged_item, inp)
        if item is None:
            return None
        try:
            model = build_model(inp.judge, playbook=None, agent_slug="judge")
        except UserError as exc:
            raise ApplicationError(str(exc), type="unknown_judge", non_retryable=True) from exc
        request = ModelRequest(
            parts=[SystemPromptPart(judge.INSTRUCTIONS), UserPromptPart(judge.prompt(item))]
        )
        started = time.monotonic()
        async with heartbeating():
            response = await model.request([request], None, ModelRequestParameters())
        usage = reply_usage(response, inp.prices, inp.judge, started)
        await asyncio.to_thread(self._meter_judge, inp, usage)
        verdict = judge.parse(response.text or "")
        await asyncio.to_thread(self._write_verdict, inp, verdict)
        return verdict.verdict

    def _meter_judge(self, inp: JudgeInput, usage: Usage) -> None:
        """Meter the judge's call to the eval once (a retried one finds its row)."""
        with session_scope(self._engine) as s:
            metering.record(
                s,
                message_id=f"{inp.eval_id}:judge:{inp.recorded}",
                agent=inp.agent_slug,
                session_id=inp.eval_id,
                model=inp.judge,
                input_tokens=usage.input_tokens,
                output_tokens=usage.output_tokens,
                cost_usd=usage.cost_usd,
            )

    def _write_verdict(self, inp: JudgeInput, verdict: judge.Verdict) -> None:
        with session_scope(self._engine) as s:
            row = s.get(EvalRow, inp.eval_id)
            if row is None or row.status != "running":
                return
            sessions = [dict(x) for x in (row.report or {}).get("sessions", [])]
            for item in sessions:
                if item["session_id"] == inp.recorded:
                    item["final"] = {**item["final"], "judge": verdict.model_dump()}
                    item["regression"] = item["regression"] or verdict.verdict == "worse"
            _write(row, sessions)
            s.add(row)

    @activity.defn(name="finish_eval")
    def finish_eval(self, end: EvalEnd) -> None:
        """End the eval: its status, ``finished_at`` and error (an eval already ended keeps
        its end)."""
        with session_scope(self._engine) as s:
            row = s.get(EvalRow, end.eval_id)
            if row is None or row.status != "running":
                return
            row.status = end.status
            row.error = end.error[:1000] if end.error else None
            row.finished_at = utcnow()
            _write(row, (row.report or {}).get("sessions", []))
            s.add(row)

    @activity.defn(name="cancel_replays")
    async def cancel_replays(self, eval_id: str) -> list[str]:
        """Cancel every replay session of ``eval_id`` still open; their ids."""

        def open_replays() -> list[str]:
            with session_scope(self._engine) as s:
                return [
                    r.id
                    for r in replay.eval_sessions(s, eval_id=eval_id)
                    if r.status not in CLOSED_STATUSES
                ]

        ids = await asyncio.to_thread(open_replays)
        for sid in ids:
            if sid.startswith("step-"):  # a step replay's transcript row: cancel the step
                await launch.cancel_run(self._client, workflow_id=sid)
            else:
                await launch.cancel_session(self._client, self._engine, session_id=sid)
        return ids


def _write(row: EvalRow, sessions: list[dict[str, object]]) -> None:
    """The eval's report and counters from its finished sessions."""
    report = compare.report(sessions)
    row.report = report
    row.done = len(sessions)
    row.changed = report["totals"]["changed"]
    row.regressions = report["totals"]["regressions"]
