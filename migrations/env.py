"""Alembic environment: Baton's models are the target, Baton's engine runs the revisions.

:mod:`baton.storage.migrate` always hands over an open connection in
``config.attributes["connection"]`` (one transaction, with PostgreSQL's advisory
lock held); with none, the engine comes from ``BATON_DATABASE_URL``.
"""

from __future__ import annotations

from typing import Any, Literal

from alembic import context
from alembic.autogenerate.api import AutogenContext
from sqlalchemy.engine import Connection
from sqlmodel import SQLModel
from sqlmodel.sql.sqltypes import AutoString

import baton.storage.db  # the tables register on SQLModel.metadata
from baton.storage.db import UTCDateTime

target_metadata = SQLModel.metadata


def render_item(type_: str, obj: Any, autogen_context: AutogenContext) -> str | Literal[False]:
    """Render Baton's column types as plain SQLAlchemy ones.

    Revisions must not import application code that later changes: ``UTCDateTime``
    is a ``DateTime(timezone=True)`` on disk and ``AutoString(n)`` a ``String(n)``.
    """
    if type_ == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    if type_ == "type" and isinstance(obj, AutoString):
        return f"sa.String(length={obj.length})" if obj.length else "sa.String()"
    return False


def configure(connection: Connection) -> None:
    """The one set of options autogenerate, ``compare_metadata`` and upgrades share."""
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_item=render_item,
        # SQLite cannot ALTER most things: batch mode rebuilds the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )


def run(connection: Connection) -> None:
    configure(connection)
    with context.begin_transaction():
        context.run_migrations()


def main() -> None:
    given = context.config.attributes.get("connection")
    if given is not None:
        run(given)
        return
    from baton.settings import get_settings

    engine = baton.storage.db.make_engine(get_settings().database_url)
    try:
        with engine.begin() as connection:
            run(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise SystemExit("Baton's migrations run online only (baton db upgrade)")
main()
