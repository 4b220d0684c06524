"""sessions.resume_input: where an idle session's next workflow run starts

An idle session's workflow now completes after ``BATON_SESSION_IDLE_TIMEOUT``; just
before it does, it stores the input of its next run (pin, provenance, engine config,
agent snapshot, turn counter, review memory) here, and the next message starts that
run under the same workflow id. NULL for sessions that never completed idle.

Revision ID: 0007
Revises: 0006
Created: 2026-12-02 09:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


# Plain ALTER TABLE on both backends, not batch mode: SQLite's batch mode copies the
# table, and dropping `sessions` while `messages` rows point at it fails their foreign
# keys. SQLite (3.35+) adds and drops a column in place.
def upgrade() -> None:
    op.add_column("sessions", sa.Column("resume_input", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.execute("ALTER TABLE sessions DROP COLUMN resume_input")
