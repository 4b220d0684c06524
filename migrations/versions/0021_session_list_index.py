"""session_list_index: the session list served by one index

``ix_sessions_listed`` on ``sessions (eval_id, created_at, id)`` replaces
``ix_sessions_eval_id`` (its leading column): a page of ``GET /v1/sessions`` (replays left
out, newest first) becomes a range read in index order instead of a sort of every session,
and its total a count of the index instead of a read of every row with its agent snapshot
(bench/README.md, the session list with 20,000 sessions held).

Revision ID: 0021
Revises: 0020
Created: 2026-12-06 12:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0021"
down_revision: str | Sequence[str] | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_sessions_listed", "sessions", ["eval_id", "created_at", "id"], unique=False)
    op.drop_index(op.f("ix_sessions_eval_id"), table_name="sessions")


def downgrade() -> None:
    op.create_index(op.f("ix_sessions_eval_id"), "sessions", ["eval_id"], unique=False)
    op.drop_index("ix_sessions_listed", table_name="sessions")
