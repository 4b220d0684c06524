"""eval_sessions: a session an eval started to replay a recorded one

``eval_id`` names the eval (``evals.id``) and ``replay_of`` the recorded session whose user
turns the session replays (docs/change-safely.md, Replay against a candidate). Ordinary
lists leave such sessions out; a replay's tool calls are answered from ``replay_of``'s
recording.

Revision ID: 0019
Revises: 0017
Created: 2026-12-02 06:20:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | Sequence[str] | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


# Plain ALTER TABLE on both backends (as in 0013).
def upgrade() -> None:
    op.add_column("sessions", sa.Column("eval_id", sa.String(length=80), nullable=True))
    op.add_column("sessions", sa.Column("replay_of", sa.String(length=80), nullable=True))
    op.create_index(op.f("ix_sessions_eval_id"), "sessions", ["eval_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_sessions_eval_id"), table_name="sessions")
    for column in ("replay_of", "eval_id"):
        op.execute(f"ALTER TABLE sessions DROP COLUMN {column}")
