"""The Temporal Web UI shows each run's tree and true state (done-when):
Playwright drives Debian's Chromium (never a browser download) against the UI that the
Temporal dev server serves, started as `baton dev` starts it (:class:`worker.stack.DevServer`,
with Baton's search attributes), with the real API + worker + SQLite file behind it.

One module-scoped stack and one team run + one failed step, made through the API. Set
``BATON_SCREENSHOTS=1`` to refresh the screenshots of docs/operations.md (docs/screenshots/).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect

from baton import temporal_ui
from baton.settings import Settings
from tests.conftest import migrated
from tests.test_console import browser as browser  # the fixture: one headless system Chromium
from tests.test_console import shot
from worker.stack import DevServer, ServicesThread, free_port

# Each UI page takes seconds to render on a loaded machine; and the tests share one module
# stack, so under `make test`'s xdist they stay on one process (one dev server, not two):
# their group is in tests/xdist_groups.py.
pytestmark = pytest.mark.slow

NAMESPACE = "default"
#: Page loads of the UI (a Svelte app reading the server through its own API) are slow on
#: a 2-core machine shared with the suite: wait this long (ms) for what a page shows.
UI_WAIT_MS = 45_000
#: Playwright's own default for `expect`, restored after each test of this module.
PLAYWRIGHT_EXPECT_MS = 5_000
#: The Baton columns docs/operations.md tells an operator to add to the list (Configure Columns);
#: the UI keeps them in local storage, which this seeds.
COLUMNS = ["Status", "Workflow ID", "Type", "BatonKind", "BatonAgent", "BatonStatus", "Start"]
SCHEMA = {"type": "object", "properties": {"summary": {"type": "string"}}, "required": ["summary"]}
WIDE = {"width": 1680, "height": 900}


class Run:
    """What the module made: the UI's base URL, the team run's tree and a failed step."""

    def __init__(self, ui: str, root: str, members: list[str], step_id: str) -> None:
        self.ui = ui
        self.root = root
        self.members = members
        self.step_id = step_id

    def url(self, path: str) -> str:
        return temporal_ui.absolute(self.ui, path)


def _agent(http: httpx.Client, slug: str, **spec: Any) -> None:
    created = http.post("/v1/agents", json={"slug": slug, "name": slug, "spec": spec})
    assert created.status_code == 201, created.text
    assert http.post(f"/v1/agents/{slug}/publish").status_code == 201


def _failed_step(http: httpx.Client) -> str:
    """A step whose only attempt is not JSON: ``failed`` with ``invalid_deliverable``, the
    status and error the API reported before failed steps failed their workflows."""
    _agent(http, "stubborn", playbook=[{"reply": "not json at all"}])
    body = {"agent": "stubborn", "input": "Summarise.", "output_schema": SCHEMA}
    resp = http.post("/v1/steps", json=body | {"retry": {"max_attempts": 1}})
    assert resp.status_code == 202, resp.text
    step_id = str(resp.json()["step_id"])
    deadline = time.monotonic() + 30
    while (step := http.get(f"/v1/steps/{step_id}").json())["status"] == "running":
        assert time.monotonic() < deadline, step
        time.sleep(0.1)
    assert step["status"] == "failed", step
    assert step["error"].startswith("invalid_deliverable: after 1 attempts"), step
    return step_id


def _team_run(http: httpx.Client) -> tuple[str, list[str]]:
    """A team run whose supervisor delegates to two members: the root and member ids."""
    _agent(http, "checker", playbook=[{"reply": "CHECKED"}])
    _agent(http, "writer", playbook=[{"reply": "WRITTEN"}])
    calls = [
        {"tool": "delegate_to", "args": {"agent_id": "checker", "task": "check the memo"}},
        {"tool": "delegate_to", "args": {"agent_id": "writer", "task": "write the memo"}},
    ]
    _agent(
        http,
        "lead",
        playbook=[
            {"when": "^delegate_to: ", "reply": "SYNTH {last_message}"},
            {"when": "go", "reply": "Delegating.", "tool_calls": calls},
        ],
    )
    team = {
        "id": "desk",
        "name": "Desk",
        "supervisor_agent_id": "lead",
        "members": [
            {"agent_id": "lead", "role": "supervisor"},
            {"agent_id": "checker", "role": "specialist", "delegation_hint": "facts"},
            {"agent_id": "writer", "role": "specialist", "delegation_hint": "prose"},
        ],
    }
    assert http.post("/v1/teams", json=team).status_code == 201
    run = http.post("/v1/sessions", json={"team": "desk", "prompt": "go", "sync": True})
    assert run.status_code == 201, run.text
    root = str(run.json()["session_id"])
    trace = http.get(f"/v1/sessions/{root}/trace").json()
    return root, [c["session_id"] for c in trace["children"]]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """The dev server with its Web UI, the API + worker on it, a team run, a failed step."""
    folder = tmp_path_factory.mktemp("temporal-ui")
    dev = DevServer(port=free_port(), ui_port=free_port(), db_file=None, namespace=NAMESPACE)
    dev.start()
    try:
        settings = Settings(
            database_url=migrated(f"sqlite:///{folder / 'ui.db'}"),
            temporal_address=dev.address,
            temporal_namespace=NAMESPACE,
            temporal_ui_url=dev.ui_url,
            temporal_env_config=False,
            task_queue=f"tq-{uuid.uuid4()}",
        )
        services = ServicesThread(settings, api_port=free_port())
        services.start()
        try:
            with httpx.Client(base_url=services.api_url, timeout=60) as http:
                root, members = _team_run(http)
                step_id = _failed_step(http)
                yield Run(dev.ui_url, root, members, step_id)
        finally:
            services.stop()
    finally:
        dev.stop()


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    """A wide browser context whose workflow list shows the Baton columns."""
    ctx = browser.new_context(viewport=WIDE)  # type: ignore[arg-type]
    columns = {NAMESPACE: [{"label": label} for label in COLUMNS]}
    ctx.add_init_script(
        "localStorage.setItem('namespace-workflow-table-columns', "
        f"JSON.stringify({json.dumps(columns)}))"
    )
    ctx.set_default_timeout(UI_WAIT_MS)
    expect.set_options(timeout=UI_WAIT_MS)
    try:
        yield ctx
    finally:
        expect.set_options(timeout=PLAYWRIGHT_EXPECT_MS)
        ctx.close()


@pytest.fixture
def page(context: BrowserContext) -> Page:
    """A page of :func:`context`."""
    return context.new_page()


def rows(page: Page) -> Any:
    """The rows of the workflow list."""
    return page.get_by_test_id("workflows-summary-configurable-table-row")


def test_one_query_lists_a_run_tree_with_the_baton_columns(
    run: Run, browser: Browser, tmp_path: Path
) -> None:
    """``BatonRoot = "<root>"`` lists the team run and both delegated sessions; the
    Configure Columns steps of docs/operations.md add BatonKind, BatonAgent and BatonStatus."""
    ctx = browser.new_context(viewport=WIDE)  # type: ignore[arg-type]
    ctx.set_default_timeout(UI_WAIT_MS)
    try:
        page = ctx.new_page()
        page.goto(run.url(temporal_ui.workflows_path(NAMESPACE, temporal_ui.tree_query(run.root))))
        expect(rows(page)).to_have_count(3, timeout=UI_WAIT_MS)
        for sid in (run.root, *run.members):
            expect(rows(page).filter(has_text=sid)).to_have_count(1)
        page.get_by_role("button", name="Configure Columns").click()
        for column in ("Run ID", "End"):  # room for Baton's, as docs/operations.md suggests
            page.get_by_role("button", name=f"Remove {column} column").click()
        for column in ("BatonKind", "BatonAgent", "BatonStatus"):
            page.get_by_role("button", name=f"Add {column} column").click()
        page.get_by_role("button", name=re.compile(r"^Close .* configuration$")).click()
        expect(page.locator("#workflows-table-configuration-drawer")).to_be_hidden()
        for column in ("BatonKind", "BatonAgent", "BatonStatus"):
            header = page.get_by_test_id(f"workflows-summary-table-header-cell-{column}")
            expect(header).to_be_visible(timeout=UI_WAIT_MS)
        lead = rows(page).filter(has_text=run.root)
        for value in ("session", "lead", "running"):
            expect(lead.get_by_role("cell", name=value, exact=True)).to_have_count(1)
        shot(page, "temporal-list", tmp_path)
    finally:
        ctx.close()


def test_a_team_runs_page_links_to_its_delegated_sessions(
    run: Run, context: BrowserContext, page: Page, tmp_path: Path
) -> None:
    """The team run's User Metadata links the sessions it delegated to; following the link
    lists both members, and a member's page links back to its parent."""
    page.goto(run.url(temporal_ui.workflow_path(NAMESPACE, run.root)))
    page.locator("#user-metadata-tab").click()
    details = page.frame_locator("#user-metadata-details")
    started = details.get_by_role("link", name="sessions this one started")
    expect(started).to_be_visible()
    expect(details.locator("body")).to_contain_text(f'BatonParentSession = "{run.root}"')
    shot(page, "temporal-team-run", tmp_path)
    with context.expect_page() as opened:
        started.click()
    children = opened.value
    expect(rows(children)).to_have_count(2)
    for sid in run.members:
        expect(rows(children).filter(has_text=sid)).to_have_count(1)

    member = context.new_page()
    member.goto(run.url(temporal_ui.workflow_path(NAMESPACE, run.members[0])))
    member.locator("#user-metadata-tab").click()
    parent = member.frame_locator("#user-metadata-details").get_by_role("link", name=run.root)
    expect(parent).to_be_visible()
    # Relative in the markdown, so it resolves against the UI's own address.
    href = parent.evaluate("a => a.href")
    assert href == run.url(temporal_ui.workflow_path(NAMESPACE, run.root))


def test_a_failed_step_is_listed_as_failed(run: Run, page: Page, tmp_path: Path) -> None:
    """The failed step's workflow failed: ExecutionStatus = "Failed" (and docs/operations.md's
    failed-steps query) lists it, and its page shows the step's code and error."""
    failed = temporal_ui.equals("ExecutionStatus", "Failed")
    page.goto(run.url(temporal_ui.workflows_path(NAMESPACE, failed)))
    expect(rows(page).filter(has_text=run.step_id)).to_have_count(1)
    expect(rows(page)).to_have_count(1)  # the sessions of the team run did not fail
    page.goto(run.url(temporal_ui.workflows_path(NAMESPACE, temporal_ui.FAILED_STEPS_QUERY)))
    step_row = rows(page).filter(has_text=run.step_id)
    for column_value in ("step", "stubborn", "failed"):  # BatonKind, BatonAgent, BatonStatus
        expect(step_row.get_by_role("cell", name=column_value, exact=True)).to_have_count(1)
    step_row.get_by_role("link", name=run.step_id).click()
    expect(page.get_by_text("invalid_deliverable: after 1 attempts").first).to_be_visible()
    shot(page, "temporal-step", tmp_path)
