"""What every ``baton`` command shares: the consoles, one-line errors, the API client,
a database session, and the options several nouns take.

Imports only ``baton`` (the domain) and output libraries; never ``api`` or ``worker``
at import time, so ``baton --help`` stays quick.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import httpx
import typer
from rich.console import Console
from rich.markup import escape

from baton.errors import BatonError

if TYPE_CHECKING:
    from sqlmodel import Session

console = Console()
err_console = Console(stderr=True, soft_wrap=True)

EXAMPLES = Path("examples/agents.yaml")
STATE_DIR = Path(".baton")

ApiOption = Annotated[
    str | None, typer.Option("--api", help="Baton API base URL (default BATON_API_URL).")
]


def fail(exc: BatonError) -> typer.Exit:
    """Print ``exc`` as ``error [code] at path: detail`` and return the exit to raise."""
    return problem_exit(exc.code, exc.path, exc.detail)


def problem_exit(code: str, path: str | None, detail: str) -> typer.Exit:
    """Print one ``error [code] at path: detail`` line (a local error or the API's
    problem+json) and return the exit to raise (code 1)."""
    where = f" at {path}" if path and path not in detail else ""
    err_console.print(f"[bold red]error[/] {escape(f'[{code}]{where}: {detail}')}", highlight=False)
    return typer.Exit(code=1)


@contextlib.contextmanager
def one_line_errors() -> Iterator[None]:
    """Turn domain, settings and database errors into one-line messages and exit 1."""
    from pydantic import ValidationError
    from sqlalchemy.exc import ArgumentError, SQLAlchemyError

    from baton.errors import InvalidSettings, from_database_error

    try:
        yield
    except BatonError as exc:
        raise fail(exc) from exc
    except ValidationError as exc:  # only settings are validated outside BatonError paths
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "settings"
        msg = f"BATON_{where.upper()}: {first['msg']}"
        raise fail(InvalidSettings(msg)) from exc
    except ArgumentError as exc:
        raise fail(InvalidSettings(f"BATON_DATABASE_URL: {exc}")) from exc
    except SQLAlchemyError as exc:
        mapped = from_database_error(exc)
        if mapped is None:
            raise
        raise fail(mapped) from exc


@contextlib.contextmanager
def api_client(api_url: str | None) -> Iterator[httpx.Client]:
    """An HTTP client for the API, sending BATON_TOKEN as the bearer token when set."""
    from baton.settings import get_settings

    with one_line_errors():
        settings = get_settings()
    url = api_url or settings.api_url
    headers = (
        {"Authorization": f"Bearer {settings.token.get_secret_value()}"} if settings.token else {}
    )
    with httpx.Client(base_url=url, timeout=30, headers=headers) as http:
        try:
            yield http
        except httpx.HTTPError as exc:
            where = "--api" if api_url else "BATON_API_URL"
            err_console.print(
                f"[bold red]error[/] cannot reach {url} (the Baton API, from {where}): {exc} "
                "(is `baton dev` up? set BATON_API_URL or --api to where the API listens)",
                soft_wrap=True,
                highlight=False,
            )
            raise typer.Exit(1) from exc


def checked(resp: httpx.Response) -> dict[str, object]:
    """The JSON body (``{}`` for 204 No Content), or print the problem (``error [code]:
    detail``) and exit 1."""
    if resp.status_code >= 400:
        try:
            body = resp.json()
            problem = f"[{body.get('code')}]: {body.get('detail', '')}"
        except ValueError:
            problem = f"HTTP {resp.status_code}"
        err_console.print(f"[bold red]error[/] {escape(problem)}", highlight=False)
        raise typer.Exit(1)
    if resp.status_code == 204:
        return {}
    result: dict[str, object] = resp.json()
    return result


@contextlib.contextmanager
def db_session() -> Iterator[Session]:
    """A database session on BATON_DATABASE_URL (an empty database gets the schema, see
    :func:`baton.storage.db.init_db`); errors become one line and exit 1."""
    from baton.settings import get_settings
    from baton.storage.db import init_db, make_engine, session_scope

    with one_line_errors():
        engine = make_engine(get_settings().database_url)
        try:
            init_db(engine)
            with session_scope(engine) as s:
                yield s
        finally:
            engine.dispose()
