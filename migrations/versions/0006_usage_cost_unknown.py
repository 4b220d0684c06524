"""usage.cost_usd nullable: NULL = no price known for the model

Rows written before this revision keep 0.0 (whether their price was known is not
recorded); from now on an unpriced call stores NULL, which ``GET /v1/usage`` and the
trace show as ``cost_usd: null`` (the CLI: "unknown").

Revision ID: 0006
Revises: 0005
Created: 2026-12-01 11:02:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("usage", schema=None) as batch_op:
        batch_op.alter_column("cost_usd", existing_type=sa.Float(), nullable=True)


def downgrade() -> None:
    op.execute("UPDATE usage SET cost_usd = 0.0 WHERE cost_usd IS NULL")
    with op.batch_alter_table("usage", schema=None) as batch_op:
        batch_op.alter_column("cost_usd", existing_type=sa.Float(), nullable=False)
