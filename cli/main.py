"""The ``baton`` command: the root Typer app, composed from one module per noun.

Top-level commands (``baton apply``, ``baton run``, …) come from modules added without
a name; groups (``baton db``, ``baton reviews``, …) keep the name users type.
"""

from __future__ import annotations

from importlib.metadata import version

import typer

from cli import (
    agents,
    db,
    dev,
    evals,
    files,
    mcp,
    reviews,
    services,
    sessions,
    steps,
    usage,
    users,
    webhooks,
)

app = typer.Typer(
    name="baton",
    help="Durable multi-agent orchestration on Temporal.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(agents.app)  # apply, show
app.add_typer(agents.group, name="agents")  # agents rebase
app.add_typer(services.app)  # api, worker, setup
app.add_typer(dev.app)  # dev, demo
app.add_typer(sessions.app)  # run, fork, trace
app.add_typer(evals.app)  # eval
app.add_typer(usage.app)  # usage, balance
app.add_typer(users.app)  # users, tokens
app.add_typer(db.app, name="db")
app.add_typer(steps.app, name="step")
app.add_typer(reviews.app, name="reviews")
app.add_typer(webhooks.app, name="webhooks")
app.add_typer(mcp.app, name="mcp")
app.add_typer(files.app, name="files")


def _print_version(value: bool) -> None:
    """``baton --version``: print ``baton <installed package version>`` and exit 0. The
    image's ``org.opencontainers.image.version`` label is checked against this line when
    it is built (deploy/Dockerfile)."""
    if value:
        typer.echo(f"baton {version('baton')}")
        raise typer.Exit


@app.callback()
def _root(
    show_version: bool = typer.Option(
        False,
        "--version",
        callback=_print_version,
        is_eager=True,
        help="Print Baton's version and exit.",
    ),
) -> None:
    """Durable multi-agent orchestration on Temporal."""
