"""Webhooks on the real stack: signed deliveries to a receiver on a loopback port, retries,
a worker killed mid-delivery, the outbound rule in auth mode, owner scoping, bad input."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlmodel import Session
from standardwebhooks.webhooks import Webhook
from temporalio.testing import WorkflowEnvironment
from typer.testing import CliRunner

from api.app import create_app
from baton.grants import auth
from baton.outbound import OutboundPolicy
from baton.runs import metering
from baton.settings import Settings
from baton.storage.db import ReviewRow, init_db, make_engine, session_scope
from baton.webhooks import events
from baton.webhooks.subscriptions import MAX_PENDING_TESTS, WebhookIn, create_webhook
from cli import app
from tests.conftest import serve
from tests.helpers import publish
from tests.test_api_agents import assert_problem
from tests.test_api_reviews import agent, launch, pending, poll, running_stack, target
from tests.test_fault import start_worker, worker_env
from tests.xagent_helpers import caller_playbook
from worker.factory import build_worker
from worker.stack import stop_process

INVOKE = {"slug": "target", "prompt": "hello target", "sync": True}
#: Retries a loaded machine still makes quickly (the schedule is exponential from here).
FAST_RETRY = {"BATON_WEBHOOK_RETRY_INITIAL": "0.2", "BATON_WEBHOOK_RETRY_MAX": "1"}


@dataclass
class Receiver:
    """A real HTTP receiver on a loopback port: answers ``fail_first`` requests with 500,
    then 200; ``hold`` (when set) keeps each request open until released. Keeps every
    request (headers, body) and the ids it processed once (dedup by ``webhook-id``)."""

    fail_first: int = 0
    hold: threading.Event | None = None
    arrived: threading.Event = field(default_factory=threading.Event)
    requests: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    processed: dict[str, dict[str, Any]] = field(default_factory=dict)
    received_at: list[float] = field(default_factory=list)
    duplicates: int = 0
    url: str = ""

    def serve(self) -> Iterator[Receiver]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                headers = {k.lower(): v for k, v in self.headers.items()}
                receiver.received_at.append(time.time())
                receiver.requests.append((headers, body))
                receiver.arrived.set()
                if receiver.hold is not None and not receiver.hold.wait(60):
                    return
                if len(receiver.requests) <= receiver.fail_first:
                    self.send_response(500)
                    self.end_headers()
                    self.wfile.write(b"not now")
                    return
                if headers["webhook-id"] in receiver.processed:
                    receiver.duplicates += 1
                else:
                    receiver.processed[headers["webhook-id"]] = json.loads(body)
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            if self.hold is not None:
                self.hold.set()
            server.shutdown()
            server.server_close()

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [p for p in self.processed.values() if p["type"] == kind]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A receiver that accepts every delivery."""
    yield from Receiver().serve()


def subscribe(http: httpx.Client, url: str, events_: list[str], **extra: Any) -> dict[str, Any]:
    """``POST /v1/webhooks``; returns the created subscription (with its secret)."""
    resp = http.post("/v1/webhooks", json={"url": url, "events": events_, **extra})
    assert resp.status_code == 201, resp.text
    body: dict[str, Any] = resp.json()
    return body


def deliveries(http: httpx.Client, hook: dict[str, Any]) -> list[dict[str, Any]]:
    resp = http.get(f"/v1/webhooks/{hook['id']}/deliveries")
    assert resp.status_code == 200, resp.text
    data: list[dict[str, Any]] = resp.json()["data"]
    return data


def delivered(http: httpx.Client, hook: dict[str, Any], count: int = 1) -> list[dict[str, Any]]:
    """Wait until ``count`` deliveries of ``hook`` are final; returns the log."""

    def check() -> list[dict[str, Any]] | None:
        log = deliveries(http, hook)
        final = [d for d in log if d["status"] in ("delivered", "failed", "refused")]
        return log if len(final) >= count else None

    found: list[dict[str, Any]] = poll(check, f"{count} final deliveries", timeout=90)
    return found


def test_review_opened_reaches_the_receiver_signed(
    temporal_env: WorkflowEnvironment,
    tmp_path: Path,
    receiver: Receiver,
    record_property: Callable[[str, object], None],
) -> None:
    """A review's opening is POSTed signed (Standard Webhooks) with caller, target,
    operation, preview, deadline and decision links, after the review opened (the delay
    is printed under 'measured'); its resolution follows."""
    with running_stack(temporal_env, tmp_path / "hooks.db") as stack:
        http = stack.http
        hook = subscribe(http, receiver.url, ["review.opened", "review.resolved"])
        assert hook["secret"].startswith("whsec_")
        assert "secret" not in http.get(f"/v1/webhooks/{hook['id']}").json()
        target(http)
        agent(http, "caller", caller_playbook("invoke_agent", INVOKE))
        launch(http, "caller")
        (review,) = pending(http)
        poll(lambda: receiver.of_type("review.opened"), "review.opened delivered")
        headers, body = receiver.requests[0]
        opened = datetime.fromisoformat(review["created_at"].replace("Z", "+00:00"))
        delay_ms = (receiver.received_at[0] - opened.timestamp()) * 1000
        assert delay_ms > 0  # sent because the review opened, never before it
        record_property("measured", f"review.opened received {delay_ms:.0f} ms after it opened")
        payload = Webhook(hook["secret"]).verify(body, headers)
        assert payload["id"] == headers["webhook-id"]
        data = payload["data"]
        assert data["review_id"] == review["id"]
        assert (data["caller"], data["target"], data["operation"]) == ("caller", "target", "invoke")
        assert data["preview"] == review["preview"] and data["deadline"]
        assert data["links"]["decision"].endswith(f"/v1/reviews/{review['id']}/decision")
        assert data["links"]["console"].endswith(f"/ui/inbox#{review['id']}")
        forged = Webhook("whsec_" + "A" * 43)
        with pytest.raises(Exception, match="signature"):
            forged.verify(body, headers)
        decided = http.post(f"/v1/reviews/{review['id']}/decision", json={"decision": "allow_once"})
        assert decided.status_code in (200, 202), decided.text
        (resolved,) = poll(lambda: receiver.of_type("review.resolved"), "review.resolved")
        assert resolved["data"]["status"] == "allowed"
        log = delivered(http, hook, 2)
        assert {d["status"] for d in log} == {"delivered"} and {d["attempts"] for d in log} == {1}


def test_a_receiver_failing_twice_gets_the_third_attempt(
    temporal_env: WorkflowEnvironment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two 500 answers, then the same signed body under the same id succeeds: 3 attempts."""
    for name, value in FAST_RETRY.items():
        monkeypatch.setenv(name, value)
    for flaky in Receiver(fail_first=2).serve():
        with running_stack(temporal_env, tmp_path / "retry.db") as stack:
            hook = subscribe(stack.http, flaky.url, ["session.failed"])
            sent = stack.http.post(f"/v1/webhooks/{hook['id']}/test")
            assert sent.status_code == 202, sent.text
            (entry,) = delivered(stack.http, hook)
            assert (entry["status"], entry["attempts"]) == ("delivered", 3)
            assert entry["id"] == sent.json()["delivery_id"]
            assert len(flaky.requests) == 3
            assert len({h["webhook-id"] for h, _ in flaky.requests}) == 1
            assert len({b for _, b in flaky.requests}) == 1
            for headers, body in flaky.requests:
                Webhook(hook["secret"]).verify(body, headers)


def test_a_worker_killed_mid_delivery_still_delivers_once(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """SIGKILL while the receiver holds the POST; another worker sends it again and the
    receiver, deduplicating by delivery id, processes it once."""
    db_url = f"sqlite:///{tmp_path / 'kill.db'}"
    engine = make_engine(db_url)
    init_db(engine)
    queue = f"tq-{uuid.uuid4()}"
    extra = {**FAST_RETRY, "BATON_WEBHOOK_TIMEOUT": "2"}
    env = worker_env(db_url, temporal_env, queue, **extra)
    settings = Settings(
        database_url=db_url,
        temporal_address=temporal_env.client.service_client.config.target_host,
        task_queue=queue,
    )
    server, thread, base = serve(create_app(settings))
    first = start_worker(env)
    second = None
    try:
        for held in Receiver(hold=threading.Event()).serve():
            with httpx.Client(base_url=base, timeout=60) as http:
                hook = subscribe(http, held.url, ["step.failed"])
                sent = http.post(f"/v1/webhooks/{hook['id']}/test")
                assert sent.status_code == 202, sent.text
                assert held.arrived.wait(90), "the first attempt never arrived"
                first.send_signal(signal.SIGKILL)
                first.wait(timeout=10)
                assert held.hold is not None
                held.hold.set()  # the first POST is answered to a dead worker
                second = start_worker(env)
                (entry,) = delivered(http, hook)
                assert entry["status"] == "delivered" and entry["attempts"] >= 2
                assert len(held.requests) >= 2 and len(held.processed) == 1
                assert held.duplicates == len(held.requests) - 1
                assert list(held.processed) == [sent.json()["delivery_id"]]
    finally:
        for proc in (first, second):
            stop_process(proc)
        server.should_exit = True
        thread.join(timeout=10)
        engine.dispose()


def _user(engine: Any, user_id: str) -> str:
    with session_scope(engine) as s:
        auth.create_user(s, user_id=user_id)
        _, token = auth.issue_token(s, user_id=user_id)
    return token


async def test_auth_mode_refuses_private_receivers_at_creation_and_at_delivery(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """Auth mode: a loopback or metadata receiver outside BATON_OUTBOUND_ALLOW is refused
    at creation; one the API allowed but the worker's rule refuses is refused at delivery,
    and nothing reaches it."""
    db_url = f"sqlite:///{tmp_path / 'ssrf.db'}"
    engine = make_engine(db_url)
    init_db(engine)
    token = _user(engine, "alice")
    queue = f"tq-{uuid.uuid4()}"
    api_settings = Settings(
        database_url=db_url,
        auth="on",
        outbound_allow="127.0.0.1/32",
        temporal_address=temporal_env.client.service_client.config.target_host,
        task_queue=queue,
    )
    server, thread, base = serve(create_app(api_settings))
    headers = {"Authorization": f"Bearer {token}"}
    try:
        for quiet in Receiver().serve():
            async with httpx.AsyncClient(base_url=base, headers=headers, timeout=60) as http:
                for url in ("http://127.0.0.2:9/hook", "http://169.254.169.254/latest"):
                    refused = await http.post(
                        "/v1/webhooks", json={"url": url, "events": ["review.opened"]}
                    )
                    body = assert_problem(refused, 422, "webhook_url_refused")
                    assert "BATON_OUTBOUND_ALLOW" in body["detail"]
                created = await http.post(
                    "/v1/webhooks", json={"url": quiet.url, "events": ["review.opened"]}
                )
                assert created.status_code == 201, created.text
                hook = created.json()
                restricted = OutboundPolicy(restricted=True)  # this worker allows nothing
                async with build_worker(
                    temporal_env.client, engine=engine, task_queue=queue, outbound=restricted
                ):
                    sent = await http.post(f"/v1/webhooks/{hook['id']}/test")
                    assert sent.status_code == 202, sent.text

                    log_path = f"/v1/webhooks/{hook['id']}/deliveries"
                    deadline = time.monotonic() + 90
                    while True:
                        log = (await http.get(log_path)).json()
                        if log["data"] and log["data"][0]["status"] == "refused":
                            break
                        assert time.monotonic() < deadline, "the delivery was not refused"
                        await asyncio.sleep(0.1)
                log = (await http.get(f"/v1/webhooks/{hook['id']}/deliveries")).json()
                (entry,) = log["data"]
                assert entry["attempts"] == 1 and "BATON_OUTBOUND_ALLOW" in entry["last_error"]
                assert quiet.requests == []
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        engine.dispose()


def test_each_user_sees_and_changes_only_her_webhooks(tmp_path: Path, receiver: Receiver) -> None:
    """Auth mode: another user's webhook is 404 to list, get, delete, log and test."""
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'own.db'}", auth="on", outbound_allow="127.0.0.0/8"
    )
    engine = make_engine(settings.database_url)
    init_db(engine)
    alice, bob = _user(engine, "alice"), _user(engine, "bob")
    server, thread, base = serve(create_app(settings))
    try:
        as_alice = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {alice}"})
        as_bob = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {bob}"})
        hook = subscribe(as_alice, receiver.url, ["review.opened"])
        assert hook["owner"] == "alice"
        assert as_bob.get("/v1/webhooks").json() == {"data": [], "count": 0}
        assert as_alice.get("/v1/webhooks").json()["count"] == 1
        path = f"/v1/webhooks/{hook['id']}"
        for resp in (
            as_bob.get(path),
            as_bob.get(f"{path}/deliveries"),
            as_bob.post(f"{path}/test"),
            as_bob.delete(path),
        ):
            assert_problem(resp, 404, "webhook_not_found")
        assert as_alice.delete(path).status_code == 204
        assert_problem(as_alice.get(path), 404, "webhook_not_found")
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        engine.dispose()


def test_an_owner_hears_only_of_reviews_she_may_decide(tmp_path: Path) -> None:
    """A review of alice's agent queues a delivery to alice's webhook, none to bob's."""
    engine = make_engine(f"sqlite:///{tmp_path / 'acl.db'}")
    init_db(engine)
    publish(engine, "helper")
    with Session(engine) as s:
        for user in ("alice", "bob"):
            auth.create_user(s, user_id=user)
        auth.grant(s, agent="helper", user_id="alice", role="owner")
        policy = OutboundPolicy()
        hooks = {
            user: create_webhook(
                s,
                body=WebhookIn(url="https://example.com/hook", events=["review.opened"]),
                owner=user,
                policy=policy,
            )
            for user in ("alice", "bob")
        }
        row = ReviewRow(
            id="review-1",
            session_id="session-1",
            caller_agent_slug="helper",
            operation="list",
            preview="list agents",
        )
        ids = events.review_opened(s, row)
        assert ids == [events.delivery_id(hooks["alice"].id, "review.opened:review-1")]
        assert events.review_opened(s, row) == []  # emitted again: nothing new
        s.rollback()  # never committed: no workflow is started
    engine.dispose()


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"url": "ftp://example.com/x", "events": ["review.opened"]}, 422, "validation_error"),
        ({"url": "https://example.com/x", "events": []}, 422, "validation_error"),
        ({"url": "https://example.com/x", "events": ["review.maybe"]}, 422, "validation_error"),
        ({"url": "https://u:p@example.com/x", "events": ["step.failed"]}, 422, "validation_error"),
        (
            {"url": "https://example.com/x", "events": ["step.failed"], "agent": "a", "team": "t"},
            422,
            "validation_error",
        ),
        (
            {"url": "https://example.com/x", "events": ["step.failed"], "balance_low_usd": 5},
            422,
            "validation_error",
        ),
        (
            {"url": "https://example.com/x", "events": ["step.failed"], "agent": "nobody"},
            404,
            "agent_not_found",
        ),
    ],
    ids=[
        "scheme",
        "no-events",
        "unknown-event",
        "credentials",
        "two-filters",
        "threshold",
        "unknown-agent",
    ],
)
def test_a_bad_subscription_is_a_problem_with_a_code(
    api: httpx.Client, body: dict[str, Any], status: int, code: str
) -> None:
    """Each malformed or impossible subscription answers its 4xx problem+json."""
    assert_problem(api.post("/v1/webhooks", json=body), status, code)


def test_unknown_and_malformed_webhook_ids_are_problems(api: httpx.Client) -> None:
    """An id of no webhook is 404 ``webhook_not_found``; a malformed one 422."""
    unknown = f"/v1/webhooks/webhook-{uuid.UUID(int=0)}"
    assert_problem(api.get(unknown), 404, "webhook_not_found")
    assert_problem(api.post(f"{unknown}/test"), 404, "webhook_not_found")
    assert_problem(api.get("/v1/webhooks/nope"), 422, "validation_error")


def test_the_cli_adds_tests_logs_and_removes_a_webhook(
    temporal_env: WorkflowEnvironment, tmp_path: Path, receiver: Receiver
) -> None:
    """`baton webhooks add/list/test/deliveries/rm` against a live API and worker."""
    runner = CliRunner()
    with running_stack(temporal_env, tmp_path / "cli.db") as stack:

        def run(*args: str) -> str:
            result = runner.invoke(app, ["webhooks", *args, "--api", stack.url])
            assert result.exit_code == 0, result.output
            return result.output

        added = run("add", receiver.url, "-e", "step.failed", "-e", "review.opened")
        hook_id = re.search(r"webhook-[0-9a-f-]{36}", added)
        assert hook_id is not None and "whsec_" in added
        listed = run("list")
        assert hook_id[0] in listed and "step.failed, review.opened" in listed
        assert "queued" in run("test", hook_id[0])
        poll(lambda: receiver.of_type("webhook.test"), "the test delivery")
        assert "delivered" in run("deliveries", hook_id[0])
        assert "deleted" in run("rm", hook_id[0])
        assert "no webhooks" in run("list")


def test_handoffs_failures_and_a_low_balance_are_delivered(
    temporal_env: WorkflowEnvironment, tmp_path: Path, receiver: Receiver
) -> None:
    """handoff.opened and .resolved for a rejected handoff, step.failed for an invalid
    deliverable, balance.low when a charge crosses the threshold, session.failed when a
    turn fails for good (here: the balance is spent)."""
    every = [
        "handoff.opened",
        "handoff.resolved",
        "step.failed",
        "balance.low",
        "session.failed",
    ]
    prices = {"scripted": (0.0, 1_000_000.0)}  # $1 per output token
    with running_stack(temporal_env, tmp_path / "events.db", prices=prices) as stack:
        http = stack.http
        assert http.put("/v1/balance", json={"balance": 100}).status_code == 200
        subscribe(http, receiver.url, every, balance_low_usd=99.5)
        agent(http, "drafter", [{"reply": '{"summary": "a draft"}'}])
        schema = {"type": "object", "required": ["summary"]}
        retry = {"max_attempts": 1, "initial_interval_s": 0.01, "backoff_coefficient": 1}
        body = {"agent": "drafter", "input": "go", "output_schema": schema, "retry": retry}
        started = http.post("/v1/steps", json={**body, "handoff": True})
        assert started.status_code == 202, started.text
        step_id = started.json()["step_id"]
        (opened,) = poll(lambda: receiver.of_type("handoff.opened"), "handoff.opened")
        assert opened["data"]["step_id"] == step_id
        assert opened["data"]["links"]["decision"].endswith(f"/v1/steps/{step_id}/handoff")
        assert "a draft" in opened["data"]["deliverable_preview"] and opened["data"]["deadline"]
        (low,) = poll(lambda: receiver.of_type("balance.low"), "balance.low")
        assert low["data"]["before"] > 99.5 >= low["data"]["balance"]
        rejected = http.post(f"/v1/steps/{step_id}/handoff", json={"decision": "reject"})
        assert rejected.status_code == 202, rejected.text
        (resolved,) = poll(lambda: receiver.of_type("handoff.resolved"), "handoff.resolved")
        assert (resolved["data"]["step_id"], resolved["data"]["status"]) == (step_id, "rejected")

        agent(http, "sloppy", [{"reply": "not json"}])
        bad = http.post("/v1/steps", json={**body, "agent": "sloppy"})
        assert bad.status_code == 202, bad.text
        (failed,) = poll(lambda: receiver.of_type("step.failed"), "step.failed")
        assert failed["data"]["step_id"] == bad.json()["step_id"]
        assert "invalid_deliverable" in failed["data"]["error"]

        assert http.put("/v1/balance", json={"balance": 0}).status_code == 200
        session_id = launch(http, "drafter")
        (gone,) = poll(lambda: receiver.of_type("session.failed"), "session.failed")
        assert (gone["data"]["session_id"], gone["data"]["agent"]) == (session_id, "drafter")
        assert gone["data"]["status"] == "idle" and "balance" in gone["data"]["error"]
        assert len(receiver.of_type("balance.low")) == 1  # crossed once


def test_test_sends_in_flight_are_bounded(
    temporal_env: WorkflowEnvironment, tmp_path: Path, receiver: Receiver
) -> None:
    """With no worker to deliver them, the sixth test-send of one webhook is 429."""
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'tests.db'}",
        temporal_address=temporal_env.client.service_client.config.target_host,
        task_queue=f"tq-{uuid.uuid4()}",  # nobody polls it: every delivery stays pending
    )
    engine = make_engine(settings.database_url)
    init_db(engine)
    server, thread, base = serve(create_app(settings))
    try:
        with httpx.Client(base_url=base, timeout=60) as http:
            hook = subscribe(http, receiver.url, ["review.opened"])
            for _ in range(MAX_PENDING_TESTS):
                assert http.post(f"/v1/webhooks/{hook['id']}/test").status_code == 202
            assert_problem(
                http.post(f"/v1/webhooks/{hook['id']}/test"), 429, "too_many_pending_tests"
            )
            assert [d["status"] for d in deliveries(http, hook)] == ["pending"] * MAX_PENDING_TESTS
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        engine.dispose()


def test_a_charge_crossing_the_threshold_queues_one_balance_low(engine: Any) -> None:
    """balance.low is queued by the charge that crosses a webhook's threshold, not by the
    charges before or after it (both backends: the charge reads the amount it left)."""
    with Session(engine) as s:
        metering.set_balance(s, amount=10.0)
        hook = create_webhook(
            s,
            body=WebhookIn(url="https://example.com/h", events=["balance.low"], balance_low_usd=5),
            owner="local",
            policy=OutboundPolicy(),
        )
        queued = []
        for i, cost in enumerate((3.0, 3.0, 3.0)):  # 10 → 7 → 4 (crosses 5) → 1
            before = len(events.pending_ids(s))
            metering.record(
                s,
                message_id=f"m{i}",
                agent="a",
                session_id="session-1",
                model="scripted",
                input_tokens=1,
                output_tokens=1,
                cost_usd=cost,
            )
            queued.append(len(events.pending_ids(s)) - before)
        assert queued == [0, 1, 0]
        (delivery,) = events.pending_ids(s)
        assert delivery == events.delivery_id(hook.id, "balance.low:m1")
        s.rollback()


def test_an_agent_or_team_filter_delivers_its_events_and_holds_back_the_rest(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """With the balance spent, three turns fail: alpha's alone, beta's alone, and the lead
    alpha's in a run of team crew. A subscription filtered to beta hears only beta's
    failure, one filtered to crew only the team run's; an unfiltered one hears all three
    (written in the same transactions, so once it has them the filtered logs are final)."""
    served = contextlib.contextmanager(Receiver.serve)
    with contextlib.ExitStack() as receivers:
        every, by_agent, by_team = (receivers.enter_context(served(Receiver())) for _ in range(3))
        with running_stack(temporal_env, tmp_path / "filters.db") as stack:
            http = stack.http
            for slug in ("alpha", "beta"):
                agent(http, slug, [{"reply": f"{slug} answers"}])
            crew = {
                "id": "crew",
                "name": "Crew",
                "supervisor_agent_id": "alpha",
                "members": [{"agent_id": "alpha", "role": "supervisor"}, {"agent_id": "beta"}],
            }
            assert http.post("/v1/teams", json=crew).status_code == 201
            hooks = {
                "every": subscribe(http, every.url, ["session.failed"]),
                "agent": subscribe(http, by_agent.url, ["session.failed"], agent="beta"),
                "team": subscribe(http, by_team.url, ["session.failed"], team="crew"),
            }
            assert (hooks["agent"]["agent"], hooks["team"]["team"]) == ("beta", "crew")
            assert http.put("/v1/balance", json={"balance": 0}).status_code == 200
            alone = {slug: launch(http, slug) for slug in ("alpha", "beta")}
            team_run = http.post("/v1/sessions", json={"team": "crew", "prompt": "go"})
            assert team_run.status_code == 201, team_run.text
            in_team = team_run.json()["session_id"]

            def failed(r: Receiver) -> set[str]:
                return {p["data"]["session_id"] for p in r.of_type("session.failed")}

            poll(lambda: len(failed(every)) == 3, "three session.failed", timeout=90)
            assert failed(every) == {alone["alpha"], alone["beta"], in_team}
            assert len(delivered(http, hooks["agent"])) == 1
            assert len(delivered(http, hooks["team"])) == 1
            poll(lambda: failed(by_agent) and failed(by_team), "the filtered deliveries")
            assert failed(by_agent) == {alone["beta"]}
            assert failed(by_team) == {in_team}
            assert len(delivered(http, hooks["every"], 3)) == 3
            assert len(deliveries(http, hooks["agent"])) == 1
            assert len(deliveries(http, hooks["team"])) == 1
