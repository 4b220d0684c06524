"""Logging is the application's: no library installs a root handler, and workflow code's
log records never run a handler inside the workflow sandbox."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator

from api.app import create_app
from worker.factory import SDK_LOGGER, route_sdk_logs_off_the_sandbox


@contextlib.contextmanager
def bare_root() -> Iterator[logging.Logger]:
    """The root logger with no handlers (as in a fresh `baton dev` process), restored after
    (inside the test body: pytest adds its capture handlers around the call)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    root.handlers[:] = []
    try:
        yield root
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def test_building_the_api_installs_no_root_logging_handler() -> None:
    """create_app (which builds the MCP server) leaves the root logger's handlers and level
    as they were: the MCP SDK's basicConfig put a Rich handler there."""
    with bare_root() as root:
        level = root.level
        create_app()
        assert root.handlers == []
        assert root.level == level


class _Threads(logging.Handler):
    """Records the thread each record is handled on."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[str] = []
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.threads.append(threading.current_thread().name)
        self.seen.set()


def test_sdk_log_records_reach_the_root_handlers_from_another_thread() -> None:
    """A record of the SDK's logger tree (``workflow.logger`` is ``temporalio.workflow``)
    reaches the root handlers once, on the listener's thread, not on the logging one."""
    route_sdk_logs_off_the_sandbox()
    route_sdk_logs_off_the_sandbox()  # once per process, however many workers are built
    seen = _Threads()
    with bare_root() as root:
        root.addHandler(seen)
        logging.getLogger(f"{SDK_LOGGER}.workflow").warning("from workflow code")
        assert seen.seen.wait(30)
    assert len(seen.threads) == 1
    assert seen.threads[0] != threading.current_thread().name
    assert logging.getLogger(SDK_LOGGER).propagate is False
