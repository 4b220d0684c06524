"""A session run's start and ends other than continue-as-new and idle completion: the
pinned agent loaded once, a cancel recorded and cascaded, a pin that no longer loads.
"""

from __future__ import annotations

import contextlib

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.delegate import DelegationActivities
    from activities.turns import SessionActivities
    from baton.contracts.activity_io import LoadAgentInput
    from baton.contracts.values import ResolvedAgent
    from baton.contracts.workflow_io import SessionInput

from workflows.calls import error_cause, local, record_failure, store_status, turn_failure
from workflows.options import STORE_RETRY, store_timeout


async def load_agent(inp: SessionInput) -> ResolvedAgent:
    """The pinned agent (``load_agent``), as a local activity: it runs inside the first
    workflow task, so the first model turn is scheduled by that same task instead of one
    more server round trip. Durable all the same: its result is a history marker."""
    load = LoadAgentInput(session_id=inp.session_id, agent_pin=inp.agent_pin)
    agent: ResolvedAgent = await local(
        SessionActivities.load_agent, load, inp.config, summary=f"load {inp.agent_pin}"
    )
    return agent


async def record_cancel(inp: SessionInput) -> None:
    """Store ``cancelled`` on the session row, then cancel every open session delegated
    from this one (sync or async, any depth). The cascade is best effort: the session
    itself is cancelled whatever it reports."""
    await store_status(inp.session_id, "cancelled", inp.config)
    with contextlib.suppress(ActivityError):
        await workflow.execute_activity_method(
            DelegationActivities.cancel_delegations,
            inp.session_id,
            start_to_close_timeout=store_timeout(inp.config),
            retry_policy=STORE_RETRY,
            summary="cancel delegations",
        )


def unloadable(inp: SessionInput, err: ActivityError) -> str:
    """What the session's details say of a pin that no longer resolves."""
    return f"{inp.agent_pin} cannot run: {error_cause(err)}"


async def record_unloadable(inp: SessionInput, err: ActivityError) -> None:
    """The pin no longer resolves (retired or deleted since launch): record why, and the
    session ``failed``."""
    failure = turn_failure(
        inp.session_id, "", inp.session_id + ":load", "000000.000.3000", error_cause(err), "failed"
    )
    await record_failure(failure, inp.config)
