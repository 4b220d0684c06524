"""How a session run waits to end (docs/sessions.md): continue-as-new when Temporal
suggests it or the turn limit is reached, or complete once idle for ``idle_timeout_s``
after storing where the next run starts.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.turns import SessionActivities
    from baton.contracts.activity_io import ResumePoint
    from baton.contracts.search import SA_AGENT, SA_STATUS
    from baton.contracts.workflow_io import SessionInput

from workflows.options import STORE_RETRY, store_timeout


def continue_as_new_due(inp: SessionInput, turn: int) -> bool:
    """Whether this run should hand over to a new one: ``continue_as_new_after_turns``
    turns ran in it, or Temporal suggests it (history size)."""
    limit = inp.config.continue_as_new_after_turns
    if limit is not None and turn - inp.turn >= limit:
        return True
    return workflow.info().is_continue_as_new_suggested()


async def serve(
    inp: SessionInput,
    *,
    working: Callable[[], bool],
    due: Callable[[], bool],
    carried: Callable[[], SessionInput],
) -> bool:
    """Wait until the run should end: True to continue-as-new, False to complete idle.

    ``working``: a turn, an external call or another handler is in flight; ``due``:
    continue-as-new is due; ``carried``: the next run's input. Idle means nothing in
    flight for ``idle_timeout_s`` seconds in a row (the clock restarts after every turn;
    None: never idle). Before completing, the carried state goes to the session row
    (``record_resume``); a message that arrived meanwhile keeps the run going. One that
    arrives while the completion is in flight makes the server refuse it (unhandled
    message), so this runs again with the message; one that arrives after finds the run
    closed and starts the next (update-with-start).
    """
    idle = inp.config.idle_timeout_s
    if idle is None:
        await workflow.wait_condition(lambda: due() and not working())
        return True
    while True:
        # No idle timer while something is in flight: a long turn or review is not idle.
        await workflow.wait_condition(lambda: not working())
        if due():
            return True
        try:
            await workflow.wait_condition(
                lambda: working() or due(),
                timeout=timedelta(seconds=idle),
                timeout_summary="idle",
            )
            continue
        except TimeoutError:
            pass
        if working():
            continue
        point = carried()
        if not await _record_resume(inp, point):
            continue  # the DB kept refusing: stay up and try again after another idle spell
        # A message, call or signal that came in during the write keeps the run going
        # (and made the stored point stale: it is written again after the next idle spell).
        if working() or carried() != point:
            continue
        if workflow.info().typed_search_attributes.get(SA_AGENT) is not None:
            # Operators find the sessions whose run completed idle: BatonStatus = 'idle'.
            workflow.upsert_search_attributes([SA_STATUS.value_set("idle")])
        return False


async def _record_resume(inp: SessionInput, point: SessionInput) -> bool:
    """Store the next run's input on the session row; False when the DB kept refusing."""
    try:
        await workflow.execute_activity_method(
            SessionActivities.record_resume,
            ResumePoint(input=point, task_queue=workflow.info().task_queue),
            start_to_close_timeout=store_timeout(inp.config),
            retry_policy=STORE_RETRY,
            summary="idle: store the resume point",
        )
    except ActivityError:
        return False
    return True
