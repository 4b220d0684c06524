"""A real Baton worker process that SIGKILLs itself right after one activity's work.

``python -m tests.crash_worker ACTIVITY MARKER``: the worker runs every Baton activity;
the first time ``ACTIVITY`` finishes (its transaction committed) it writes ``MARKER`` and
kills its own process before Temporal can record the result: the window in which
the work is done but not recorded, so the retry must find it.
Configured like ``baton worker`` (BATON_* variables).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

from baton.settings import get_settings
from baton.storage.db import make_engine
from worker.factory import build_worker, connect


class _KillAfter(ActivityInboundInterceptor):
    def __init__(self, nxt: ActivityInboundInterceptor, name: str, marker: Path) -> None:
        super().__init__(nxt)
        self._name = name
        self._marker = marker

    def _after(self) -> None:
        if activity.info().activity_type == self._name and not self._marker.exists():
            self._marker.write_text("killed")
            os.kill(os.getpid(), signal.SIGKILL)

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        result = await self.next.execute_activity(input)
        self._after()
        return result


class KillAfter(Interceptor):
    """Kills the worker process after the first run of one activity."""

    def __init__(self, name: str, marker: Path) -> None:
        self._name = name
        self._marker = marker

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _KillAfter(next, self._name, self._marker)


async def main(name: str, marker: Path) -> None:
    settings = get_settings()
    client = await connect(settings)
    engine = make_engine(settings.database_url)
    worker = build_worker(
        client,
        engine=engine,
        task_queue=settings.task_queue,
        interceptors=[KillAfter(name, marker)],
        review_key=settings.review_key(),
        sticky_timeout=timedelta(seconds=settings.worker_sticky_timeout),
    )
    await worker.run()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2])))
