"""``baton files``: a session's workspace over the API (docs/workspaces.md) — list its
files, download one, attach one as the session's owner."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import typer
from rich.table import Table
from typer.core import TyperGroup

from cli.common import ApiOption, api_client, checked, console, err_console


class _ListByDefault(TyperGroup):
    """``baton files SESSION`` is ``baton files list SESSION``: a first argument that is no
    subcommand names the session to list."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:  # typer vendors click
        if args and not args[0].startswith("-") and args[0] not in self.commands:
            args = ["list", *args]
        return super().parse_args(ctx, args)


app = typer.Typer(
    cls=_ListByDefault,
    help="A session's workspace: `baton files SESSION` lists it; get and put move files.",
    no_args_is_help=True,
)

SessionArg = Annotated[str, typer.Argument(help="The session id (session-…).")]
PathArg = Annotated[str, typer.Argument(help="The file's path in the workspace.")]


def _url(session: str, path: str | None = None) -> str:
    base = f"/v1/sessions/{quote(session, safe='')}/files"
    # Every character quoted, slashes too: the API decodes them, and no client-side
    # dot-segment cleanup changes what the server is asked (it refuses '..' itself).
    return base if path is None else f"{base}/{quote(path, safe='')}"


@app.command("list")
def list_files(session: SessionArg, api_url: ApiOption = None) -> None:
    """List the files of the session's workspace: path, size, type, modified."""
    with api_client(api_url) as http:
        body = checked(http.get(_url(session)))
    files: list[dict[str, Any]] = body["data"]  # type: ignore[assignment]
    table = Table("path", "bytes", "type", "modified", title=f"Workspace of {session}")
    for f in files:
        table.add_row(f["path"], str(f["size"]), f["content_type"], f["modified"])
    console.print(table)
    console.print(f"{len(files)} files, {sum(f['size'] for f in files)} bytes")


@app.command("get")
def get_file(
    session: SessionArg,
    path: PathArg,
    output: Annotated[
        Path | None,
        typer.Option("-o", "--output", help="Write it here (default: stdout)."),
    ] = None,
    api_url: ApiOption = None,
) -> None:
    """Download a file of the session's workspace to ``--output`` or stdout."""
    with api_client(api_url) as http, http.stream("GET", _url(session, path)) as resp:
        if resp.status_code >= 400:
            resp.read()
            checked(resp)
        sink = output.open("wb") if output else sys.stdout.buffer
        try:
            for chunk in resp.iter_bytes():
                sink.write(chunk)
        finally:
            if output:
                sink.close()
    if output:
        err_console.print(f"wrote {output}", highlight=False)


@app.command("put")
def put_file(
    session: SessionArg,
    path: PathArg,
    file: Annotated[
        Path, typer.Argument(exists=True, dir_okay=False, readable=True, help="The local file.")
    ],
    api_url: ApiOption = None,
) -> None:
    """Attach a local file to the session's workspace at ``PATH`` (as the session's owner);
    the session hears of it (``workspace_attached``)."""
    with api_client(api_url) as http, file.open("rb") as body:
        info = checked(
            http.put(
                _url(session, path),
                content=body,
                headers={"Content-Type": "application/octet-stream"},
                timeout=300,
            )
        )
    console.print(f"attached {info['path']} ({info['size']} bytes, {info['content_type']})")
