"""evals: recorded sessions replayed on a candidate and a baseline, and the eval a
published revision passed (docs/change-safely.md, Replay against a candidate; the
publish gate).

Revision ID: 0014
Revises: 0013
Created: 2026-12-02 06:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "evals",
        sa.Column("id", sa.String(length=80), nullable=False),
        sa.Column("agent_slug", sa.String(length=63), nullable=False),
        sa.Column("candidate", sa.String(length=80), nullable=False),
        sa.Column("candidate_digest", sa.String(length=71), nullable=False),
        sa.Column("baseline", sa.String(length=80), nullable=False),
        sa.Column("options", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("done", sa.Integer(), nullable=False),
        sa.Column("changed", sa.Integer(), nullable=False),
        sa.Column("regressions", sa.Integer(), nullable=False),
        sa.Column("report", sa.JSON(), nullable=True),
        sa.Column("error", sa.String(length=1000), nullable=True),
        sa.Column("owner", sa.String(length=63), nullable=False),
        sa.Column("workflow_id", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_evals_agent_slug"), "evals", ["agent_slug"], unique=False)
    op.create_index(op.f("ix_evals_owner"), "evals", ["owner"], unique=False)
    op.create_index(op.f("ix_evals_created_at"), "evals", ["created_at"], unique=False)
    # Plain ALTER TABLE on both backends (as in 0013).
    op.add_column("agent_revisions", sa.Column("eval_id", sa.String(length=80), nullable=True))


def downgrade() -> None:
    op.execute("ALTER TABLE agent_revisions DROP COLUMN eval_id")
    op.drop_index(op.f("ix_evals_created_at"), table_name="evals")
    op.drop_index(op.f("ix_evals_owner"), table_name="evals")
    op.drop_index(op.f("ix_evals_agent_slug"), table_name="evals")
    op.drop_table("evals")
