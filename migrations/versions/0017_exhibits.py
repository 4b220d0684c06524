"""exhibits: what an agent showed the person (docs/exhibits.md)

One row per exhibit: its wire (the JSON its ``exhibit`` event and transcript turn carry)
and, for an image or a download, the decoded content the API serves.

Revision ID: 0017
Revises: 0015
Created: 2026-12-02 06:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | Sequence[str] | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "exhibits",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("session_id", sa.String(length=80), nullable=False),
        sa.Column("root_session_id", sa.String(length=80), nullable=False),
        sa.Column("delegation_id", sa.String(length=200), nullable=True),
        sa.Column("message_id", sa.String(length=160), nullable=False),
        sa.Column("kind", sa.String(length=20), nullable=False),
        sa.Column("wire", sa.JSON(), nullable=False),
        sa.Column("media_type", sa.String(length=100), nullable=True),
        sa.Column("content", sa.LargeBinary(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["session_id"], ["sessions.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_exhibits_session_id"), "exhibits", ["session_id"], unique=False)
    op.create_index(op.f("ix_exhibits_delegation_id"), "exhibits", ["delegation_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_exhibits_delegation_id"), table_name="exhibits")
    op.drop_index(op.f("ix_exhibits_session_id"), table_name="exhibits")
    op.drop_table("exhibits")
