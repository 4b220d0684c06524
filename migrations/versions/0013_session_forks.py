"""session_forks: a session forked from another at a message, reading its prefix through

A fork holds the original's transcript up to the fork point by reference
(``fork_prefix``: the segments it reads through), never as copied rows, so forking a
10,000-message session writes one row (docs/change-safely.md, Fork a session). ``sandbox``
marks a fork that runs an agent's draft (the authoring sandbox).

Revision ID: 0013
Revises: 0012
Created: 2026-12-02 03:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


# Plain ALTER TABLE on both backends (as in 0007 and 0010): SQLite adds and drops a column in
# place, where a batch copy of ``sessions`` would trip the foreign keys pointing at it.
def upgrade() -> None:
    op.add_column("sessions", sa.Column("forked_from", sa.String(length=80), nullable=True))
    op.add_column("sessions", sa.Column("fork_point", sa.String(length=160), nullable=True))
    op.add_column("sessions", sa.Column("fork_prefix", sa.JSON(), nullable=True))
    op.add_column(
        "sessions",
        sa.Column("sandbox", sa.Boolean(), nullable=False, server_default=sa.false()),
    )
    op.create_index(op.f("ix_sessions_forked_from"), "sessions", ["forked_from"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_sessions_forked_from"), table_name="sessions")
    for column in ("sandbox", "fork_prefix", "fork_point", "forked_from"):
        op.execute(f"ALTER TABLE sessions DROP COLUMN {column}")
