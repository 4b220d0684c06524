"""Metrics scraped over real HTTP: the worker's Prometheus endpoint
(``BATON_METRICS_BIND``: the Temporal SDK's metrics and Baton's counters) and the API's
``/metrics`` (request count and latency by route and status, the balance)."""

from __future__ import annotations

from datetime import datetime
from functools import partial
from pathlib import Path

import httpx
import pydantic
import pytest
from prometheus_client.parser import text_string_to_metric_families
from temporalio.testing import WorkflowEnvironment

from baton import telemetry
from baton.settings import Settings
from baton.storage.db import init_db, make_engine, session_scope
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


def test_every_review_outcome_its_opening_time_to_decision_and_the_balance_are_exported(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """Four invoke reviews, allowed, denied, cancelled with their session and left to time
    out, each count once in baton_reviews_opened_total{operation} and
    baton_reviews_total{outcome}, and baton_review_decision_seconds{outcome} holds each
    one's stored seconds from opening to outcome in Baton's buckets; the API's /metrics
    serves baton_balance_usd as GET /v1/balance reads it, and none while it is unlimited."""
    db_file = tmp_path / "r.db"
    bind, quick_bind = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    prices = {"scripted": (1000.0, 2000.0)}
    # The review left to time out runs on a second API + worker (same database) with a 4 s
    # review timeout, so no decision on the first one races a timer.
    with (
        running_stack(temporal_env, db_file, metrics_bind=bind, prices=prices) as st,
        running_stack(
            temporal_env,
            db_file,
            metrics_bind=quick_bind,
            prices=prices,
            review_timeout=4.0,
            review_delivery_grace=0,
        ) as quick,
    ):
        http = st.http
        assert total(samples(f"{st.url}/metrics"), "baton_balance_usd") == 0  # unlimited
        assert http.put("/v1/balance", json={"balance": 50.0}).status_code == 200
        before = samples(f"http://{bind}/metrics") | samples(f"http://{quick_bind}/metrics")
        target(http)
        agent(http, "caller", caller_playbook("invoke_agent", INVOKE_SYNC))
        sids = [launch(http, "caller") for _ in range(3)]
        by_session = {r["session_id"]: r["id"] for r in pending(http, 3)}
        allowed, denied, cancelled = (by_session[sid] for sid in sids)
        # Found once it has timed out: it may do so before a poll would see it pending.
        timed_sid = launch(quick.http, "caller")
        assert decide(http, allowed, "allow_once").status_code == 200
        assert decide(http, denied, "deny").status_code == 200
        assert http.post(f"/v1/sessions/{sids[2]}/cancel").status_code == 202
        for sid, status in [(sids[0], "idle"), (sids[1], "idle"), (sids[2], "cancelled")]:
            settled(http, sid, status)
        settled(http, timed_sid)
        (timed,) = http.get("/v1/reviews", params={"session_id": timed_sid}).json()["data"]
        rows = {
            outcome: http.get(f"/v1/reviews/{review_id}").json()
            for outcome, review_id in [
                ("allowed", allowed),
                ("denied", denied),
                ("cancelled", cancelled),
                ("timed_out", timed["id"]),
            ]
        }
        after = samples(f"http://{bind}/metrics") | samples(f"http://{quick_bind}/metrics")
        api, quick_api = samples(f"{st.url}/metrics"), samples(f"{quick.url}/metrics")
        balance = http.get("/v1/balance").json()["balance"]

    def moved(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    assert [row["status"] for row in rows.values()] == list(rows)
    assert moved("baton_reviews_opened_total", operation="invoke") == 4
    assert moved("baton_reviews_opened_total") == 4
    assert moved("baton_reviews_total") == 4
    buckets = {float(b) for b in telemetry.REVIEW_DECISION_BUCKETS_S} | {float("inf")}
    for outcome, row in rows.items():
        assert moved("baton_reviews_total", outcome=outcome) == 1, outcome
        assert moved("baton_review_decision_seconds_count", outcome=outcome) == 1, outcome
        stored = (
            datetime.fromisoformat(row["decided_at"]) - datetime.fromisoformat(row["created_at"])
        ).total_seconds()
        seconds = moved("baton_review_decision_seconds_sum", outcome=outcome)
        assert seconds == pytest.approx(stored, abs=1e-3), outcome
        les = {
            float(dict(labels)["le"])
            for (name, labels) in after
            if name == "baton_review_decision_seconds_bucket" and dict(labels)["outcome"] == outcome
        }
        assert les == buckets, outcome
    # The timer, not a person, ended the last one, once its deadline had passed.
    timed_out = rows["timed_out"]
    assert timed_out["decided_by"] == "timeout"
    assert datetime.fromisoformat(timed_out["decided_at"]) >= datetime.fromisoformat(
        timed_out["expires_at"]
    )
    # The balance: one value for the organisation, the same on every API replica.
    assert 0 < balance < 50.0
    assert total(api, "baton_balance_usd") == total(quick_api, "baton_balance_usd") == balance
    assert [ls for (n, ls) in api if n == "baton_balance_usd"] == [frozenset()]


def test_a_count_waits_for_its_commit_and_a_rollback_drops_it(tmp_path: Path) -> None:
    """telemetry.at_commit runs a count once, after the transaction commits; a rolled-back
    transaction's counts never run, so an activity retried after a failed commit counts
    its event once."""
    engine = make_engine(f"sqlite:///{tmp_path / 'c.db'}")
    init_db(engine)
    counted: list[str] = []
    with pytest.raises(RuntimeError), session_scope(engine) as s:
        telemetry.at_commit(s, partial(counted.append, "rolled back"))
        raise RuntimeError("the commit never comes")
    with session_scope(engine) as s:
        telemetry.at_commit(s, partial(counted.append, "committed"))
        assert counted == []
    assert counted == ["committed"]
    with session_scope(engine):
        pass
    assert counted == ["committed"]
    engine.dispose()


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
