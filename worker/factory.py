"""One factory for the Temporal client and Worker, used by `baton worker`, `baton dev`,
`make demo` and the tests, so they all run the same registrations."""

from __future__ import annotations

import asyncio
import importlib.abc
import importlib.machinery
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from types import CodeType
from typing import Any, ClassVar

from sqlalchemy.engine import Engine
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.client import Client
from temporalio.common import VersioningBehavior, WorkerDeploymentVersion
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.envconfig import ClientConfigProfile, ClientConnectConfig
from temporalio.runtime import Runtime
from temporalio.service import TLSConfig
from temporalio.worker import Interceptor, Worker, WorkerDeploymentConfig
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from activities.delegate import DelegationActivities
from activities.external import ExternalActivities
from activities.inquiry import InquiryActivities
from activities.mcp_tools import McpToolActivities
from activities.steps import StepActivities
from activities.turns import SessionActivities
from activities.xagent import XAgentActivities
from baton import telemetry
from baton.contracts import SEARCH_ATTRIBUTES
from baton.errors import EngineUnavailable, InvalidSettings
from baton.settings import DEFAULT_CONTEXT_MESSAGES, DEV_REVIEW_KEY, Settings
from workflows.inquiry import InquiryWorkflow
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

WORKFLOWS = [SessionWorkflow, AgentStepWorkflow, InquiryWorkflow]


class _CompiledOnceLoader(importlib.machinery.SourceFileLoader):
    """A source loader that compiles each file once per process (per modification time)."""

    codes: ClassVar[dict[tuple[str, int], CodeType]] = {}

    def get_code(self, fullname: str) -> CodeType:
        path = self.get_filename(fullname)
        key = (path, os.stat(path).st_mtime_ns)
        code = self.codes.get(key)
        if code is None:
            code = super().get_code(fullname)
            assert code is not None  # a source file always compiles to code (or raises)
            self.codes[key] = code
        return code


class WorkflowCodeCache(importlib.abc.MetaPathFinder):
    """Compile the sandbox's re-imported modules once, when Python writes no bytecode.

    The workflow sandbox imports a workflow's module afresh for every new run (its module
    state must not leak between runs). Without ``.pyc`` files (``PYTHONDONTWRITEBYTECODE``,
    an editable install) that import compiles the source each time: ~15 ms of CPU for
    ``workflows/session.py``, 70 % of a new session's sandbox set-up (bench/README.md,
    issue 14). Code objects are immutable, so sharing one across runs is what loading a
    ``.pyc`` does; each run still executes it in a fresh module.
    """

    def __init__(self, packages: Sequence[str]) -> None:
        self.packages = frozenset(packages)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] not in self.packages:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and type(spec.loader) is importlib.machinery.SourceFileLoader:
            spec.loader = _CompiledOnceLoader(fullname, str(spec.origin))
        return spec


def install_workflow_code_cache() -> None:
    """Put a :class:`WorkflowCodeCache` for ``workflows`` first on ``sys.meta_path``, once,
    when Python writes no bytecode (with ``.pyc`` files the import system caches already)."""
    if sys.dont_write_bytecode and not any(isinstance(f, WorkflowCodeCache) for f in sys.meta_path):
        sys.meta_path.insert(0, WorkflowCodeCache(["workflows"]))


def activities_for(
    engine: Engine,
    client: Client,
    *,
    review_key: bytes = DEV_REVIEW_KEY,
    context_messages: int | None = DEFAULT_CONTEXT_MESSAGES,
) -> list[Callable[..., Any]]:
    """The activity callables bound to ``engine`` (and ``client``, for delegations);
    ``review_key`` (Settings.review_key) verifies and signs review-decision proofs;
    ``context_messages`` (Settings.context_messages) bounds what a model call reads."""
    acts = SessionActivities(engine, context_messages=context_messages)
    xagent = XAgentActivities(engine, client, review_key=review_key)
    delegation = DelegationActivities(engine, client)
    steps = StepActivities(engine)
    inquiry = InquiryActivities(engine)
    external = ExternalActivities(engine)  # issue 13: external sessions
    mcp_tools = McpToolActivities(engine)  # issue 13: MCP servers as agents' tools
    return [
        acts.load_agent,
        acts.model_turn,
        acts.run_tool,
        acts.record_failure,
        acts.set_status,
        acts.record_resume,
        xagent.authorize,
        xagent.settle_review,
        xagent.refuse_tool,
        xagent.xagent_tool,
        delegation.delegate,
        delegation.cancel_delegations,
        delegation.route_turn,
        steps.check_deliverable,
        steps.update_step,
        inquiry.inquiry_turn,
        inquiry.inquiry_tool,
        inquiry.finish_inquiry,
        external.record_external_message,
        mcp_tools.mcp_tool,
    ]


def temporal_connect_config(settings: Settings) -> ClientConnectConfig:
    """The keyword arguments for ``Client.connect``: Temporal's profile, then ``BATON_*``.

    The profile comes from ``temporalio.envconfig`` exactly as the ``temporal`` CLI
    reads it: the TOML file at ``TEMPORAL_CONFIG_FILE`` (default
    ``~/.config/temporalio/temporal.toml``), profile ``TEMPORAL_PROFILE`` (default
    ``default``), overridden by ``TEMPORAL_ADDRESS``, ``TEMPORAL_NAMESPACE``,
    ``TEMPORAL_API_KEY``, ``TEMPORAL_TLS_*``. Then an *explicitly set*
    ``BATON_TEMPORAL_ADDRESS`` / ``BATON_TEMPORAL_NAMESPACE`` wins; their defaults
    (``localhost:7233``, ``default``) only fill what the profile leaves unset, so a
    default never masks a profile. ``BATON_TEMPORAL_ENV_CONFIG=false`` (and
    ``baton dev``, which runs its own plain server) ignores the profile entirely.

    The result holds secrets (API key, key bytes): pass it to ``Client.connect``,
    never log it (:func:`describe_target` is the loggable form). Raises
    :class:`~baton.errors.InvalidSettings` when the profile cannot be loaded (a
    named profile missing, a malformed file, an unreadable certificate file).
    """
    config: ClientConnectConfig = {}
    if settings.temporal_env_config:
        try:
            config = ClientConfigProfile.load().to_client_connect_config()
        except (OSError, RuntimeError, ValueError) as exc:
            # The bridge raises its own ConfigError (a RuntimeError); a certificate
            # path that cannot be read is an OSError.
            msg = f"Temporal client profile: {exc}"
            raise InvalidSettings(msg) from exc
    explicit = settings.model_fields_set
    if "temporal_address" in explicit or "target_host" not in config:
        config["target_host"] = settings.temporal_address
    config["namespace"] = settings.resolve_namespace(config.get("namespace"))
    return config


def describe_target(config: ClientConnectConfig) -> str:
    """``host:port (namespace N, TLS|mTLS, API key)`` for logs and errors; never a secret."""
    tls = config.get("tls", False)
    extras = [f"namespace {config.get('namespace', 'default')}"]
    if isinstance(tls, TLSConfig):
        extras.append("mTLS" if tls.client_cert else "TLS")
    elif tls:
        extras.append("TLS")
    if config.get("api_key"):
        extras.append("API key")
    return f"{config.get('target_host', '?')} ({', '.join(extras)})"


async def connect(settings: Settings, *, runtime: Runtime | None = None) -> Client:
    """The one way Baton connects to Temporal (worker, API, CLI, `baton setup`, `baton dev`).

    Options from :func:`temporal_connect_config`, the pydantic data converter, and
    the whole connect bounded by ``BATON_TEMPORAL_CONNECT_TIMEOUT`` seconds, so an
    address that swallows packets fails instead of hanging. Raises
    :class:`~baton.errors.EngineUnavailable` (503 ``engine_unavailable``) naming the
    target and the reason on one line (refused, DNS, TLS handshake, bad
    certificate, timeout); :class:`~baton.errors.InvalidSettings` for a bad profile.

    Tracing (issue 12, item 5): the interceptors of :func:`baton.telemetry.client_interceptors`
    (the SDK's TracingInterceptor when ``OTEL_*`` turns tracing on), which every
    worker built on this client inherits. ``runtime``: a Temporal runtime of its own
    (the worker's metrics, :func:`baton.telemetry.worker_runtime`), else the default.
    """
    config = temporal_connect_config(settings)
    interceptors = telemetry.client_interceptors()
    target = describe_target(config)
    timeout = settings.temporal_connect_timeout
    try:
        return await asyncio.wait_for(
            Client.connect(
                **config,
                data_converter=pydantic_data_converter,
                interceptors=interceptors,
                runtime=runtime,
            ),
            timeout=timeout,
        )
    except TimeoutError as exc:
        msg = f"cannot reach Temporal at {target}: no answer within {timeout:g} s"
        raise EngineUnavailable(msg) from exc
    except (RuntimeError, OSError, ValueError) as exc:
        # The bridge reports transport, DNS and TLS failures as RuntimeError.
        reason = " ".join(str(exc).split())
        msg = f"cannot reach Temporal at {target}: {reason}"
        raise EngineUnavailable(msg) from exc


#: How each workflow type follows new builds under Worker Versioning. Both AUTO_UPGRADE:
#: a session lives for days and hands its history across continue-as-new, and a step may
#: wait a day for its handoff (``handoff_timeout_s``) with no overall bound unless
#: ``timeout_s`` is set, so PINNED would keep old builds running for as long. Every
#: command change is gated by ``workflow.patched`` and proven by the replay suite
#: (tests/test_replay.py over tests/histories/), which is what makes upgrading safe.
#: Set as the worker's default rather than on ``@workflow.defn``: the server refuses a
#: per-workflow behaviour from an unversioned worker ("versioning behavior cannot be
#: specified without deployment options"), and unversioned must keep working.
VERSIONING_BEHAVIOR = {
    SessionWorkflow: VersioningBehavior.AUTO_UPGRADE,
    AgentStepWorkflow: VersioningBehavior.AUTO_UPGRADE,
}


def deployment_config(settings: Settings) -> WorkerDeploymentConfig | None:
    """Worker Versioning for this worker, or None (unversioned) when no deployment is set.

    Opt-in (``BATON_WORKER_DEPLOYMENT``): a versioned worker receives tasks only once
    its version is current (``temporal worker deployment set-current-version``), which
    `baton dev` and an unversioned install must not need. The version is
    ``BATON_WORKER_DEPLOYMENT`` + ``BATON_BUILD_ID``; the default behaviour is the one
    :data:`VERSIONING_BEHAVIOR` gives every workflow (AUTO_UPGRADE).
    """
    if not settings.worker_deployment:
        return None
    (behavior,) = set(VERSIONING_BEHAVIOR.values())  # one default serves all workflows
    return WorkerDeploymentConfig(
        version=WorkerDeploymentVersion(
            deployment_name=settings.worker_deployment, build_id=settings.build_id
        ),
        use_worker_versioning=True,
        default_versioning_behavior=behavior,
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
    graceful_shutdown: timedelta = timedelta(),
    deployment: WorkerDeploymentConfig | None = None,
    context_messages: int | None = DEFAULT_CONTEXT_MESSAGES,
    max_cached_workflows: int = 1000,
) -> Worker:
    """The Baton worker for ``task_queue``: workflows, activities, sandbox passthrough.

    ``interceptors`` are added to the worker's (the fault tests use one to kill the
    process at an exact point). ``review_key`` must be the API's
    (``Settings.review_key()``, as run_services passes it): with another key every
    API decision is recorded as unverified. ``graceful_shutdown``: how long a
    shutdown (SIGTERM) lets in-flight activities finish before cancelling them
    (``BATON_WORKER_GRACEFUL_SHUTDOWN_S``). ``deployment``: Worker Versioning
    (:func:`deployment_config`), None = unversioned. ``context_messages``: the context
    window of a model call (``BATON_CONTEXT_MESSAGES``, None = the whole transcript).
    ``max_cached_workflows``: open runs kept in memory, the SDK's sticky cache
    (``BATON_WORKER_MAX_CACHED_WORKFLOWS``): what bounds the worker's RSS while runs
    wait (a review, a turn), ~240 KB per run (bench/held.py, issue 14).
    """
    install_workflow_code_cache()
    # Deliberate: many slots (async delegations wait in them) over a small thread pool.
    warnings.filterwarnings("ignore", message="Worker max_concurrent_activities is")
    return Worker(
        client,
        task_queue=task_queue,
        workflows=WORKFLOWS,
        activities=activities_for(
            engine, client, review_key=review_key, context_messages=context_messages
        ),
        # Slots are many because a sync delegation holds one while its child runs (async,
        # no thread); blocking DB activities share the thread pool and queue there instead.
        activity_executor=ThreadPoolExecutor(max_workers=activity_threads),
        max_concurrent_activities=max_concurrent_activities,
        max_cached_workflows=max_cached_workflows,
        interceptors=interceptors,
        graceful_shutdown_timeout=graceful_shutdown,
        deployment_config=deployment,
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
