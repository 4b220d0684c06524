"""The web console in a real browser (issue 15): Playwright drives Debian's Chromium
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
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright
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
#: Review timeout of this module's stack (seconds): long enough to click, short enough
#: to watch a card count down to its timeout.
REVIEW_TIMEOUT = 8.0
SHOTS = Path(__file__).resolve().parent.parent / "docs" / "screenshots"
LAPTOP = {"width": 1200, "height": 760}
PHONE = {"width": 390, "height": 800}


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
    context = browser.new_context(viewport=LAPTOP)  # type: ignore[arg-type]
    try:
        yield context.new_page()
    finally:
        context.close()


def shot(page: Page, name: str, tmp_path: Path) -> None:
    """Take a screenshot (into docs/screenshots/ with BATON_SCREENSHOTS=1)."""
    folder = SHOTS if os.environ.get("BATON_SCREENSHOTS") == "1" else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / f"{name}.png"))


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
    expect(card.locator(".countdown")).to_have_text(re.compile(r"^0:0\d$"))
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
    contexts = [browser.new_context(viewport=LAPTOP) for _ in range(2)]  # type: ignore[arg-type]
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
    then shows the timeout outcome (denied) when nobody decides."""
    _caller(stack.http, "caller-c")
    sid = _launch(stack.http, {"agent": "caller-c", "prompt": "go"})
    rid = _review_of(stack.http, sid)
    page.goto(f"{stack.base}/ui/sessions/{sid}")
    countdown = page.locator(f'#transcript [data-review="{rid}"] .countdown')
    expect(countdown).to_have_text(re.compile(r"^0:0\d$"))
    shot(page, "session-review", tmp_path)
    first = int(countdown.inner_text().split(":")[1])
    page.wait_for_timeout(2100)
    if countdown.count():
        assert int(countdown.inner_text().split(":")[1]) < first
    outcome = page.locator(f'#transcript [data-review="{rid}"] .outcome')
    expect(outcome).to_have_text("Timed out — denied", timeout=int(REVIEW_TIMEOUT * 1000) + 5000)
    assert stack.http.get(f"/v1/reviews/{rid}").json()["status"] == "timed_out"


def test_team_run_delegation_cards_stream_and_the_trace_shows_each_step(
    stack: Stack, page: Page, tmp_path: Path
) -> None:
    """A team run's delegations render inline as cards that fill as the members stream,
    then complete; the trace page lists each step with tokens, cost and wall-clock."""
    sid = _launch(stack.http, {"team": "desk", "prompt": "go"})
    page.goto(f"{stack.base}/ui/sessions/{sid}")
    checker = page.locator('#transcript [data-delegation]:has-text("lead → checker")')
    expect(checker.locator(".state")).to_have_text("running", timeout=15_000)
    # Streaming: part of the member's reply is on the card before it completes.
    expect(checker.locator(".work")).to_contain_text("checking every", timeout=10_000)
    assert checker.locator(".state").inner_text() == "running"
    expect(checker.locator(".state")).to_have_text(
        "completed: checking every claim in the memo one by one now done CHECKED", timeout=15_000
    )
    writer = page.locator('#transcript [data-delegation]:has-text("lead → writer")')
    expect(writer.locator(".state")).to_have_text("completed: WRITTEN")
    expect(page.locator("#session-status")).to_have_text("idle", timeout=15_000)
    expect(page.locator("#transcript .msg-assistant").last).to_contain_text("SYNTH")
    shot(page, "session-team", tmp_path)

    page.get_by_role("link", name="Trace").click()
    rows = page.locator(".trace-row")
    expect(rows).to_have_count(3)
    expect(rows.nth(1)).to_contain_text("delegate_to from lead")
    expect(rows.nth(1).locator("dd").first).to_have_text(re.compile(r"^\d+ / \d+$"))
    expect(rows.nth(1)).to_contain_text(re.compile(r"\d+ ms"))
    shot(page, "trace", tmp_path)


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
        context = browser.new_context(viewport=viewport)  # type: ignore[arg-type]
        try:
            page = context.new_page()
            page.goto(f"{stack.base}/ui/sessions/{sid}")
            if name == "session-phone":
                expect(page.locator("#thread [data-inquiry]")).to_have_count(1)
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
    launcher starts a Solo session of an agent and opens its page."""
    page.goto(f"{stack.base}/ui/agents")
    expect(page.locator("tr:has-text('briefer')")).to_contain_text("ambassador")
    expect(page.locator("tr:has-text('checker')").first).to_contain_text("v1")
    expect(page.locator("tr:has-text('desk')")).to_contain_text("checker, writer")
    shot(page, "agents", tmp_path)
    page.goto(f"{stack.base}/ui/")
    page.get_by_label("Agent", exact=True).select_option("target")
    page.get_by_label("Solo").check()
    page.get_by_label("First message").fill("hello there")
    shot(page, "home", tmp_path)
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


def test_auth_mode_token_login_and_the_same_acl_as_the_api(
    temporal_env: WorkflowEnvironment, browser: Browser, tmp_path: Path
) -> None:
    """In auth mode a console page redirects to the token login; a bad token is refused;
    after login the cookie carries the token to the pages, the SSE inbox and the API, and
    a user sees and decides only what the API would let them (bob: nothing; ann: her
    review, decided as ann)."""
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
            context = browser.new_context(viewport=LAPTOP)  # type: ignore[arg-type]
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
            finally:
                context.close()
            _wait_status(ann, sid, "idle")
    finally:
        engine.dispose()
        services.stop()
