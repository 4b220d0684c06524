"""reviews: one (status, created_at) index for the review inbox

``GET /v1/reviews?status=pending`` lists pending reviews newest first. With only an
index on ``status`` the database fetched every pending review and sorted them for each
page (1,000 reviews pending: a sort of 1,000 rows per request, bench/held.py); with
``(status, created_at)`` a page is a range read in order. The composite index serves
every lookup by ``status`` alone too, so ``ix_reviews_status`` goes.

Revision ID: 0008
Revises: 0007
Created: 2026-12-01 16:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_reviews_status_created_at", "reviews", ["status", "created_at"])
    op.drop_index("ix_reviews_status", table_name="reviews")


def downgrade() -> None:
    op.create_index("ix_reviews_status", "reviews", ["status"])
    op.drop_index("ix_reviews_status_created_at", table_name="reviews")
