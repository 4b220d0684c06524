"""Request values are taken as typed, and the OpenAPI document lists the problems routes
really return.

``PUT /v1/balance`` took ``false`` (→ 0.0, which stops every model call), ``true``,
``"5"`` and ``-1``; ``GET /v1/usage?until=0.5`` read a Unix time. Bodies are strict now
(no bool/str/number coercion), the balance is non-negative, and query date-times must be
RFC 3339. Every route's documented responses cover the 400 ``malformed_body``, 401 and
403 it can answer with, checked by calling every operation of the document.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from temporalio.testing import WorkflowEnvironment

from tests.test_api_agents import assert_problem
from tests.test_api_reviews import Stack, agent, launch, poll, running_stack
from tests.test_auth import USERS, Users, add_user, create_agent


@pytest.fixture(scope="module")
def stack(
    temporal_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """API + worker (auth off) on one SQLite file, with agent ``typed`` published."""
    with running_stack(temporal_env, tmp_path_factory.mktemp("types") / "types.db") as s:
        agent(s.http, "typed", [{"reply": "ok"}])
        yield s
        assert s.http.put("/v1/balance", json={"balance": None}).status_code == 200


# --- the balance ------------------------------------------------------------------------


@pytest.mark.parametrize("value", [False, True, "5", -1, -0.0001, 1e12 * 1.0000001, "null"])
def test_put_balance_refuses_anything_but_a_non_negative_number(stack: Stack, value: Any) -> None:
    """Booleans, strings and negative amounts are a 422; the balance is left as it was."""
    assert stack.http.put("/v1/balance", json={"balance": 7}).status_code == 200
    assert_problem(stack.http.put("/v1/balance", json={"balance": value}), 422, "validation_error")
    assert stack.http.get("/v1/balance").json() == {"balance": 7.0}


@pytest.mark.parametrize("value", [0, 0.0, 5, 2.5, 1e12, None])
def test_put_balance_takes_zero_to_the_bound_and_null(stack: Stack, value: Any) -> None:
    """0 (spent), any amount up to 1e12 USD, and null (unlimited) are accepted as sent."""
    resp = stack.http.put("/v1/balance", json={"balance": value})
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"balance": None if value is None else float(value)}


# --- query date-times ------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["0.5", "1700000000", "1e3", "-1", "2026-12-01T10:00:00"])
def test_usage_refuses_a_bare_number_or_a_naive_date_time(stack: Stack, value: str) -> None:
    """``until=0.5`` (a Unix time to pydantic) or a date-time without a zone is a 422."""
    for name in ("since", "until"):
        resp = stack.http.get("/v1/usage", params={name: value})
        assert_problem(resp, 422, "validation_error")


def test_usage_takes_rfc3339_date_times(stack: Stack) -> None:
    """``2026-12-01T10:00:00Z`` and an explicit offset are accepted."""
    params = {"since": "2026-12-01T10:00:00Z", "until": "2026-12-02T10:00:00+01:00"}
    assert stack.http.get("/v1/usage", params=params).status_code == 200


# --- strict bodies ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/sessions", {"agent": "typed", "prompt": "hi", "sync": "true"}),
        ("/v1/sessions", {"agent": "typed", "prompt": "hi", "sync": 1}),
        ("/v1/sessions", {"agent": "typed", "prompt": "hi", "disable_delegation": 0}),
        ("/v1/steps", {"agent": "typed", "input": "x", "handoff": 1}),
        ("/v1/steps", {"agent": "typed", "input": "x", "timeout_s": "60"}),
        ("/v1/steps", {"agent": "typed", "input": "x", "handoff_timeout_s": True}),
        ("/v1/steps", {"agent": "typed", "input": "x", "retry": {"max_attempts": True}}),
        ("/v1/steps", {"agent": "typed", "input": "x", "retry": {"max_attempts": "2"}}),
        ("/v1/steps", {"agent": "typed", "input": "x", "retry": {"backoff_coefficient": "2"}}),
        ("/v1/agents", {"slug": "t1", "name": "T", "spec": {"limits": {"max_spawns": True}}}),
        ("/v1/agents", {"slug": "t2", "name": "T", "spec": {"limits": {"token_budget": "100"}}}),
        ("/v1/agents", {"slug": "t3", "name": "T", "spec": {"limits": {"max_depth": 1.0}}}),
        (
            "/v1/agents",
            {"slug": "t4", "name": "T", "spec": {"delegation": {"available_for_delegation": 1}}},
        ),
        (
            "/v1/agents",
            {
                "slug": "t5",
                "name": "T",
                "spec": {"playbook": [{"reply": "r", "chunk_delay_ms": "5"}]},
            },
        ),
    ],
)
def test_bodies_refuse_coerced_booleans_and_numbers(
    stack: Stack, path: str, body: dict[str, Any]
) -> None:
    """A boolean sent as a string or number, or a number sent as a boolean or string, is a 422."""
    assert_problem(stack.http.post(path, json=body), 422, "validation_error")


def test_typed_values_are_still_accepted(stack: Stack) -> None:
    """The same fields with proper JSON types work (an integer where a float is expected too)."""
    resp = stack.http.post(
        "/v1/steps",
        json={
            "agent": "typed",
            "input": "x",
            "handoff": False,
            "timeout_s": 60,
            "retry": {"max_attempts": 1, "initial_interval_s": 0, "backoff_coefficient": 1},
        },
    )
    assert resp.status_code == 202, resp.text
    spec = {"limits": {"max_spawns": 4}, "delegation": {"available_for_delegation": True}}
    created = stack.http.post("/v1/agents", json={"slug": "typed-ok", "name": "T", "spec": spec})
    assert created.status_code == 201, created.text
    sid = stack.http.post("/v1/sessions", json={"agent": "typed", "prompt": "hi", "sync": True})
    assert sid.status_code == 201 and sid.json()["response"] == "ok"


# --- the OpenAPI document against what the routes answer -------------------------------------


@pytest.fixture(scope="module")
def auth_stack(
    temporal_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Users, Stack, dict[str, str]]]:
    """Auth mode: alice owns agent ``alpha``, a session, a step and team ``crew``; bob owns
    nothing. Yields the users, the stack and the ids to put in paths."""
    tokens: dict[str, str] = {}

    def prepare(engine: Any) -> None:
        tokens.update({u: add_user(engine, u) for u in USERS})

    db = tmp_path_factory.mktemp("openapi") / "openapi.db"
    with running_stack(temporal_env, db, prepare, auth="on") as st:
        users = Users(st.url, tokens)
        alice = users["alice"]
        create_agent(alice, "alpha", [{"reply": "ok"}])
        session_id = launch(alice, "alpha")
        step = alice.post("/v1/steps", json={"agent": "alpha", "input": "x"})
        assert step.status_code == 202, step.text
        team = alice.post("/v1/teams", json=team_body("crew"))
        assert team.status_code == 201, team.text
        hook = alice.post("/v1/webhooks", json=WEBHOOK)
        assert hook.status_code == 201, hook.text
        poll(lambda: alice.get(f"/v1/sessions/{session_id}").json()["status"] == "idle", "idle")
        ids = {
            "slug": "alpha",
            "version": "1",
            "session_id": session_id,
            "step_id": step.json()["step_id"],
            "team_id": "crew",
            "review_id": "review-00000000-0000-0000-0000-000000000000",
            "inquiry_id": "inquiry-00000000-0000-0000-0000-000000000000",
            "webhook_id": hook.json()["id"],
            "eval_id": "eval-00000000-0000-0000-0000-000000000000",
            "exhibit_id": "exhibit-00000000-0000-0000-0000-000000000000",
            "path": "notes.txt",
        }
        try:
            yield users, st, ids
        finally:
            users.close()


def team_body(team_id: str) -> dict[str, Any]:
    """A one-member team led by ``alpha``."""
    return {
        "id": team_id,
        "name": "Crew",
        "supervisor_agent_id": "alpha",
        "members": [{"agent_id": "alpha", "role": "supervisor"}],
    }


#: A webhook auth mode accepts without a network: a public IP literal, an event that never
#: fires here (no prices, so no charge).
WEBHOOK = {"url": "https://93.184.216.34/hook", "events": ["balance.low"]}
#: A body each operation accepts as valid, so that a refusal can only come from auth.
BODIES: dict[tuple[str, str], Any] = {
    ("post", "/v1/agents"): {"slug": "bobs", "name": "Bob's"},
    ("patch", "/v1/agents/{slug}"): {"name": "Taken"},
    ("put", "/v1/agents/{slug}/draft"): {},
    ("post", "/v1/agents/{slug}/restore"): {"version": 1},
    ("post", "/v1/agents/{slug}/publish"): {},
    ("post", "/v1/agents/{slug}/evals"): {},
    ("post", "/v1/agents/{slug}/rollback"): {"version": 1},
    ("put", "/v1/agents/{slug}/policies"): {},
    ("post", "/v1/sessions"): {"agent": "alpha", "prompt": "hi"},
    ("post", "/v1/sessions/{session_id}/messages"): {"prompt": "hi"},
    ("post", "/v1/sessions/{session_id}/fork"): {"after_message_id": "m", "prompt": "hi"},
    ("post", "/v1/reviews/{review_id}/decision"): {"decision": "deny"},
    ("post", "/v1/teams"): team_body("bobs-crew"),
    ("put", "/v1/teams/{team_id}"): team_body("crew"),
    ("post", "/v1/steps"): {"agent": "alpha", "input": "x"},
    ("post", "/v1/steps/{step_id}/handoff"): {"decision": "approve"},
    ("put", "/v1/balance"): {"balance": 5},
    ("post", "/v1/sessions/{session_id}/inquiries"): {"question": "What happened?"},
    ("post", "/v1/webhooks"): WEBHOOK,
}
#: Multipart operations (the spoken inquiry): the file they take.
FILES: dict[tuple[str, str], Any] = {
    ("post", "/v1/sessions/{session_id}/inquiries/voice"): {
        "audio": ("question.webm", b"\x1aE\xdf\xa3", "audio/webm")
    },
}

#: Operations whose body is raw bytes (a workspace file): the bytes they take.
RAW: dict[tuple[str, str], bytes] = {
    ("put", "/v1/sessions/{session_id}/files/{path}"): b"hello",
}


def operations(http: httpx.Client) -> list[tuple[str, str, dict[str, Any]]]:
    """Every ``(method, path template, operation)`` of the served OpenAPI document under /v1."""
    doc = http.get("/openapi.json").json()
    return [
        (method, path, op)
        for path, ops in doc["paths"].items()
        for method, op in ops.items()
        if path.startswith("/v1/")
    ]


def status_of(http: httpx.Client, method: str, url: str, **kwargs: Any) -> int:
    """The status of a request, without reading a body (an SSE stream stays open)."""
    request = http.build_request(method.upper(), url, **kwargs)
    response = http.send(request, stream=True)
    response.close()
    return response.status_code


def test_every_operation_documents_the_problems_it_returns(
    auth_stack: tuple[Users, Stack, dict[str, str]],
) -> None:
    """For each operation: its 401 (no token), its 400 malformed_body (a body that is not
    UTF-8) and whatever it answers bob on alice's resources (403 included) are documented."""
    users, _stack, ids = auth_stack
    bob = users["bob"]
    ops = operations(bob)
    assert len(ops) > 30
    undocumented: list[str] = []
    for method, path, op in ops:
        documented = set(op["responses"])
        url = path.format(**ids)
        has_body = "requestBody" in op
        json_body = "application/json" in op.get("requestBody", {}).get("content", {})
        seen = {status_of(users.anonymous, method, url, json=BODIES.get((method, path), {}))}
        assert seen == {401}, f"{method} {path} answered {seen} without a token"
        if json_body:
            bad = status_of(
                bob,
                method,
                url,
                content=b'{"x": "\xff"}',
                headers={"content-type": "application/json"},
            )
            assert bad == 400, f"{method} {path} answered {bad} to a body that is not UTF-8"
            seen.add(bad)
        kwargs: dict[str, Any] = {}
        if json_body:
            kwargs = {"json": BODIES[(method, path)]}
        elif (method, path) in RAW:
            kwargs = {"content": RAW[(method, path)]}
        elif has_body:
            kwargs = {"files": FILES[(method, path)]}
        seen.add(status_of(bob, method, url, **kwargs))
        undocumented += [f"{method.upper()} {path}: {s}" for s in seen if str(s) not in documented]
    assert not undocumented, undocumented


def test_a_malformed_body_is_a_400_malformed_body_problem(stack: Stack) -> None:
    """A body that is not UTF-8, or nested past the JSON parser's limit, is 400 malformed_body."""
    for content in (b'{"slug": "\xff"}', b"[" * 100_000 + b"]" * 100_000):
        resp = stack.http.post(
            "/v1/agents", content=content, headers={"content-type": "application/json"}
        )
        assert_problem(resp, 400, "malformed_body")
