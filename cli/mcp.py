"""``baton mcp``: agents outside Baton, the proxy tokens of external sessions (on the
database)."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.common import db_session, err_console

app = typer.Typer(help="Agents outside Baton: proxy tokens of external sessions (database).")


@app.command("token")
def mcp_token(
    session_id: Annotated[str, typer.Argument(help="An external session's id.")],
    ttl: Annotated[
        int | None, typer.Option("--ttl", min=60, help="Token lifetime in seconds (default: none).")
    ] = None,
) -> None:
    """Reissue an external session's proxy token: the old one stops working (401) at once.
    Prints the new token (shown once) and the MCP client's Authorization header."""
    from baton.runs import external, session_store

    with db_session() as s:
        if not session_store.is_external(s, session_id=session_id):
            raise external.NotExternal(f"session '{session_id}' is not an external session")
        _, plain = external.issue_proxy_token(s, session_id=session_id, expires_in_s=ttl)
    typer.echo(plain)
    err_console.print(f"Authorization: Bearer {plain[:16]}… (the previous token is revoked)")
