"""What the CLI and the docs tell a newcomer, each against a live API + worker:
`baton run`'s review hint, `baton trace`'s labels and unknown cost,
`baton step approve|revise|reject`, the handoff reply, the sessions list and a step's
transcript, the unreachable-API error, the `baton dev` banner, offline `/docs` and
`make`'s install progress."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from tests.test_api_reviews import (
    INVOKE_SYNC,
    Stack,
    agent,
    pending,
    poll,
    running_stack,
    settled,
    target,
)
from tests.test_cli_steps import INPUT, SCHEMA, STEP_ID, invoke
from tests.xagent_helpers import caller_playbook
from worker.stack import free_port

ROOT = Path(__file__).resolve().parents[1]
BATON = str(Path(sys.executable).with_name("baton"))
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module")
def stack(
    temporal_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """API + worker, no model prices (the scripted model's cost is unknown), examples
    applied, a `caller` whose invoke_agent waits on a review, and its `target`."""
    db = tmp_path_factory.mktemp("guidance") / "guidance.db"
    with running_stack(temporal_env, db) as s:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("BATON_API_URL", s.url)
            applied = invoke("apply", "-f", str(ROOT / "examples" / "agents.yaml"))
        assert applied.exit_code == 0, applied.output
        target(s.http)
        agent(s.http, "caller", caller_playbook("invoke_agent", INVOKE_SYNC))
        yield s


def cli_env(stack: Stack, **extra: str) -> dict[str, str]:
    """The environment of a real `baton` process pointed at ``stack``, 250 columns wide."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATON_")}
    env |= {
        "BATON_API_URL": stack.url,
        "BATON_DATABASE_URL": stack.settings.database_url,
        "COLUMNS": "250",
        "NO_COLOR": "1",
    }
    return env | extra


def baton(stack: Stack, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    """Run ``baton ARGS`` as a real process against ``stack``."""
    return subprocess.run(
        [BATON, *args],
        env=cli_env(stack, **extra),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


@pytest.fixture(scope="module")
def reviewed_run(stack: Stack) -> dict[str, Any]:
    """`baton run caller go` as a real process: its invoke_agent waits on a review,
    approved through the API once it is pending. ``{session_id, review_id, stdout}``."""
    proc = subprocess.Popen(
        [BATON, "run", "caller", "go"],
        env=cli_env(stack, BATON_REVIEW_TIMEOUT="300"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        (review,) = pending(stack.http)
        decided = stack.http.post(
            f"/v1/reviews/{review['id']}/decision", json={"decision": "allow_once"}
        )
        assert decided.status_code in (200, 202), decided.text
        stdout, stderr = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stdout + stderr
    settled(stack.http, review["session_id"])
    return {"session_id": review["session_id"], "review_id": review["id"], "stdout": stdout}


def test_run_prints_the_approve_command_and_the_time_left(reviewed_run: dict[str, Any]) -> None:
    """A turn waiting on a review: `baton run` prints `baton reviews approve ID` and the wait."""
    rid, out = reviewed_run["review_id"], ANSI.sub("", reviewed_run["stdout"])
    assert f"approve: baton reviews approve {rid}" in out, out
    assert f"deny: baton reviews deny {rid}" in out
    assert "denied automatically 300 s after it opened (BATON_REVIEW_TIMEOUT)" in out


def test_the_printed_approve_command_is_a_real_command(stack: Stack) -> None:
    """The subcommand the hint names exists: `baton reviews approve --help` exits 0."""
    shown = baton(stack, "reviews", "approve", "--help")
    assert shown.returncode == 0, shown.stderr
    assert "review-… id" in shown.stdout


def test_trace_labels_durations_and_shows_delegation_status_and_child(
    stack: Stack, reviewed_run: dict[str, Any]
) -> None:
    """`baton trace`: the child's session id, `delegation completed`, labelled times."""
    sid = reviewed_run["session_id"]
    body = stack.http.get(f"/v1/sessions/{sid}/trace").json()
    (child,) = body["children"]
    shown = baton(stack, "trace", sid)
    assert shown.returncode == 0, shown.stderr
    out = ANSI.sub("", shown.stdout)
    assert f"session {child['session_id']} (idle)" in out, out
    assert "delegation completed" in out
    assert "model time " in out and " ms" in out
    assert f"delegation wall {child['delegation']['wall_ms']} ms" in out
    assert "run total: tokens in/out " in out


def test_trace_prints_each_nodes_temporal_ui_link_and_the_run_tree(
    stack: Stack, reviewed_run: dict[str, Any]
) -> None:
    """The API trace has each node's `workflow_url` and the root's `run_tree_url`;
    `baton trace` prints both."""
    sid = reviewed_run["session_id"]
    body = stack.http.get(f"/v1/sessions/{sid}/trace").json()
    (child,) = body["children"]
    settings = stack.settings
    assert body["workflow_url"] == settings.workflow_url(sid)
    assert child["workflow_url"] == settings.workflow_url(child["session_id"])
    assert body["run_tree_url"] == settings.workflows_url(f'BatonRoot = "{sid}"')
    assert child["run_tree_url"] is None
    out = ANSI.sub("", baton(stack, "trace", sid).stdout)
    for node in (body, child):
        assert f"Temporal UI: {node['workflow_url']}" in out, out
    assert f"run tree in the Temporal UI: {body['run_tree_url']}" in out


def test_unknown_cost_is_null_in_trace_and_usage_and_unknown_in_the_cli(
    stack: Stack, reviewed_run: dict[str, Any]
) -> None:
    """No price for the model: the trace and /v1/usage both say null; the CLI, "unknown"."""
    sid = reviewed_run["session_id"]
    body = stack.http.get(f"/v1/sessions/{sid}/trace").json()
    assert body["usage"]["requests"] >= 1
    assert body["usage"]["cost_usd"] is None and body["subtree_usage"]["cost_usd"] is None
    usage = stack.http.get("/v1/usage", params={"group_by": "session", "session_id": sid})
    (group,) = usage.json()["data"]
    assert group["requests"] == body["usage"]["requests"]
    assert group["cost_usd"] is None
    out = ANSI.sub("", baton(stack, "trace", sid).stdout)
    assert "cost unknown" in out and "$0.0000" not in out
    by_session = baton(stack, "usage", "--by", "session")
    assert by_session.returncode == 0, by_session.stderr
    assert "unknown" in by_session.stdout


def launch_handoff_step(stack: Stack) -> str:
    """A summariser step with a schema and handoff, once it awaits the decision."""
    resp = stack.http.post(
        "/v1/steps",
        json={
            "agent": "summariser",
            "input": Path(INPUT).read_text(encoding="utf-8"),
            "output_schema": json.loads(Path(SCHEMA).read_text(encoding="utf-8")),
            "retry": {"max_attempts": 3, "initial_interval_s": 0.01},
            "handoff": True,
        },
    )
    assert resp.status_code == 202, resp.text
    step_id: str = resp.json()["step_id"]
    awaiting(stack, step_id)
    return step_id


def awaiting(stack: Stack, step_id: str) -> dict[str, Any]:
    """Wait until the step awaits a handoff decision; returns it."""

    def check() -> dict[str, Any] | None:
        body: dict[str, Any] = stack.http.get(f"/v1/steps/{step_id}").json()
        return body if body["status"] == "awaiting_handoff" else None

    found: dict[str, Any] = poll(check, f"{step_id} to await handoff")
    return found


def test_step_revise_approve_and_reject_commands(stack: Stack) -> None:
    """`baton step revise|approve|reject ID` decide and print the status each led to."""
    step_id = launch_handoff_step(stack)
    revised = baton(stack, "step", "revise", step_id, "--feedback", "Mention the region.")
    assert revised.returncode == 0, revised.stderr
    assert f"{step_id}: revise → running after 2 attempt(s)" in revised.stdout, revised.stdout
    assert awaiting(stack, step_id)["attempts"] == 3
    approved = baton(stack, "step", "approve", step_id)
    assert approved.returncode == 0, approved.stderr
    assert f"{step_id}: approve → completed after 3 attempt(s)" in approved.stdout
    again = baton(stack, "step", "approve", step_id)
    assert again.returncode == 1 and "[step_not_awaiting_handoff]" in again.stderr

    other = launch_handoff_step(stack)
    rejected = baton(stack, "step", "reject", other, "--feedback", "Off topic.")
    assert rejected.returncode == 0, rejected.stderr
    assert f"{other}: reject → rejected" in rejected.stdout
    assert stack.http.get(f"/v1/steps/{other}").json()["error"] == "Off topic."


def test_step_still_runs_an_agent_and_hints_the_new_commands(stack: Stack) -> None:
    """`baton step AGENT --handoff` (the old form) runs; its hint names `baton step approve`."""
    ran = baton(stack, "step", "summariser", "--input", INPUT, "--schema", SCHEMA, "--handoff")
    assert ran.returncode == 0, ran.stderr
    found = STEP_ID.search(ran.stdout)
    assert found, ran.stdout
    assert f"baton step approve {found.group(0)}" in ran.stdout
    also = baton(stack, "step", "run", "summariser", "--input", INPUT)
    assert also.returncode == 0 and "status: completed" in also.stdout, also.stderr


def test_handoff_reply_shows_the_status_the_decision_led_to(stack: Stack) -> None:
    """POST …/handoff returns the step after the decision, not its awaiting_handoff state."""
    step_id = launch_handoff_step(stack)
    resp = stack.http.post(f"/v1/steps/{step_id}/handoff", json={"decision": "approve"})
    assert resp.status_code == 202, resp.text
    assert resp.json()["status"] == "completed"
    assert stack.http.get(f"/v1/steps/{step_id}").json()["status"] == "completed"


def test_sessions_list_omits_steps_and_a_step_has_a_transcript(
    stack: Stack, reviewed_run: dict[str, Any]
) -> None:
    """GET /v1/sessions lists no step; GET /v1/steps/{id}/transcript has every attempt."""
    step_id = launch_handoff_step(stack)
    listed = stack.http.get("/v1/sessions", params={"limit": 200}).json()
    assert listed["data"] and not [r for r in listed["data"] if r["session_id"] == step_id]
    assert all(r["session_id"].startswith("session-") for r in listed["data"])
    assert listed["count"] == len(listed["data"])
    by_agent = stack.http.get("/v1/sessions", params={"agent": "summariser"}).json()
    assert by_agent == {"data": [], "count": 0, "next_cursor": None}
    body = stack.http.get(f"/v1/steps/{step_id}/transcript").json()
    assert body["session_id"] == step_id
    assistant = [m["text"] for m in body["messages"] if m["role"] == "assistant"]
    assert len(assistant) == 2 and '"headline"' in assistant[0] and "Q3 report" in assistant[1]
    assert any("does not validate" in m["text"] for m in body["messages"] if m["role"] == "user")
    missing = stack.http.get("/v1/steps/step-00000000-0000-0000-0000-000000000000/transcript")
    assert missing.status_code == 404 and missing.json()["code"] == "step_not_found"


@pytest.mark.parametrize(
    "args",
    [("run", "researcher", "hi"), ("reviews", "list"), ("trace", "session-x"), ("usage",)],
)
def test_an_unreachable_api_names_baton_api_url(stack: Stack, args: tuple[str, ...]) -> None:
    """Nothing listening at BATON_API_URL: exit 1, the error names the URL and the variable."""
    url = f"http://127.0.0.1:{free_port()}"
    shown = baton(stack, *args, BATON_API_URL=url)
    assert shown.returncode == 1, shown.stdout
    err = " ".join(shown.stderr.split())
    assert f"cannot reach {url} (the Baton API, from BATON_API_URL)" in err, err


def test_docs_are_served_without_a_cdn(stack: Stack) -> None:
    """/docs references only assets the app serves itself (Swagger UI 5 from a package)."""
    page = stack.http.get("/docs")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    urls = re.findall(r"""(?:src|href)=["']([^"']+)["']""", page.text)
    urls += re.findall(r"""url:\s*['"]([^'"]+)['"]""", page.text)
    assert "/docs/assets/swagger-ui-bundle.js" in urls and "/openapi.json" in urls
    assert not [u for u in urls if "//" in u], urls  # nothing off the app
    js = stack.http.get("/docs/assets/swagger-ui-bundle.js")
    assert js.status_code == 200 and "javascript" in js.headers["content-type"]
    assert len(js.content) > 500_000
    css = stack.http.get("/docs/assets/swagger-ui.css")
    assert css.status_code == 200 and "text/css" in css.headers["content-type"]
    assert stack.http.get("/openapi.json").json()["openapi"].startswith("3.1")
    assert 'PACKAGE_VERSION:"5.' in js.text  # Swagger UI 5: it renders OpenAPI 3.1


def test_docs_render_in_a_browser_with_the_network_cut_off(stack: Stack) -> None:
    """Headless Chromium, every request off the app refused: /docs renders the operations."""
    from playwright.sync_api import expect, sync_playwright

    from tests.test_console import CHROMIUM, CHROMIUM_ARGS

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} missing: `apt-get install chromium` (.ci/run does it)")
    refused: list[str] = []

    def only_the_app(route: Any) -> None:
        if route.request.url.startswith(stack.url):
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.route("**/*", only_the_app)
            page.goto(f"{stack.url}/docs")
            expect(page.locator(".opblock").first).to_be_visible(timeout=20_000)
            expect(page.locator("#swagger-ui")).to_contain_text("/v1/steps/{step_id}/transcript")
            assert "Unable to render" not in page.content()
        finally:
            browser.close()
    assert refused == []


@pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make to read the Makefile")
def test_make_install_shows_progress() -> None:
    """The install recipe announces itself and lets pip show progress (no --quiet)."""
    shown = subprocess.run(
        ["make", "-n", "-B", "install"], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert shown.returncode == 0, shown.stderr
    pip = [line for line in shown.stdout.splitlines() if "pip install" in line]
    assert pip and all("--quiet" not in line and "-q " not in line for line in pip), pip
    assert "Installing Baton and its dependencies" in shown.stdout
