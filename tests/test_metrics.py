"""Metrics scraped over real HTTP (issue 12, item 6): the worker's Prometheus endpoint
(``BATON_METRICS_BIND``: the Temporal SDK's metrics and Baton's counters) and the API's
``/metrics`` (request count and latency by route and status)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pydantic
import pytest
from prometheus_client.parser import text_string_to_metric_families
from temporalio.testing import WorkflowEnvironment

from baton.settings import Settings
from tests.test_api_reviews import (
    INVOKE_SYNC,
    agent,
    decide,
    launch,
    pending,
    running_stack,
    settled,
    target,
)
from tests.xagent_helpers import caller_playbook
from worker.stack import free_port


def samples(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Scrape ``url``: ``{(sample name, labels): value}``."""
    resp = httpx.get(url, timeout=10)
    assert resp.status_code == 200, resp.text
    found: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(resp.text):
        for s in family.samples:
            found[(s.name, frozenset(s.labels.items()))] = s.value
    return found


def total(
    scraped: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    """Sum of the samples named ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in scraped.items() if n == name and want <= ls)


def test_a_turn_a_review_and_a_delegation_move_the_worker_counters(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """One invoke run (2 caller turns + 1 target turn, an allowed review, a delegation)
    moves baton_turns, baton_tokens, baton_cost_usd, baton_reviews and baton_delegations
    on the worker's endpoint, next to the SDK's own metrics; the API counts its routes."""
    port = free_port()
    bind = f"127.0.0.1:{port}"
    with running_stack(
        temporal_env, tmp_path / "m.db", metrics_bind=bind, prices={"scripted": (1.0, 2.0)}
    ) as stack:
        http = stack.http
        worker_url = f"http://{bind}/metrics"
        before = samples(worker_url)
        target(http)
        agent(http, "caller", caller_playbook("invoke_agent", INVOKE_SYNC))
        sid = launch(http, "caller")
        (review,) = pending(http)
        assert decide(http, review["id"], "allow_once").status_code == 200
        settled(http, sid)
        after = samples(worker_url)
        api = samples(f"{stack.url}/metrics")

    def moved(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    assert moved("baton_turns_total", agent="caller") == 2
    assert moved("baton_turns_total", agent="target") == 1
    assert moved("baton_tokens_total", agent="caller", direction="in") > 0
    assert moved("baton_tokens_total", agent="caller", direction="out") > 0
    assert moved("baton_cost_usd_count", agent="caller") == 2
    assert moved("baton_cost_usd_sum", agent="caller") > 0
    assert moved("baton_reviews_total", outcome="allowed") == 1
    assert moved("baton_reviews_total", outcome="denied") == 0
    assert moved("baton_delegations_total", kind="invoke") == 1
    # The Temporal SDK's own metrics share the endpoint.
    assert total(after, "temporal_activity_execution_latency_count") > 0
    # The API counts by route template and status; ids never become labels.
    assert total(api, "baton_http_requests_total", route="/v1/sessions", status="201") == 1
    assert total(api, "baton_http_requests_total", route="/v1/agents", status="201") == 2
    decided = "/v1/reviews/{review_id}/decision"
    assert total(api, "baton_http_requests_total", route=decided, status="200") == 1
    assert total(api, "baton_http_request_duration_seconds_count", route=decided) == 1
    assert not any(sid in dict(ls).get("route", "") for (_, ls) in api)


def test_api_metrics_count_refusals_and_unmatched_paths(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """A 404 on an unknown agent counts under its route template; an unknown path under
    ``unmatched``; the worker endpoint stays off without BATON_METRICS_BIND."""
    with running_stack(temporal_env, tmp_path / "a.db") as stack:
        http = stack.http
        assert http.get("/v1/agents/nobody").status_code == 404
        assert http.get("/no/such/path").status_code == 404
        api = samples(f"{stack.url}/metrics")
    assert total(api, "baton_http_requests_total", route="/v1/agents/{slug}", status="404") == 1
    assert total(api, "baton_http_requests_total", route="unmatched", status="404") == 1


@pytest.mark.parametrize(
    ("value", "ok"),
    [("127.0.0.1:9464", True), ("0.0.0.0:65535", True), (":9464", True), ("9464", False)],
)
def test_metrics_bind_is_host_and_port(value: str, ok: bool) -> None:
    """BATON_METRICS_BIND must be ``host:port``; a bare port is refused at load."""
    if ok:
        assert Settings(metrics_bind=value).metrics_bind == value
    else:
        with pytest.raises(pydantic.ValidationError):
            Settings(metrics_bind=value)


def test_a_taken_metrics_port_stops_the_worker_clearly() -> None:
    """BATON_METRICS_BIND on a port someone else holds fails the start with one line
    naming the setting (InvalidSettings), not a worker without metrics."""
    import socket

    from baton import telemetry
    from baton.errors import InvalidSettings

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(InvalidSettings, match=f"BATON_METRICS_BIND=127.0.0.1:{port}"):
            telemetry.worker_runtime(f"127.0.0.1:{port}")


def test_the_metrics_middleware_counts_answers_by_route_and_a_crash_as_500() -> None:
    """MeteredApp (pure ASGI) records an answer when its response starts, under the
    matched route's template, a route that raises before answering as a 500, and a
    streamed answer once (at its headers)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    from baton import telemetry
    from tests.conftest import serve

    def ok(request: Request) -> JSONResponse:
        return JSONResponse({"id": request.path_params["item"]})

    def boom(_request: Request) -> JSONResponse:
        raise RuntimeError("before any answer")

    def stream(_request: Request) -> StreamingResponse:
        return StreamingResponse(iter([b"a", b"b", b"c"]), media_type="text/plain")

    metrics = telemetry.RequestMetrics()
    app = Starlette(
        routes=[Route("/items/{item}", ok), Route("/boom", boom), Route("/stream", stream)]
    )
    app.add_middleware(telemetry.MeteredApp, metrics=metrics)
    server, thread, url = serve(app)
    try:
        with httpx.Client(base_url=url) as http:
            assert http.get("/items/1").status_code == 200
            assert http.get("/items/2").status_code == 200
            assert http.get("/stream").text == "abc"
        # Last, on its own connection: Starlette answers 500 and re-raises, and uvicorn
        # then drops that connection.
        with httpx.Client(base_url=url) as http:
            assert http.get("/boom").status_code == 500
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    counted = {
        (s.labels["route"], s.labels["status"]): s.value
        for family in text_string_to_metric_families(metrics.render()[0].decode())
        if family.name == "baton_http_requests"
        for s in family.samples
        if s.name == "baton_http_requests_total"
    }
    assert counted == {("/items/{item}", "200"): 2, ("/boom", "500"): 1, ("/stream", "200"): 1}
