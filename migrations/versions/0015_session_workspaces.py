"""session_workspaces: the workspace a session works in

``workspace_id`` names the workspace of a session that works in another session's
(a ``shareable`` subagent task or delegation, docs/workspaces.md); NULL means the
session's own, named by its id. Files live in the workspace store, never in the
database.

Revision ID: 0015
Revises: 0014
Created: 2026-12-02 06:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | Sequence[str] | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


# Plain ALTER TABLE on both backends (as in 0013): a batch copy of ``sessions`` would trip
# the foreign keys pointing at it.
def upgrade() -> None:
    op.add_column("sessions", sa.Column("workspace_id", sa.String(length=80), nullable=True))


def downgrade() -> None:
    op.execute("ALTER TABLE sessions DROP COLUMN workspace_id")
