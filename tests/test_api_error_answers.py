"""A failure the API maps (PostgreSQL gone: 503 ``database_unavailable``) or does not map
(500 ``internal_error``) is answered as problem+json with one log record, and the client's
keep-alive connection stays open for its next request: the exception stops at Baton's
handlers instead of being re-raised to uvicorn, which logged it again and closed the
connection."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import httpx
import pytest
from fastapi import FastAPI

from api.app import create_app
from baton.settings import Settings
from tests.conftest import migrated, pg_cluster, serve
from tests.test_api_agents import assert_problem


class Records(logging.Handler):
    """Every record of the loggers it is attached to."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def records() -> Iterator[Records]:
    """Records of Baton's API logger and of uvicorn's error logger (where an exception that
    reaches the server is logged as 'Exception in ASGI application')."""
    handler = Records()
    loggers = [logging.getLogger(name) for name in ("baton.api", "uvicorn.error")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield handler
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


def _local_port(resp: httpx.Response) -> int:
    """The client-side port of the connection ``resp`` came on (same port: same connection)."""
    stream = resp.extensions["network_stream"]
    port: int = stream.get_extra_info("client_addr")[1]
    return port


def _serve(app: FastAPI) -> Iterator[httpx.Client]:
    server, thread, base = serve(app)
    try:
        with httpx.Client(base_url=base, timeout=30) as http:
            yield http
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_a_stopped_postgresql_is_a_503_on_a_connection_that_stays_open(
    records: Records,
) -> None:
    """With PostgreSQL stopped under a running API, each request needing it is 503
    ``database_unavailable`` with one warning line and no traceback; the next request on
    the same keep-alive connection is answered (it failed with a read error before)."""
    with pg_cluster() as pg:
        settings = Settings(database_url=migrated(pg.url))
        for http in _serve(create_app(settings)):
            assert http.get("/v1/agents").status_code == 200
            pg.stop()
            first = http.get("/v1/agents")
            assert_problem(first, 503, "database_unavailable")
            second = http.get("/v1/sessions")
            assert_problem(second, 503, "database_unavailable")
            alive = http.get("/healthz")
            assert alive.status_code == 200
            assert _local_port(first) == _local_port(second) == _local_port(alive)
    warned = [r for r in records.records if r.name == "baton.api"]
    assert [r.levelno for r in warned] == [logging.WARNING, logging.WARNING], warned
    assert "database error" in warned[0].getMessage()
    assert not [r for r in records.records if r.exc_info], "a traceback was logged"


def test_an_unexpected_error_is_a_500_logged_once_on_a_connection_that_stays_open(
    records: Records, settings: Settings
) -> None:
    """A route raising an exception nothing maps answers 500 ``internal_error`` (no detail of
    the failure), logged once with its traceback by Baton and not again by uvicorn; the
    connection serves the next request."""
    migrated(settings.database_url)
    app = create_app(settings)

    def boom() -> None:
        raise RuntimeError("the secret detail of a bug")

    app.add_api_route("/boom", boom)
    for http in _serve(app):
        failed = http.get("/boom")
        body = assert_problem(failed, 500, "internal_error")
        assert "secret detail" not in failed.text and body["title"] == "Internal server error"
        alive = http.get("/healthz")
        assert alive.status_code == 200
        assert _local_port(failed) == _local_port(alive)
    logged = [r for r in records.records if r.exc_info]
    assert [(r.name, r.getMessage()) for r in logged] == [
        ("baton.api", "unhandled error on GET /boom")
    ]
