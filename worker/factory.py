"""One factory for the Temporal client and Worker, used by `baton worker`, `baton dev`,
`make demo` and the tests, so they all run the same registrations."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sqlalchemy.engine import Engine
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Interceptor, Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from activities.delegation import DelegationActivities
from activities.external import ExternalActivities
from activities.mcp_tools import McpToolActivities
from activities.session import SessionActivities
from activities.steps import StepActivities
from activities.xagent import XAgentActivities
from baton.contracts import SEARCH_ATTRIBUTES
from baton.settings import DEV_REVIEW_KEY, Settings
from workflows.session import SessionWorkflow
from workflows.step import AgentStepWorkflow

#: Modules the workflow sandbox imports once instead of per run. Each is pure
#: (no I/O at import) and only its pure parts run inside workflow code:
PASSTHROUGH = (
    "baton",  # contracts, spec and errors: pydantic models crossing the boundary
    "activities",  # referenced for activity method names/types, never executed in workflows
    "pydantic_ai",  # imported by activities; heavy, not used by workflow code
    "sqlalchemy",  # imported by activities/baton.db; not used by workflow code
    "sqlmodel",
    "regex",
    "jsonschema",
)

WORKFLOWS = [SessionWorkflow, AgentStepWorkflow]


def activities_for(
    engine: Engine, client: Client, *, review_key: bytes = DEV_REVIEW_KEY
) -> list[Callable[..., Any]]:
    """The activity callables bound to ``engine`` (and ``client``, for delegations);
    ``review_key`` (Settings.review_key) verifies and signs review-decision proofs."""
    acts = SessionActivities(engine)
    xagent = XAgentActivities(engine, client, review_key=review_key)
    delegation = DelegationActivities(engine, client)
    steps = StepActivities(engine)
    external = ExternalActivities(engine)  # issue 13: external sessions
    mcp_tools = McpToolActivities(engine)  # issue 13: MCP servers as agents' tools
    return [
        acts.load_agent,
        acts.model_turn,
        acts.run_tool,
        acts.record_failure,
        acts.set_status,
        xagent.authorize,
        xagent.settle_review,
        xagent.refuse_tool,
        xagent.xagent_tool,
        delegation.delegate,
        delegation.cancel_delegations,
        delegation.route_turn,
        steps.check_deliverable,
        steps.update_step,
        external.record_external_message,
        mcp_tools.mcp_tool,
    ]


async def connect(settings: Settings) -> Client:
    """A Temporal client for ``settings`` with the pydantic data converter."""
    return await Client.connect(
        settings.temporal_address,
        namespace=settings.temporal_namespace,
        data_converter=pydantic_data_converter,
    )


def build_worker(
    client: Client,
    *,
    engine: Engine,
    task_queue: str,
    max_concurrent_activities: int = 2048,
    activity_threads: int = 64,
    interceptors: Sequence[Interceptor] = (),
    review_key: bytes = DEV_REVIEW_KEY,
) -> Worker:
    """The Baton worker for ``task_queue``: workflows, activities, sandbox passthrough.

    ``interceptors`` are added to the worker's (the fault tests use one to kill the
    process at an exact point). ``review_key`` must be the API's
    (``Settings.review_key()``, as run_services passes it): with another key every
    API decision is recorded as unverified.
    """
    # Deliberate: many slots (async delegations wait in them) over a small thread pool.
    warnings.filterwarnings("ignore", message="Worker max_concurrent_activities is")
    return Worker(
        client,
        task_queue=task_queue,
        workflows=WORKFLOWS,
        activities=activities_for(engine, client, review_key=review_key),
        # Slots are many because a sync delegation holds one while its child runs (async,
        # no thread); blocking DB activities share the thread pool and queue there instead.
        activity_executor=ThreadPoolExecutor(max_workers=activity_threads),
        max_concurrent_activities=max_concurrent_activities,
        interceptors=interceptors,
        workflow_runner=SandboxedWorkflowRunner(
            restrictions=SandboxRestrictions.default.with_passthrough_modules(*PASSTHROUGH)
        ),
    )


async def ensure_search_attributes(client: Client, namespace: str) -> list[str]:
    """Register Baton's Keyword search attributes that are missing; returns those added."""
    existing = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=namespace)
    )
    missing = [k.name for k in SEARCH_ATTRIBUTES if k.name not in existing.custom_attributes]
    if missing:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(
                namespace=namespace,
                search_attributes={
                    name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD for name in missing
                },
            )
        )
    return missing
