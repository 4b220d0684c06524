"""The agents API over real HTTP (uvicorn on loopback), problem+json errors, OpenAPI."""

from __future__ import annotations

from typing import Any

import httpx


def create(api: httpx.Client, slug: str, **spec: Any) -> httpx.Response:
    return api.post("/v1/agents", json={"slug": slug, "name": slug.title(), "spec": spec})


def assert_problem(resp: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """``resp`` is problem+json with ``status`` and ``code``; returns the body."""
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = resp.json()
    assert body["code"] == code and body["status"] == status and body["detail"]
    return body


def test_agent_lifecycle_over_http(api: httpx.Client) -> None:
    """Create, publish, edit, republish, restore, rollback and retire through the API."""
    resp = create(api, "writer", system_prompt="v1")
    assert resp.status_code == 201
    assert resp.json()["live_version"] is None and resp.json()["retired"] is False

    first = api.post("/v1/agents/writer/publish")
    assert first.status_code == 201 and first.json()["version"] == 1
    same = api.post("/v1/agents/writer/publish")
    assert same.status_code == 200 and same.json()["version"] == 1

    assert api.put("/v1/agents/writer/draft", json={"system_prompt": "v2"}).status_code == 200
    second = api.post("/v1/agents/writer/publish")
    assert second.status_code == 201 and second.json()["version"] == 2
    assert second.json()["digest"] != first.json()["digest"]

    revisions = api.get("/v1/agents/writer/revisions").json()
    assert revisions["count"] == 2 and [r["version"] for r in revisions["data"]] == [2, 1]
    assert api.get("/v1/agents/writer/revisions/1").json()["spec"]["system_prompt"] == "v1"

    restored = api.post("/v1/agents/writer/restore", json={"version": 1}).json()
    assert restored["draft"]["system_prompt"] == "v1" and restored["live_version"] == 2

    rolled = api.post("/v1/agents/writer/rollback", json={"version": 1}).json()
    assert rolled["live_version"] == 1
    assert api.get("/v1/agents/writer/resolved").json()["system_prompt"] == "v1"
    assert api.get("/v1/agents/writer/resolved", params={"version": 2}).json()["version"] == 2

    retired = api.post("/v1/agents/writer/retire").json()
    assert retired["retired"] is True and retired["live_version"] is None
    assert_problem(api.get("/v1/agents/writer/resolved"), 409, "agent_retired")


def test_metadata_edits_create_no_revision(api: httpx.Client) -> None:
    """PATCH changes name/description without touching revisions."""
    create(api, "a", system_prompt="x")
    api.post("/v1/agents/a/publish")
    resp = api.patch("/v1/agents/a", json={"name": "Renamed", "description": "New words"})
    assert resp.status_code == 200 and resp.json()["name"] == "Renamed"
    assert api.get("/v1/agents/a/revisions").json()["count"] == 1


def test_list_is_paged(api: httpx.Client) -> None:
    """GET /v1/agents returns {data, count} ordered by slug, honouring limit and offset."""
    for slug in ("c", "a", "b"):
        create(api, slug)
    page = api.get("/v1/agents", params={"limit": 2, "offset": 1}).json()
    assert page["count"] == 3 and [a["slug"] for a in page["data"]] == ["b", "c"]
    assert_problem(api.get("/v1/agents", params={"limit": 201}), 422, "validation_error")


def test_not_found_and_conflict_problems(api: httpx.Client) -> None:
    """Unknown agent/revision → 404 with code; a taken slug → 409 agent_exists."""
    assert_problem(api.get("/v1/agents/ghost"), 404, "agent_not_found")
    create(api, "a")
    assert_problem(create(api, "a"), 409, "agent_exists")
    assert_problem(api.get("/v1/agents/a/revisions/3"), 404, "revision_not_found")
    assert_problem(api.get("/v1/agents/a/resolved"), 409, "agent_not_published")
    assert_problem(api.get("/v1/nowhere"), 404, "not_found")


def test_publish_validation_is_a_400_with_code_and_path(api: httpx.Client) -> None:
    """Publish-time spec errors answer 400 problem+json naming the code and the path."""
    create(api, "a", extends="ghost")
    body = assert_problem(api.post("/v1/agents/a/publish"), 400, "unknown_agent")
    assert body["path"] == "extends"
    api.put("/v1/agents/a/draft", json={"extends": "a"})
    assert_problem(api.post("/v1/agents/a/publish"), 400, "inheritance_cycle")
    assert api.get("/v1/agents/a").json()["live_version"] is None


def test_tree_and_removed_field_errors_are_400(api: httpx.Client) -> None:
    """Duplicate aliases and the removed maxFanout field are 400s with the offending path."""
    create(api, "leaf")
    dup = [{"alias": "x", "agent": "leaf"}, {"alias": "x", "agent": "leaf"}]
    body = assert_problem(
        api.put("/v1/agents/leaf/draft", json={"subagents": dup}), 400, "duplicate_alias"
    )
    assert body["path"] == "subagents[1].alias"
    body = assert_problem(
        api.put("/v1/agents/leaf/draft", json={"limits": {"maxFanout": 3}}), 400, "removed_field"
    )
    assert body["path"] == "limits.maxFanout"


def test_malformed_bodies_are_422_naming_the_field(api: httpx.Client) -> None:
    """Unknown fields, bad types and bad slugs are 422 validation_error naming the field."""
    body = assert_problem(
        api.post("/v1/agents", json={"slug": "a", "name": "A", "spec": {"temprature": 1}}),
        422,
        "validation_error",
    )
    assert body["path"] == "spec.temprature"
    body = assert_problem(
        api.post("/v1/agents", json={"slug": "Bad Slug", "name": "x"}), 422, "validation_error"
    )
    assert body["path"] == "slug"
    body = assert_problem(
        api.post("/v1/agents", content=b"{not json", headers={"content-type": "application/json"}),
        422,
        "validation_error",
    )
    assert api.get("/v1/agents").json()["count"] == 0


def test_referenced_agent_cannot_be_deleted(api: httpx.Client) -> None:
    """DELETE of an agent another live revision extends is 409 agent_in_use; otherwise 204."""
    create(api, "base")
    api.post("/v1/agents/base/publish")
    create(api, "child", extends="base")
    api.post("/v1/agents/child/publish")
    body = assert_problem(api.delete("/v1/agents/base"), 409, "agent_in_use")
    assert body["dependents"] == ["child@1"]
    assert api.delete("/v1/agents/child").status_code == 204
    assert api.delete("/v1/agents/base").status_code == 204


def test_openapi_documents_every_schema_with_examples(api: httpx.Client) -> None:
    """Every component schema has examples and every error status is documented as problem+json."""
    spec = api.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    assert "Problem" in schemas and "HTTPValidationError" not in schemas
    missing = [name for name, s in schemas.items() if not (s.get("examples") or s.get("example"))]
    assert missing == []
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            for status, resp in op["responses"].items():
                if status.startswith(("4", "5")):
                    assert "application/problem+json" in resp["content"], (method, path, status)


def test_concurrent_publishes_never_fail_the_server(api: httpx.Client) -> None:
    """Parallel draft+publish calls answer 200/201/409, never 500, and versions stay dense."""
    import concurrent.futures

    create(api, "solo", system_prompt="start")
    api.post("/v1/agents/solo/publish")

    def publish(i: int) -> list[int]:
        with httpx.Client(base_url=api.base_url, timeout=30) as c:
            put = c.put("/v1/agents/solo/draft", json={"system_prompt": f"variant {i}"})
            return [put.status_code, c.post("/v1/agents/solo/publish").status_code]

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        statuses = [s for pair in pool.map(publish, range(16)) for s in pair]
    assert set(statuses) <= {200, 201, 409, 503}, statuses
    versions = [r["version"] for r in api.get("/v1/agents/solo/revisions").json()["data"]]
    assert versions == list(range(len(versions), 0, -1))


def test_invalid_json_names_the_body(api: httpx.Client) -> None:
    """A body that is not JSON is a 422 whose path is `body`."""
    resp = api.post("/v1/agents", content=b"{", headers={"content-type": "application/json"})
    assert assert_problem(resp, 422, "validation_error")["path"] == "body"


def test_healthz(api: httpx.Client) -> None:
    """/healthz answers ok."""
    assert api.get("/healthz").json() == {"status": "ok"}


def test_out_of_range_and_loose_numbers_are_422(api: httpx.Client) -> None:
    """Huge versions/offsets and non-integer versions are validation errors, not 500s."""
    create(api, "pv")
    api.post("/v1/agents/pv/publish")
    huge = 9223372036854775808
    assert_problem(api.get(f"/v1/agents/pv/revisions/{huge}"), 422, "validation_error")
    assert_problem(api.get("/v1/agents", params={"offset": huge}), 422, "validation_error")
    for version in (huge, True, "1", 1.5):
        resp = api.post("/v1/agents/pv/rollback", json={"version": version})
        assert_problem(resp, 422, "validation_error")


def test_validation_errors_are_capped(api: httpx.Client) -> None:
    """A body with thousands of errors reports 20 of them and the total."""
    resp = api.put("/v1/agents/x/draft", json={"tools": ["bad name"] * 200})
    body = assert_problem(resp, 422, "validation_error")
    assert len(body["errors"]) <= 20 and body["error_count"] >= 1


def test_nul_in_name_is_refused_on_every_backend(api: httpx.Client) -> None:
    """A NUL character in a name is a 422, not stored."""
    resp = api.post("/v1/agents", json={"slug": "nul1", "name": "a\u0000b"})
    assert_problem(resp, 422, "validation_error")


def test_oversized_bodies_are_refused_before_reading(api: httpx.Client) -> None:
    """A body over 8 MiB is 413 payload_too_large; one at the limit is parsed as usual."""
    from api.app import MAX_BODY_BYTES

    big = b"x" * (MAX_BODY_BYTES + 1)
    resp = api.post("/v1/agents", content=big, headers={"content-type": "application/json"})
    assert_problem(resp, 413, "payload_too_large")
    at_limit = b" " * (MAX_BODY_BYTES - 2) + b"{}"
    resp = api.post("/v1/agents", content=at_limit, headers={"content-type": "application/json"})
    assert_problem(resp, 422, "validation_error")
