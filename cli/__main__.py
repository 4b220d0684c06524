"""``python -m cli`` runs the ``baton`` command (the tests and bench start it this way)."""

from cli.main import app

app()
