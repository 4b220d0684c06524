"""The ``baton`` command: the root Typer app, composed from one module per noun.

Top-level commands (``baton apply``, ``baton run``, …) come from modules added without
a name; groups (``baton db``, ``baton reviews``, …) keep the name users type.
"""

from __future__ import annotations

import typer

from cli import agents, db, dev, mcp, reviews, services, sessions, steps, usage, users

app = typer.Typer(
    name="baton",
    help="Durable multi-agent orchestration on Temporal.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(agents.app)  # apply, show
app.add_typer(services.app)  # api, worker, setup
app.add_typer(dev.app)  # dev, demo
app.add_typer(sessions.app)  # run, trace
app.add_typer(usage.app)  # usage, balance
app.add_typer(users.app)  # users, tokens
app.add_typer(db.app, name="db")
app.add_typer(steps.app, name="step")
app.add_typer(reviews.app, name="reviews")
app.add_typer(mcp.app, name="mcp")
