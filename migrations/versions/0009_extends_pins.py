"""agent_revisions.extends_pins: a published revision's bases as immutable pins

A revision's ``extends`` used to follow its base's live pointer, so republishing a base
changed what every published revision extending it meant (Xema Agent Concepts, 'Agent
references': production should compile to immutable pins). Publishing now records the
``extends`` chain it resolved, nearest base first (``["mid@2", "base@3"]``; ``[]`` for a
revision that extends nothing), and resolution reads those revisions.

Existing revisions are pinned to what they resolve to at migration time, so the upgrade
changes no agent's meaning: each link's bare slug is the base's live revision then, a
``slug@N`` stays N. A retired base (no live revision; only a non-live revision can
still extend it) is pinned to its newest revision, what it last meant. A chain that
does not resolve (a base gone, a cycle) stays NULL: that revision follows the live
pointers as before, and resolving it fails as it did.

Revision ID: 0009
Revises: 0008
Created: 2026-12-01 21:15:00
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: A reference as the spec validator accepts it (``slug`` or ``slug@N``); copied, not
#: imported, so this revision keeps meaning what it meant when the code moves on.
_REF = re.compile(r"^([a-z0-9][a-z0-9-]{0,62})(?:@([0-9]+))?$")
#: The resolver's bound on an ``extends`` chain (links).
_MAX_LINKS = 32


def _pins(
    start: tuple[int, int],
    specs: dict[tuple[int, int], dict[str, Any]],
    ids: dict[str, int],
    live: dict[int, int],
    newest: dict[int, int],
    slugs: dict[int, str],
) -> list[str] | None:
    """The chain from revision ``start`` = (agent id, version) as pins, or None."""
    pins: list[str] = []
    seen = {start}
    current = start
    while True:
        ref = specs[current].get("extends")
        if not ref:
            return pins
        found = _REF.match(str(ref))
        if found is None or found.group(1) not in ids:
            return None
        agent_id = ids[found.group(1)]
        version = (
            int(found.group(2)) if found.group(2) else live.get(agent_id, newest.get(agent_id, 0))
        )
        current = (agent_id, version)
        if current not in specs or current in seen or len(pins) >= _MAX_LINKS:
            return None
        seen.add(current)
        pins.append(f"{slugs[agent_id]}@{version}")


# Plain ALTER TABLE on both backends (as 0007): batch mode would copy the table.
def upgrade() -> None:
    op.add_column("agent_revisions", sa.Column("extends_pins", sa.JSON(), nullable=True))
    conn = op.get_bind()
    meta = sa.MetaData()
    agents = sa.Table("agents", meta, autoload_with=conn)
    revisions = sa.Table("agent_revisions", meta, autoload_with=conn)
    pointers = sa.Table("agent_live_pointers", meta, autoload_with=conn)
    slugs = {row.id: row.slug for row in conn.execute(sa.select(agents.c.id, agents.c.slug))}
    ids = {slug: agent_id for agent_id, slug in slugs.items()}
    live = {
        row.agent_id: row.version
        for row in conn.execute(sa.select(pointers.c.agent_id, pointers.c.version))
    }
    rows = conn.execute(
        sa.select(revisions.c.id, revisions.c.agent_id, revisions.c.version, revisions.c.spec)
    ).all()
    specs = {(r.agent_id, r.version): dict(r.spec or {}) for r in rows}
    newest: dict[int, int] = {}
    for agent_id, version in specs:
        newest[agent_id] = max(version, newest.get(agent_id, 0))
    for r in rows:
        pins = _pins((r.agent_id, r.version), specs, ids, live, newest, slugs)
        if pins is not None:
            conn.execute(revisions.update().where(revisions.c.id == r.id).values(extends_pins=pins))


def downgrade() -> None:
    op.execute("ALTER TABLE agent_revisions DROP COLUMN extends_pins")
