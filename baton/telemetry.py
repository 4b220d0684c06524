"""Tracing and metrics (docs/operations.md).

**Tracing** is off unless the standard OpenTelemetry variables ask for it (see
:func:`exporter_names`). When on, one trace spans an API request (FastAPI
instrumentation) → the Temporal client call → the workflow → its activities (the
SDK's ``TracingInterceptor``, on the client so every worker built on it has it too)
→ the model's HTTP call (httpx/httpx2 instrumentation); :func:`annotate` adds Baton's
attributes (``baton.agent``, ``baton.session``, ``baton.review``…) to the current span.

**Metrics**: Baton's counters (:func:`count_turn`, :func:`count_review_opened`,
:func:`count_review`, :func:`count_delegation`) are recorded through the Temporal SDK's
metric meter of the activity that runs them, so a worker exposes them on the same
Prometheus endpoint as the SDK's own metrics (``BATON_METRICS_BIND``,
:func:`worker_runtime`); outside an activity, or with metrics off, they record nothing.
:func:`at_commit` defers one until its transaction commits. The API's metrics are
prometheus-client's (:class:`RequestMetrics`, served at ``/metrics``): requests, and the
balance read from the database at each scrape.

Nothing here runs at import time but the registration of :func:`at_commit`'s two
session listeners; the environment is read on the first call.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from importlib.metadata import entry_points
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client import generate_latest as _generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import event as sa_event
from sqlalchemy.orm import Session
from temporalio import activity
from temporalio.client import Interceptor as ClientInterceptor
from temporalio.contrib.opentelemetry import TracingInterceptor
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from baton.errors import InvalidSettings

#: Service name spans carry when neither OTEL_SERVICE_NAME nor OTEL_RESOURCE_ATTRIBUTES
#: names one.
DEFAULT_SERVICE_NAME = "baton"
#: The entry-point group OpenTelemetry exporters register under (opentelemetry-sdk's
#: ``console``; opentelemetry-exporter-otlp's ``otlp`` = gRPC, ``otlp_proto_http``).
EXPORTER_GROUP = "opentelemetry_traces_exporter"

_lock = threading.Lock()
_state: dict[str, TracerProvider | None] = {}


def exporter_names(environ: Mapping[str, str]) -> list[str]:
    """The span exporters the environment asks for; ``[]`` = tracing off (the default).

    The switch, in order: ``OTEL_SDK_DISABLED=true`` → off; ``OTEL_TRACES_EXPORTER``
    (comma-separated entry-point names, e.g. ``otlp``, ``console``; ``none`` → off);
    unset but ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT``
    set → ``otlp``; nothing set → off. Unlike the OpenTelemetry default (``otlp``),
    an unconfigured Baton exports nothing: there is no collector to assume.
    """
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    raw = environ.get("OTEL_TRACES_EXPORTER", "").strip()
    endpoints = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
    if not raw and any(environ.get(name) for name in endpoints):
        raw = "otlp"
    names = [n.strip() for n in raw.split(",") if n.strip()]
    return [] if names in ([], ["none"]) else [n for n in names if n != "none"]


def _exporter(name: str) -> SpanExporter:
    """The exporter registered as ``name``. Raises InvalidSettings when none is installed."""
    found = entry_points(group=EXPORTER_GROUP, name=name)
    if not found:
        hint = " (pip install 'baton[otlp]')" if name.startswith("otlp") else ""
        msg = f"OTEL_TRACES_EXPORTER names {name!r}, which no installed package provides{hint}"
        raise InvalidSettings(msg)
    exporter: SpanExporter = next(iter(found)).load()()
    return exporter


def provider_from_environment(environ: Mapping[str, str]) -> TracerProvider | None:
    """A TracerProvider exporting to :func:`exporter_names` (batched), or None when off.

    Its resource comes from ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES``
    (service name :data:`DEFAULT_SERVICE_NAME` when they name none); the exporters read
    their own ``OTEL_EXPORTER_*`` variables. Raises InvalidSettings for an exporter
    name no installed package provides.
    """
    names = exporter_names(environ)
    if not names:
        return None
    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": DEFAULT_SERVICE_NAME}))
    provider = TracerProvider(resource=resource)
    for name in names:
        provider.add_span_processor(BatchSpanProcessor(_exporter(name)))
    return provider


def use_tracer_provider(provider: TracerProvider | None) -> None:
    """Make ``provider`` this process's tracing (None = off), in place of the environment's.

    For embedding and tests (an in-memory exporter). Instruments (or un-instruments)
    httpx, so the model's HTTP calls get client spans. Clients and apps built before
    the call keep what they had.
    """
    from opentelemetry.instrumentation.httpx import (
        HTTPX2ClientInstrumentor,
        HTTPXClientInstrumentor,
    )

    with _lock:
        # httpx2 is the OpenAI and Anthropic SDKs' HTTP client (the model's calls); httpx
        # is everyone else's (MCP servers, voice, tools).
        for instrumentor in (HTTPXClientInstrumentor(), HTTPX2ClientInstrumentor()):
            if instrumentor.is_instrumented_by_opentelemetry:
                instrumentor.uninstrument()
            if provider is not None:
                instrumentor.instrument(tracer_provider=provider)
        _state["provider"] = provider


def tracer_provider() -> TracerProvider | None:
    """This process's tracing, or None (off). First call: from the environment, which
    also becomes OpenTelemetry's global provider so other libraries' spans join.

    Raises InvalidSettings (:func:`provider_from_environment`).
    """
    if "provider" not in _state:
        provider = provider_from_environment(os.environ)
        if provider is not None:
            trace.set_tracer_provider(provider)
        use_tracer_provider(provider)
    return _state["provider"]


def shutdown() -> None:
    """Export what tracing still buffers and stop it; nothing when tracing is off or was
    never read. For a process that ends with ``os._exit`` (OpenTelemetry's own exit hook
    never runs there)."""
    provider = _state.get("provider")
    if provider is not None:
        provider.shutdown()


def client_interceptors() -> list[ClientInterceptor]:
    """Interceptors for ``Client.connect``: the SDK's TracingInterceptor when tracing is on.

    On the client it also serves every worker built on that client (the SDK adds a
    client interceptor that is a worker interceptor to the worker), so no worker adds
    it again. It only adds headers to commands, so histories replay unchanged.
    """
    provider = tracer_provider()
    if provider is None:
        return []
    return [TracingInterceptor(tracer=provider.get_tracer("baton"))]


def instrument_app(app: Any) -> None:
    """Give a FastAPI app server spans when tracing is on (probes and /metrics excluded)."""
    provider = tracer_provider()
    if provider is None:
        return
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    FastAPIInstrumentor.instrument_app(
        app, tracer_provider=provider, excluded_urls="healthz,readyz,metrics"
    )


def annotate(**attributes: str | int | None) -> None:
    """Set ``baton.<key>`` attributes on the current span (None values skipped); a no-op
    when tracing is off. Keys in use: agent, session, review, delegation, kind."""
    span = trace.get_current_span()
    if not span.is_recording():
        return
    for key, value in attributes.items():
        if value is not None:
            span.set_attribute(f"baton.{key}", value)


# --- metrics ---------------------------------------------------------------------------


#: Upper bounds (seconds) of ``baton_review_decision_seconds``'s buckets: a review waits
#: for a person, from seconds to the longest ``BATON_REVIEW_TIMEOUT`` (7 days); the SDK's
#: default buckets (50 to 10,000) suit milliseconds.
REVIEW_DECISION_BUCKETS_S = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 21600, 86400, 604800)


@functools.cache
def worker_runtime(bind: str) -> Runtime:
    """A Temporal runtime serving Prometheus metrics on ``bind`` (``host:port``).

    One per address and process (the port binds once). The SDK's metrics and Baton's
    counters (recorded through the activities' meter) share this endpoint. Counters are
    exported with the ``_total`` suffix (``baton_turns_total``,
    ``temporal_request_total``): the Prometheus text format stores a name as served, and
    without it the SDK would serve ``baton_turns``. Raises InvalidSettings when the
    address is malformed or taken.
    """
    config = PrometheusConfig(
        bind_address=bind,
        counters_total_suffix=True,
        histogram_bucket_overrides={
            "baton_review_decision_seconds": [float(b) for b in REVIEW_DECISION_BUCKETS_S]
        },
    )
    try:
        return Runtime(telemetry=TelemetryConfig(metrics=config))
    except (RuntimeError, ValueError) as exc:
        msg = f"BATON_METRICS_BIND={bind}: {' '.join(str(exc).split())}"
        raise InvalidSettings(msg) from exc


def _meter() -> Any:
    """The running activity's metric meter, or None outside an activity."""
    return activity.metric_meter() if activity.in_activity() else None


def count_turn(
    *, agent: str, input_tokens: int, output_tokens: int, cost_usd: float | None
) -> None:
    """Count one metered model call: ``baton_turns``, ``baton_tokens`` (direction in|out)
    and ``baton_cost_usd`` (a histogram: its ``_sum`` is the known spend; a call with
    no known price, ``None``, adds nothing). Called by :func:`baton.runs.metering.record`
    only, once per call it records."""
    meter = _meter()
    if meter is None:
        return
    labels = {"agent": agent}
    meter.create_counter("baton_turns", "Model calls metered").with_additional_attributes(
        labels
    ).add(1)
    tokens = meter.create_counter("baton_tokens", "Model tokens metered", "tokens")
    tokens.with_additional_attributes({**labels, "direction": "in"}).add(max(input_tokens, 0))
    tokens.with_additional_attributes({**labels, "direction": "out"}).add(max(output_tokens, 0))
    if cost_usd is not None and cost_usd > 0:
        meter.create_histogram_float(
            "baton_cost_usd", "Cost of metered model calls", "USD"
        ).with_additional_attributes(labels).record(cost_usd)


_AT_COMMIT = "baton.telemetry.at_commit"


def at_commit(session: Session, record: Callable[[], None]) -> None:
    """Run ``record`` (a ``count_*`` call) once ``session``'s transaction commits; a
    rollback drops it. So an event is counted once, when it is stored: an activity
    retried after a failed commit counts it on the attempt that stores it, and one
    retried after the commit finds it stored and counts nothing. A worker that dies
    between the commit and the count loses that one count (never counts it twice).
    ``record`` runs in the committing thread, so an activity's meter is still current. A
    savepoint (``begin_nested``) rolled back inside the transaction does not drop it: call
    this outside one."""
    session.info.setdefault(_AT_COMMIT, []).append(record)


@sa_event.listens_for(Session, "after_commit")
def _record_committed(session: Session) -> None:
    for record in session.info.pop(_AT_COMMIT, []):
        record()


@sa_event.listens_for(Session, "after_rollback")
def _drop_rolled_back(session: Session) -> None:
    session.info.pop(_AT_COMMIT, None)


def count_review_opened(*, operation: str) -> None:
    """Count one opened review, ``baton_reviews_opened{operation}`` (list | read | invoke
    | create). Called by :func:`baton.permissions.reviews.open_review` when it inserts."""
    meter = _meter()
    if meter is not None:
        meter.create_counter("baton_reviews_opened", "Reviews opened").with_additional_attributes(
            {"operation": operation}
        ).add(1)


def count_review(*, outcome: str, seconds: float) -> None:
    """Count one settled review: ``baton_reviews{outcome}`` (allowed | denied | timed_out
    | cancelled) and ``baton_review_decision_seconds{outcome}``, a histogram of the
    seconds from its opening to its outcome (buckets :data:`REVIEW_DECISION_BUCKETS_S`).
    Called by :func:`baton.permissions.reviews.count_settled` only."""
    meter = _meter()
    if meter is None:
        return
    labels = {"outcome": outcome}
    meter.create_counter("baton_reviews", "Reviews settled").with_additional_attributes(labels).add(
        1
    )
    meter.create_histogram_float(
        "baton_review_decision_seconds", "Seconds from a review's opening to its outcome", "s"
    ).with_additional_attributes(labels).record(max(seconds, 0.0))


def count_delegation(*, kind: str) -> None:
    """Count one started delegation, ``baton_delegations{kind}`` (invoke | delegate_to |
    task | route | mention). Called by the ``delegate`` activity once it started."""
    meter = _meter()
    if meter is not None:
        meter.create_counter("baton_delegations", "Delegations started").with_additional_attributes(
            {"kind": kind}
        ).add(1)


class BalanceGauge(Collector):
    """``baton_balance_usd``: the organisation's remaining balance (USD), read by
    ``read`` at each scrape; no sample while it is unlimited (``read`` returns None) or
    cannot be read (the scrape still serves the other metrics).

    Read at scrape rather than recorded by the workers: the balance is one database row
    that every worker charges and the API tops up, so a worker's last reading is stale as
    soon as another process writes it, while every API replica reads the same value.
    """

    def __init__(self, read: Callable[[], float | None]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        """The gauge, with the balance as of now."""
        try:
            amount = self._read()
        except Exception:  # a database down fails /readyz; the request metrics still serve
            return
        if amount is not None:
            yield GaugeMetricFamily(
                "baton_balance_usd", "Remaining organisation balance (USD)", value=amount
            )


class RequestMetrics:
    """The API's metrics in their own prometheus-client registry (one per app):
    ``baton_http_requests_total{method, route, status}`` and
    ``baton_http_request_duration_seconds{method, route}`` (time to the response's
    start; an SSE stream counts until its headers). ``route`` is the route template
    (``/v1/sessions/{session_id}``), never the raw path, so ids add no series. With
    ``balance`` (a reader), also :class:`BalanceGauge`.
    """

    def __init__(self, *, balance: Callable[[], float | None] | None = None) -> None:
        self.registry = CollectorRegistry()
        if balance is not None:
            self.registry.register(BalanceGauge(balance))
        self.requests = Counter(
            "baton_http_requests",
            "HTTP requests answered",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "baton_http_request_duration_seconds",
            "Seconds to the start of the response",
            ["method", "route"],
            registry=self.registry,
        )

    def record(self, scope: Mapping[str, Any], status: int, started: float) -> None:
        """Count one answer of the request ``scope`` (an ASGI http scope, routed) with
        ``status``, timed from ``started`` (``time.perf_counter()``) until now."""
        template = getattr(scope.get("route"), "path", None) or "unmatched"
        method = str(scope.get("method", ""))
        self.requests.labels(method, template, str(status)).inc()
        self.latency.labels(method, template).observe(time.perf_counter() - started)

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return _generate_latest(self.registry), CONTENT_TYPE_LATEST


class MeteredApp:
    """A pure ASGI middleware recording every http answer in ``metrics`` when its response
    starts (500 when the app raised before starting one); ``app.add_middleware(MeteredApp,
    metrics=…)``. Pure ASGI rather than ``@app.middleware("http")``: Starlette's
    BaseHTTPMiddleware runs each request in a task group with a streamed copy of the
    response, ~8 % of an API turn's CPU in the turn profile of bench/README.md."""

    def __init__(self, app: Callable[..., Awaitable[None]], *, metrics: RequestMetrics) -> None:
        self._app = app
        self._metrics = metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        started = time.perf_counter()
        answered = False

        async def sending(message: Mapping[str, Any]) -> None:
            nonlocal answered
            if message["type"] == "http.response.start" and not answered:
                answered = True  # routing has put the matched route in `scope` by now
                self._metrics.record(scope, int(message["status"]), started)
            await send(message)

        try:
            await self._app(scope, receive, sending)
        finally:
            if not answered:
                self._metrics.record(scope, 500, started)
