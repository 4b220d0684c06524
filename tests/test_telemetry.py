"""Tracing: off by default, switched on by the standard ``OTEL_*``
variables, and one trace from an API request through the workflow and its activities
to the model's HTTP call (real API + worker + dev server, an in-memory exporter)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from temporalio.testing import WorkflowEnvironment

from baton import telemetry
from baton.errors import InvalidSettings
from tests.conftest import serve
from tests.openai_stub import OpenAIStub
from tests.test_api_reviews import running_stack, settled


@pytest.mark.parametrize(
    ("environ", "names"),
    [
        ({}, []),
        ({"OTEL_TRACES_EXPORTER": "none"}, []),
        ({"OTEL_TRACES_EXPORTER": "console"}, ["console"]),
        ({"OTEL_TRACES_EXPORTER": "otlp, console"}, ["otlp", "console"]),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}, ["otlp"]),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, ["otlp"]),
        ({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}, []),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, []),
    ],
)
def test_the_otel_variables_switch_tracing(environ: dict[str, str], names: list[str]) -> None:
    """Tracing is off with no OTEL_* set; OTEL_TRACES_EXPORTER or an OTLP endpoint turns it
    on; ``none`` and OTEL_SDK_DISABLED=true keep it off."""
    assert telemetry.exporter_names(environ) == names


def test_an_exporter_nobody_provides_is_refused_clearly() -> None:
    """OTEL_TRACES_EXPORTER naming an uninstalled exporter stops the start, naming it."""
    with pytest.raises(InvalidSettings, match="'jaeger'"):
        telemetry.provider_from_environment({"OTEL_TRACES_EXPORTER": "jaeger"})


def test_console_exporter_gets_baton_service_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """A provider built from the environment names the service ``baton`` unless
    OTEL_SERVICE_NAME says otherwise."""
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    provider = telemetry.provider_from_environment({"OTEL_TRACES_EXPORTER": "console"})
    assert provider is not None
    assert provider.resource.attributes["service.name"] == "baton"
    monkeypatch.setenv("OTEL_SERVICE_NAME", "baton-eu")
    named = telemetry.provider_from_environment({"OTEL_TRACES_EXPORTER": "console"})
    assert named is not None and named.resource.attributes["service.name"] == "baton-eu"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on for this test, into memory; off again afterwards."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.use_tracer_provider(provider)
    try:
        yield exporter
    finally:
        telemetry.use_tracer_provider(None)
        provider.shutdown()


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The OpenAI stub on loopback; the provider is pointed at it. Yields its base URL."""
    server, thread, base = serve(OpenAIStub().app)
    monkeypatch.setenv("OPENAI_BASE_URL", f"{base}/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    try:
        yield base
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def url_of(span: ReadableSpan) -> str:
    """The URL an HTTP client span called (old or new semantic conventions)."""
    attrs = span.attributes or {}
    return str(attrs.get("url.full") or attrs.get("http.url") or "")


def wait_for_span(
    exporter: InMemorySpanExporter, match: Callable[[ReadableSpan], bool], what: str
) -> ReadableSpan:
    """The first finished span ``match`` accepts, waited for up to 10 s."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for span in exporter.get_finished_spans():
            if match(span):
                return span
        time.sleep(0.05)
    names = sorted({s.name for s in exporter.get_finished_spans()})
    pytest.fail(f"no {what} span; finished spans: {names}")


def test_one_trace_spans_request_workflow_activities_and_model_call(
    temporal_env: WorkflowEnvironment,
    tmp_path: Path,
    spans: InMemorySpanExporter,
    stub: str,
) -> None:
    """POST /v1/sessions → the API route's span, the Session workflow's, the model_turn
    activity's (with baton.agent/session) and the HTTP call to the model share one trace."""
    with running_stack(temporal_env, tmp_path / "t.db") as stack:
        http = stack.http
        spec = {"model": "openai-chat:stub-model", "tools": ["calculator"]}
        created = http.post("/v1/agents", json={"slug": "calc", "name": "Calc", "spec": spec})
        assert created.status_code == 201, created.text
        assert http.post("/v1/agents/calc/publish").status_code == 201
        spans.clear()
        resp = http.post("/v1/sessions", json={"agent": "calc", "prompt": "2 + 2?"})
        assert resp.status_code == 201, resp.text
        sid = resp.json()["session_id"]
        settled(http, sid)

        route = wait_for_span(
            spans,
            lambda s: s.kind == SpanKind.SERVER and s.name == "POST /v1/sessions",
            "API route",
        )
        trace_id = route.context.trace_id if route.context else None
        assert trace_id

        def in_trace(name: str) -> Callable[[ReadableSpan], bool]:
            return lambda s: (
                s.name == name and s.context is not None and (s.context.trace_id == trace_id)
            )

        workflow = wait_for_span(spans, in_trace("RunWorkflow:Session"), "workflow")
        turn = wait_for_span(spans, in_trace("RunActivity:model_turn"), "model_turn")
        tool = wait_for_span(spans, in_trace("RunActivity:run_tool"), "run_tool")
        model_call = wait_for_span(
            spans,
            lambda s: (
                s.kind == SpanKind.CLIENT
                and s.context is not None
                and s.context.trace_id == trace_id
                and url_of(s).startswith(stub)
            ),
            "model HTTP call",
        )
    assert workflow.attributes and workflow.attributes["temporalWorkflowID"] == sid
    assert turn.attributes and turn.attributes["baton.agent"] == "calc"
    assert turn.attributes["baton.session"] == sid
    assert tool.context and turn.context
    # The model's HTTP call is made inside the activity: its span is the activity's child.
    assert model_call.parent is not None
    assert model_call.parent.span_id in {
        s.context.span_id
        for s in spans.get_finished_spans()
        if s.name == "RunActivity:model_turn" and s.context is not None
    }


def test_tracing_off_leaves_no_interceptor_and_no_spans(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """With tracing off (the default) the client gets no tracing interceptor and the API
    answers as before."""
    telemetry.use_tracer_provider(None)
    assert telemetry.client_interceptors() == []
    with running_stack(temporal_env, tmp_path / "off.db") as stack:
        assert stack.http.get("/healthz").status_code == 200


async def test_old_histories_replay_with_tracing_on(spans: InMemorySpanExporter) -> None:
    """Turning tracing on for runs already in flight is safe: every checked-in history
    replays under the TracingInterceptor (it adds headers, never commands)."""
    from temporalio.client import WorkflowHistory
    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.worker import Interceptor, Replayer

    from tests.test_replay import HISTORIES
    from worker.factory import WORKFLOWS

    (interceptor,) = telemetry.client_interceptors()
    assert isinstance(interceptor, Interceptor)
    replayer = Replayer(
        workflows=WORKFLOWS,
        data_converter=pydantic_data_converter,
        interceptors=[interceptor],
    )
    assert HISTORIES
    for path in HISTORIES:
        await replayer.replay_workflow(WorkflowHistory.from_json(path.stem, path.read_text()))
