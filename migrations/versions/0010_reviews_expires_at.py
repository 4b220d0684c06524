"""reviews.expires_at: the deadline a decision must be received by

The workflow fixes a review's deadline when it asks for the review (its timeout from
then) and the ``authorize`` activity stores it with the row, so the API refuses a
decision received past it (409 ``review_too_late``) whenever the workflow's timer
fires, and shows it (``expires_at``). NULL for reviews opened before this revision.

Revision ID: 0010
Revises: 0009
Created: 2026-12-01 21:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


# Plain ALTER TABLE on both backends (as in 0007): SQLite adds and drops a column in place.
def upgrade() -> None:
    op.add_column("reviews", sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.execute("ALTER TABLE reviews DROP COLUMN expires_at")
