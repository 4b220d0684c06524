"""The session list pages by keyset cursor (newest first): pages are disjoint and complete
however many sessions are created while a client walks them; ``offset`` still pages."""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from baton.contracts.workflow_io import Provenance
from baton.runs import session_store as sessions
from baton.settings import Settings
from baton.storage.db import SessionRow, init_db, make_engine, session_scope, utcnow


def _sessions(engine: Engine, n: int, *, same_instant: bool = False) -> list[str]:
    """``n`` new sessions, returned newest first (created a millisecond apart, or all at
    one instant so that only the id orders them)."""
    start = utcnow()
    ids = []
    with session_scope(engine) as s:
        for i in range(n):
            sid = f"session-{uuid.uuid4()}"
            sessions.create_session(
                s,
                session_id=sid,
                agent_slug="a",
                agent_version=1,
                provenance=Provenance(),
                name=f"s{i}",
            )
            row = s.get(SessionRow, sid)
            assert row is not None
            row.created_at = start if same_instant else start + timedelta(milliseconds=i)
            ids.append(sid)
    if same_instant:
        return sorted(ids, reverse=True)
    return ids[::-1]


def _walk(engine: Engine, limit: int, *, between: int = 0) -> tuple[list[str], list[int]]:
    """Every page by cursor (``between`` new sessions created after each page): the ids
    seen in order and each page's size."""
    seen: list[str] = []
    sizes: list[int] = []
    cursor = None
    while True:
        with session_scope(engine) as s:
            rows, _, cursor = sessions.page_sessions(s, limit=limit, cursor=cursor)
        seen += [r.id for r in rows]
        sizes.append(len(rows))
        if cursor is None:
            return seen, sizes
        _sessions(engine, between)


@pytest.mark.parametrize("same_instant", [False, True])
def test_cursor_pages_are_disjoint_and_complete(engine: Engine, same_instant: bool) -> None:
    """Pages of 3 over 7 sessions are 3, 3, 1, newest first, each session once; sessions
    sharing one created_at are ordered (and paged) by id."""
    expected = _sessions(engine, 7, same_instant=same_instant)
    seen, sizes = _walk(engine, 3)
    assert sizes == [3, 3, 1]
    assert seen == expected


def test_sessions_created_while_paging_neither_repeat_nor_hide_older_ones(engine: Engine) -> None:
    """Two new sessions after every page: the walk still yields the 9 older ones exactly
    once, in order (offset paging would repeat them); the new ones head the next first page."""
    older = _sessions(engine, 9)
    seen, _ = _walk(engine, 2, between=2)
    assert seen == older
    with session_scope(engine) as s:
        rows, total, _ = sessions.page_sessions(s, limit=1)
    assert total == 9 + 2 * 4 and rows[0].id not in older


def test_a_page_ending_at_the_last_session_has_no_next_cursor(engine: Engine) -> None:
    """limit = the session count: one page, next_cursor null; limit - 1: a second page of one."""
    ids = _sessions(engine, 4)
    with session_scope(engine) as s:
        rows, total, cursor = sessions.page_sessions(s, limit=4)
        assert [r.id for r in rows] == ids and total == 4 and cursor is None
        rows, _, cursor = sessions.page_sessions(s, limit=3)
        assert cursor is not None
        rest, _, last = sessions.page_sessions(s, limit=3, cursor=cursor)
    assert [r.id for r in rest] == ids[3:] and last is None


def test_offset_pages_as_before(engine: Engine) -> None:
    """offset 2, limit 2 of 5 is the 3rd and 4th newest, with a cursor to the 5th."""
    ids = _sessions(engine, 5)
    with session_scope(engine) as s:
        rows, _, cursor = sessions.page_sessions(s, limit=2, offset=2)
        rest, _, _ = sessions.page_sessions(s, limit=2, cursor=cursor)
    assert [r.id for r in rows] == ids[2:4] and [r.id for r in rest] == ids[4:]


def test_session_list_route_pages_by_cursor(settings: Settings, api: httpx.Client) -> None:
    """GET /v1/sessions: limit 200 (the bound) is served and 201 refused; next_cursor walks
    every session; a cursor that does not decode, or one with offset, is 422 invalid_cursor."""
    engine = make_engine(settings.database_url)
    try:
        ids = _sessions(engine, 5)
    finally:
        engine.dispose()
    assert api.get("/v1/sessions", params={"limit": 201}).status_code == 422
    whole = api.get("/v1/sessions", params={"limit": 200}).json()
    assert [d["session_id"] for d in whole["data"]] == ids and whole["next_cursor"] is None
    seen, cursor = [], None
    while True:
        params: dict[str, str | int] = {"limit": 2}
        if cursor:
            params["cursor"] = cursor
        body = api.get("/v1/sessions", params=params).json()
        assert body["count"] == 5
        seen += [d["session_id"] for d in body["data"]]
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert seen == ids
    first = api.get("/v1/sessions", params={"limit": 2}).json()["next_cursor"]
    bad: list[dict[str, str | int]] = [
        {"cursor": "bm90LWEtY3Vyc29y"},
        {"cursor": "%%%"},
        {"cursor": first, "offset": 1},
    ]
    for params in bad:
        r = api.get("/v1/sessions", params=params)
        assert r.status_code == 422 and r.json()["code"] == "invalid_cursor", r.text


def test_a_page_and_its_total_are_read_from_the_list_index(tmp_path: Path) -> None:
    """SQLite plans the first page of the session list as a read of ix_sessions_listed in
    its order (no sort of every session) and the total as a count of that index alone (no
    read of the rows and their agent snapshots), on the migrated schema without ANALYZE."""
    engine = make_engine(f"sqlite:///{tmp_path / 'baton.db'}")
    init_db(engine)
    _sessions(engine, 120)
    statements: list[tuple[str, object]] = []

    def seen(_c: object, _cur: object, statement: str, params: object, *_: object) -> None:
        statements.append((statement, params))

    sa.event.listen(engine, "before_cursor_execute", seen)
    with session_scope(engine) as s:
        rows, total, cursor = sessions.page_sessions(s, limit=50)
    sa.event.remove(engine, "before_cursor_execute", seen)
    assert total == 120 and len(rows) == 50 and cursor is not None
    (count_sql, count_params), (page_sql, page_params) = statements

    def plan(sql: str, params: object) -> list[str]:
        with engine.connect() as conn:
            found = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}", params)  # type: ignore[arg-type]
            return [str(row[-1]) for row in found.all()]

    counted, paged = plan(count_sql, count_params), plan(page_sql, page_params)
    engine.dispose()
    assert "count" in count_sql.lower()
    assert any("USING COVERING INDEX ix_sessions_listed" in step for step in counted), counted
    assert any("USING INDEX ix_sessions_listed" in step for step in paged), paged
    assert not any("TEMP B-TREE" in step for step in paged), paged
