"""Exhibit cards in the console (docs/exhibits.md, Rendering), in Debian's Chromium via
Playwright against the real API + worker + Temporal dev server + SQLite file: what each kind
shows, that model content never runs (an XSS attempt in every field), and that a reload
rebuilds the cards from the transcript, a delegated specialist's under its delegation card."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, Route, expect
from temporalio.testing import WorkflowEnvironment

from baton.agents import roster
from baton.settings import Settings
from tests.conftest import migrated
from tests.test_console import (  # noqa: F401  (the fixtures)
    Stack,
    _agent,
    _launch,
    _wait_status,
    browser,
    page,
)
from tests.test_exhibits import b64, delegating_to, image_args, png, presenting
from worker.stack import ServicesThread, free_port

XSS = "<img src=x onerror=\"window.__xss='{}'\">"
SVG = (
    b"<svg xmlns='http://www.w3.org/2000/svg' onload=\"window.__xss='svg'\">"
    b"<script>window.__xss='svg2'</script></svg>"
)


def hostile() -> list[dict[str, Any]]:
    """One exhibit of each inline kind, each carrying markup that would run if rendered."""
    return [
        image_args(png(4, 3), title=XSS.format("title")),
        {
            "kind": "table",
            "title": "Table",
            "columns": ["name", XSS.format("th")],
            "rows": [[XSS.format("td"), 1], ["<script>window.__xss='td2'</script>", None]],
        },
        {"kind": "markdown", "title": "Notes", "text": "# Hi\n<script>window.__xss='md'</script>"},
        {
            "kind": "chart",
            "title": "Chart",
            "spec": {"mark": "bar", "title": "</pre>" + XSS.format("chart")},
        },
        {
            "kind": "download",
            "title": "Vector",
            "media_type": "image/svg+xml",
            "filename": "evil.svg",
            "data": b64(SVG),
        },
    ]


@pytest.fixture(scope="module")
def stack(
    temporal_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """API + worker on a fresh SQLite file, with the agents these tests run."""
    from baton.storage.db import make_engine

    db = tmp_path_factory.mktemp("exhibits") / "console.db"
    settings = Settings(
        database_url=migrated(f"sqlite:///{db}"),
        temporal_address=temporal_env.client.service_client.config.target_host,
        task_queue=f"tq-{uuid.uuid4()}",
    )
    services = ServicesThread(settings, api_port=free_port())
    services.start()
    engine = make_engine(settings.database_url)
    try:
        with httpx.Client(base_url=services.api_url, timeout=60) as http:
            _agent(http, "shower", playbook=presenting(*hostile()))
            _agent(
                http,
                "illustrator",
                playbook=presenting(image_args(png(2, 2), title="Sketch")),
                delegation={"available_for_delegation": True, "delegation_hint": "pictures"},
            )
            _agent(http, "host", playbook=delegating_to("illustrator"))
            roster.clear_cache()
            yield Stack(services.api_url, http, engine)
    finally:
        engine.dispose()
        services.stop()


def _no_stream(route: Route) -> None:
    route.abort()


def _check_cards(view: Page) -> None:
    """The five hostile exhibits, shown as text, the PNG as a blob: image, nothing run."""
    cards = view.locator("article.exhibit")
    expect(cards).to_have_count(5)
    image = view.locator("article.exhibit-image")
    expect(image.locator("h3")).to_have_text(XSS.format("title"))
    img = image.locator("img.exhibit-image")
    expect(img).to_have_attribute("src", re.compile(r"^blob:"))
    view.wait_for_function(
        "() => { const i = document.querySelector('img.exhibit-image'); "
        "return i && i.complete && i.naturalWidth === 4 && i.naturalHeight === 3; }"
    )
    table = view.locator("article.exhibit-table")
    expect(table.locator("th")).to_have_text(["name", XSS.format("th")])
    expect(table.locator("td")).to_have_text(
        [XSS.format("td"), "1", "<script>window.__xss='td2'</script>", ""]
    )
    markdown = view.locator("article.exhibit-markdown pre")
    expect(markdown).to_have_text("# Hi\n<script>window.__xss='md'</script>")
    expect(view.locator("article.exhibit-chart pre")).to_contain_text('"mark": "bar"')
    expect(view.locator("article.exhibit-chart pre")).to_contain_text("</pre>")
    download = view.locator("article.exhibit-download")
    expect(download.locator("img")).to_have_count(0)
    link = download.locator("a.exhibit-download")
    expect(link).to_have_attribute("download", "evil.svg")
    expect(link).to_have_attribute("href", re.compile(r"^/v1/sessions/session-.*/exhibits/ex-"))
    # Only the PNG is an image in the conversation; no markup the model wrote became an element.
    assert view.locator("#transcript img").count() == 1
    assert view.locator("#transcript script, #transcript svg, #transcript b").count() == 0
    assert view.evaluate("() => window.__xss") is None


def test_exhibit_cards_show_each_kind_as_text_and_survive_a_reload(
    stack: Stack,
    page: Page,  # noqa: F811  (the fixture imported above)
) -> None:
    """An image (blob: from the API), a table (an escaped HTML table), markdown and a chart
    spec (as text) and an SVG (only a download link) render with every XSS attempt shown
    as text; a reload with the event stream cut rebuilds them from the transcript."""
    sid = _launch(stack.http, {"agent": "shower", "prompt": "show", "sync": True})
    page.goto(f"{stack.base}/ui/sessions/{sid}")
    _check_cards(page)

    page.route("**/events*", _no_stream)  # the transcript alone rebuilds the cards
    page.reload()
    _check_cards(page)


def test_a_specialists_exhibit_renders_under_its_delegation_card_live_and_after_reload(
    stack: Stack,
    page: Page,  # noqa: F811  (the fixture imported above)
) -> None:
    """A delegated specialist's image shows inside the delegation card while the page
    watches, and again there after a reload."""
    sid = _launch(stack.http, {"agent": "host", "prompt": "go"})
    page.goto(f"{stack.base}/ui/sessions/{sid}")
    under = page.locator("article.delegation .exhibits article.exhibit")
    expect(under).to_have_count(1, timeout=60_000)
    expect(under.locator("h3")).to_have_text("Sketch")
    _wait_status(stack.http, sid, "idle", timeout=60)
    page.reload()
    expect(under).to_have_count(1)
    expect(page.locator("article.exhibit")).to_have_count(1)
    page.wait_for_function(
        "() => { const i = document.querySelector('article.delegation img.exhibit-image'); "
        "return i && i.src.startsWith('blob:') && i.naturalWidth === 2; }"
    )
