"""The session page's files panel (docs/workspaces.md, docs/console.md) in Debian's chromium
via Playwright against the real API + worker + dev server: what the agent wrote is listed
and downloads as an attachment; a file attached from the page reaches the workspace and the
transcript; workspace files the agent presents show as an image card (a PNG) and a
download link (a markdown file)."""

from __future__ import annotations

import re
from pathlib import Path

from playwright.sync_api import FilePayload, Page, expect

from tests.test_console import (  # noqa: F401  (the fixtures)
    Stack,
    _agent,
    _launch,
    _wait_status,
    browser,
    page,
    shot,
    stack,
)
from tests.test_exhibits import b64, png


def test_the_files_panel_lists_downloads_and_attaches(
    stack: Stack,  # noqa: F811  (the fixture imported above)
    page: Page,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The agent's report.md is listed with its size and type and downloads (attachment)
    with its bytes; an SVG downloads too instead of rendering; a file attached from the
    form appears in the list and as an ``attached`` message."""
    report = "# Findings\n\nAll <b>good</b>.\n"
    _agent(
        stack.http,
        "scribe",
        playbook=[
            {"when": "write_file:", "reply": "Wrote the report."},
            {
                "reply": "Writing.",
                "tool_calls": [
                    {"tool": "write_file", "args": {"path": "out/report.md", "content": report}},
                    {"tool": "write_file", "args": {"path": "x.svg", "content": "<svg/>"}},
                ],
            },
        ],
    )
    sid = _launch(stack.http, {"agent": "scribe", "prompt": "write it", "sync": True})
    _wait_status(stack.http, sid, "idle")
    page.goto(f"{stack.base}/ui/sessions/{sid}")
    row = page.locator('#files li[data-path="out/report.md"]')
    expect(row).to_contain_text("out/report.md")
    expect(row).to_contain_text("text/markdown")
    expect(page.locator("#no-files")).to_be_hidden()
    with page.expect_download() as got:
        row.get_by_role("link", name="out/report.md").click()
    download = got.value
    assert download.suggested_filename == "report.md"
    assert Path(download.path()).read_text() == report
    with page.expect_download() as svg:
        page.get_by_role("link", name="x.svg").click()
    assert svg.value.suggested_filename == "x.svg"
    assert page.url.endswith(f"/ui/sessions/{sid}")  # nothing rendered in its place

    csv: FilePayload = {"name": "data.csv", "mimeType": "text/csv", "buffer": b"a,b\n1,2\n"}
    page.set_input_files("#attach-file", files=[csv])
    page.get_by_role("button", name="Attach", exact=True).click()
    expect(page.locator('#files li[data-path="data.csv"]')).to_contain_text("text/csv")
    expect(page.locator(".msg-attachment")).to_contain_text("attached 'data.csv'")
    listed = [f["path"] for f in stack.http.get(f"/v1/sessions/{sid}/files").json()["data"]]
    assert listed == ["data.csv", "out/report.md", "x.svg"]
    shot(page, "session-files", tmp_path)


def test_presented_workspace_files_show_as_an_image_and_a_download_link(
    stack: Stack,  # noqa: F811  (the fixture imported above)
    page: Page,  # noqa: F811
) -> None:
    """An agent writes a PNG and a .md file to its workspace and presents both as kind
    file: the PNG shows as an image (blob: from the files API), the .md as a download link
    to the file that downloads its bytes."""
    raw, notes = png(5, 3), "# Notes\n\n*kept*\n"
    _agent(
        stack.http,
        "framer",
        playbook=[
            {"when": "^present_exhibit: ", "reply": "Shown."},
            {
                "when": "^write_file: ",
                "reply": "Presenting.",
                "tool_calls": [
                    {
                        "tool": "present_exhibit",
                        "args": {"kind": "file", "title": "Plot", "path": "out/plot.png"},
                    },
                    {
                        "tool": "present_exhibit",
                        "args": {"kind": "file", "title": "Notes", "path": "out/notes.md"},
                    },
                ],
            },
            {
                "reply": "Writing.",
                "tool_calls": [
                    {
                        "tool": "write_file",
                        "args": {"path": "out/plot.png", "content": b64(raw), "encoding": "base64"},
                    },
                    {"tool": "write_file", "args": {"path": "out/notes.md", "content": notes}},
                ],
            },
        ],
    )
    sid = _launch(stack.http, {"agent": "framer", "prompt": "draw", "sync": True})
    _wait_status(stack.http, sid, "idle")
    page.goto(f"{stack.base}/ui/sessions/{sid}")

    plot = page.locator('article.exhibit-file[aria-label="Exhibit: Plot"]')
    expect(plot.locator("img.exhibit-image")).to_have_attribute("src", re.compile(r"^blob:"))
    expect(plot.locator("a.exhibit-download")).to_have_count(0)
    page.wait_for_function(
        "() => { const i = document.querySelector('article.exhibit-file img.exhibit-image'); "
        "return i && i.complete && i.naturalWidth === 5 && i.naturalHeight === 3; }"
    )

    card = page.locator('article.exhibit-file[aria-label="Exhibit: Notes"]')
    expect(card.locator("img")).to_have_count(0)
    link = card.locator("a.exhibit-download")
    expect(link).to_have_attribute("href", f"/v1/sessions/{sid}/files/out/notes.md")
    expect(link).to_have_attribute("download", "notes.md")
    expect(link).to_contain_text("text/markdown")
    with page.expect_download() as got:
        link.click()
    assert got.value.suggested_filename == "notes.md"
    assert Path(got.value.path()).read_text() == notes
    assert page.url.endswith(f"/ui/sessions/{sid}")
