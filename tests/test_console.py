"""The web console in a real browser: Playwright drives Debian's Chromium
against the real API + worker + Temporal dev server + SQLite file.

Chromium comes from ``apt-get install chromium`` (.ci/run); it is never downloaded.
Set ``BATON_SCREENSHOTS=1`` to refresh the screenshots of docs/console.md (docs/screenshots/).
"""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect, sync_playwright
from playwright.sync_api import Error as PlaywrightError
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select
from temporalio.testing import WorkflowEnvironment

from baton.settings import Settings
from baton.storage.db import EventRow, MessageRow, UsageRow, make_engine
from tests.conftest import migrated
from tests.test_ambassador import BRIEFER_PLAYBOOK
from worker.stack import ServicesThread, free_port

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: Review timeout of this module's stack (seconds): long enough to click on a loaded machine
#: (two suites at once), short enough to watch a card count down to its timeout.
REVIEW_TIMEOUT = 25.0
SHOTS = Path(__file__).resolve().parent.parent / "docs" / "screenshots"
LAPTOP = {"width": 1366, "height": 768}
PHONE = {"width": 390, "height": 844}
#: How long a console test waits for a page or a server round trip (ms). A click that
#: decides a handoff waits on Temporal, which takes seconds on a loaded machine (two suites
#: at once); Playwright's 5 s default is a wall-clock bound such load breaks.
CONSOLE_WAIT_MS = 30_000


def console_context(browser: Browser, viewport: dict[str, int] = LAPTOP) -> BrowserContext:
    """A fresh browser context of ``viewport`` whose actions and ``expect`` wait up to
    :data:`CONSOLE_WAIT_MS` (``expect``'s default is process-wide: set on each context)."""
    context = browser.new_context(viewport=viewport)  # type: ignore[arg-type]
    context.set_default_timeout(CONSOLE_WAIT_MS)
    expect.set_options(timeout=CONSOLE_WAIT_MS)
    return context


class Stack:
    """The live stack: base URL, an HTTP client for setup, and the DB."""

    def __init__(self, base: str, http: httpx.Client, engine: Engine) -> None:
        self.base = base
        self.http = http
        self.engine = engine


def _agent(http: httpx.Client, slug: str, **spec: Any) -> None:
    assert (
        http.post("/v1/agents", json={"slug": slug, "name": slug, "spec": spec}).status_code == 201
    )
    assert http.post(f"/v1/agents/{slug}/publish").status_code == 201


def _caller(http: httpx.Client, slug: str) -> None:
    """``slug`` invokes ``target`` on ``go`` and ``target2`` on ``go2`` (each opens a review)."""
    rules: list[dict[str, Any]] = [{"when": "^invoke_agent: ", "reply": "RESULT {last_message}"}]
    for prompt, target in (("go", "target"), ("go2", "target2")):
        call = {"slug": target, "prompt": f"hello {target}", "sync": True}
        rules.append(
            {
                "when": f"^{prompt}$",
                "reply": "Calling.",
                "tool_calls": [{"tool": "invoke_agent", "args": call}],
            }
        )
    _agent(http, slug, playbook=rules)


@pytest.fixture(scope="module")
def stack(
    temporal_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """API + worker with a short review timeout, the default ambassador, a slow team."""
    db = tmp_path_factory.mktemp("console") / "console.db"
    settings = Settings(
        database_url=migrated(f"sqlite:///{db}"),
        temporal_address=temporal_env.client.service_client.config.target_host,
        task_queue=f"tq-{uuid.uuid4()}",
        review_timeout=REVIEW_TIMEOUT,
        review_delivery_grace=0,
        default_ambassador="briefer",
    )
    services = ServicesThread(settings, api_port=free_port())
    services.start()
    engine = make_engine(settings.database_url)
    try:
        with httpx.Client(base_url=services.api_url, timeout=60) as http:
            _agent(http, "target", playbook=[{"reply": "target says hi"}])
            _agent(http, "target2", playbook=[{"reply": "target2 says hi"}])
            words = "checking every claim in the memo one by one now done"
            _agent(http, "checker", playbook=[{"reply": f"{words} CHECKED", "chunk_delay_ms": 250}])
            _agent(http, "writer", playbook=[{"reply": "WRITTEN", "chunk_delay_ms": 100}])
            _agent(
                http,
                "lead",
                playbook=[
                    {"when": "^delegate_to: ", "reply": "SYNTH {last_message}"},
                    {
                        "when": "go",
                        "reply": "Delegating.",
                        "tool_calls": [
                            {
                                "tool": "delegate_to",
                                "args": {"agent_id": "checker", "task": "check"},
                            },
                            {
                                "tool": "delegate_to",
                                "args": {"agent_id": "writer", "task": "write"},
                            },
                        ],
                    },
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
            _agent(http, "briefer", kind="ambassador", playbook=BRIEFER_PLAYBOOK)
            yield Stack(services.api_url, http, engine)
    finally:
        engine.dispose()
        services.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One headless system Chromium for the module."""
    with system_chromium() as chromium:
        yield chromium


@contextmanager
def system_chromium() -> Iterator[Browser]:
    """Debian's Chromium, headless, through sync Playwright (which never downloads one)."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} missing: `apt-get install chromium` (.ci/run does it)")
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A fresh laptop-sized page."""
    context = console_context(browser)
    try:
        yield context.new_page()
    finally:
        context.close()


def shot(page: Page, name: str, tmp_path: Path) -> None:
    """Take a screenshot (into docs/screenshots/ with BATON_SCREENSHOTS=1)."""
    folder = SHOTS if os.environ.get("BATON_SCREENSHOTS") == "1" else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    for attempt in range(3):
        try:
            page.screenshot(path=str(folder / f"{name}.png"))
            return
        except PlaywrightError as exc:
            # A loaded machine's Chromium may have no frame to give at that moment
            # (Page.captureScreenshot: "Unable to capture screenshot"): the next one does.
            if "Unable to capture screenshot" not in exc.message or attempt == 2:
                raise


def _launch(http: httpx.Client, body: dict[str, Any]) -> str:
    resp = http.post("/v1/sessions", json=body)
    assert resp.status_code == 201, resp.text
    return str(resp.json()["session_id"])


def _wait_status(http: httpx.Client, sid: str, want: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while http.get(f"/v1/sessions/{sid}").json()["status"] != want:
        assert time.monotonic() < deadline, f"{sid} never became {want}"
        time.sleep(0.1)


def _review_of(http: httpx.Client, sid: str) -> str:
    deadline = time.monotonic() + 20
    while True:
        found = http.get("/v1/reviews", params={"status": "pending", "session_id": sid}).json()
        if found["data"]:
            return str(found["data"][0]["id"])
        assert time.monotonic() < deadline, "no review opened"
        time.sleep(0.1)


@contextmanager
def _fresh_stack(temporal_env: WorkflowEnvironment, db: Path) -> Iterator[str]:
    """A stack of its own (API + worker, nothing created yet) on the SQLite file ``db``;
    yields its base URL."""
    settings = Settings(
        database_url=migrated(f"sqlite:///{db}"),
        temporal_address=temporal_env.client.service_client.config.target_host,
        task_queue=f"tq-{uuid.uuid4()}",
    )
    services = ServicesThread(settings, api_port=free_port())
    services.start()
    try:
        yield services.api_url
    finally:
        services.stop()


def test_the_inbox_and_the_steps_list_say_so_when_empty(
    temporal_env: WorkflowEnvironment, page: Page, tmp_path: Path
) -> None:
    """On a stack with nothing yet, the inbox says nothing waits and nothing was resolved,
    and the steps list says there are no steps and how to run one."""
    with _fresh_stack(temporal_env, tmp_path / "empty.db") as base:
        page.goto(f"{base}/ui/inbox")
        expect(page.locator("#pending-count")).to_have_text("0")
        expect(page.locator("#pending-empty")).to_be_visible()
        expect(page.locator("#pending-empty")).to_have_text("Nothing is waiting for you.")
        expect(page.locator("#recent-empty")).to_be_visible()
        expect(page.locator("#recent-empty")).to_have_text("Nothing resolved yet.")
        page.goto(f"{base}/ui/steps")
        empty = page.locator("tbody .empty")
        expect(empty).to_be_visible()
        expect(empty).to_have_text(
            'No steps yet. Run one with baton step AGENT "input" or POST /v1/steps.'
        )
        expect(page.locator("tbody tr[data-step]")).to_have_count(0)


def test_approve_from_the_inbox_and_the_session_continues(
    stack: Stack, page: Page, tmp_path: Path
) -> None:
    """The inbox shows the pending review as a card (agent, operation, target, preview,
    countdown); Allow once settles it and the session finishes with the target's reply."""
    _caller(stack.http, "caller-a")
    sid = _launch(stack.http, {"agent": "caller-a", "prompt": "go"})
    rid = _review_of(stack.http, sid)
    page.goto(f"{stack.base}/ui/inbox")
    card = page.locator(f'#pending [data-review="{rid}"]')
    expect(card.get_by_role("heading")).to_have_text("caller-a wants to invoke target")
    expect(card.locator(".preview")).to_have_text("hello target")
    expect(card.locator(".countdown")).to_have_text(re.compile(r"^0:[0-2]\d$"))
    expect(card.get_by_role("button", name="Always allow")).to_be_visible()
    shot(page, "inbox", tmp_path)
    card.get_by_role("button", name="Allow once").click()
    expect(page.locator(f'[data-review="{rid}"] .outcome')).to_have_text("Allowed by local")
    _wait_status(stack.http, sid, "idle")
    msgs = stack.http.get(f"/v1/sessions/{sid}/transcript").json()["messages"]
    assert msgs[-1]["text"].startswith("RESULT ") and "target says hi" in msgs[-1]["text"]


def test_always_allow_resolves_the_other_card_in_every_open_inbox(
    stack: Stack, browser: Browser
) -> None:
    """Always allow messaging all agents on one card saves a global policy; the other
    pending card of that caller resolves live in a second open inbox too."""
    _caller(stack.http, "caller-b")
    first = _launch(stack.http, {"agent": "caller-b", "prompt": "go"})
    second = _launch(stack.http, {"agent": "caller-b", "prompt": "go2"})
    rid1, rid2 = _review_of(stack.http, first), _review_of(stack.http, second)
    contexts = [console_context(browser) for _ in range(2)]
    try:
        mine, other = (c.new_page() for c in contexts)
        for p in (mine, other):
            p.goto(f"{stack.base}/ui/inbox")
            expect(p.locator(f'#pending [data-review="{rid2}"]')).to_be_visible()
        card = mine.locator(f'#pending [data-review="{rid1}"]')
        card.get_by_label("Always allow for").select_option("all")
        card.get_by_role("button", name="Always allow").click()
        for p in (mine, other):
            expect(p.locator(f'#recent [data-review="{rid2}"] .outcome')).to_contain_text(
                "Allowed", timeout=10_000
            )
            expect(p.locator(f'#pending [data-review="{rid2}"]')).to_have_count(0)
    finally:
        for c in contexts:
            c.close()
    _wait_status(stack.http, second, "idle")


def test_a_review_card_counts_down_to_its_timeout(stack: Stack, page: Page, tmp_path: Path) -> None:
    """On the session page the waiting review is an inline card whose countdown falls,
    then shows the timeout outcome (denied) when nobody decides; the trace lists that
    call as timed out with its reason."""
    _caller(stack.http, "caller-c")
    sid = _launch(stack.http, {"agent": "caller-c", "prompt": "go"})
    rid = _review_of(stack.http, sid)
    page.goto(f"{stack.base}/ui/sessions/{sid}")
    countdown = page.locator(f'#transcript [data-review="{rid}"] .countdown')
    expect(countdown).to_have_text(re.compile(r"^0:[0-2]\d$"))
    shot(page, "session-review", tmp_path)
    first = int(countdown.inner_text().split(":")[1])
    page.wait_for_timeout(2100)
    if countdown.count():
        assert int(countdown.inner_text().split(":")[1]) < first
    outcome = page.locator(f'#transcript [data-review="{rid}"] .outcome')
    expect(outcome).to_have_text("Timed out — denied", timeout=int(REVIEW_TIMEOUT * 1000) + 5000)
    assert stack.http.get(f"/v1/reviews/{rid}").json()["status"] == "timed_out"
    page.goto(f"{stack.base}/ui/sessions/{sid}/trace")
    expect(page.locator(".refused li")).to_have_text(
        re.compile(
            rf"^timed out:\s+invoke target via invoke\s+— no decision within {REVIEW_TIMEOUT:g} s$"
        )
    )


def test_team_run_delegation_cards_stream_and_the_trace_shows_each_step(
    stack: Stack, page: Page, tmp_path: Path
) -> None:
    """A team run's delegations render inline as cards that fill as the members stream,
    link their session and show the result once (tool output collapsed); the trace page
    lists each step with tokens, cost and wall-clock."""
    sid = _launch(stack.http, {"team": "desk", "prompt": "go"})
    page.goto(f"{stack.base}/ui/sessions/{sid}")
    checker = page.locator('#transcript [data-delegation]:has-text("lead → checker")')
    expect(checker.locator(".state")).to_have_text("running", timeout=15_000)
    # Streaming: part of the member's reply is on the card before it completes.
    expect(checker.locator(".work")).to_contain_text("checking every", timeout=10_000)
    assert checker.locator(".state").inner_text() == "running"
    shot(page, "session-team", tmp_path)  # mid-stream: the checker's card still filling
    expect(checker.locator(".state")).to_have_text("completed", timeout=15_000)
    expect(checker.locator(".work")).to_have_text(
        "checking every claim in the memo one by one now done CHECKED"
    )
    expect(checker.locator("a.delegated-session")).to_have_attribute(
        "href", re.compile(r"^/ui/sessions/session-")
    )
    writer = page.locator('#transcript [data-delegation]:has-text("lead → writer")')
    expect(writer.locator(".state")).to_have_text("completed")
    expect(writer.locator(".work")).to_have_text("WRITTEN")
    # The delegated results are not repeated open in the transcript: tool output is collapsed.
    expect(page.locator("#transcript .msg-tool details:not([open])").first).to_be_attached()
    assert page.locator("#transcript .msg-tool details[open]").count() == 0
    expect(page.locator("#session-status")).to_have_text("idle", timeout=15_000)
    expect(page.locator("#transcript .msg-assistant").last).to_contain_text("SYNTH")

    page.get_by_role("link", name="Trace").click()
    rows = page.locator(".trace-row")
    expect(rows).to_have_count(3)
    expect(rows.nth(1)).to_contain_text("delegate_to from lead")
    expect(rows.nth(1).locator("dd").first).to_have_text(re.compile(r"^\d+ / \d+$"))
    expect(rows.nth(1)).to_contain_text(re.compile(r"\d+ ms"))
    shot(page, "trace", tmp_path)


#: A step's deliverable: ``{"summary": str}``.
SUMMARY = {
    "type": "object",
    "properties": {"summary": {"type": "string", "description": "one line"}},
    "required": ["summary"],
}
#: The drafter's first deliverable, and its revision once the note says "shorter please".
DRAFT_PLAYBOOK = [
    {"when": "shorter please", "reply": '{"summary": "short"}'},
    {"reply": '{"summary": "first draft"}'},
]


def _handoff_step(http: httpx.Client, text: str, **extra: Any) -> str:
    """Start a ``drafter`` step with a handoff (``extra``: more fields of POST /v1/steps)
    and wait until it awaits the decision."""
    body = {"agent": "drafter", "input": text, "output_schema": SUMMARY, "handoff": True}
    resp = http.post("/v1/steps", json={**body, **extra})
    assert resp.status_code == 202, resp.text
    sid = str(resp.json()["step_id"])
    _wait_step(http, sid, "awaiting_handoff")
    return sid


def _wait_step(
    http: httpx.Client, sid: str, want: str, attempts: int = 1, timeout: float = 30
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        got: dict[str, Any] = http.get(f"/v1/steps/{sid}").json()
        if got["status"] == want and got["attempts"] == attempts:
            return got
        assert time.monotonic() < deadline, f"{sid} never became {want}@{attempts}: {got}"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def drafter(stack: Stack) -> str:
    """The ``drafter`` agent whose steps deliver a summary (revised on "shorter please")."""
    _agent(stack.http, "drafter", playbook=DRAFT_PLAYBOOK)
    return "drafter"


def test_handoffs_are_approved_revised_and_rejected_from_the_inbox(
    stack: Stack, page: Page, drafter: str, tmp_path: Path
) -> None:
    """Pending handoffs are inbox cards beside reviews (deliverable, countdown); Approve,
    Revise with a note and Reject go through POST /v1/steps/{id}/handoff, each card shows
    the status the server applied, and the revised attempt's handoff arrives live."""
    ok, again, no = (_handoff_step(stack.http, t) for t in ("Plan A", "Plan B", "Plan C"))
    page.goto(f"{stack.base}/ui/inbox")
    card = page.locator(f'#handoffs [data-step="{ok}"]')
    expect(card.get_by_role("heading")).to_have_text("drafter@1 hands off: Plan A")
    expect(card.locator(".preview")).to_contain_text('"summary": "first draft"')
    expect(card.locator(".countdown")).to_have_text(re.compile(r"^23h 5\dm$"))
    expect(page.locator("#handoffs [data-step]")).to_have_count(3)
    shot(page, "inbox-handoffs", tmp_path)

    card.get_by_role("button", name="Approve").click()
    outcome = page.locator(f'[data-key="{ok}:1"] .outcome')
    expect(outcome).to_have_text("Approved — the step is completed")
    assert stack.http.get(f"/v1/steps/{ok}").json()["status"] == "completed"

    card = page.locator(f'#handoffs [data-step="{again}"]')
    card.get_by_role("button", name="Revise with note").click()
    expect(card.get_by_role("alert")).to_have_text("Write a note saying what to revise.")
    note = card.get_by_label("Note (sent with Revise or Reject)")
    note.fill("shorter please")
    expect(note).to_have_value("shorter please")
    card.get_by_role("button", name="Revise with note").click()
    expect(page.locator(f'[data-key="{again}:1"] .outcome')).to_contain_text(
        "Sent back for revision — the step is"
    )
    revised = page.locator(f'#handoffs [data-key="{again}:2"]')
    expect(revised.locator(".preview")).to_contain_text('"summary": "short"', timeout=15_000)

    card = page.locator(f'#handoffs [data-step="{no}"]')
    card.get_by_label("Note (sent with Revise or Reject)").fill("not needed")
    card.get_by_role("button", name="Reject").click()
    expect(page.locator(f'[data-key="{no}:1"] .outcome')).to_have_text(
        "Rejected — the step is rejected"
    )
    got = stack.http.get(f"/v1/steps/{no}").json()
    assert (got["status"], got["error"]) == ("rejected", "not needed")
    revised.get_by_role("button", name="Approve").click()
    expect(page.locator(f'[data-key="{again}:2"] .outcome')).to_have_text(
        "Approved — the step is completed"
    )
    assert _wait_step(stack.http, again, "completed", attempts=2)["deliverable"] == {
        "summary": "short"
    }


def test_the_steps_list_and_a_step_page_decide_a_handoff(
    stack: Stack, page: Page, drafter: str, tmp_path: Path
) -> None:
    """/ui/steps lists each step (status, agent@version, attempt, deadline); the step page
    shows the input, the deliverable rendered from its schema and each attempt, and its
    Approve, reached and pressed by keyboard alone, settles the step, after which the page
    shows it completed."""
    sid = _handoff_step(stack.http, "Plan D")
    page.goto(f"{stack.base}/ui/steps")
    row = page.locator(f'tr[data-step="{sid}"]')
    expect(row).to_contain_text("awaiting_handoff")
    expect(row).to_contain_text("drafter@1")
    expect(row.locator(".countdown")).to_have_text(re.compile(r"^23h 5\dm$"))
    row.get_by_role("link", name="Plan D").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Plan D")
    expect(page.locator("#deliverable .fields dt")).to_have_text("summary (one line)")
    expect(page.locator("#deliverable .fields dd")).to_have_text("first draft")
    expect(page.locator(".attempts > li")).to_have_count(1)
    expect(page.locator(".attempts .reply")).to_have_text('{"summary": "first draft"}')
    shot(page, "step", tmp_path)
    # By keyboard alone: Tab from the top of the page to Approve, then Enter.
    for _ in range(40):
        page.keyboard.press("Tab")
        if page.evaluate("() => document.activeElement.textContent") == "Approve":
            break
    else:
        pytest.fail("Tab never reached the Approve button")
    page.keyboard.press("Enter")
    expect(page.locator("#step-status")).to_have_text("completed", timeout=10_000)
    assert stack.http.get(f"/v1/steps/{sid}").json()["status"] == "completed"


def test_a_step_page_renders_each_attempts_deliverable_from_its_schema(
    stack: Stack, page: Page, drafter: str
) -> None:
    """A step revised once: each attempt's reply renders as the schema's fields (the first
    draft, then the revision), each reply's raw text collapsed under it."""
    sid = _handoff_step(stack.http, "Plan R")
    body = {"decision": "revise", "feedback": "shorter please"}
    assert stack.http.post(f"/v1/steps/{sid}/handoff", json=body).is_success
    _wait_step(stack.http, sid, "awaiting_handoff", attempts=2)
    page.goto(f"{stack.base}/ui/steps/{sid}")
    attempts = page.locator(".attempts > li")
    expect(attempts).to_have_count(2)
    expect(attempts.nth(1).locator("pre").first).to_contain_text("shorter please")
    for n, text in ((0, "first draft"), (1, "short")):
        expect(attempts.nth(n).locator(".fields dt")).to_have_text("summary (one line)")
        expect(attempts.nth(n).locator(".fields dd")).to_have_text(text)
        raw = attempts.nth(n).locator("details .reply")
        expect(raw).to_be_hidden()
        attempts.nth(n).get_by_text("Reply as sent").click()
        expect(raw).to_have_text(f'{{"summary": "{text}"}}')
        expect(raw).to_be_visible()
    expect(page.locator("#deliverable .fields dd")).to_have_text("short")
    assert stack.http.post(f"/v1/steps/{sid}/handoff", json={"decision": "approve"}).is_success


def test_a_step_pages_handoff_counts_down_the_time_left_to_decide(
    stack: Stack, page: Page, drafter: str
) -> None:
    """A step awaiting its handoff shows "Time left to decide" on its page, counting down
    from the step's handoff timeout (10 minutes here) second by second."""
    sid = _handoff_step(stack.http, "Plan T", handoff_timeout_s=600)
    page.goto(f"{stack.base}/ui/steps/{sid}")
    left = page.locator("#handoff").get_by_text("Time left to decide:")
    expect(left).to_have_text(re.compile(r"^Time left to decide: [89]:[0-5]\d$"))
    countdown = page.locator("#handoff .countdown")
    first = countdown.inner_text()
    expect(countdown).not_to_have_text(first)
    minutes, seconds = (int(n) for n in countdown.inner_text().split(":"))
    before = [int(n) for n in first.split(":")]
    assert minutes * 60 + seconds < before[0] * 60 + before[1]
    assert stack.http.post(f"/v1/steps/{sid}/handoff", json={"decision": "approve"}).is_success


def _audit_pages(stack: Stack, page: Page, monkeypatch: pytest.MonkeyPatch) -> None:
    """caller-d's 3 audit rows, 1 a page: Older follows the API's cursor to the last page
    (no Older there), Newer walks back to the first (no Newer there); at 3 a page the one
    full page links neither; an offset past the API's bound is refused (422)."""
    from api.ui import audit as ui_audit
    from baton.agents.schemas import MAX_OFFSET

    monkeypatch.setattr(ui_audit, "PAGE", 1)
    page.goto(f"{stack.base}/ui/audit?agent=caller-d")
    rows = page.locator("tbody tr[data-audit]")
    seen = [rows.first.get_attribute("data-audit")]
    expect(page.locator("#audit-count")).to_have_text("Rows 1 to 1 of 3")
    expect(page.get_by_role("link", name="← Newer")).to_have_count(0)
    for n in (2, 3):
        page.get_by_role("link", name="Older →").click()
        expect(page).to_have_url(re.compile(r"agent=caller-d&cursor="))
        expect(page.locator("#audit-count")).to_have_text(f"Rows {n} to {n} of 3")
        seen.append(rows.first.get_attribute("data-audit"))
    expect(page.get_by_role("link", name="Older →")).to_have_count(0)
    assert len(set(seen)) == 3
    page.get_by_role("link", name="← Newer").click()
    expect(page.locator("#audit-count")).to_have_text("Rows 2 to 2 of 3")
    assert rows.first.get_attribute("data-audit") == seen[1]
    page.get_by_role("link", name="← Newer").click()
    expect(page).to_have_url(re.compile(r"/ui/audit\?agent=caller-d$"))
    expect(page.locator("#audit-count")).to_have_text("Rows 1 to 1 of 3")
    monkeypatch.setattr(ui_audit, "PAGE", 3)
    page.reload()
    expect(rows).to_have_count(3)
    expect(page.locator(".pager a")).to_have_count(0)
    assert stack.http.get("/ui/audit", params={"offset": MAX_OFFSET}).status_code == 200
    refused = stack.http.get("/ui/audit", params={"offset": MAX_OFFSET + 1})
    assert (refused.status_code, refused.json()["code"]) == (422, "validation_error")
    refused = stack.http.get("/ui/audit", params={"cursor": "not-a-cursor"})
    assert (refused.status_code, refused.json()["code"]) == (422, "invalid_cursor")


def test_a_reviews_audit_row_is_found_from_its_card(
    stack: Stack, page: Page, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A card names and links its calling session and opening time, shows the caller's
    last two messages and its history with this target (counted from the audit log);
    Always allow leaves it visibly resolved with "policy saved"; its audit link opens the
    audit log at that review's row (caller, target, via, outcome, decided by, policy
    saved); the log pages with Newer / Older by the API's cursor (edges: a page of exactly
    the page size, the last page, the largest offset); filters that match nothing show the
    empty state."""
    _caller(stack.http, "caller-d")
    sid = _launch(stack.http, {"agent": "caller-d", "prompt": "go"})
    rid = _review_of(stack.http, sid)
    page.goto(f"{stack.base}/ui/inbox")
    card = page.locator(f'#pending [data-review="{rid}"]')
    expect(card.locator(".session-link")).to_have_attribute("href", f"/ui/sessions/{sid}")
    expect(card.locator(".context time")).to_have_count(1)
    expect(card.locator(".last-messages li")).to_have_text(["user: go", "caller-d: Calling."])
    expect(card.locator(".history")).to_have_text("First time caller-d asks for this.")
    card.get_by_role("button", name="Always allow").click()
    done = page.locator(f'[data-review="{rid}"]')
    expect(done.locator(".saved")).to_have_text("policy saved: always allow for target")
    expect(done).to_have_class(re.compile(r"\bresolved\b"))
    done.get_by_role("link", name="Find in the audit log").click()
    page.wait_for_url(re.compile(r"/ui/audit\?review_id="))
    row = page.locator(f'tr[data-review="{rid}"]')
    expect(row).to_have_count(1)
    expect(page.locator("tbody tr")).to_have_count(1)
    for text in ("caller-d", "invoke", "target", "allowed", "local", "yes, for target"):
        expect(row).to_contain_text(text)
    shot(page, "audit", tmp_path)
    again = _launch(stack.http, {"agent": "caller-d", "prompt": "go2"})
    page.goto(f"{stack.base}/ui/inbox")
    rid2 = _review_of(stack.http, again)
    second = page.locator(f'#pending [data-review="{rid2}"]')
    expect(second.locator(".history")).to_have_text("First time caller-d asks for this.")
    second.get_by_role("button", name="Deny").click()
    expect(page.locator(f'[data-review="{rid2}"] .outcome')).to_have_text("Denied by local")
    third = _launch(stack.http, {"agent": "caller-d", "prompt": "go2"})
    page.goto(f"{stack.base}/ui/inbox")
    rid3 = _review_of(stack.http, third)
    card = page.locator(f'#pending [data-review="{rid3}"]')
    expect(card.locator(".history")).to_have_text("Before: allowed 0 times, denied 1 time.")
    card.get_by_role("button", name="Deny").click()
    expect(page.locator(f'[data-review="{rid3}"] .outcome')).to_have_text("Denied by local")
    page.goto(f"{stack.base}/ui/audit")
    page.get_by_label("Agent (caller)").select_option("caller-d")
    page.get_by_label("Outcome").select_option("block")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("tbody .empty")).to_have_text("No audit rows match these filters.")
    page.get_by_label("Outcome").select_option("allow")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator(f'tr[data-review="{rid}"]')).to_have_count(1)
    _audit_pages(stack, page, monkeypatch)
    by_review = stack.http.get("/v1/audit", params={"review_id": rid}).json()
    assert [a["review_id"] for a in by_review["data"]] == [rid]
    assert stack.http.get("/v1/audit", params={"review_id": rid, "via": "route"}).json() == {
        "data": [],
        "count": 0,
        "next_cursor": None,
    }
    _wait_status(stack.http, sid, "idle")


def test_a_pending_card_links_the_callers_past_decisions_in_the_audit_log(
    stack: Stack, page: Page
) -> None:
    """A pending review card links the audit log filtered to its caller and target, which
    lists the earlier decision on that pair."""
    _caller(stack.http, "caller-f")
    first = _launch(stack.http, {"agent": "caller-f", "prompt": "go"})
    rid1 = _review_of(stack.http, first)
    denied = stack.http.post(f"/v1/reviews/{rid1}/decision", json={"decision": "deny"})
    assert denied.status_code == 200, denied.text
    second = _launch(stack.http, {"agent": "caller-f", "prompt": "go"})
    rid2 = _review_of(stack.http, second)
    page.goto(f"{stack.base}/ui/inbox")
    card = page.locator(f'#pending [data-review="{rid2}"]')
    card.get_by_role("link", name="Past decisions in the audit log").click()
    page.wait_for_url(re.compile(r"/ui/audit\?agent=caller-f&target=target$"))
    expect(page.get_by_label("Agent (caller)")).to_have_value("caller-f")
    expect(page.get_by_label("Target")).to_have_value("target")
    expect(page.locator("tbody tr[data-audit]")).to_have_count(1)
    expect(page.locator(f'tr[data-review="{rid1}"]')).to_contain_text("denied by user")
    stack.http.post(f"/v1/reviews/{rid2}/decision", json={"decision": "deny"})
    _wait_status(stack.http, second, "idle")


def test_the_audit_log_is_filtered_by_via(stack: Stack, page: Page) -> None:
    """On the audit page, choosing a Via (with the caller) lists only that path's rows;
    Via "any" lists them all again."""
    from baton.permissions import reviews
    from baton.storage.db import session_scope

    _agent(stack.http, "caller-v", playbook=[{"reply": "unused"}])
    with session_scope(stack.engine) as s:
        for via, target in (("invoke", "target"), ("delegate_to", "checker"), ("route", "writer")):
            reviews.add_audit(
                s,
                session_id="session-via",
                caller="caller-v",
                operation="invoke",
                target=target,
                outcome="block",
                decided_by="policy",
                via=via,
            )
    page.goto(f"{stack.base}/ui/audit")
    page.get_by_label("Agent (caller)").select_option("caller-v")
    page.get_by_role("button", name="Filter").click()
    rows = page.locator("tbody tr[data-audit]")
    expect(rows).to_have_count(3)
    for via, target in (("delegate_to", "checker"), ("route", "writer")):
        page.get_by_label("Via").select_option(via)
        page.get_by_role("button", name="Filter").click()
        expect(page).to_have_url(re.compile(rf"agent=caller-v&.*via={via}"))
        expect(rows).to_have_count(1)
        expect(rows.locator("td").nth(4)).to_have_text(via)
        expect(rows.locator("td").nth(3)).to_have_text(target)
    page.get_by_label("Via").select_option("")
    page.get_by_role("button", name="Filter").click()
    expect(rows).to_have_count(3)


def _set_toggle(page: Page, base: str, caller: str, target: str, value: str) -> None:
    page.goto(f"{base}/ui/agents/{caller}/policies")
    page.get_by_label("Search agents by name or slug").fill(target)
    expect(page.locator(f'tr[data-target="{target}"]')).to_be_visible()
    expect(page.locator('tr[data-target="checker"]')).to_be_hidden()
    page.get_by_label(f"Send messages to {target}", exact=True).select_option(value)
    page.get_by_role("button", name="Save permissions").click()
    expect(page.locator("#policy-saved")).to_have_text(
        "Saved. The next call follows these permissions."
    )


def test_a_per_agent_toggle_is_followed_by_the_next_invoke(
    stack: Stack, page: Page, tmp_path: Path
) -> None:
    """The policies page (three global toggles, a searchable per-agent table) saves through
    PUT /v1/agents/{slug}/policies: Block on a row refuses the next invoke without a
    review; Allow lets the next one through without a review."""
    _caller(stack.http, "caller-e")
    page.goto(f"{stack.base}/ui/agents")
    page.locator('tr[data-agent="caller-e"]').get_by_role("link", name="Policies").click()
    expect(page.get_by_role("radiogroup", name="List agents")).to_be_visible()
    expect(page.get_by_role("radiogroup", name="Send messages to all agents")).to_be_visible()
    expect(page.get_by_label("Send messages to target", exact=True)).to_have_value("review")
    shot(page, "policies", tmp_path)
    _set_toggle(page, stack.base, "caller-e", "target", "block")
    got = stack.http.get("/v1/agents/caller-e/policies").json()
    assert got["targets"] == {"target": {"read": "review", "invoke": "block"}}
    blocked = _launch(stack.http, {"agent": "caller-e", "prompt": "go", "sync": True})
    assert stack.http.get("/v1/reviews", params={"session_id": blocked}).json()["count"] == 0
    audit = stack.http.get("/v1/audit", params={"session_id": blocked}).json()["data"]
    assert [(a["outcome"], a["target"], a["via"]) for a in audit] == [("block", "target", "invoke")]
    for via, count in (("invoke", 1), ("route", 0)):
        params = {"session_id": blocked, "via": via}
        assert stack.http.get("/v1/audit", params=params).json()["count"] == count
    page.goto(f"{stack.base}/ui/sessions/{blocked}/trace")
    expect(page.locator(".refused li")).to_contain_text(re.compile(r"^refused:\s+invoke target"))

    _set_toggle(page, stack.base, "caller-e", "target", "allow")
    allowed = _launch(stack.http, {"agent": "caller-e", "prompt": "go", "sync": True})
    assert stack.http.get("/v1/reviews", params={"session_id": allowed}).json()["count"] == 0
    msgs = stack.http.get(f"/v1/sessions/{allowed}/transcript").json()["messages"]
    assert "target says hi" in msgs[-1]["text"]


def test_publish_a_draft_roll_back_and_the_next_session_runs_the_rolled_back_revision(
    stack: Stack, page: Page, tmp_path: Path
) -> None:
    """On the agent page the draft editor shows the API's validation errors at the field;
    a valid draft is saved and published as v2 (live), the diff shows v1 against v2, Roll
    back to v1 moves the live marker, and the next session is pinned to v1."""
    _agent(stack.http, "versioned", playbook=[{"reply": "v1 says hi"}])
    page.goto(f"{stack.base}/ui/agents")
    page.locator('tr[data-agent="versioned"]').get_by_role("link", name="versioned").click()
    expect(page.locator("#live-version")).to_have_text("v1")
    editor = page.get_by_label("Spec")
    expect(editor).to_have_value(re.compile("v1 says hi"))
    editor.fill("playbook:\n- reply: v2 says hi\nlimits:\n  max_depth: -1\n")
    page.get_by_role("button", name="Save draft").click()
    error = page.locator('#draft-errors [data-path="limits.max_depth"]')
    expect(error).to_contain_text("limits.max_depth: ")
    expect(error).to_contain_text("(line 4)")
    editor.fill("playbook: [unclosed\n")
    page.get_by_role("button", name="Save draft").click()
    expect(page.locator("#draft-errors li")).to_contain_text("line 2")
    editor.fill("playbook:\n- reply: v2 says hi\n")
    page.get_by_role("button", name="Publish the draft").click()
    expect(page.locator("#agent-done")).to_contain_text("Published v2")
    expect(page.locator("#live-version")).to_have_text("v2")
    expect(page.locator('#revisions tr[data-version="2"]')).to_contain_text("live")
    page.get_by_label("From").select_option("1")
    page.get_by_label("To").select_option("2")
    page.get_by_role("button", name="Show diff").click()
    expect(page.locator("#diff .d-del")).to_contain_text(["v1 says hi"])
    expect(page.locator("#diff .d-add")).to_contain_text(["v2 says hi"])
    shot(page, "agent", tmp_path)
    page.get_by_role("button", name="Roll back to v1").click()
    expect(page.locator("#agent-done")).to_have_text(
        "Rolled back: v1 is live; new sessions run it."
    )
    expect(page.locator("#live-version")).to_have_text("v1")
    resp = stack.http.post(
        "/v1/sessions", json={"agent": "versioned", "prompt": "hi", "sync": True}
    )
    assert resp.status_code == 201, resp.text
    assert (resp.json()["version"], resp.json()["response"]) == (1, "v1 says hi")
    draft = stack.http.get("/v1/agents/versioned").json()["draft"]
    assert [rule["reply"] for rule in draft["playbook"]] == ["v2 says hi"]


def test_the_agent_page_diffs_a_revision_against_the_draft(stack: Stack, page: Page) -> None:
    """A revision's "diff with draft" link shows what the draft changed (the revision's
    line removed, the draft's added); once the draft equals the revision the page says
    there is no difference."""
    _agent(stack.http, "drafty", playbook=[{"reply": "published words"}])
    draft = {"playbook": [{"reply": "draft words"}]}
    assert stack.http.put("/v1/agents/drafty/draft", json=draft).is_success
    page.goto(f"{stack.base}/ui/agents/drafty")
    page.locator('#revisions tr[data-version="1"]').get_by_role(
        "link", name="diff with draft"
    ).click()
    page.wait_for_url(re.compile(r"/ui/agents/drafty\?a=1&b=draft#diff-h$"))
    expect(page.get_by_label("From")).to_have_value("1")
    expect(page.get_by_label("To")).to_have_value("draft")
    expect(page.locator("#diff .d-del")).to_contain_text(["published words"])
    expect(page.locator("#diff .d-add")).to_contain_text(["draft words"])
    restored = stack.http.post("/v1/agents/drafty/restore", json={"version": 1})
    assert restored.is_success, restored.text
    page.reload()
    expect(page.locator("#diff")).to_have_count(0)
    expect(page.locator("#diff-same")).to_have_text("No difference between v1 and draft.")


def test_the_team_page_shows_the_lead_members_and_routes(
    stack: Stack, page: Page, tmp_path: Path
) -> None:
    """The agents page links each team to its page: lead, members with roles and hints,
    the routes (or their empty state)."""
    page.goto(f"{stack.base}/ui/agents")
    page.locator('tr[data-team="desk"]').get_by_role("link", name="desk").click()
    expect(page.get_by_role("heading", level=1)).to_contain_text("Desk")
    expect(page.locator("#members tbody tr")).to_have_count(3)
    expect(page.locator("#members tbody tr").first).to_contain_text("lead (supervisor)")
    expect(page.locator("main")).to_contain_text("No routes: the lead decides every delegation.")


def test_a_team_is_edited_from_its_page_and_a_bad_edit_shows_the_apis_error(
    stack: Stack, page: Page
) -> None:
    """The team editor saves members, lead and routes through PUT /v1/teams/{id}: dropping
    a member and adding a route shows in the API's team; a route to a non-specialist is
    refused and the page shows the API's validation error, the team unchanged."""
    team = {
        "id": "edits",
        "name": "Edits",
        "supervisor_agent_id": "lead",
        "members": [
            {"agent_id": "lead", "role": "supervisor"},
            {"agent_id": "checker", "role": "specialist", "delegation_hint": "facts"},
            {"agent_id": "writer", "role": "specialist"},
        ],
    }
    assert stack.http.post("/v1/teams", json=team).status_code == 201
    page.goto(f"{stack.base}/ui/teams/edits")
    expect(page.get_by_label("Member 1 is the lead")).to_be_checked()
    page.get_by_role("button", name="Remove member 3").click()
    page.get_by_label("Member 2 delegation hint").fill("checks every claim")
    page.get_by_role("button", name="Add a route").click()
    page.get_by_label("Route 1 when").fill("^check:")
    page.get_by_label("Route 1 to").fill("checker")
    page.get_by_role("button", name="Save the team").click()
    expect(page.locator("#team-done")).to_have_text("Saved. New runs of the team use it.")
    got = stack.http.get("/v1/teams/edits").json()
    assert [(m["agent_id"], m["role"], m.get("delegation_hint")) for m in got["members"]] == [
        ("lead", "supervisor", None),
        ("checker", "specialist", "checks every claim"),
    ]
    assert got["routes"] == [{"when": "^check:", "to": "checker"}]
    expect(page.locator("#members tbody tr")).to_have_count(2)
    page.get_by_label("Route 1 to").fill("lead")
    page.get_by_role("button", name="Save the team").click()
    expect(page.locator("#team-errors li")).to_have_text(
        re.compile(r"routes\[0\]\.to 'lead' is not a specialist of this team")
    )
    assert stack.http.get("/v1/teams/edits").json()["routes"] == got["routes"]


def test_every_page_fits_a_phone_and_is_shot_at_both_widths(
    stack: Stack, browser: Browser, drafter: str, tmp_path: Path
) -> None:
    """At 390 px no console page scrolls sideways (wide tables scroll inside their own
    box); each page is shot at 1366x768 and 390x844, and its skip link leads the tab
    order."""
    sid = _launch(stack.http, {"team": "desk", "prompt": "go", "sync": True})
    step = _handoff_step(stack.http, "Plan for the phone")
    pages = {
        "home": "/ui/",
        "inbox": "/ui/inbox",
        "steps": "/ui/steps",
        "step": f"/ui/steps/{step}",
        "audit": "/ui/audit",
        "agents": "/ui/agents",
        "agent": "/ui/agents/lead",
        "policies": "/ui/agents/lead/policies",
        "team": "/ui/teams/desk",
        "session": f"/ui/sessions/{sid}",
        "trace": f"/ui/sessions/{sid}/trace",
        "login": "/ui/login",
    }
    for suffix, viewport in (("", LAPTOP), ("-phone", PHONE)):
        context = console_context(browser, viewport)
        try:
            page = context.new_page()
            for name, path in pages.items():
                page.goto(f"{stack.base}{path}")
                page.wait_for_load_state("networkidle")
                wide = page.evaluate(
                    "() => [document.documentElement.scrollWidth,"
                    " document.documentElement.clientWidth]"
                )
                assert wide[0] <= wide[1], f"{path} overflows at {viewport}: {wide}"
                shot(page, f"page-{name}{suffix}", tmp_path)
                page.keyboard.press("Tab")
                focused = page.evaluate("() => document.activeElement.textContent")
                assert focused == "Skip to content", (path, focused)
        finally:
            context.close()
    stack.http.post(f"/v1/steps/{step}/handoff", json={"decision": "approve"})


def _tab_to(page: Page, within: str, name: str, tabs: int = 300) -> None:
    """Press Tab until the focus is on the button ``name`` inside ``within`` (a selector)."""
    script = (
        "([within, name]) => { const a = document.activeElement;"
        " return !!a.closest(within) && a.textContent === name; }"
    )
    for _ in range(tabs):
        page.keyboard.press("Tab")
        if page.evaluate(script, [within, name]):
            return
    pytest.fail(f"Tab never reached {name} in {within}")


def test_a_review_and_a_handoff_are_decided_by_keyboard_alone(
    stack: Stack, page: Page, drafter: str
) -> None:
    """In the inbox, Tab reaches a review card's Allow once and a handoff card's Approve,
    and Enter decides each: the review is allowed, the step completed."""
    _caller(stack.http, "caller-k")
    sid = _launch(stack.http, {"agent": "caller-k", "prompt": "go"})
    rid = _review_of(stack.http, sid)
    step = _handoff_step(stack.http, "Plan K")
    page.goto(f"{stack.base}/ui/inbox")
    expect(page.locator(f'#handoffs [data-step="{step}"]')).to_be_visible()
    _tab_to(page, f'#pending [data-review="{rid}"]', "Allow once")
    page.keyboard.press("Enter")
    expect(page.locator(f'[data-review="{rid}"] .outcome')).to_have_text("Allowed by local")
    page.locator("h1").click()  # back to the top of the page: Tab again from there
    _tab_to(page, f'#handoffs [data-step="{step}"]', "Approve")
    page.keyboard.press("Enter")
    expect(page.locator(f'[data-key="{step}:1"] .outcome')).to_have_text(
        "Approved — the step is completed"
    )
    assert stack.http.get(f"/v1/reviews/{rid}").json()["status"] == "allowed"
    _wait_status(stack.http, sid, "idle")


def test_an_inbox_refresh_leaves_the_keyboard_focus_where_it_was(
    stack: Stack, page: Page, drafter: str
) -> None:
    """A person on a handoff card's Approve keeps the focus there when the inbox refreshes
    because another review opened (every refresh took all the cards out of the page, and
    the focus fell to the page's body: Enter then decided nothing)."""
    step = _handoff_step(stack.http, "Plan F")
    page.goto(f"{stack.base}/ui/inbox")
    expect(page.locator(f'#handoffs [data-step="{step}"]')).to_be_visible()
    _tab_to(page, f'#handoffs [data-step="{step}"]', "Approve")
    _caller(stack.http, "caller-f2")
    rid = _review_of(stack.http, _launch(stack.http, {"agent": "caller-f2", "prompt": "go"}))
    expect(page.locator(f'#pending [data-review="{rid}"]')).to_be_visible()
    on = page.evaluate(
        "() => { const a = document.activeElement; const card = a.closest('[data-step]');"
        " return card ? `${card.dataset.step} ${a.textContent}` : a.tagName; }"
    )
    assert on == f"{step} Approve"
    page.keyboard.press("Enter")
    expect(page.locator(f'[data-key="{step}:1"] .outcome')).to_have_text(
        "Approved — the step is completed"
    )


def _tab_until(page: Page, selector: str, tabs: int = 300) -> None:
    """Press Tab until the focused element matches ``selector``."""
    for _ in range(tabs):
        page.keyboard.press("Tab")
        if page.evaluate("(s) => document.activeElement.matches(s)", selector):
            return
    pytest.fail(f"Tab never reached {selector}")


def test_the_policies_page_and_the_draft_editor_work_by_keyboard_alone(
    stack: Stack, page: Page
) -> None:
    """By keyboard alone: an arrow key moves a global toggle (a radio group) to Block, the
    search box and a per-agent select are reached by Tab and changed by typing and an
    arrow key, Enter on Save permissions saves them; in the draft editor, text typed into
    the Spec and Space on Save draft save the draft through the API."""
    _agent(stack.http, "keyed", playbook=[{"reply": "before keys"}])
    page.goto(f"{stack.base}/ui/agents/keyed/policies")
    _tab_until(page, 'input[name="global.list"]')
    expect(page.locator('input[name="global.list"][value="review"]')).to_be_focused()
    page.keyboard.press("ArrowRight")
    expect(page.locator('input[name="global.list"][value="block"]')).to_be_checked()
    _tab_until(page, "#policy-search")
    page.keyboard.type("target2")
    expect(page.locator('tr[data-target="target"]')).to_be_hidden()
    _tab_until(page, 'select[aria-label="Send messages to target2"]')
    page.keyboard.press("ArrowDown")
    expect(page.get_by_label("Send messages to target2", exact=True)).to_have_value("allow")
    _tab_to(page, "#policies", "Save permissions")
    page.keyboard.press("Enter")
    expect(page.locator("#policy-saved")).to_have_text(
        "Saved. The next call follows these permissions."
    )
    got = stack.http.get("/v1/agents/keyed/policies").json()
    assert got["global"]["list"] == "block"
    assert got["targets"] == {"target2": {"read": "review", "invoke": "allow"}}

    page.goto(f"{stack.base}/ui/agents/keyed")
    _tab_until(page, "#draft-text")
    page.keyboard.press("Control+A")
    page.keyboard.type("playbook:\n- reply: typed by keys\n")
    expect(page.get_by_label("Spec")).to_have_value("playbook:\n- reply: typed by keys\n")
    _tab_to(page, "#draft-form", "Save draft")
    page.keyboard.press("Space")
    expect(page.locator("#agent-done")).to_have_text("Draft saved.")
    draft = stack.http.get("/v1/agents/keyed").json()["draft"]
    assert [rule["reply"] for rule in draft["playbook"]] == ["typed by keys"]


def test_always_allow_from_a_card_shows_at_once_on_the_policies_page(
    stack: Stack, page: Page
) -> None:
    """Always allow (messaging the target) on a review card, then the caller's policies
    page: its Send messages row for that target reads Allow."""
    _caller(stack.http, "caller-g")
    sid = _launch(stack.http, {"agent": "caller-g", "prompt": "go"})
    rid = _review_of(stack.http, sid)
    page.goto(f"{stack.base}/ui/inbox")
    card = page.locator(f'#pending [data-review="{rid}"]')
    card.get_by_role("button", name="Always allow").click()
    expect(page.locator(f'[data-review="{rid}"] .saved')).to_have_text(
        "policy saved: always allow for target"
    )
    page.goto(f"{stack.base}/ui/agents/caller-g/policies")
    expect(page.get_by_label("Send messages to target", exact=True)).to_have_value("allow")
    expect(page.get_by_label("Send messages to target2", exact=True)).to_have_value("review")
    _wait_status(stack.http, sid, "idle")


def test_a_denied_invoke_is_a_denied_row_in_the_trace(stack: Stack, page: Page) -> None:
    """A review denied by a person shows under its session in the trace as denied, with
    the call and who denied it."""
    _caller(stack.http, "caller-h")
    sid = _launch(stack.http, {"agent": "caller-h", "prompt": "go"})
    rid = _review_of(stack.http, sid)
    assert stack.http.post(f"/v1/reviews/{rid}/decision", json={"decision": "deny"}).is_success
    _wait_status(stack.http, sid, "idle")
    page.goto(f"{stack.base}/ui/sessions/{sid}/trace")
    expect(page.locator(".refused li.refused-denied_by_user")).to_have_text(
        re.compile(r"^denied:\s+invoke target via invoke\s+— by local$")
    )


def test_restore_into_draft_and_retire_from_the_agent_page(stack: Stack, page: Page) -> None:
    """Restore v1 into draft copies v1 into the draft (v2 stays live); Retire clears the
    live pointer, the page says retired and the API refuses a launch (agent_retired)."""
    _agent(stack.http, "restorable", playbook=[{"reply": "v1 here"}])
    draft = {"playbook": [{"reply": "v2 here"}]}
    assert stack.http.put("/v1/agents/restorable/draft", json=draft).is_success
    assert stack.http.post("/v1/agents/restorable/publish").status_code == 201
    page.goto(f"{stack.base}/ui/agents/restorable")
    expect(page.get_by_label("Spec")).to_have_value(re.compile("v2 here"))
    page.get_by_role("button", name="Restore v1 into draft").click()
    expect(page.locator("#agent-done")).to_have_text(
        "v1 restored into the draft (nothing published)."
    )
    expect(page.get_by_label("Spec")).to_have_value(re.compile("v1 here"))
    expect(page.locator("#live-version")).to_have_text("v2")
    got = stack.http.get("/v1/agents/restorable").json()
    assert (got["live_version"], got["draft"]["playbook"][0]["reply"]) == (2, "v1 here")
    page.get_by_role("button", name="Retire (refuse new launches)").click()
    expect(page.locator("#agent-done")).to_have_text(
        "Retired: new launches are refused until you publish or roll back."
    )
    expect(page.locator("#live-version")).to_have_text("retired")
    refused = stack.http.post("/v1/sessions", json={"agent": "restorable", "prompt": "hi"})
    assert (refused.status_code, refused.json()["code"]) == (409, "agent_retired")


def test_the_draft_editor_shows_and_saves_json(stack: Stack, page: Page) -> None:
    """The JSON format shows the draft as JSON; edited JSON is saved through the API, and
    a JSON syntax error is listed with its line."""
    _agent(stack.http, "jsonish", playbook=[{"reply": "as yaml"}])
    page.goto(f"{stack.base}/ui/agents/jsonish")
    page.get_by_label("JSON").check()
    page.wait_for_url(re.compile(r"\?fmt=json$"))
    editor = page.get_by_label("Spec")
    expect(editor).to_have_value(re.compile(r'^\{\s+"playbook": \['))
    editor.fill('{\n  "playbook": [\n    {"reply": "as json"\n  ]\n}\n')
    page.get_by_role("button", name="Save draft").click()
    expect(page.locator("#draft-errors li")).to_contain_text("line 4")
    editor.fill('{"playbook": [{"reply": "as json"}]}')
    page.get_by_role("button", name="Save draft").click()
    expect(page.locator("#agent-done")).to_have_text("Draft saved.")
    draft = stack.http.get("/v1/agents/jsonish").json()["draft"]
    assert draft["playbook"][0]["reply"] == "as json"


#: The fixer's first reply misses ``summary``; the errors fed back make it answer right.
FIX_PLAYBOOK = [
    {"when": "required property", "reply": '{"summary": "fixed"}'},
    {"reply": '{"wrong": 1}'},
]


def test_a_step_page_shows_the_validation_error_fed_back(stack: Stack, page: Page) -> None:
    """A step whose first reply fails its schema: the step page lists both attempts, the
    second fed back with the validation error, and the deliverable of the second; the
    home page lists it under its steps, and its sessions with their start time."""
    _agent(stack.http, "fixer", playbook=FIX_PLAYBOOK)
    resp = stack.http.post(
        "/v1/steps", json={"agent": "fixer", "input": "Fix me", "output_schema": SUMMARY}
    )
    assert resp.status_code == 202, resp.text
    sid = str(resp.json()["step_id"])
    _wait_step(stack.http, sid, "completed", attempts=2)
    page.goto(f"{stack.base}/ui/steps/{sid}")
    attempts = page.locator(".attempts > li")
    expect(attempts).to_have_count(2)
    expect(attempts.nth(0).locator(".reply")).to_have_text('{"wrong": 1}')
    expect(attempts.nth(1).locator(".meta").first).to_have_text("Fed back to the agent")
    expect(attempts.nth(1).locator("pre").first).to_contain_text("'summary' is a required property")
    expect(page.locator("#deliverable .fields dd")).to_have_text("fixed")
    session = _launch(stack.http, {"agent": "target", "prompt": "hi", "sync": True})
    page.goto(f"{stack.base}/ui/")
    row = page.locator(
        f'section[aria-labelledby="list-h"] tr:has(a[href="/ui/sessions/{session}"])'
    )
    expect(row.locator("time")).to_have_attribute("datetime", re.compile(r"^\d{4}-\d\d-\d\dT"))
    expect(row.locator("time")).to_have_text(re.compile(r"^\d\d-\d\d \d\d:\d\d$"))
    step_row = page.locator(f'section[aria-labelledby="steps-h"] tr:has(a[href="/ui/steps/{sid}"])')
    expect(step_row).to_contain_text("fixer@1")
    expect(step_row).to_contain_text("completed")
    expect(step_row.locator("time")).to_have_text(re.compile(r"^\d\d-\d\d \d\d:\d\d$"))


def _footprint(engine: Engine, root: str) -> tuple[Any, ...]:
    with Session(engine) as s:
        from baton.runs import run_tree

        ids = [root, *run_tree.run_sessions(s, root_session_id=root)]
        return (
            s.exec(
                select(MessageRow.id, MessageRow.text).where(col(MessageRow.session_id).in_(ids))
            ).all(),
            s.exec(
                select(EventRow.id, EventRow.data).where(col(EventRow.session_id).in_(ids))
            ).all(),
            s.exec(select(UsageRow.id).where(col(UsageRow.session_id).in_(ids))).all(),
        )


def test_the_ambassador_panel_answers_and_its_draft_is_sent_as_a_user_turn(
    stack: Stack, browser: Browser, tmp_path: Path
) -> None:
    """Beside a finished team run the ambassador answers from the panel; the run's
    messages, events and usage are unchanged by it (DB and event log); Send draft posts
    the draft as the person's own user turn."""
    sid = _launch(stack.http, {"team": "desk", "prompt": "go", "sync": True})
    before = _footprint(stack.engine, sid)
    for name, viewport in (("ambassador", LAPTOP), ("session-phone", PHONE)):
        context = console_context(browser, viewport)
        try:
            page = context.new_page()
            page.goto(f"{stack.base}/ui/sessions/{sid}")
            if name == "session-phone":
                expect(page.locator("#thread [data-inquiry]")).to_have_count(1)
                # The panel sits under the transcript on a phone: show the thread.
                page.locator("#thread").scroll_into_view_if_needed()
                shot(page, name, tmp_path)
                continue
            page.get_by_label("Your question").fill("What did they decide?")
            page.get_by_role("button", name="Ask").click()
            entry = page.locator("#thread [data-inquiry]")
            expect(entry.locator(".a")).to_contain_text("briefer: Your lead asked checker")
            expect(entry.locator(".draft")).to_have_text("Please cite the checker.")
            assert _footprint(stack.engine, sid) == before
            with Session(stack.engine) as s:
                events = s.exec(select(EventRow.data).where(EventRow.session_id == sid)).all()
            assert not any("inquiry-" in str(e) or "cite the checker" in str(e) for e in events)
            shot(page, name, tmp_path)
            entry.get_by_role("button", name="Send draft").click()
            expect(entry.locator(".sent")).to_have_text("Sent.")
            expect(page.locator("#transcript .msg-user").last).to_have_text(
                re.compile("Please cite the checker."), timeout=15_000
            )
        finally:
            context.close()
    _wait_status(stack.http, sid, "idle")
    msgs = stack.http.get(f"/v1/sessions/{sid}/transcript").json()["messages"]
    assert [m["text"] for m in msgs if m["role"] == "user"] == ["go", "Please cite the checker."]


def test_agents_teams_and_the_launcher(stack: Stack, page: Page, tmp_path: Path) -> None:
    """The agents page lists each agent with its kind and live version and the teams; the
    launcher shows only the chosen kind's controls and starts a Solo session of an agent
    and opens its page."""
    page.goto(f"{stack.base}/ui/agents")
    expect(page.locator("tr:has-text('briefer')")).to_contain_text("ambassador")
    expect(page.locator("tr:has-text('checker')").first).to_contain_text("v1")
    expect(page.locator("tr:has-text('desk')")).to_contain_text("checker, writer")
    page.goto(f"{stack.base}/ui/")
    page.get_by_label("a team").check()
    expect(page.get_by_label("Agent", exact=True)).to_be_hidden()
    expect(page.get_by_label("Solo")).to_be_hidden()
    expect(page.get_by_label("Team", exact=True)).to_be_visible()
    page.get_by_label("an agent").check()
    expect(page.get_by_label("Team", exact=True)).to_be_hidden()
    page.get_by_label("Agent", exact=True).select_option("target")
    page.get_by_label("Solo").check()
    page.get_by_label("First message").fill("hello there")
    with page.expect_request(
        lambda r: r.url.endswith("/v1/sessions") and r.method == "POST"
    ) as req:
        page.get_by_role("button", name="Start").click()
    assert req.value.post_data_json == {
        "prompt": "hello there",
        "disable_delegation": True,
        "agent": "target",
    }
    page.wait_for_url(re.compile(r"/ui/sessions/session-"))
    expect(page.locator("#transcript .msg-assistant")).to_have_text(re.compile("target says hi"))


def _policy_table_visibility(page: Page, base: str, engine: Engine, tokens: dict[str, str]) -> None:
    """Auth mode, ann logged in: her policy table hides bob's agent (and its stored row,
    which her save keeps); bob, a viewer of caller-z, reads it without a Save button."""
    from baton.grants import auth, policies
    from baton.storage.db import session_scope

    bob = {"Authorization": f"Bearer {tokens['bob']}"}
    with httpx.Client(base_url=base, timeout=60, headers=bob) as http:
        _agent(http, "bobs-secret", playbook=[{"reply": "hidden"}])
    with session_scope(engine) as s:
        policies.save_policy(
            s, caller="caller-z", operation="invoke", target="bobs-secret", decision="block"
        )
        auth.grant(s, agent="caller-z", user_id="bob", role="viewer")
    page.goto(f"{base}/ui/agents/caller-z/policies")
    expect(page.locator("tr[data-target]")).to_have_count(1)
    expect(page.locator('tr[data-target="target"]')).to_be_visible()
    expect(page.locator("#policy-table")).not_to_contain_text("bobs-secret")
    page.get_by_label("Send messages to target", exact=True).select_option("allow")
    page.get_by_role("button", name="Save permissions").click()
    expect(page.locator("#policy-saved")).to_contain_text("Saved.")
    with session_scope(engine) as s:
        kept = policies.get_policies(s, caller="caller-z").targets
    assert kept["bobs-secret"].invoke == "block" and kept["target"].invoke == "allow"
    page.get_by_role("button", name="Log out").click()
    page.get_by_label("API token").fill(tokens["bob"])
    page.get_by_role("button", name="Log in").click()
    page.goto(f"{base}/ui/agents/caller-z/policies")
    expect(page.get_by_role("note")).to_contain_text("Only an owner of caller-z")
    expect(page.get_by_role("button", name="Save permissions")).to_have_count(0)
    expect(page.locator('tr[data-target="bobs-secret"] select').first).to_be_disabled()


def test_auth_mode_token_login_and_the_same_acl_as_the_api(
    temporal_env: WorkflowEnvironment, browser: Browser, tmp_path: Path
) -> None:
    """In auth mode a console page redirects to the token login; a bad token is refused;
    after login the cookie carries the token to the pages, the SSE inbox and the API, and
    a user sees and decides only what the API would let them (bob: nothing; ann: her
    review, decided as ann), the ambassador panel says how to add one when none exists,
    and the policy table hides agents the viewer cannot see."""
    settings = Settings(
        database_url=migrated(f"sqlite:///{tmp_path / 'auth.db'}"),
        temporal_address=temporal_env.client.service_client.config.target_host,
        task_queue=f"tq-{uuid.uuid4()}",
        review_timeout=30.0,
        auth="on",
    )
    services = ServicesThread(settings, api_port=free_port())
    services.start()
    engine = make_engine(settings.database_url)
    try:
        from baton.grants import auth
        from baton.storage.db import session_scope

        tokens = {}
        with session_scope(engine) as s:
            for user in ("ann", "bob"):
                auth.create_user(s, user_id=user)
                tokens[user] = auth.issue_token(s, user_id=user)[1]
        headers = {"Authorization": f"Bearer {tokens['ann']}"}
        with httpx.Client(base_url=services.api_url, timeout=60, headers=headers) as ann:
            _agent(ann, "target", playbook=[{"reply": "target says hi"}])
            _caller(ann, "caller-z")
            sid = _launch(ann, {"agent": "caller-z", "prompt": "go"})
            rid = _review_of(ann, sid)
            context = console_context(browser)
            try:
                page = context.new_page()
                page.goto(f"{services.api_url}/ui/inbox")
                expect(page).to_have_url(re.compile(r"/ui/login$"))
                page.get_by_label("API token").fill("baton_wrong")
                page.get_by_role("button", name="Log in").click()
                expect(page.get_by_role("alert")).to_have_text("That token is not valid.")
                page.get_by_label("API token").fill(tokens["bob"])
                page.get_by_role("button", name="Log in").click()
                expect(page.locator("#pending-count")).to_have_text("0")
                assert page.request.get(f"{services.api_url}/ui/sessions/{sid}").status == 403
                page.get_by_role("button", name="Log out").click()
                page.get_by_label("API token").fill(tokens["ann"])
                page.get_by_role("button", name="Log in").click()
                card = page.locator(f'#pending [data-review="{rid}"]')
                card.get_by_role("button", name="Allow once").click()
                expect(page.locator(f'[data-review="{rid}"] .outcome')).to_have_text(
                    "Allowed by ann"
                )
                page.goto(f"{services.api_url}/ui/sessions/{sid}")
                expect(page.locator("#no-ambassador")).to_contain_text("No ambassador yet.")
                expect(page.get_by_role("button", name="Ask")).to_have_count(0)
                _policy_table_visibility(page, services.api_url, engine, tokens)
            finally:
                context.close()
            _wait_status(ann, sid, "idle")
    finally:
        engine.dispose()
        services.stop()


def test_fork_from_here_opens_the_fork_with_the_prefix_and_its_own_turn(
    stack: Stack, page: Page
) -> None:
    """ "Fork from here" on a reply, with a new message, opens the new session: its lineage,
    the original's messages up to that reply, then its own turn; the original is unchanged."""
    sid = _launch(stack.http, {"agent": "target", "prompt": "hi there", "sync": True})
    before = stack.http.get(f"/v1/sessions/{sid}/transcript").json()["messages"]
    reply = before[-1]["id"]
    page.goto(f"{stack.base}/ui/sessions/{sid}")
    item = page.locator(f'#transcript li[data-msg="{reply}"]')
    item.get_by_role("button", name="Fork from here").click()
    item.get_by_label("Next message").fill("once more")
    item.get_by_role("button", name="Fork", exact=True).click()
    page.wait_for_url(re.compile(r"/ui/sessions/session-(?!" + sid.removeprefix("session-") + ")"))
    expect(page.locator(".lineage")).to_contain_text(f"Forked from {sid}")
    expect(page.locator("#transcript .msg-user")).to_have_text(
        [re.compile("hi there"), re.compile("once more")]
    )
    expect(page.locator("#transcript .msg-assistant")).to_have_count(2)
    assert stack.http.get(f"/v1/sessions/{sid}/transcript").json()["messages"] == before
    page.get_by_role("link", name="Trace", exact=True).click()
    expect(page.locator(".trace-node .lineage")).to_contain_text(f"forked from {sid} after {reply}")
