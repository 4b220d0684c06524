"""``GET /v1/audit`` pages by cursor (``next_cursor``) as ``GET /v1/sessions`` does, and
``offset`` still works."""

from __future__ import annotations

import uuid

import httpx

from baton.settings import Settings
from baton.storage.db import AuditRow, make_engine, session_scope


def _rows(settings: Settings, caller: str, n: int) -> list[int]:
    """Write ``n`` audit rows of ``caller``; their ids, newest first."""
    engine = make_engine(settings.database_url)
    try:
        with session_scope(engine) as s:
            made = [
                AuditRow(
                    session_id=f"session-{uuid.uuid4()}",
                    caller_agent_slug=caller,
                    operation="invoke",
                    target_agent_slug="target",
                    outcome="allow",
                    decided_by="local",
                    via="invoke",
                )
                for _ in range(n)
            ]
            s.add_all(made)
            s.flush()
            ids = [int(r.id or 0) for r in made]
    finally:
        engine.dispose()
    return sorted(ids, reverse=True)


def _walk(api: httpx.Client, limit: int, **params: str) -> list[list[int]]:
    """Every page's ids, following next_cursor until it is null."""
    pages: list[list[int]] = []
    cursor: str | None = None
    while True:
        query = {**params, "limit": str(limit), **({"cursor": cursor} if cursor else {})}
        got = api.get("/v1/audit", params=query)
        assert got.status_code == 200, got.text
        body = got.json()
        pages.append([row["id"] for row in body["data"]])
        cursor = body["next_cursor"]
        if cursor is None:
            return pages
        assert len(pages) < 20


def test_the_audit_log_pages_by_cursor_to_a_null_next_cursor(
    api: httpx.Client, settings: Settings
) -> None:
    """Following next_cursor walks every row once, newest first, in pages of limit; the
    last page's next_cursor is null."""
    ids = _rows(settings, "pager", 5)
    _rows(settings, "other", 2)
    assert _walk(api, 2, caller="pager") == [ids[0:2], ids[2:4], ids[4:5]]
    first = api.get("/v1/audit", params={"caller": "pager", "limit": 2}).json()
    assert first["count"] == 5 and first["next_cursor"]


def test_a_page_of_exactly_limit_rows_is_the_last(api: httpx.Client, settings: Settings) -> None:
    """When the rows left fill the page exactly, that page's next_cursor is null (no
    empty page follows), on the first page and on a later one."""
    ids = _rows(settings, "exact", 4)
    assert _walk(api, 4, caller="exact") == [ids]
    assert _walk(api, 2, caller="exact") == [ids[0:2], ids[2:4]]


def test_offset_still_pages_and_a_foreign_cursor_is_refused(
    api: httpx.Client, settings: Settings
) -> None:
    """offset skips rows as before; a cursor the audit log never gave, or a cursor with
    offset, is 422 invalid_cursor."""
    ids = _rows(settings, "offset", 3)
    got = api.get("/v1/audit", params={"caller": "offset", "limit": 2, "offset": 2}).json()
    assert ([r["id"] for r in got["data"]], got["next_cursor"]) == (ids[2:3], None)
    sessions_cursor = "MjAyNi0xMi0wMlQwMDowMDowMCswMDowMHxzZXNzaW9uLXg"
    cursor = api.get("/v1/audit", params={"caller": "offset", "limit": 1}).json()["next_cursor"]
    for params in ({"cursor": sessions_cursor}, {"cursor": "%%%"}, {"cursor": cursor, "offset": 1}):
        refused = api.get("/v1/audit", params=params)
        assert (refused.status_code, refused.json()["code"]) == (422, "invalid_cursor"), params
