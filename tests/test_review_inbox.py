"""The review inbox query (``GET /v1/reviews?status=pending``, newest first) reads its page
off the ``(status, created_at)`` index instead of sorting every pending review
(bench/held.py keeps 1,000 reviews pending)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from baton.permissions import reviews
from baton.storage.db import init_db, make_engine, session_scope


def add_reviews(engine: Engine, pending: int, allowed: int) -> None:
    """``pending`` pending and ``allowed`` allowed reviews, one second apart."""
    start = datetime(2026, 12, 1, tzinfo=UTC)
    with session_scope(engine) as s:
        for i in range(pending + allowed):
            row, _ = reviews.open_review(
                s,
                review_id=f"review-{i:04d}",
                session_id=f"session-{i:04d}",
                caller="lister",
                operation="list",
                target=None,
                preview="list_agents",
            )
            row.created_at = start + timedelta(seconds=i)
            row.status = "pending" if i % 2 == 0 or i >= 2 * allowed else "allowed"


def test_reviews_have_a_status_created_at_index(engine: Engine) -> None:
    """The migrated schema (SQLite and PostgreSQL) indexes reviews on (status, created_at)."""
    indexes = {
        tuple(i["column_names"]): i["name"] for i in sa.inspect(engine).get_indexes("reviews")
    }
    assert indexes[("status", "created_at")] == "ix_reviews_status_created_at"


def test_pending_page_is_an_index_range_read(tmp_path: Path) -> None:
    """SQLite plans the pending page as a search of the composite index, with no sort of
    every pending row (only ties on ``created_at`` are ordered by id)."""
    engine = make_engine(f"sqlite:///{tmp_path / 'baton.db'}")
    init_db(engine)
    add_reviews(engine, pending=300, allowed=100)
    statements: list[tuple[str, object]] = []

    def seen(_c: object, _cur: object, statement: str, params: object, *_: object) -> None:
        statements.append((statement, params))

    sa.event.listen(engine, "before_cursor_execute", seen)
    with session_scope(engine) as s:
        rows, total = reviews.list_reviews(s, status="pending", limit=50)
    sa.event.remove(engine, "before_cursor_execute", seen)
    assert total == 300
    assert [r.id for r in rows] == sorted((r.id for r in rows), reverse=True)
    assert rows[0].id == "review-0399"  # the newest pending first
    (page_sql, params), *_ = [(q, p) for q, p in statements if "LIMIT" in q]
    with engine.connect() as conn:
        plan = [
            str(row[-1])
            for row in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {page_sql}", params).all()  # type: ignore[arg-type]
        ]
    engine.dispose()
    assert any("USING INDEX ix_reviews_status_created_at" in step for step in plan), plan
    assert "USE TEMP B-TREE FOR ORDER BY" not in plan, plan
