"""Shared FastAPI dependencies."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlmodel import Session


def get_session(request: Request) -> Iterator[Session]:
    """A DB session for one request; routes commit explicitly, anything else rolls back."""
    with Session(request.app.state.engine, expire_on_commit=False) as session:
        try:
            yield session
        finally:
            session.rollback()


SessionDep = Annotated[Session, Depends(get_session)]
