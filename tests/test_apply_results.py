"""What applying a file reports per entry (baton.agents.apply, shared by every way of
running ``baton apply``): an agent with its live version, a team with none, since teams
have no revisions (it was reported as version 0)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.engine import Engine

from baton.agents.apply import apply_agents, load_apply_file
from baton.storage.db import session_scope

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "agents.yaml"


def test_apply_reports_agents_with_their_version_and_teams_with_none(db_engine: Engine) -> None:
    """Applying the examples twice: agents are created at version 1, then unchanged at it;
    each team is created, then unchanged, with ``version`` None both times."""
    doc = load_apply_file(EXAMPLES)
    assert doc.teams, "the examples define a team"
    for expected in ("created", "unchanged"):
        with session_scope(db_engine) as s:
            results = apply_agents(s, doc=doc)
        teams = [r for r in results if r.slug.startswith("team:")]
        agents = [r for r in results if not r.slug.startswith("team:")]
        assert [(r.version, r.change) for r in teams] == [(None, expected)] * len(doc.teams)
        assert agents and all(r.version == 1 for r in agents)
        assert all(
            r.change == ("created" if expected == "created" else "unchanged") for r in agents
        )
