"""Schema migrations: Alembic driven from code (``baton db …``, ``baton dev``, start-up checks).

The revisions live in the top-level :mod:`migrations` package (shipped with
Baton, so this works from any folder). Rules (docs/deployment.md):

- ``baton db upgrade`` (a one-shot job in deployments), ``baton dev`` and
  ``baton demo`` change the schema; nothing else ever does.
- ``baton api`` and ``baton worker`` refuse to start on a database behind the
  code (:func:`require_current`), naming the command to run.
- A database made by ``create_all`` before migrations existed (tables, no
  ``alembic_version``) is adopted by ``upgrade``: checked against the
  :data:`BASELINE` revision and stamped with it, then upgraded as usual.
- On PostgreSQL an upgrade holds an advisory lock for its whole transaction, so
  two migration jobs started at once run one after the other.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import Script, ScriptDirectory
from alembic.util import CommandError
from sqlalchemy.engine import Connection, Engine
from sqlmodel import SQLModel

import migrations
from baton.errors import BatonError

log = logging.getLogger("baton.migrate")

#: Where the revisions are: next to the installed ``migrations`` package.
MIGRATIONS_DIR = Path(migrations.__file__).parent

#: The first revision: exactly the schema ``create_all`` made before Alembic.
BASELINE = "0001"

#: PostgreSQL advisory lock key of a running upgrade (any constant; 'baton' in ASCII).
PG_LOCK_KEY = 0x6261746F6E

UPGRADE_HINT = "run 'baton db upgrade'"


class SchemaOutOfDate(BatonError):
    """The database's schema revision is not the one this code needs (start-up refusal)."""

    code = "schema_out_of_date"
    status = 503
    title = "Database schema out of date"


class MigrationFailed(BatonError):
    """Alembic refused a command (e.g. an unknown target revision)."""

    code = "migration_failed"
    status = 500
    title = "Migration failed"


@contextmanager
def _alembic_errors() -> Iterator[None]:
    try:
        yield
    except CommandError as exc:
        raise MigrationFailed(str(exc)) from exc


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic config for Baton's revisions; ``connection`` is what ``env.py`` runs on."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    # Revision files are named 0001_initial_schema.py, 0002_…: readable and ordered.
    cfg.set_main_option("file_template", "%%(rev)s_%%(slug)s")
    cfg.attributes["connection"] = connection
    return cfg


def script_directory() -> ScriptDirectory:
    """The revisions as Alembic sees them."""
    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str:
    """The newest revision id (e.g. ``"0001"``). Raises alembic's CommandError on two heads."""
    head = script_directory().get_current_head()
    if head is None:  # pragma: no cover - the package always ships BASELINE
        msg = f"no revisions under {MIGRATIONS_DIR}"
        raise RuntimeError(msg)
    return head


def current_revision(connection: Connection) -> str | None:
    """The revision stamped in ``alembic_version``; None when there is none."""
    return MigrationContext.configure(connection).get_current_revision()


def _baton_tables(connection: Connection) -> set[str]:
    return set(sa.inspect(connection).get_table_names()) & set(SQLModel.metadata.tables)


@dataclass(frozen=True)
class SchemaState:
    """Where a database stands: its revision, the code's head, and what that means."""

    url: str
    current: str | None
    head: str
    has_tables: bool

    @property
    def up_to_date(self) -> bool:
        return self.current == self.head

    @property
    def empty(self) -> bool:
        """Nothing of Baton's yet: no revision and no tables."""
        return self.current is None and not self.has_tables

    @property
    def legacy(self) -> bool:
        """Made by ``create_all`` before migrations: tables but no revision."""
        return self.current is None and self.has_tables

    @property
    def unknown(self) -> bool:
        """Stamped with a revision this code does not ship (a newer Baton migrated it)."""
        if self.current is None:
            return False
        try:
            return script_directory().get_revision(self.current) is None
        except CommandError:  # "Can't locate revision identified by …"
            return True

    def describe(self) -> str:
        """One line for ``baton db current`` and the start-up refusal."""
        if self.up_to_date:
            return f"database {self.url} is at revision {self.current} (head)"
        if self.empty:
            return f"database {self.url} has no Baton schema"
        if self.legacy:
            return (
                f"database {self.url} was created before migrations (no schema revision); "
                "upgrading adopts it"
            )
        if self.unknown:
            return (
                f"database {self.url} is at revision {self.current}, unknown to this Baton "
                f"(head {self.head}): a newer Baton migrated it"
            )
        return f"database {self.url} is at revision {self.current}, this Baton needs {self.head}"


def schema_state(engine: Engine) -> SchemaState:
    """Read where ``engine``'s database stands. Raises SQLAlchemy errors when unreachable."""
    with engine.connect() as connection:
        return SchemaState(
            url=engine.url.render_as_string(hide_password=True),
            current=current_revision(connection),
            head=head_revision(),
            has_tables=bool(_baton_tables(connection)),
        )


def require_current(engine: Engine) -> SchemaState:
    """Refuse a database behind the code: the start-up check of ``baton api`` and ``baton worker``.

    Returns the state when the database is at head. A revision this code does not
    know (a newer Baton already migrated, e.g. mid rolling upgrade or on rollback)
    is logged and allowed: revisions are written backward compatible (see
    docs/deployment.md, 'Upgrading'). Raises :class:`SchemaOutOfDate` naming
    ``baton db upgrade`` when the database is empty, legacy or behind.
    """
    state = schema_state(engine)
    if state.up_to_date:
        return state
    if state.unknown:
        log.warning("%s; starting anyway", state.describe())
        return state
    raise SchemaOutOfDate(f"{state.describe()}: {UPGRADE_HINT}")


def _lock(connection: Connection) -> None:
    if connection.dialect.name == "postgresql":
        connection.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": PG_LOCK_KEY})


def _baseline_columns() -> dict[str, set[str]]:
    """Table → column names of the :data:`BASELINE` schema, built on an in-memory SQLite."""
    scratch = sa.create_engine("sqlite://")
    try:
        with scratch.begin() as connection:
            command.upgrade(alembic_config(connection), BASELINE)
            inspector = sa.inspect(connection)
            return {
                t: {c["name"] for c in inspector.get_columns(t)}
                for t in inspector.get_table_names()
                if t != "alembic_version"
            }
    finally:
        scratch.dispose()


def _adopt(connection: Connection) -> None:
    """Stamp a ``create_all``-made database with :data:`BASELINE` once it is proven to match.

    Raises :class:`SchemaOutOfDate` listing what is missing when it does not (a
    database from an older Baton than the baseline: export and re-import it).
    """
    inspector = sa.inspect(connection)
    present = set(inspector.get_table_names())
    missing: list[str] = []
    for table, columns in sorted(_baseline_columns().items()):
        if table not in present:
            missing.append(table)
            continue
        have = {c["name"] for c in inspector.get_columns(table)}
        missing += [f"{table}.{c}" for c in sorted(columns - have)]
    if missing:
        shown = ", ".join(missing[:10]) + (" …" if len(missing) > 10 else "")
        msg = (
            f"the database has Baton tables but no schema revision, and differs from "
            f"revision {BASELINE} (missing {shown}); it cannot be adopted"
        )
        raise SchemaOutOfDate(msg)
    command.stamp(alembic_config(connection), BASELINE)
    log.info("adopted a database made before migrations as revision %s", BASELINE)


def upgrade(engine: Engine, revision: str = "head") -> tuple[str | None, str | None]:
    """Upgrade to ``revision`` (default head) in one transaction; returns (before, after).

    Adopts a legacy ``create_all`` database first (see :func:`_adopt`). Safe to run
    again (nothing to do) and, on PostgreSQL, concurrently (advisory lock).
    """
    with _alembic_errors(), engine.begin() as connection:
        _lock(connection)
        before = current_revision(connection)
        if before is None and _baton_tables(connection):
            _adopt(connection)
        command.upgrade(alembic_config(connection), revision)
        return before, current_revision(connection)


def downgrade(engine: Engine, revision: str) -> tuple[str | None, str | None]:
    """Downgrade to ``revision`` (an id, ``-1``, or ``base`` = drop everything); (before, after)."""
    with _alembic_errors(), engine.begin() as connection:
        _lock(connection)
        before = current_revision(connection)
        command.downgrade(alembic_config(connection), revision)
        return before, current_revision(connection)


def history() -> list[Script]:
    """Every revision, newest first."""
    return list(script_directory().walk_revisions())


def model_diff(engine: Engine) -> list[object]:
    """What autogenerate would add to reach the models from ``engine``'s schema ([] = agree).

    Compares types too, as ``env.py`` does, so this is what a new ``baton db
    revision`` would contain.
    """
    with engine.connect() as connection:
        context = MigrationContext.configure(
            connection, opts={"compare_type": True, "target_metadata": SQLModel.metadata}
        )
        return list(compare_metadata(context, SQLModel.metadata))


def new_revision(message: str) -> Path:
    """Write the next revision (``000N_<slug>.py``) autogenerated from the models.

    Compares the models with a scratch SQLite database at head, so no database
    is needed; review the file (SQLite cannot see every change, e.g. a
    PostgreSQL-only index option). Returns the file's path.
    """
    next_id = f"{len(history()) + 1:04d}"
    scratch = sa.create_engine("sqlite://")
    try:
        with scratch.begin() as connection:
            cfg = alembic_config(connection)
            ruff = Path(sys.executable).parent / "ruff"
            if ruff.exists():  # the dev extra: the new file passes `make lint` as written
                hooks = {"fix": "check --fix --quiet", "format": "format --quiet"}
                cfg.set_section_option("post_write_hooks", "hooks", ", ".join(hooks))
                for name, args in hooks.items():
                    cfg.set_section_option("post_write_hooks", f"{name}.type", "exec")
                    cfg.set_section_option("post_write_hooks", f"{name}.executable", str(ruff))
                    cfg.set_section_option(
                        "post_write_hooks", f"{name}.options", f"{args} REVISION_SCRIPT_FILENAME"
                    )
            command.upgrade(cfg, "head")
            script = command.revision(cfg, message=message, autogenerate=True, rev_id=next_id)
    finally:
        scratch.dispose()
    if script is None or isinstance(script, list):  # pragma: no cover - one head
        msg = "alembic wrote no single revision"
        raise RuntimeError(msg)
    return Path(script.path)
