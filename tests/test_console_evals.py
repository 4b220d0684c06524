"""The console's eval view in real Chromium (Debian's, through Playwright) against the
real API on a SQLite file, evals written as the eval workflow leaves them: the agent
page's list, the eval page's totals, table and side-by-side answers, its live progress,
and model text shown as text (an XSS attempt stays inert), at laptop and phone widths."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect
from sqlalchemy.engine import Engine
from sqlmodel import Session

from baton.settings import Settings
from baton.storage.db import EvalRow, make_engine, session_scope
from tests.eval_helpers import insert_eval, report, session_report
from tests.helpers import publish
from tests.test_console import LAPTOP, PHONE, browser, console_context, shot

__all__ = ["browser"]  # the module's Chromium fixture

XSS = '<img src=x onerror="window.__pwned=1">Paris <script>window.__pwned=2</script>'


@pytest.fixture
def engine(settings: Settings, api: httpx.Client) -> Iterator[Engine]:
    """The database of the served API, with agent ``writer`` published."""
    eng = make_engine(settings.database_url)
    publish(eng, "writer", system_prompt="v1")
    try:
        yield eng
    finally:
        eng.dispose()


def _open(browser: Browser, viewport: dict[str, int]) -> Page:
    return console_context(browser, viewport).new_page()


def _fits(page: Page) -> None:
    wide = page.evaluate(
        "() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
    )
    assert wide[0] <= wide[1], f"{page.url} scrolls sideways: {wide}"


def test_the_agent_page_lists_evals_and_the_eval_page_compares_side_by_side(
    api: httpx.Client, engine: Engine, browser: Browser, tmp_path: Path
) -> None:
    """The agent page lists each eval (status, candidate vs baseline, changed,
    regressions, sessions); its page shows the totals, a row per session and each
    session's answers side by side with the differing words marked, the tool sequences
    and decisions; a final answer holding markup is shown as text and runs nothing; both
    pages fit 1366x768 and 390x844."""
    sessions = [
        session_report(1, baseline="The capital is Paris.", candidate="The capital is Lyon."),
        session_report(2, baseline="Same answer."),
        session_report(3, baseline="Paris", candidate=XSS, regression=True),
    ]
    done = insert_eval(
        engine, "writer", report_body=report(sessions), total=3, changed=2, regressions=1
    )
    running = insert_eval(engine, "writer", status="running", total=10, done=4, age_s=-5)
    base = str(api.base_url)
    for suffix, viewport in (("", LAPTOP), ("-phone", PHONE)):
        page = _open(browser, viewport)
        try:
            page.goto(f"{base}/ui/agents/writer")
            rows = page.locator("#evals tbody tr")
            expect(rows).to_have_count(2)
            expect(rows.nth(0)).to_contain_text("running")
            expect(rows.nth(0)).to_contain_text("4 of 10")
            expect(rows.nth(1)).to_contain_text("completed")
            expect(rows.nth(1)).to_contain_text("draft vs live")
            assert rows.nth(1).locator("td").nth(3).inner_text() == "2"
            assert rows.nth(1).locator("td").nth(4).inner_text() == "1"
            _fits(page)
            shot(page, f"page-agent-evals{suffix}", tmp_path)

            rows.nth(1).locator("a").click()
            page.wait_for_url(f"**/ui/agents/writer/evals/{done}")
            expect(page.locator("#eval-status")).to_have_text("completed")
            expect(page.locator("#eval-changed")).to_have_text("2")
            expect(page.locator("#eval-regressions")).to_have_text("1")
            expect(page.locator("#eval-sessions tbody tr")).to_have_count(3)
            expect(page.locator("#eval-sessions tbody tr.regressed")).to_have_count(1)
            first = page.locator("#s-1")
            left = first.locator('.answer[data-side="baseline"]')
            right = first.locator('.answer[data-side="candidate"]')
            expect(left).to_have_text("The capital is Paris.")
            expect(right).to_have_text("The capital is Lyon.")
            expect(left.locator("mark.w-del")).to_have_text("Paris.")
            expect(right.locator("mark.w-add")).to_have_text("Lyon.")
            expect(first.locator('.tools[data-side="candidate"] li')).to_have_text(
                ["lookup", "fetch"]
            )
            expect(first.locator(".tool-diff li.t-added")).to_have_text("+ fetch")
            expect(page.locator("#s-2 mark")).to_have_count(0)
            hostile = page.locator('#s-3 .answer[data-side="candidate"]')
            expect(hostile).to_have_text(XSS)
            assert hostile.locator("img, script").count() == 0
            assert page.evaluate("() => window.__pwned") is None
            expect(page.locator('#s-3 .decisions[data-side="candidate"]')).to_contain_text(
                "block invoke helper"
            )
            _fits(page)
            shot(page, f"page-eval{suffix}", tmp_path)
        finally:
            page.context.close()
    assert running


def test_a_running_eval_shows_its_progress_live(
    api: httpx.Client, engine: Engine, browser: Browser
) -> None:
    """A running eval's page follows GET …/evals/{id}: as replays finish its progress and
    its table grow without a manual reload, and it shows completed when the eval ends."""
    eval_id = insert_eval(engine, "writer", status="running", total=2, done=0)
    page = _open(browser, LAPTOP)
    try:
        page.goto(f"{api.base_url}/ui/agents/writer/evals/{eval_id}")
        expect(page.locator("#eval-done")).to_have_text("0 of 2 sessions")
        expect(
            page.locator("#eval-sessions tbody tr.empty, #eval-sessions td.empty")
        ).to_have_count(1)
        with session_scope(engine) as s:
            row = s.get(EvalRow, eval_id)
            assert row is not None
            row.done, row.changed = 1, 1
            row.report = report([session_report(1, baseline="a", candidate="b")])
        expect(page.locator("#eval-done")).to_have_text("1 of 2 sessions", timeout=30_000)
        expect(page.locator("#eval-sessions tbody tr[data-session]")).to_have_count(1)
        with Session(engine) as s:
            row = s.get(EvalRow, eval_id)
            assert row is not None
            row.done, row.status = 2, "completed"
            row.report = report([session_report(1, baseline="a", candidate="b"), session_report(2)])
            s.add(row)
            s.commit()
        expect(page.locator("#eval-status")).to_have_text("completed", timeout=30_000)
        expect(page.locator("#eval-sessions tbody tr[data-session]")).to_have_count(2)
    finally:
        page.context.close()
