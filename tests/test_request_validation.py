"""Requests are validated before anything runs: a ``null`` where a value is expected is a
422 (never a 500), an ambassador is not a step's agent (422 ``not_invocable``), and every
check comes before Temporal is reached, so a bad request is its 4xx while Temporal is down
and only a valid one is a 503 ``engine_unavailable``."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from temporalio.testing import WorkflowEnvironment

from api.app import create_app
from baton.contracts.workflow_io import Provenance
from baton.runs import session_store
from baton.settings import Settings
from baton.storage.db import make_engine, session_scope
from tests.conftest import migrated, serve
from tests.test_api_agents import assert_problem
from tests.test_api_reviews import Stack, agent, running_stack
from worker.stack import free_port


def ambassador(http: httpx.Client, slug: str = "briefer") -> None:
    """Create and publish ``slug`` as an agent of kind ambassador."""
    spec = {"kind": "ambassador", "playbook": [{"reply": "briefed"}]}
    created = http.post("/v1/agents", json={"slug": slug, "name": "Briefer", "spec": spec})
    assert created.status_code == 201, created.text
    assert http.post(f"/v1/agents/{slug}/publish").status_code == 201


@pytest.fixture(scope="module")
def stack(
    temporal_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """API + worker on one SQLite file, with agent ``typed`` and ambassador ``briefer``."""
    with running_stack(temporal_env, tmp_path_factory.mktemp("valid") / "valid.db") as s:
        agent(s.http, "typed", [{"reply": "ok"}])
        ambassador(s.http)
        yield s


# --- null values ------------------------------------------------------------------------


def test_a_null_prompt_is_a_422_not_a_500(stack: Stack) -> None:
    """``prompt: null`` on a launch, and beside ``from_draft`` on a message, is 422
    ``validation_error`` (the blank check read ``.strip()`` of None: 500)."""
    http = stack.http
    launch = http.post("/v1/sessions", json={"agent": "typed", "prompt": None})
    assert_problem(launch, 422, "validation_error")
    sid = http.post("/v1/sessions", json={"agent": "typed", "prompt": "hi", "sync": True})
    assert sid.status_code == 201, sid.text
    draft = f"inquiry-{uuid.uuid4()}"
    message = http.post(
        f"/v1/sessions/{sid.json()['session_id']}/messages",
        json={"prompt": None, "from_draft": draft},
    )
    assert_problem(message, 422, "validation_error")


def _json_bodies(doc: dict[str, Any]) -> Iterator[tuple[str, str, list[str]]]:
    """``(method, path, body properties)`` of every operation taking a JSON object body."""
    schemas = doc["components"]["schemas"]
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            content = operation.get("requestBody", {}).get("content", {})
            schema = content.get("application/json", {}).get("schema")
            if schema is None:
                continue
            if "$ref" in schema:
                schema = schemas[schema["$ref"].rsplit("/", 1)[1]]
            yield method, path, sorted(schema.get("properties", {}))


#: An id that names nothing in a fresh database. Fixed, not random: the tests are
#: parametrized by it, and every xdist worker must collect the same test ids.
_NOTHING = "00000000-0000-4000-8000-000000000000"

#: A well-formed value for each path parameter (naming nothing, or the stack's agent).
_PATH_VALUES = {
    "session_id": f"session-{_NOTHING}",
    "step_id": f"step-{_NOTHING}",
    "review_id": f"review-{_NOTHING}",
    "slug": "typed",
    "team_id": "no-team",
}


def test_no_body_field_sent_as_null_is_a_500(stack: Stack) -> None:
    """Every field of every JSON body of the API, sent alone as ``null``, is answered below
    500 (a 4xx problem, or accepted where null is a value, e.g. an unlimited balance)."""
    http = stack.http
    doc = http.get("/openapi.json").json()
    tried = 0
    for method, template, properties in _json_bodies(doc):
        path = template.format(**_PATH_VALUES)
        for prop in properties:
            resp = http.request(method, path, json={prop: None})
            assert resp.status_code < 500, (method, path, prop, resp.text)
            tried += 1
    assert tried > 40  # the whole API was walked, not an empty document
    assert http.put("/v1/balance", json={"balance": None}).status_code == 200


# --- an ambassador is no step -------------------------------------------------------------


@pytest.mark.parametrize("ref", ["briefer", "briefer@1"])
def test_a_step_refuses_an_ambassador(stack: Stack, ref: str) -> None:
    """``POST /v1/steps`` naming an ambassador (live or pinned) is 422 ``not_invocable``, as
    for a session, and records no step."""
    http = stack.http
    before = http.get("/v1/steps").json()["count"]
    refused = http.post("/v1/steps", json={"agent": ref, "input": "brief me"})
    body = assert_problem(refused, 422, "not_invocable")
    assert body["path"] == "agent"
    assert http.get("/v1/steps").json()["count"] == before
    ok = http.post("/v1/steps", json={"agent": "typed", "input": "go"})
    assert ok.status_code == 202, ok.text


# --- validate first, then Temporal --------------------------------------------------------


@dataclass(frozen=True)
class Down:
    """A client of the API without Temporal, and its database's URL."""

    http: httpx.Client
    database_url: str


@pytest.fixture(scope="module")
def down(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Down]:
    """The real API whose Temporal address is a loopback port nobody listens on, with agent
    ``typed`` and ambassador ``briefer`` published (the registry needs no Temporal)."""
    db = tmp_path_factory.mktemp("down") / "down.db"
    settings = Settings(
        database_url=f"sqlite:///{db}",
        temporal_address=f"127.0.0.1:{free_port()}",
        temporal_connect_timeout=2,
        task_queue=f"tq-{uuid.uuid4()}",
    )
    migrated(settings.database_url)
    server, thread, base = serve(create_app(settings))
    try:
        with httpx.Client(base_url=base, timeout=60) as http:
            agent(http, "typed", [{"reply": "ok"}])
            ambassador(http)
            yield Down(http, settings.database_url)
    finally:
        server.should_exit = True
        thread.join(timeout=10)


_SID, _STEP, _REVIEW = (f"{kind}-{_NOTHING}" for kind in ("session", "step", "review"))


@pytest.mark.parametrize(
    ("path", "body", "status", "code"),
    [
        ("/v1/sessions", {"agent": "typed", "prompt": None}, 422, "validation_error"),
        ("/v1/sessions", {"agent": "typed", "prompt": "hi", "sync": 1}, 422, "validation_error"),
        ("/v1/sessions", {"agent": "nobody", "prompt": "hi"}, 404, "agent_not_found"),
        ("/v1/sessions", {"agent": "briefer", "prompt": "hi"}, 422, "not_invocable"),
        (f"/v1/sessions/{_SID}/messages", {"prompt": "  "}, 422, "validation_error"),
        (f"/v1/sessions/{_SID}/messages", {"prompt": "hi"}, 404, "session_not_found"),
        (f"/v1/sessions/{_SID}/cancel", None, 404, "session_not_found"),
        (f"/v1/sessions/{_SID}/inquiries", {"question": "why?"}, 404, "session_not_found"),
        ("/v1/steps", {"agent": "typed"}, 422, "validation_error"),
        ("/v1/steps", {"agent": "briefer", "input": "x"}, 422, "not_invocable"),
        ("/v1/steps", {"agent": "nobody", "input": "x"}, 404, "agent_not_found"),
        (f"/v1/steps/{_STEP}/handoff", {"decision": "approve"}, 404, "step_not_found"),
        (f"/v1/reviews/{_REVIEW}/decision", {"decision": "maybe"}, 422, "validation_error"),
        (f"/v1/reviews/{_REVIEW}/decision", {"decision": "deny"}, 404, "review_not_found"),
    ],
)
def test_a_bad_request_is_its_4xx_while_temporal_is_down(
    down: Down, path: str, body: dict[str, Any] | None, status: int, code: str
) -> None:
    """With Temporal unreachable, a malformed request, an unknown reference or an
    ambassador is answered with its own 4xx, not 503 (the client was a dependency,
    connected before FastAPI validated the body)."""
    assert_problem(down.http.post(path, json=body), status, code)


def test_a_valid_request_is_a_503_and_leaves_nothing_behind(down: Down) -> None:
    """With Temporal unreachable, a valid launch and a valid step are 503
    ``engine_unavailable`` and leave no session or step recorded; a valid inquiry is 503
    and its inquiry is failed, not left running."""
    http = down.http
    launch = http.post("/v1/sessions", json={"agent": "typed", "prompt": "hi"})
    assert_problem(launch, 503, "engine_unavailable")
    step = http.post("/v1/steps", json={"agent": "typed", "input": "go"})
    assert_problem(step, 503, "engine_unavailable")
    assert http.get("/v1/sessions").json()["count"] == 0
    assert http.get("/v1/steps").json()["count"] == 0
    sid = f"session-{uuid.uuid4()}"
    engine = make_engine(down.database_url)
    try:
        with session_scope(engine) as s:  # a session that ran while Temporal was up
            session_store.create_session(
                s,
                session_id=sid,
                agent_slug="typed",
                agent_version=1,
                provenance=Provenance(),
                name="ran before",
            )
    finally:
        engine.dispose()
    asked = http.post(
        f"/v1/sessions/{sid}/inquiries", json={"question": "why?", "ambassador": "briefer"}
    )
    assert_problem(asked, 503, "engine_unavailable")
    (inquiry,) = http.get(f"/v1/sessions/{sid}/inquiries").json()["data"]
    assert inquiry["status"] == "failed" and inquiry["error"]
