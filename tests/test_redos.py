"""User regular expressions cannot stall or bloat the process.

(a) A step's JSON Schema ``pattern`` / ``patternProperties`` run on the `regex` module with
a time limit, never on Python's ``re`` (which holds the GIL: ``^(a+)+$`` on 28 ``a`` and
``!`` stalled ``/healthz`` for 15.8 s). (b) The repeat guard counts what the compiler
expands, so an escaped backslash before ``{n}`` no longer hides a counted repeat, and
the compiled-pattern cache is bounded by size.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError
from temporalio.testing import WorkflowEnvironment

from activities.steps import parse_deliverable
from baton import saferegex
from baton.agents.spec import PlaybookRule, compile_pattern
from tests.test_api_agents import assert_problem
from tests.test_api_reviews import Stack, agent, poll, running_stack

#: A known bypass of a naive size check: an escaped backslash, then counted repeats (3,000,000).
ESCAPED_BYPASS = r"((\\{1000}){1000}){3}"
#: Backtracks past any time limit even on the `regex` module.
EXPONENTIAL = r"^(a|aa)+$"


def _nested_items(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {}
    for _ in range(levels):
        schema = {"items": schema}
    return schema


#: 33 levels of JSON: one past what a workflow input may carry.
DEEP_SCHEMA = _nested_items(32)


def rss_mb() -> float:
    """This process's resident set size (MB), from /proc."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * 4096 / 1e6


# --- (b) the repeat guard and the cache ------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "size"),
    [
        ("a{10000}", 10_000),
        ("(a{100}){100}", 10_000),
        ("(?:ab){5000}", 10_000),
        ("[a-z]{10000}", 10_000),
        ("a{0,50000}x{9999}", 10_000),
    ],
)
def test_a_pattern_expanding_to_the_bound_compiles(pattern: str, size: int) -> None:
    """Exactly MAX_EXPANDED_SIZE (10,000) atoms once counted repeats are copied out is fine."""
    assert saferegex.expanded_size(pattern) == size == saferegex.MAX_EXPANDED_SIZE
    compile_pattern(pattern)


@pytest.mark.parametrize(
    "pattern",
    ["a{10001}", "(a{100}){100}b", "(?:ab){5000}c", r"(\\{100}){101}", r"(?:\\\\{50}){201}"],
)
def test_a_pattern_expanding_one_past_the_bound_is_refused(pattern: str) -> None:
    """One atom past the bound is refused, escaped backslashes before ``{n}`` included."""
    assert saferegex.expanded_size(pattern) > saferegex.MAX_EXPANDED_SIZE
    with pytest.raises(ValidationError, match="expands to"):
        PlaybookRule.model_validate({"when": pattern, "reply": "r"})


def test_escaped_braces_are_literal_and_not_counted() -> None:
    """``\\{1000}`` is the literal text ``{1000}`` (6 atoms), as the compiler reads it."""
    assert saferegex.expanded_size(r"\{1000}") == 6
    assert compile_pattern(r"\{1000}").search("x{1000}") is not None


def test_the_brace_bypass_is_refused_fast_without_growing_the_api(api: httpx.Client) -> None:
    """Saving the escaped-brace bypass pattern is a 422 at once and the API does not grow."""
    before = rss_mb()
    # CPU time of this process (the API serves in a thread of it): what an expansion
    # would burn, and what another process's load on the machine does not inflate.
    started = time.process_time()
    spec = {"playbook": [{"when": ESCAPED_BYPASS, "reply": "r"}]}
    resp = api.post("/v1/agents", json={"slug": "bypass", "name": "B", "spec": spec})
    elapsed = time.process_time() - started
    body = assert_problem(resp, 422, "validation_error")
    assert "expands to 3000000" in body["detail"]
    assert elapsed < 2, f"the refusal took {elapsed:.1f} s"
    assert rss_mb() - before < 50


def test_the_compiled_pattern_cache_is_bounded_by_size() -> None:
    """Compiling 100 distinct patterns at the bound keeps ~25 of them, not 100 (RSS stays flat)."""
    saferegex._cache.clear()
    before = rss_mb()
    for i in range(100):
        compile_pattern(f"{i:03d}" + "a{9997}")
    grown = rss_mb() - before
    assert saferegex._cache.currsize <= saferegex.CACHE_MAX_SIZE
    assert len(saferegex._cache) <= saferegex.CACHE_MAX_SIZE // saferegex.MAX_EXPANDED_SIZE
    assert grown < 80, f"RSS grew {grown:.0f} MB"  # 100 kept would be ~134 MB


# --- (a) JSON Schema patterns -----------------------------------------------------------


def test_a_backtracking_schema_pattern_is_checked_fast() -> None:
    """The classic ``^(a+)+$`` on 28 ``a`` and ``!`` is a plain mismatch within a second."""
    schema = {"type": "object", "properties": {"v": {"type": "string", "pattern": "^(a+)+$"}}}
    started = time.process_time()  # CPU time: immune to the machine's other load
    result = parse_deliverable('{"v": "' + "a" * 28 + '!"}', schema)
    assert time.process_time() - started < 1
    assert not result.ok and "does not match" in result.errors[0]


@pytest.mark.parametrize(
    "schema",
    [
        {"properties": {"v": {"pattern": EXPONENTIAL}}},
        {"patternProperties": {EXPONENTIAL: {"type": "string"}}},
        {"patternProperties": {EXPONENTIAL: {}}, "additionalProperties": False},
    ],
    ids=["pattern", "patternProperties", "additionalProperties"],
)
def test_a_pattern_that_runs_out_of_time_is_a_validation_error(schema: dict[str, Any]) -> None:
    """A pattern still backtracking at its time limit is an error fed back, not a stall."""
    text = "a" * 40 + "!"
    started = time.process_time()  # CPU time: immune to the machine's other load
    result = parse_deliverable('{"v": "' + text + '", "' + text + '": "x"}', schema)
    assert time.process_time() - started < 5  # the budget is 1 s of pattern time per check
    assert not result.ok
    assert any("in time" in e for e in result.errors), result.errors


# --- over HTTP ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stack(
    temporal_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """API + worker in this process (as `baton dev` runs them), on one SQLite file."""
    with running_stack(temporal_env, tmp_path_factory.mktemp("redos") / "redos.db") as s:
        yield s


@pytest.mark.parametrize(
    "schema",
    [
        {"properties": {"v": {"pattern": "(a{100}){101}"}}},
        {"properties": {"v": {"pattern": "("}}},
        {"patternProperties": {"(?:x{200}){51}": {}}},
        {"patternProperties": {"^x": {}}, "unevaluatedProperties": False},
        DEEP_SCHEMA,
    ],
    ids=["huge-pattern", "broken-pattern", "huge-key-pattern", "unevaluated", "deep"],
)
def test_post_refuses_a_schema_whose_patterns_cannot_run_safely(
    stack: Stack, schema: dict[str, Any]
) -> None:
    """Patterns over the bound or invalid for `regex`, and unevaluatedProperties beside
    patternProperties, are a 422 invalid_schema at POST /v1/steps."""
    if stack.http.get("/v1/agents/refused").status_code == 404:
        agent(stack.http, "refused", [{"reply": "{}"}])
    resp = stack.http.post(
        "/v1/steps", json={"agent": "refused", "input": "go", "output_schema": schema}
    )
    assert_problem(resp, 422, "invalid_schema")


def test_a_backtracking_schema_pattern_does_not_stall_the_process(stack: Stack) -> None:
    """While a deliverable is checked against ``^(a+)+$``, /healthz keeps answering quickly,
    and the mismatch is fed back (the step fails with invalid_deliverable)."""
    http = stack.http
    agent(http, "backtracker", [{"reply": '{"v": "' + "a" * 28 + '!"}'}])
    schema = {"type": "object", "properties": {"v": {"type": "string", "pattern": "^(a+)+$"}}}
    worst = 0.0
    done = threading.Event()

    def probe() -> None:
        nonlocal worst
        with stack.client() as c:
            while not done.is_set():
                started = time.monotonic()
                assert c.get("/healthz").status_code == 200
                worst = max(worst, time.monotonic() - started)
                time.sleep(0.05)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    try:
        resp = http.post(
            "/v1/steps",
            json={
                "agent": "backtracker",
                "input": "go",
                "output_schema": schema,
                "retry": {"max_attempts": 1},
            },
        )
        assert resp.status_code == 202, resp.text
        step_id = resp.json()["step_id"]

        def ended() -> dict[str, Any] | None:
            body: dict[str, Any] = http.get(f"/v1/steps/{step_id}").json()
            return body if body["status"] in ("completed", "failed") else None

        body = poll(ended, "the step to end", timeout=60)
    finally:
        done.set()
        prober.join(timeout=30)
    assert body["status"] == "failed" and "does not match" in body["error"]
    assert worst < 2, f"/healthz took {worst:.1f} s"
