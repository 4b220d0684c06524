"""Shared FastAPI dependencies."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.engine import Engine
from sqlmodel import Session
from temporalio.client import Client

from baton.errors import EngineUnavailable
from baton.settings import Settings

log = logging.getLogger("baton.api")


def get_session(request: Request) -> Iterator[Session]:
    """A DB session for one request; routes commit explicitly, anything else rolls back."""
    with Session(request.app.state.engine, expire_on_commit=False) as session:
        try:
            yield session
        finally:
            session.rollback()


def get_engine(request: Request) -> Engine:
    engine: Engine = request.app.state.engine
    return engine


def get_settings_dep(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_temporal(request: Request) -> Client:
    """The app's Temporal client, connecting on first use; 503 ``engine_unavailable`` if down."""
    state = request.app.state
    if state.temporal is None:
        async with state.temporal_lock:
            if state.temporal is None:
                from worker.factory import connect

                try:
                    state.temporal = await asyncio.wait_for(connect(state.settings), timeout=10)
                except Exception as exc:
                    log.warning("Temporal unavailable: %s", exc)
                    msg = f"cannot reach Temporal at {state.settings.temporal_address}"
                    raise EngineUnavailable(msg) from exc
    client: Client = state.temporal
    return client


SessionDep = Annotated[Session, Depends(get_session)]
EngineDep = Annotated[Engine, Depends(get_engine)]
SettingsDep = Annotated[Settings, Depends(get_settings_dep)]
TemporalDep = Annotated[Client, Depends(get_temporal)]
