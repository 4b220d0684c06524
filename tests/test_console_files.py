"""The session page's files panel (docs/workspaces.md, docs/console.md) in Debian's chromium
via Playwright against the real API + worker + dev server: what the agent wrote is listed
and downloads as an attachment; a file attached from the page reaches the workspace and the
transcript."""

from __future__ import annotations

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
