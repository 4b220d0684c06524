"""revision_publisher: who published an agent revision

``agent_revisions.published_by`` is the caller's user at publish (``local`` with auth off);
NULL for the revisions published before this migration, whose publisher was not recorded
(docs/console.md, An agent).

Revision ID: 0020
Revises: 0019
Created: 2026-12-02 16:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | Sequence[str] | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


# Plain ALTER TABLE on both backends (as in 0013 and 0019).
def upgrade() -> None:
    op.add_column(
        "agent_revisions", sa.Column("published_by", sa.String(length=200), nullable=True)
    )


def downgrade() -> None:
    op.execute("ALTER TABLE agent_revisions DROP COLUMN published_by")
