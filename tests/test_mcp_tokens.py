"""Proxy tokens of external sessions: hashed, bound to one session, revoked by a
reissue (`baton mcp token`), by an expiry and when the session closes."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from sqlmodel import select
from typer.testing import Result

from baton.agents import registry
from baton.agents.spec import AgentSpec
from baton.contracts.workflow_io import Provenance
from baton.grants import auth
from baton.runs import external, session_store
from baton.storage.db import ProxyTokenRow, init_db, make_engine, session_scope, utcnow
from tests.test_cli_reviews import cli  # noqa: F401 (fixture)

Run = Callable[..., Result]


def setup(db_url: str) -> tuple[str, str]:
    """An agent, an external session row and its first token: ``(session_id, token)``."""
    engine = make_engine(db_url)
    init_db(engine)
    with session_scope(engine) as s:
        registry.create_agent(s, slug="outside", name="Outside", spec=AgentSpec())
        registry.publish(s, slug="outside")
        session_store.create_session(
            s,
            session_id="session-00000000-0000-0000-0000-000000000001",
            agent_slug="outside",
            agent_version=1,
            provenance=Provenance(external=True),
            name="x",
        )
        session_store.create_session(
            s,
            session_id="session-00000000-0000-0000-0000-000000000002",
            agent_slug="outside",
            agent_version=1,
            provenance=Provenance(),
            name="ordinary",
        )
        _, plain = external.issue_proxy_token(
            s, session_id="session-00000000-0000-0000-0000-000000000001"
        )
    engine.dispose()
    return "session-00000000-0000-0000-0000-000000000001", plain


def who(db_url: str, token: str) -> str:
    engine = make_engine(db_url)
    try:
        with session_scope(engine) as s:
            return external.authenticate(s, token).session_id
    finally:
        engine.dispose()


def test_reissue_revokes_the_old_token_and_stores_only_digests(
    cli: Callable[[dict[str, str]], Run],  # noqa: F811
    tmp_path: Path,
) -> None:
    """`baton mcp token SESSION` prints a new token; the old one is 401 from then on, and
    the table holds SHA-256 digests, never a plaintext."""
    db_url = f"sqlite:///{tmp_path / 'tokens.db'}"
    sid, old = setup(db_url)
    assert who(db_url, old) == sid
    run = cli({"BATON_DATABASE_URL": db_url})
    result = run("mcp", "token", sid)
    assert result.exit_code == 0, result.output
    new = result.stdout.strip().splitlines()[0]
    assert new.startswith(external.PROXY_PREFIX) and new != old
    assert who(db_url, new) == sid
    with pytest.raises(auth.Unauthorized):
        who(db_url, old)
    engine = make_engine(db_url)
    with session_scope(engine) as s:
        hashes = {r.token_hash for r in s.exec(select(ProxyTokenRow)).all()}
    engine.dispose()
    assert hashes == {auth._digest(old), auth._digest(new)}
    refused = run("mcp", "token", "session-00000000-0000-0000-0000-000000000002")
    assert refused.exit_code == 1
    assert "not_external" in refused.output or "not an external" in refused.output


def test_expired_and_closed_session_tokens_are_refused(tmp_path: Path) -> None:
    """A token is valid up to its expiry and refused at it; a cancelled session's token is
    refused too (Gamut X-Agent: the token lives with its session)."""
    db_url = f"sqlite:///{tmp_path / 'expiry.db'}"
    sid, _ = setup(db_url)
    engine = make_engine(db_url)
    try:
        with session_scope(engine) as s:
            row, plain = external.issue_proxy_token(s, session_id=sid, expires_in_s=60)
            assert row.expires_at is not None
            edge = row.expires_at
        with session_scope(engine) as s:
            assert (
                external.authenticate(s, plain, now=edge - timedelta(seconds=1)).session_id == sid
            )
            with pytest.raises(auth.Unauthorized):
                external.authenticate(s, plain, now=edge)
            assert external.authenticate(s, plain, now=utcnow()).session_id == sid
            session_store.set_status(s, session_id=sid, status="cancelled")
        with session_scope(engine) as s, pytest.raises(auth.Unauthorized):
            external.authenticate(s, plain)
    finally:
        engine.dispose()
