"""One factory for the Temporal client and Worker, used by `baton worker`, `baton dev`,
`make demo` and the tests, so they all run the same registrations."""

from __future__ import annotations

import asyncio
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import logging
import logging.handlers
import os
import queue
import sys
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from types import CodeType, FunctionType
from typing import Any, ClassVar

from sqlalchemy.engine import Engine
from temporalio import activity
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
from activities.evals import EvalActivities
from activities.external import ExternalActivities
from activities.inquiry import InquiryActivities
from activities.mcp_tools import McpToolActivities
from activities.steps import StepActivities
from activities.turns import SessionActivities
from activities.webhooks import WebhookActivities
from activities.workspaces import WorkspaceActivities
from activities.xagent import XAgentActivities
from baton import telemetry
from baton.contracts.search import SEARCH_ATTRIBUTES
from baton.contracts.values import DeliveryConfig, ExhibitLimits
from baton.errors import EngineUnavailable, InvalidSettings
from baton.outbound import OPEN, OutboundPolicy
from baton.settings import (
    DEFAULT_CONTEXT_MESSAGES,
    DEFAULT_STICKY_TIMEOUT_S,
    DEV_REVIEW_KEY,
    Settings,
)
from baton.workspaces.store import WorkspaceStore
from workflows.evals import EvalWorkflow
from workflows.inquiry import InquiryWorkflow
from workflows.session import SessionWorkflow
from workflows.step import AgentStepWorkflow
from workflows.webhooks import WebhookDeliveryWorkflow

#: Modules the workflow sandbox imports once per process instead of once per run, each
#: for its reason. Every other module a workflow imports (``workflows.*`` above all) is
#: imported afresh in each run's sandbox, under its restrictions.
PASSTHROUGH = (
    # The shapes that cross the Temporal boundary: the pydantic data converter decodes
    # payloads outside the sandbox, so workflow code must see those very classes.
    "baton.contracts",
    # The cross-agent guard (pure): workflow code runs it before it schedules anything.
    "baton.permissions.guard",
    # Pure functions workflow code calls: the step's markdown for the Temporal UI, and the
    # handoff rule the step workflow shares with the API.
    "baton.temporal_ui",
    "baton.runs.handoff",
    # The activity classes, one module each: workflow code names their methods (the
    # activity type and its argument types) and never runs them. Importing them imports
    # the DB, model and MCP stacks below. Only the modules workflow code imports are
    # listed (tests/test_replay.py checks the list against the imports); the rest of
    # `activities` (outcomes, outbound HTTP) is reached only through them, on the host.
    # Sessions and steps: load_agent, model_turn, run_tool, record_failure, record_resume,
    # set_status.
    "activities.turns",
    # Sessions: authorize, settle_review, refuse_tool, xagent_tool.
    "activities.xagent",
    # Sessions: delegate, route_turn, cancel_delegations.
    "activities.delegate",
    # Sessions: mcp_tool, a remote MCP server's tool.
    "activities.mcp_tools",
    # Sessions: workspace_tool, the workspace tools.
    "activities.workspaces",
    # External sessions: record_external_message.
    "activities.external",
    # AgentStep: check_deliverable, check_edited_deliverable, update_step.
    "activities.steps",
    # Inquiry: inquiry_turn, inquiry_tool, finish_inquiry.
    "activities.inquiry",
    # WebhookDelivery: deliver_webhook, fail_delivery.
    "activities.webhooks",
    # Eval: replay, replay_step, record_replays, judge_replays, finish_eval,
    # cancel_replays.
    "activities.evals",
    # What the activities import (the model stack, the DB stack, the spec's safe regexes
    # and the deliverables' JSON Schema checks): heavy, never called from workflow code,
    # and named here as well so that no run's sandbox imports them afresh.
    "pydantic_ai",
    "sqlalchemy",
    "sqlmodel",
    "regex",
    "jsonschema",
    # The workspace store's filesystem layer (local files, S3), likewise.
    "fsspec",
)

WORKFLOWS = [
    SessionWorkflow,
    AgentStepWorkflow,
    InquiryWorkflow,
    WebhookDeliveryWorkflow,
    EvalWorkflow,
]


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
    """Find and compile the sandbox's re-imported modules once per process.

    The workflow sandbox imports a workflow's module afresh for every new run (its module
    state must not leak between runs). Each such import searched ``sys.path`` for the
    file (a ``stat`` per directory: ~5 % of a ``baton worker``'s CPU while sessions are
    being created, bench/README.md) and then compiled the source (no ``.pyc`` files:
    ``PYTHONDONTWRITEBYTECODE``, an editable install; ~15 ms of CPU for the session
    workflow's modules) or read and unmarshalled its ``.pyc``. Here a module's file is
    found once, and its code object (immutable: sharing one across runs is what loading
    a ``.pyc`` does) is made once per modification time; each run still executes it in a
    fresh module, from a fresh spec.
    """

    def __init__(self, packages: Sequence[str]) -> None:
        self.packages = frozenset(packages)
        #: Module name -> (its file, its package's search locations; None: not a package).
        self._found: dict[str, tuple[str, list[str] | None]] = {}

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] not in self.packages:
            return None
        found = self._found.get(fullname)
        if found is None:
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if spec is None or type(spec.loader) is not importlib.machinery.SourceFileLoader:
                return spec
            locations = spec.submodule_search_locations
            found = (str(spec.origin), None if locations is None else list(locations))
            self._found[fullname] = found
        origin, locations = found
        return importlib.util.spec_from_file_location(
            fullname,
            origin,
            loader=_CompiledOnceLoader(fullname, origin),
            submodule_search_locations=locations,
        )


def install_workflow_code_cache() -> None:
    """Put a :class:`WorkflowCodeCache` for ``workflows`` first on ``sys.meta_path``, once."""
    if not any(isinstance(f, WorkflowCodeCache) for f in sys.meta_path):
        sys.meta_path.insert(0, WorkflowCodeCache(["workflows"]))


#: The logger tree of the Temporal SDK: ``temporalio.workflow`` (``workflow.logger``) and
#: the SDK's own workflow-instance logger write from workflow code, inside the sandbox.
SDK_LOGGER = "temporalio"


class _ToRoot(logging.Handler):
    """Hands a record taken off the queue to the root logger's handlers (on the listener
    thread, outside any workflow sandbox), as propagation would have."""

    def emit(self, record: logging.LogRecord) -> None:
        logging.getLogger().handle(record)


_sdk_log_listener: logging.handlers.QueueListener | None = None


def route_sdk_logs_off_the_sandbox() -> None:
    """Make the SDK's log records (workflow code's among them) reach the root handlers
    from a thread of their own, once per process.

    Workflow code runs in the sandbox on the workflow task's thread: a handler called
    there runs there too, and a handler that imports lazily (Rich's, installed on the root
    logger by a library when the API is mounted in the same process, as in `baton dev`)
    fails inside the sandbox, failing the workflow task on every retry, or holds its lock
    when the deadlock detector gives up on the thread, hanging every other logger. A
    :class:`logging.handlers.QueueHandler` only formats the message and puts it on a
    queue; the listener thread calls the real handlers. ``propagate`` is off so no root
    handler is called on the workflow's thread as well.
    """
    global _sdk_log_listener
    if _sdk_log_listener is not None:
        return
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    sdk = logging.getLogger(SDK_LOGGER)
    sdk.addHandler(logging.handlers.QueueHandler(records))
    sdk.propagate = False
    _sdk_log_listener = logging.handlers.QueueListener(records, _ToRoot())
    _sdk_log_listener.start()


def activities_for(
    engine: Engine,
    client: Client,
    *,
    review_key: bytes = DEV_REVIEW_KEY,
    context_messages: int | None = DEFAULT_CONTEXT_MESSAGES,
    outbound: OutboundPolicy = OPEN,
    webhooks: DeliveryConfig | None = None,
    exhibit_limits: ExhibitLimits | None = None,
    workspaces: WorkspaceStore | None = None,
) -> list[Callable[..., Any]]:
    """The activity callables bound to ``engine`` (and ``client``, for delegations);
    ``review_key`` (Settings.review_key) verifies and signs review-decision proofs;
    ``context_messages`` (Settings.context_messages) bounds what a model call reads;
    ``outbound`` (Settings.outbound_policy) is where a spec's MCP servers and webhook
    receivers may be reached; ``webhooks`` (Settings.webhook_config) how deliveries are
    attempted, None = as ``BATON_WEBHOOK_*`` in the environment say; ``exhibit_limits``
    (Settings.exhibit_limits) what one exhibit may hold, None = the defaults; ``workspaces``
    the session workspaces' store, None = as ``BATON_WORKSPACE_*`` say."""
    store = workspaces or WorkspaceStore.from_settings(Settings())
    return activity_methods(
        WebhookActivities(
            engine,
            client,
            outbound=outbound,
            config=webhooks if webhooks is not None else Settings().webhook_config(),
        ),
        WorkspaceActivities(engine, store),
        SessionActivities(
            engine,
            context_messages=context_messages,
            outbound=outbound,
            exhibit_limits=exhibit_limits,
            workspaces=store,
        ),
        XAgentActivities(engine, client, review_key=review_key),
        DelegationActivities(engine, client, outbound=outbound),
        StepActivities(engine),
        InquiryActivities(engine),
        ExternalActivities(engine),
        McpToolActivities(engine, policy=outbound),
        EvalActivities(engine, client),
    )


def activity_methods(*instances: object) -> list[Callable[..., Any]]:
    """Every ``@activity.defn`` method of each instance, bound, in definition order (a
    base class's first; a subclass's override in its base's place): the activities a
    worker registers are the activity classes' own, never a list kept by hand beside
    them. Whether a method is an activity is what the SDK itself asks when it registers
    one (``activity._Definition.from_callable``)."""
    found: list[Callable[..., Any]] = []
    for obj in instances:
        names = dict.fromkeys(n for cls in reversed(type(obj).__mro__) for n in vars(cls))
        for name in names:
            member = inspect.getattr_static(obj, name)
            if not isinstance(member, FunctionType | staticmethod | classmethod):
                continue  # properties and data are not read: only methods can be activities
            bound = getattr(obj, name)
            # A private SDK read, kept for want of a public one: temporalio (1.35) has no
            # public way to ask whether a callable is an activity. ``activity.defn`` keeps
            # the definition in a private attribute that only ``activity._Definition``
            # reads (the SDK's own ``testing.ActivityEnvironment`` reads it so too), and
            # ``temporalio.activity`` exports nothing that reads it back. A marker of
            # Baton's own would be a second decorator on every activity, kept in step
            # with the first by hand; tests/test_session_collaborators.py fails if an SDK
            # upgrade moves the attribute.
            if activity._Definition.from_callable(bound) is not None:
                found.append(bound)
    return found


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

    Tracing: the interceptors of :func:`baton.telemetry.client_interceptors`
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


#: How each workflow type follows new builds under Worker Versioning: AUTO_UPGRADE, so a
#: run in flight moves to the current build at its next workflow task. Sessions are not
#: PINNED although an idle run now completes after ``idle_timeout_s``: a session in use
#: continues-as-new without ever being idle, and a PINNED run's continue-as-new inherits
#: its build, so such a session would stay on an old build for as long as it is used;
#: ``idle_timeout_s`` may be unset (never idle); and a build rolled back must take its
#: runs with it. A step may wait a day for its handoff. The price is the rule of
#: docs/development.md (Workflow changes): a command change is gated by a patch and
#: proven by the replay suite (tests/test_replay.py over
#: tests/histories/). Set as the worker's default rather than on ``@workflow.defn``:
#: the server refuses a per-workflow behaviour from an unversioned worker ("versioning
#: behavior cannot be specified without deployment options"), and unversioned must
#: keep working.
VERSIONING_BEHAVIOR = {
    SessionWorkflow: VersioningBehavior.AUTO_UPGRADE,
    AgentStepWorkflow: VersioningBehavior.AUTO_UPGRADE,
    InquiryWorkflow: VersioningBehavior.AUTO_UPGRADE,
    WebhookDeliveryWorkflow: VersioningBehavior.AUTO_UPGRADE,
    EvalWorkflow: VersioningBehavior.AUTO_UPGRADE,
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
    outbound: OutboundPolicy = OPEN,
    sticky_timeout: timedelta = timedelta(seconds=DEFAULT_STICKY_TIMEOUT_S),
    webhooks: DeliveryConfig | None = None,
    exhibit_limits: ExhibitLimits | None = None,
    workspaces: WorkspaceStore | None = None,
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
    wait (a review, a turn), ~240 KB per run (bench/held.py). ``outbound``:
    where a spec's MCP servers may be reached (:meth:`Settings.outbound_policy`; the
    default refuses nothing, as with auth off).
    ``sticky_timeout``: how long a run's next workflow task waits on this worker's sticky
    queue before any worker may take it (``BATON_WORKER_STICKY_TIMEOUT``): after this
    worker is killed, its runs resume elsewhere that much later. ``webhooks``: how webhook
    deliveries are attempted (:meth:`Settings.webhook_config`; None reads the environment);
    ``exhibit_limits``: what one exhibit may hold (:meth:`Settings.exhibit_limits`);
    ``workspaces``: the session workspaces' store (None: as ``BATON_WORKSPACE_*`` say).
    """
    install_workflow_code_cache()
    route_sdk_logs_off_the_sandbox()
    # Deliberate: many slots (async delegations wait in them) over a small thread pool.
    warnings.filterwarnings("ignore", message="Worker max_concurrent_activities is")
    return Worker(
        client,
        task_queue=task_queue,
        workflows=WORKFLOWS,
        activities=activities_for(
            engine,
            client,
            review_key=review_key,
            context_messages=context_messages,
            outbound=outbound,
            webhooks=webhooks,
            exhibit_limits=exhibit_limits,
            workspaces=workspaces,
        ),
        # Slots are many because a sync delegation holds one while its child runs (async,
        # no thread); blocking DB activities share the thread pool and queue there instead.
        activity_executor=ThreadPoolExecutor(max_workers=activity_threads),
        max_concurrent_activities=max_concurrent_activities,
        max_cached_workflows=max_cached_workflows,
        sticky_queue_schedule_to_start_timeout=sticky_timeout,
        interceptors=interceptors,
        graceful_shutdown_timeout=graceful_shutdown,
        deployment_config=deployment,
        workflow_runner=workflow_runner(),
    )


def workflow_runner() -> SandboxedWorkflowRunner:
    """The sandbox every Baton workflow runs in (the worker's, the replayer's): the SDK's
    default restrictions with :data:`PASSTHROUGH` passed through."""
    return SandboxedWorkflowRunner(
        restrictions=SandboxRestrictions.default.with_passthrough_modules(*PASSTHROUGH)
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
