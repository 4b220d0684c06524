"""The console's eval view in real Chromium (Debian's, through Playwright) against the
real API on a SQLite file, evals written as the eval workflow leaves them: the agent
page's list, the eval page's totals, table and side-by-side answers, its live progress,
and model text shown as text (an XSS attempt stays inert), at laptop and phone widths;
and an eval run on the real stack, its two replays' transcripts side by side."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect
from sqlalchemy.engine import Engine
from sqlmodel import Session
from temporalio.testing import WorkflowEnvironment

from api.ui.evals import TRANSCRIPT_SHOWN
from baton.contracts.workflow_io import Provenance
from baton.runs import session_store
from baton.settings import Settings
from baton.storage.db import EvalRow, make_engine, session_scope
from tests import test_evals
from tests.eval_helpers import insert_eval, report, session_report
from tests.helpers import publish
from tests.test_api_reviews import Stack
from tests.test_console import LAPTOP, PHONE, console_context, shot, system_chromium
from tests.test_evals import finished, record, stack, start

__all__ = ["stack"]  # a real stack (API, worker, Temporal) per test that asks for one

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


@pytest.fixture(scope="module")
def browser(temporal_env: WorkflowEnvironment) -> Iterator[Browser]:
    """One headless system Chromium for the module, launched once the Temporal dev server
    runs: the server is an async fixture, which cannot start while sync Playwright's event
    loop runs in this thread (as it would for a real eval after the first test)."""
    with system_chromium() as chromium:
        yield chromium


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


def _replay(engine: Engine, session_id: str, eval_id: str | None, texts: list[str]) -> None:
    """A session of ``writer`` (a replay of ``eval_id``, or an ordinary one for None)
    holding a user message then, for each of ``texts``, an assistant turn calling
    ``lookup`` and the tool's JSON output."""
    with session_scope(engine) as s:
        session_store.create_session(
            s,
            session_id=session_id,
            agent_slug="writer",
            agent_version=1,
            provenance=Provenance(eval_id=eval_id),
            name=session_id,
        )
        messages: list[dict[str, Any]] = [{"role": "user", "text": "question"}]
        for text in texts:
            call = [{"id": f"c{len(messages)}", "name": "lookup", "args": {"q": text}}]
            messages.append({"role": "assistant", "text": text, "tool_calls": call})
            messages.append(
                {
                    "role": "tool",
                    "text": '{"found": [1, 2]}',
                    "tool_name": "lookup",
                    "tool_args": {"q": text},
                }
            )
        for n, m in enumerate(messages):
            session_store.add_message(
                s,
                message_id=f"{session_id}:{n:04d}",
                session_id=session_id,
                position=f"{n:08d}",
                agent_slug="writer",
                **m,
            )


def test_replay_transcripts_are_bounded_escaped_and_only_the_evals_own(
    api: httpx.Client, engine: Engine, browser: Browser
) -> None:
    """Each session's replay transcripts show their first messages (role, text, tool calls
    by name, a tool's JSON output collapsed and indented), model text as text (markup runs
    nothing), a link to the rest when more follow; a report naming a session that is not
    one of the eval's replays shows no transcript of it."""
    item = session_report(1, baseline="a", candidate="b")
    done = insert_eval(engine, "writer", report_body=report([item]), total=1, changed=1)
    _replay(engine, "sess-b1", done, [XSS] + [f"turn {n}" for n in range(40)])
    _replay(engine, "sess-c1", None, ["an ordinary session's secret"])
    page = _open(browser, PHONE)
    try:
        page.goto(f"{api.base_url}/ui/agents/writer/evals/{done}")
        left = page.locator('#s-1 .transcript.replay[data-side="baseline"]')
        expect(left.locator("li.msg")).to_have_count(TRANSCRIPT_SHOWN)
        first = left.locator("li.msg").nth(0)
        expect(first.locator(".who")).to_have_text("user")
        hostile = left.locator("li.msg-assistant").nth(0)
        expect(hostile.locator(".text")).to_have_text(XSS)
        expect(hostile.locator(".calls")).to_have_text("→ lookup")
        assert hostile.locator("img, script").count() == 0
        assert page.evaluate("() => window.__pwned") is None
        tool = left.locator("li.msg-tool").nth(0)
        expect(tool.locator("summary")).to_contain_text("tool lookup")
        expect(tool.locator("pre.text")).to_be_hidden()
        tool.locator("summary").click()
        assert tool.locator("pre.text").inner_text() == '{\n  "found": [\n    1,\n    2\n  ]\n}'
        more = page.locator("#s-1 .side-baseline .more a")
        expect(more).to_have_attribute("href", "/ui/sessions/sess-b1")
        expect(page.locator('#s-1 .transcript.replay[data-side="candidate"]')).to_have_count(0)
        expect(page.locator('#s-1 .empty[data-side="candidate"]')).to_have_text("No transcript.")
        assert "secret" not in page.content()
        _fits(page)
    finally:
        page.context.close()


#: The live agent: a capital question is answered, a sum calls the calculator.
CAPITALS: list[dict[str, Any]] = [
    {"when": "^calculator: ", "reply": "The sum is {last_message}."},
    {"when": "capital", "reply": "The capital of France is Paris."},
    {
        "when": "sum",
        "reply": "Computing.",
        "tool_calls": [{"tool": "calculator", "args": {"expression": "6*7"}}],
    },
    {"reply": "plain: {last_message}"},
]
#: The draft: one answer changed.
CAPITALS_DRAFT = [CAPITALS[0], {"when": "capital", "reply": "The capital of France is Lyon."}]
CAPITALS_DRAFT += CAPITALS[2:]


def test_a_real_eval_shows_both_replays_transcripts_side_by_side(
    stack: Stack, browser: Browser, tmp_path: Path
) -> None:
    """An eval run through the API of a draft that changes one answer: its page shows, per
    session, the baseline replay's and the candidate replay's transcripts side by side on
    a laptop (stacked on a phone, nothing scrolling sideways), each message with its role,
    the changed answer in each column, a tool's output collapsed under its name."""
    http = stack.http
    test_evals.publish(http, "helper", CAPITALS, tools=["calculator"])
    asked = record(http, "helper", "What is the capital of France?")
    summed = record(http, "helper", "sum please")
    draft = {"playbook": CAPITALS_DRAFT, "tools": ["calculator"]}
    assert http.put("/v1/agents/helper/draft", json=draft).status_code == 200
    body = finished(http, "helper", start(http, "helper", sessions=2)["id"])
    assert (body["status"], body["changed"]) == ("completed", 1)
    replays = {i["session_id"]: i for i in body["report"]["sessions"]}
    for suffix, viewport in (("", LAPTOP), ("-phone", PHONE)):
        page = _open(browser, viewport)
        try:
            page.goto(f"{stack.url}/ui/agents/helper/evals/{body['id']}")
            card = page.locator(f'section.compare[data-session="{asked}"]')
            left = card.locator('.transcript.replay[data-side="baseline"]')
            right = card.locator('.transcript.replay[data-side="candidate"]')
            for side, column in (("baseline", left), ("candidate", right)):
                expect(column.locator("li.msg")).to_have_count(2)
                user, answer = column.locator("li.msg").nth(0), column.locator("li.msg").nth(1)
                expect(user.locator(".who")).to_have_text("user")
                expect(user.locator(".text")).to_have_text("What is the capital of France?")
                expect(answer.locator(".who")).to_have_text("helper")
                link = card.locator(
                    f".side-{side} a[href='/ui/sessions/{replays[asked][side + '_session_id']}']"
                )
                expect(link.first).to_be_visible()
            expect(left.locator("li.msg-assistant .text")).to_have_text(
                "The capital of France is Paris."
            )
            expect(right.locator("li.msg-assistant .text")).to_have_text(
                "The capital of France is Lyon."
            )
            lbox, rbox = left.bounding_box(), right.bounding_box()
            assert lbox is not None and rbox is not None
            if viewport is LAPTOP:  # two columns, level with each other
                assert rbox["x"] >= lbox["x"] + lbox["width"] and abs(rbox["y"] - lbox["y"]) < 2
            else:  # one column, the candidate under the baseline
                assert rbox["y"] >= lbox["y"] + lbox["height"] and abs(rbox["x"] - lbox["x"]) < 2
            tool = page.locator(
                f'section.compare[data-session="{summed}"] '
                '.transcript.replay[data-side="candidate"] li.msg-tool'
            )
            expect(tool.locator("summary")).to_contain_text("tool calculator")
            expect(tool.locator("pre.text")).to_be_hidden()
            _fits(page)
            # The picture shows the changed session: on a laptop its card (answers and
            # transcripts), on a phone its transcripts (under the answers there).
            top = card if viewport is LAPTOP else card.locator(".transcripts-h")
            top.evaluate("e => e.scrollIntoView()")
            shot(page, f"page-eval{suffix}", tmp_path)
        finally:
            page.context.close()
