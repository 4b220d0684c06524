"""What the review inbox and the audit log report: an invoke settled by a review is audited
with ``via: invoke`` like every other invoke (it was ``null``), and ``GET
/v1/reviews?status=all`` lists every status, as ``baton reviews list --status all`` does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from tests.test_api_agents import assert_problem
from tests.test_api_reviews import (
    Stack,
    agent,
    decide,
    launch,
    pending,
    running_stack,
    settled,
    target,
)
from tests.xagent_helpers import caller_playbook

INVOKE_SYNC = {"slug": "target", "prompt": "hello target", "sync": True}


@pytest.fixture
def stack(temporal_env: WorkflowEnvironment, tmp_path: Path) -> Iterator[Stack]:
    """API + worker with ``target`` and a ``caller`` that invokes it (every invoke reviewed)."""
    with running_stack(temporal_env, tmp_path / "listings.db") as s:
        target(s.http)
        agent(s.http, "caller", caller_playbook("invoke_agent", INVOKE_SYNC))
        yield s


def test_invokes_settled_by_a_review_are_audited_via_invoke(stack: Stack) -> None:
    """An invoke allowed once and one denied by a person are audited with outcome allow /
    denied_by_user and ``via: invoke``, as a blocked invoke is."""
    http = stack.http
    for decision in ("allow_once", "deny"):
        sid = launch(http, "caller")
        (review,) = pending(http)
        assert decide(http, review["id"], decision).status_code == 200
        settled(http, sid)
    rows = http.get("/v1/audit", params={"caller": "caller"}).json()["data"]
    assert [(r["outcome"], r["operation"], r["via"]) for r in rows] == [
        ("denied_by_user", "invoke", "invoke"),
        ("allow", "invoke", "invoke"),
    ]


def test_reviews_status_all_lists_every_status(stack: Stack) -> None:
    """``status=all`` answers every review (a settled and a pending one), the same as no
    status; an unknown status stays a 422."""
    http = stack.http
    first = launch(http, "caller")
    (review,) = pending(http)
    assert decide(http, review["id"], "allow_once").status_code == 200
    settled(http, first)
    launch(http, "caller")
    pending(http)
    every = http.get("/v1/reviews", params={"status": "all"})
    assert every.status_code == 200, every.text
    assert sorted(r["status"] for r in every.json()["data"]) == ["allowed", "pending"]
    assert every.json() == http.get("/v1/reviews").json()
    assert_problem(http.get("/v1/reviews", params={"status": "any"}), 422, "validation_error")
