"""Recovery after ``kill -9`` of a worker: how soon its sessions resume on a new one.

Starts the stack as separate processes: a Temporal dev server (the ``temporal``
binary next to this Python, in memory), a SQLite file in a temp dir (or
``--database-url``), the API (``baton api``) and a worker (``baton worker``).
Publishes an agent whose scripted reply streams slowly (``chunk_delay_ms``), puts
``--sessions`` sessions mid-turn through the API, waits until each has streamed a
few chunks, SIGKILLs the worker and starts a new one at once. Then, per session:

* **resume**: from the kill to the first chunk of the retried model call (a chunk
  event with ``attempt`` ≥ 2: the turn runs again on the new worker);
* **complete**: from the kill to the session's turn completed (status ``idle``),
  checked to have exactly one assistant reply.

With ``--sticky`` the sessions are idle instead, their runs in the killed worker's
sticky cache (their first turn ran there, and nowhere else): the kill is followed by a
message to each, whose workflow task waits on the dead worker's sticky queue for
``BATON_WORKER_STICKY_TIMEOUT`` before the other worker takes it. Then, per session:

* **resume**: from its message sent to the first chunk of its new turn;
* **complete**: from its message sent to its turn completed (two assistant replies).

Printed: median and p95 of both, per round, and over all rounds. Engine settings
come from the environment as usual (``BATON_HEARTBEAT_TIMEOUT``, …); the flags
below override the ones that decide recovery.

Run from the repo root (not part of ``make test``)::

    .venv/bin/python bench/recovery.py
    .venv/bin/python bench/recovery.py --sessions 10 --rounds 3 --heartbeat-timeout 30
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
from sqlalchemy.engine import Engine
from sqlmodel import col, select
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client

ROOT = Path(__file__).resolve().parents[1]
if __name__ == "__main__":
    # `python bench/recovery.py` puts bench/ on sys.path, not the repo root.
    sys.path.insert(0, str(ROOT))

from baton.storage.db import EventRow, MessageRow, SessionRow, make_engine, session_scope  # noqa: E402
from worker.stack import DevServer, free_port, stop_process  # noqa: E402

AGENT = "slow-streamer"


#: A session held in a killed worker's sticky cache answers its next message within 5 s
#: (p95), with another worker polling.
STICKY_P95_S = 5.0


def p95(values: list[float]) -> float:
    """The 95th percentile (nearest rank) of ``values``."""
    ordered = sorted(values)
    return ordered[max(0, round(0.95 * len(ordered)) - 1)]


def spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """A ``baton`` subcommand as a child process (output to ``log``)."""
    out = log.open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "cli", *args],
        cwd=ROOT,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
    )


def chunks(engine: Engine, session_ids: list[str]) -> dict[str, list[tuple[int, datetime]]]:
    """Per session, its chunk events as ``(attempt, created_at)``."""
    out: dict[str, list[tuple[int, datetime]]] = {sid: [] for sid in session_ids}
    with session_scope(engine) as s:
        rows = s.exec(
            select(EventRow).where(
                col(EventRow.session_id).in_(session_ids), EventRow.type == "chunk"
            )
        ).all()
        for r in rows:
            out[r.session_id].append((int(r.data.get("attempt", 1)), r.created_at))
    return out


def idle_and_replies(engine: Engine, session_ids: list[str]) -> dict[str, tuple[str, int]]:
    """Per session: its status and how many assistant messages it holds."""
    with session_scope(engine) as s:
        rows = s.exec(select(SessionRow).where(col(SessionRow.id).in_(session_ids))).all()
        replies = s.exec(
            select(MessageRow.session_id).where(
                col(MessageRow.session_id).in_(session_ids), MessageRow.role == "assistant"
            )
        ).all()
    return {r.id: (r.status, sum(1 for x in replies if x == r.id)) for r in rows}


def polling(env: dict[str, str], pid: int) -> bool:
    """Whether the worker process ``pid`` polls the activity task queue (its identity is
    ``<pid>@<host>``, the SDK's default)."""

    async def ask() -> bool:
        client = await Client.connect(env["BATON_TEMPORAL_ADDRESS"])
        found = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace="default",
                task_queue=TaskQueue(name=env["BATON_TASK_QUEUE"]),
                task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
            )
        )
        return any(p.identity.startswith(f"{pid}@") for p in found.pollers)

    return asyncio.run(ask())


def wait(condition: object, timeout: float, what: str) -> None:
    """Poll ``condition()`` every 50 ms; raises TimeoutError naming ``what``."""
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


@contextlib.contextmanager
def dev_server(
    args: argparse.Namespace, tmp: Path, name: str
) -> Iterator[tuple[DevServer, dict[str, str]]]:
    """An in-memory Temporal dev server for the block, and the environment a ``baton``
    child process needs to use it: the bench's database (``--database-url``, or the SQLite
    file ``<name>.db`` in ``tmp``) and the task queue ``name``."""
    server = DevServer(port=free_port(), ui_port=free_port(), db_file=None)
    server.start()
    try:
        yield (
            server,
            {
                **os.environ,
                "BATON_DATABASE_URL": args.database_url or f"sqlite:///{tmp / f'{name}.db'}",
                "BATON_TEMPORAL_ADDRESS": server.address,
                "BATON_TASK_QUEUE": name,
            },
        )
    finally:
        server.stop()


@contextlib.contextmanager
def stack(args: argparse.Namespace, tmp: Path) -> Iterator[tuple[dict[str, str], str, Engine]]:
    """Dev server + API process; yields (worker env, API base URL, engine)."""
    with dev_server(args, tmp, "recovery") as (_, env):
        if args.heartbeat_timeout is not None:
            env["BATON_HEARTBEAT_TIMEOUT"] = str(args.heartbeat_timeout)
        if args.sticky_timeout is not None:
            env["BATON_WORKER_STICKY_TIMEOUT"] = str(args.sticky_timeout)
        engine = make_engine(env["BATON_DATABASE_URL"])
        try:
            with api_process(env, tmp) as (base, _):
                yield env, base, engine
        finally:
            engine.dispose()


@contextlib.contextmanager
def api_process(env: dict[str, str], tmp: Path) -> Iterator[tuple[str, int]]:
    """`baton db upgrade`, then `baton api` on a free port until it answers ``/healthz``;
    yields (its base URL, its pid) and stops it afterwards."""
    # The API and the workers refuse a database behind the code: migrate it first.
    upgrade = [sys.executable, "-m", "cli", "db", "upgrade"]
    subprocess.run(upgrade, cwd=ROOT, env=env, check=True, capture_output=True)
    api_port = free_port()
    api = spawn(["api", "--port", str(api_port)], env, tmp / "api.log")
    try:
        base = f"http://127.0.0.1:{api_port}"

        def api_up() -> bool:
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
            return False

        wait(api_up, 120, "the API")
        yield base, api.pid
    finally:
        stop_process(api)


def start_sessions(base: str, count: int, n: int) -> list[str]:
    """Start ``count`` sessions of the bench agent (round ``n``) without waiting for them."""
    with httpx.Client(base_url=base, timeout=60) as http:
        sids = []
        for i in range(count):
            r = http.post(
                "/v1/sessions", json={"agent": AGENT, "prompt": f"go {n}.{i}", "sync": False}
            )
            r.raise_for_status()
            sids.append(r.json()["session_id"])
    return sids


def one_round(
    args: argparse.Namespace, env: dict[str, str], base: str, engine: Engine, tmp: Path, n: int
) -> tuple[list[float], list[float]]:
    """Put sessions mid-turn, kill the worker, start another; (resume s, complete s) lists."""
    first = spawn(["worker"], env, tmp / f"worker-{n}a.log")
    second: subprocess.Popen[bytes] | None = None
    try:
        sids = start_sessions(base, args.sessions, n)

        def mid_turn() -> bool:
            return all(len(c) >= 3 for c in chunks(engine, sids).values())

        wait(mid_turn, 120, "every session to stream")
        if not args.cold:
            # Another worker, polling before the kill: what a deployment with 2+ workers has.
            second = spawn(["worker"], env, tmp / f"worker-{n}b.log")
            wait(lambda: polling(env, second.pid), 120, "the second worker to poll")
        killed_at = datetime.now(UTC)
        killed = time.monotonic()
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        if args.cold:
            second = spawn(["worker"], env, tmp / f"worker-{n}b.log")
        done: dict[str, float] = {}

        def all_done() -> bool:
            for sid, (status, replies) in idle_and_replies(engine, sids).items():
                if sid not in done and status == "idle":
                    done[sid] = time.monotonic() - killed
                    if replies != 1:
                        raise AssertionError(f"{sid}: {replies} assistant replies, not 1")
            return len(done) == len(sids)

        wait(all_done, 300, "every session to complete")
        resumed: list[float] = []
        for sid, events in chunks(engine, sids).items():
            later = [at for attempt, at in events if attempt >= 2]
            if not later:
                raise AssertionError(f"{sid}: no chunk of a retried attempt")
            resumed.append((min(later) - killed_at).total_seconds())
        return resumed, list(done.values())
    finally:
        stop_process(first)
        stop_process(second)


def sticky_round(
    args: argparse.Namespace, env: dict[str, str], base: str, engine: Engine, tmp: Path, n: int
) -> tuple[list[float], list[float]]:
    """Idle sessions held in one worker's sticky cache, that worker killed, a message to
    each; (resume s, complete s) lists, from each message sent."""
    first = spawn(["worker"], env, tmp / f"worker-{n}a.log")
    second: subprocess.Popen[bytes] | None = None
    try:
        wait(lambda: polling(env, first.pid), 120, "the first worker to poll")
        sids = start_sessions(base, args.sessions, n)

        def idle() -> bool:
            return all(st == "idle" for st, _ in idle_and_replies(engine, sids).values())

        wait(idle, 300, "every first turn to end")
        second = spawn(["worker"], env, tmp / f"worker-{n}b.log")
        wait(lambda: polling(env, second.pid), 120, "the second worker to poll")
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        sent = asyncio.run(_send_all(base, sids, n))
        done: dict[str, float] = {}

        def all_done() -> bool:
            for sid, (status, replies) in idle_and_replies(engine, sids).items():
                if sid not in done and status == "idle" and replies >= 2:
                    done[sid] = (datetime.now(UTC) - sent[sid]).total_seconds()
                    if replies != 2:
                        raise AssertionError(f"{sid}: {replies} assistant replies, not 2")
            return len(done) == len(sids)

        wait(all_done, 300, "every second turn to complete")
        resumed: list[float] = []
        for sid, events in chunks(engine, sids).items():
            later = [at for _, at in events if at > sent[sid]]
            if not later:
                raise AssertionError(f"{sid}: no chunk of its second turn")
            resumed.append((min(later) - sent[sid]).total_seconds())
        return resumed, list(done.values())
    finally:
        stop_process(first)
        stop_process(second)


async def _send_all(base: str, sids: list[str], n: int) -> dict[str, datetime]:
    """A message to each session at once (each POST waits for its workflow task to be
    taken); when each was sent."""
    sent: dict[str, datetime] = {}
    async with httpx.AsyncClient(base_url=base, timeout=120) as http:

        async def one(sid: str) -> None:
            sent[sid] = datetime.now(UTC)
            body = {"prompt": f"again {n}", "sync": False}
            (await http.post(f"/v1/sessions/{sid}/messages", json=body)).raise_for_status()

        await asyncio.gather(*(one(sid) for sid in sids))
    return sent


def publish(base: str, args: argparse.Namespace) -> None:
    """The slow agent: ``--words`` words, ``--chunk-delay-ms`` apart."""
    reply = " ".join(f"w{i}" for i in range(args.words))
    spec = {"playbook": [{"reply": reply, "chunk_delay_ms": args.chunk_delay_ms}]}
    with httpx.Client(base_url=base, timeout=60) as http:
        http.post("/v1/agents", json={"slug": AGENT, "name": "Slow streamer", "spec": spec})
        http.put(f"/v1/agents/{AGENT}/draft", json=spec).raise_for_status()
        http.post(f"/v1/agents/{AGENT}/publish").raise_for_status()


def main() -> None:
    """Parse flags, run the rounds, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", "--sessions", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--words",
        type=int,
        default=None,
        help="words in the streamed reply (default 250: the stream must outlast the second "
        "worker's start-up; 40 with --cold)",
    )
    parser.add_argument("--chunk-delay-ms", type=int, default=100)
    parser.add_argument("--heartbeat-timeout", type=float, default=None, help="seconds")
    parser.add_argument("--database-url", default=None)
    parser.add_argument(
        "--cold",
        action="store_true",
        help="start the new worker after the kill (its start-up counts) instead of before",
    )
    parser.add_argument(
        "--sticky",
        action="store_true",
        help="kill a worker holding idle sessions in its sticky cache, then message them",
    )
    parser.add_argument(
        "--sticky-timeout", type=float, default=None, help="BATON_WORKER_STICKY_TIMEOUT, seconds"
    )
    args = parser.parse_args()
    if args.words is None:
        args.words = 20 if args.sticky else 40 if args.cold else 250
    with tempfile.TemporaryDirectory(prefix="baton-recovery-") as d:
        tmp = Path(d)
        resumed: list[float] = []
        completed: list[float] = []
        with stack(args, tmp) as (env, base, engine):
            publish(base, args)
            for n in range(1, args.rounds + 1):
                run = sticky_round if args.sticky else one_round
                r, c = run(args, env, base, engine, tmp, n)
                resumed += r
                completed += c
                print(
                    f"round {n}: resume median {statistics.median(r):5.1f} s  p95 {p95(r):5.1f} s"
                    f" | complete median {statistics.median(c):5.1f} s  p95 {p95(c):5.1f} s",
                    flush=True,
                )
    hb = args.heartbeat_timeout or os.environ.get("BATON_HEARTBEAT_TIMEOUT", "default")
    mode = "new worker started after the kill" if args.cold else "another worker polling"
    if args.sticky:
        sticky = args.sticky_timeout or os.environ.get("BATON_WORKER_STICKY_TIMEOUT", "default")
        mode = f"idle sessions in the killed worker's sticky cache (sticky timeout {sticky})"
    print(
        f"\n{len(resumed)} sessions, heartbeat timeout {hb}, {mode}: "
        f"resume median {statistics.median(resumed):.1f} s, p95 {p95(resumed):.1f} s; "
        f"complete median {statistics.median(completed):.1f} s, p95 {p95(completed):.1f} s"
    )
    if args.sticky:
        met = p95(resumed) <= STICKY_P95_S
        print(
            f"\n== targets ==\n  resume after kill -9, sticky   p95 {p95(resumed):.1f} s   "
            f"target <= {STICKY_P95_S:g} s: {'MET' if met else 'NOT MET'}"
        )


if __name__ == "__main__":
    main()
