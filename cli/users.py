"""``baton users`` and ``baton tokens``: the users of auth mode, their roles on agents, and
their bearer API tokens (on the database)."""

from __future__ import annotations

from typing import Annotated, cast

import typer
from rich.table import Table

from cli.common import console, db_session, err_console, fail

users_app = typer.Typer(help="Users of auth mode and their roles on agents (database).")
tokens_app = typer.Typer(help="Bearer API tokens of auth mode (database).")
app = typer.Typer()
app.add_typer(users_app, name="users")
app.add_typer(tokens_app, name="tokens")


@users_app.command("add")
def users_add(
    user_id: Annotated[str, typer.Argument(help="Lower-case id, e.g. alice")],
    name: Annotated[str, typer.Option(help="Display name.")] = "",
) -> None:
    """Create a user."""
    from baton.grants import auth

    with db_session() as s:
        auth.create_user(s, user_id=user_id, name=name)
    console.print(f"user {user_id} created")


@users_app.command("list")
def users_list() -> None:
    """Users and their roles on agents."""
    from sqlmodel import select

    from baton.grants import auth
    from baton.storage.db import AgentAcl

    with db_session() as s:
        table = Table("user", "name", "roles")
        for u in auth.list_users(s):
            roles = s.exec(select(AgentAcl).where(AgentAcl.user_id == u.id)).all()
            table.add_row(u.id, u.name, ", ".join(f"{r.agent_slug}:{r.role}" for r in roles))
    console.print(table)


@users_app.command("grant")
def users_grant(
    user_id: Annotated[str, typer.Argument(help="User id.")],
    agent: Annotated[str, typer.Argument(help="Agent slug.")],
    role: Annotated[str, typer.Argument(help="viewer | user | owner")],
) -> None:
    """Give USER the ROLE on AGENT (viewer < user < owner)."""
    from baton.agents import registry
    from baton.grants import auth

    if role not in auth.ROLE_RANK:
        raise fail(auth.InvalidUser(f"role must be viewer, user or owner, not {role!r}"))
    with db_session() as s:
        registry.get_agent(s, slug=agent)
        auth.grant(s, agent=agent, user_id=user_id, role=cast("auth.Role", role))
    console.print(f"{user_id} is {role} of {agent}")


@users_app.command("revoke")
def users_revoke(
    user_id: Annotated[str, typer.Argument(help="User id.")],
    agent: Annotated[str, typer.Argument(help="Agent slug.")],
) -> None:
    """Remove USER's role on AGENT."""
    from baton.grants import auth

    with db_session() as s:
        removed = auth.revoke(s, agent=agent, user_id=user_id)
    console.print(f"{user_id} {'no longer has a role on' if removed else 'had no role on'} {agent}")


@tokens_app.command("issue")
def tokens_issue(
    user_id: Annotated[str, typer.Argument(help="User id.")],
    name: Annotated[str, typer.Option(help="What the token is for.")] = "",
) -> None:
    """Issue a bearer token for USER; it is printed once (only its hash is stored)."""
    from baton.grants import auth

    with db_session() as s:
        row, plain = auth.issue_token(s, user_id=user_id, name=name)
        token_id = row.id
    err_console.print(f"token {token_id} for {user_id} (shown once; store it now):")
    print(plain)


@tokens_app.command("list")
def tokens_list(
    user_id: Annotated[str | None, typer.Option("--user", help="Only this user's.")] = None,
) -> None:
    """Tokens (id, user, prefix, revoked); never their value."""
    from baton.grants import auth

    with db_session() as s:
        table = Table("id", "user", "prefix", "name", "revoked", "created")
        for t in auth.list_tokens(s, user_id=user_id):
            table.add_row(
                str(t.id), t.user_id, t.prefix + "…", t.name, str(t.revoked), str(t.created_at)
            )
    console.print(table)


@tokens_app.command("revoke")
def tokens_revoke(token_id: Annotated[int, typer.Argument(help="Token id.")]) -> None:
    """Revoke a token: requests with it get 401 from now on."""
    from baton.grants import auth

    with db_session() as s:
        auth.revoke_token(s, token_id=token_id)
    console.print(f"token {token_id} revoked")
