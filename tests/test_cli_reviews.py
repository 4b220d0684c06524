"""The `baton users`, `baton tokens` and `baton reviews` commands, run in-process."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from sqlmodel import select
from temporalio.testing import WorkflowEnvironment
from typer.testing import CliRunner, Result

from api.app import create_app
from baton.settings import Settings, get_settings
from baton.storage.db import ApiToken, init_db, make_engine, session_scope
from cli import app
from cli import common as cli_module
from tests.conftest import serve
from tests.test_api_agents import assert_problem
from tests.test_api_reviews import (
    INVOKE_SYNC,
    UNKNOWN_REVIEW,
    agent,
    launch,
    pending,
    result_of,
    running_stack,
    settled,
    target,
)
from tests.xagent_helpers import caller_playbook
from worker.stack import free_port

TOKEN = re.compile(r"^baton_[A-Za-z0-9_-]{43}$")
Run = Callable[..., Result]


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[dict[str, str]], Run]]:
    """``cli(env)`` → a runner of ``baton …`` with ``env`` as BATON_* settings."""

    def configure(env: dict[str, str]) -> Run:
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        get_settings.cache_clear()
        runner = CliRunner()

        def run(*args: str) -> Result:
            get_settings.cache_clear()
            return runner.invoke(app, list(args), catch_exceptions=False)

        return run

    try:
        yield configure
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()


def only_token_ids(db_url: str) -> list[tuple[int, str, str]]:
    """``(id, user, token_hash)`` of every stored token."""
    engine = make_engine(db_url)
    try:
        with session_scope(engine) as s:
            return [(t.id or 0, t.user_id, t.token_hash) for t in s.exec(select(ApiToken)).all()]
    finally:
        engine.dispose()


def test_users_add_and_tokens_issue_print_the_token_once(
    cli: Callable[[dict[str, str]], Run], tmp_path: Path
) -> None:
    """`users add` creates a user; `tokens issue` prints the token once and stores its hash."""
    db_url = f"sqlite:///{tmp_path / 'cli.db'}"
    run = cli({"BATON_DATABASE_URL": db_url})
    added = run("users", "add", "alice", "--name", "Alice")
    assert added.exit_code == 0, added.output
    assert "user alice created" in added.stdout
    again = run("users", "add", "alice")
    assert again.exit_code == 1 and "[user_exists]" in again.stderr
    bad = run("users", "add", "Not-Valid!")
    assert bad.exit_code == 1 and "[invalid_user]" in bad.stderr
    listed = run("users", "list")
    assert listed.exit_code == 0 and "alice" in listed.stdout and "Not-Valid" not in listed.stdout

    issued = run("tokens", "issue", "alice", "--name", "ci")
    assert issued.exit_code == 0, issued.output
    lines = issued.stdout.splitlines()
    assert len(lines) == 1 and TOKEN.match(lines[0]), issued.stdout
    plain = lines[0]
    assert "shown once" in issued.stderr and plain not in issued.stderr
    ((token_id, user, token_hash),) = only_token_ids(db_url)
    assert user == "alice" and token_hash == hashlib.sha256(plain.encode()).hexdigest()
    tokens = run("tokens", "list")
    assert tokens.exit_code == 0 and plain not in tokens.output
    assert plain[:12] in tokens.stdout and str(token_id) in tokens.stdout
    second = run("tokens", "issue", "alice")
    assert second.exit_code == 0 and second.stdout.strip() != plain
    ghost = run("tokens", "issue", "ghost")
    assert ghost.exit_code == 1 and "[user_not_found]" in ghost.stderr
    assert len(only_token_ids(db_url)) == 2


def test_revoked_token_is_refused_by_the_api(
    cli: Callable[[dict[str, str]], Run], tmp_path: Path
) -> None:
    """`tokens revoke` makes the API answer 401; `users grant` gives a role the API honours."""
    db_url = f"sqlite:///{tmp_path / 'cli-auth.db'}"
    run = cli({"BATON_DATABASE_URL": db_url})
    assert run("users", "add", "alice").exit_code == 0
    assert run("users", "add", "bob").exit_code == 0
    alice_token = run("tokens", "issue", "alice").stdout.strip()
    bob_token = run("tokens", "issue", "bob").stdout.strip()
    settings = Settings(database_url=db_url, auth="on", temporal_address=f"127.0.0.1:{free_port()}")
    server, thread, base = serve(create_app(settings))
    try:
        alice = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {alice_token}"})
        bob = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {bob_token}"})
        with alice, bob:
            assert (
                alice.post("/v1/agents", json={"slug": "desk", "name": "Desk"}).status_code == 201
            )
            assert_problem(bob.get("/v1/agents/desk"), 403, "forbidden")
            granted = run("users", "grant", "bob", "desk", "viewer")
            assert granted.exit_code == 0 and "bob is viewer of desk" in granted.stdout
            assert bob.get("/v1/agents/desk").status_code == 200
            assert "desk:viewer" in run("users", "list").stdout
            bad_role = run("users", "grant", "bob", "desk", "admin")
            assert bad_role.exit_code == 1 and "viewer, user or owner" in bad_role.stderr
            no_agent = run("users", "grant", "bob", "ghost", "viewer")
            assert no_agent.exit_code == 1 and "[agent_not_found]" in no_agent.stderr
            revoked_role = run("users", "revoke", "bob", "desk")
            assert revoked_role.exit_code == 0
            assert_problem(bob.get("/v1/agents/desk"), 403, "forbidden")

            (alice_id,) = [i for i, user, _ in only_token_ids(db_url) if user == "alice"]
            revoked = run("tokens", "revoke", str(alice_id))
            assert revoked.exit_code == 0 and f"token {alice_id} revoked" in revoked.stdout
            assert_problem(alice.get("/v1/agents"), 401, "unauthorized")
            assert bob.get("/v1/agents").status_code == 200
            assert "True" in run("tokens", "list", "--user", "alice").stdout
            missing = run("tokens", "revoke", "999999")
            assert missing.exit_code == 1 and "no token 999999" in missing.stderr
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_reviews_commands_need_a_token_in_auth_mode(
    cli: Callable[[dict[str, str]], Run], tmp_path: Path
) -> None:
    """`baton reviews list` sends BATON_TOKEN; without it an auth-mode API's 401 exits 1."""
    db_url = f"sqlite:///{tmp_path / 'cli-tok.db'}"
    engine = make_engine(db_url)
    init_db(engine)
    engine.dispose()
    settings = Settings(database_url=db_url, auth="on", temporal_address=f"127.0.0.1:{free_port()}")
    server, thread, base = serve(create_app(settings))
    try:
        run = cli({"BATON_DATABASE_URL": db_url, "BATON_API_URL": base})
        assert run("users", "add", "alice").exit_code == 0
        token = run("tokens", "issue", "alice").stdout.strip()
        refused = run("reviews", "list")
        assert refused.exit_code == 1 and "[unauthorized]" in refused.stderr
        run = cli({"BATON_TOKEN": token})
        listed = run("reviews", "list")
        assert listed.exit_code == 0, listed.output
        closed = run("reviews", "list", "--api", f"http://127.0.0.1:{free_port()}")
        assert closed.exit_code == 1 and "cannot reach" in closed.stderr
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def terminal_width(monkeypatch: pytest.MonkeyPatch, columns: int) -> None:
    """Render the CLI's Rich output as in a terminal ``columns`` wide."""
    monkeypatch.setattr(cli_module.console, "width", columns)


def test_reviews_list_prints_whole_ids_in_a_120_column_terminal(
    cli: Callable[[dict[str, str]], Run],
    temporal_env: WorkflowEnvironment,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`reviews list` shows the full review and session ids, which `approve`/`deny` need."""
    with running_stack(temporal_env, tmp_path / "cli-narrow.db") as st:
        run = cli({"BATON_API_URL": st.url})
        terminal_width(monkeypatch, 120)
        target(st.http)
        agent(st.http, "caller", caller_playbook("invoke_agent", INVOKE_SYNC))
        sid = launch(st.http, "caller")
        (review,) = pending(st.http)
        listed = run("reviews", "list")
        assert listed.exit_code == 0, listed.output
        assert review["id"] in listed.stdout, listed.stdout
        assert sid in listed.stdout, listed.stdout


def test_reviews_list_approve_and_deny_against_a_live_api(
    cli: Callable[[dict[str, str]], Run],
    temporal_env: WorkflowEnvironment,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`reviews list` shows the pending review; `approve` lets the call through, `deny` refuses."""
    terminal_width(monkeypatch, 250)  # wide enough for every column in full
    with running_stack(temporal_env, tmp_path / "cli-live.db") as st:
        http = st.http
        run = cli({"BATON_API_URL": st.url, "BATON_DATABASE_URL": st.settings.database_url})
        target(http)
        agent(http, "caller", caller_playbook("invoke_agent", INVOKE_SYNC))
        sid = launch(http, "caller")
        (review,) = pending(http)
        rid = review["id"]
        listed = run("reviews", "list")
        assert listed.exit_code == 0, listed.output
        assert rid in listed.stdout, listed.stdout
        assert "invoke" in listed.stdout and "target" in listed.stdout

        approved = run("reviews", "approve", rid)
        assert approved.exit_code == 0, approved.output
        assert f"{rid}: allowed (by local)" in approved.stdout
        settled(http, sid)
        assert result_of(http, sid)["response"] == "target says hi"
        late = run("reviews", "deny", rid)
        assert late.exit_code == 1 and "[review_already_decided]" in late.stderr
        assert rid not in run("reviews", "list").stdout
        assert rid in run("reviews", "list", "--status", "allowed").stdout
        unknown = run("reviews", "approve", UNKNOWN_REVIEW)
        assert unknown.exit_code == 1 and "[review_not_found]" in unknown.stderr

        denied_sid = launch(http, "caller")
        (second,) = pending(http)
        denied = run("reviews", "deny", second["id"])
        assert denied.exit_code == 0 and f"{second['id']}: denied (by local)" in denied.stdout
        settled(http, denied_sid)
        assert "denied" in result_of(http, denied_sid)["error"]

        always_sid = launch(http, "caller")
        (third,) = pending(http)
        always = run("reviews", "approve", third["id"], "--always")
        assert always.exit_code == 0 and "allowed" in always.stdout
        settled(http, always_sid)
        policies = http.get("/v1/agents/caller/policies").json()
        assert policies["targets"]["target"]["invoke"] == "allow"
        assert policies["global"]["invoke"] == "review"
        everything = run("reviews", "list", "--status", "all")
        assert all(r in everything.stdout for r in (rid, second["id"], third["id"]))
