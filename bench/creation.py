"""Session creation at the engine's own rate: Baton's ``POST /v1/sessions`` against the bare
floor, with the API, the worker and Temporal each a process of its own.

One in-memory Temporal dev server (``worker.stack.DevServer``, as ``baton dev`` starts
it), a SQLite file in a temp dir (or ``--database-url``), and three more processes:

* **bare**: a worker process running ``bench/systems.py``'s ``BenchBareTurn`` (a
  workflow that runs one no-op activity and returns), started from this process with
  ``client.execute_workflow``: a start, one activity, the completion;
* **baton**: ``baton api`` and ``baton worker`` processes, sessions created by
  ``POST /v1/sessions`` with ``sync: true`` over HTTP (the session recorded, its
  workflow started with its first message, the first turn answered by the scripted
  offline model, the reply returned).

Both run at each ``--clients`` level (16 and 64 by default), ``--sessions`` creations per
level and round, rounds interleaved. Printed per level: creations/s and their ratio to
bare's in the same round, p50/p95 of one creation, and the CPU each process spent per
creation (from ``/proc``); then the history events of a new session and of one more
turn, against bare's. Targets (issue "close to the floor"): at 16 clients ≥ 0.9x bare's
rate, p95 ≤ 2x bare's p95, Baton's worker + API CPU ≤ 30 ms per session.

Run from the repo root (not part of ``make test``)::

    .venv/bin/python bench/creation.py
    .venv/bin/python bench/creation.py --clients 16 --sessions 200 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from temporalio.client import Client

ROOT = Path(__file__).resolve().parents[1]
if __name__ == "__main__":
    # `python bench/creation.py` puts bench/ on sys.path, not the repo root.
    sys.path.insert(0, str(ROOT))

from bench.recovery import api_process, dev_server, p95, polling, spawn, wait  # noqa: E402
from worker.stack import stop_process  # noqa: E402

AGENT = "creation-bench"
BARE_QUEUE = "creation-bare"
BARE_WORKER = """
import asyncio, sys
from temporalio.client import Client
from temporalio.worker import Worker
sys.path.insert(0, sys.argv[3])
from bench.systems import BareTurn, noop

async def main(address, queue):
    client = await Client.connect(address)
    async with Worker(client, task_queue=queue, workflows=[BareTurn], activities=[noop]):
        print("ready", flush=True)
        await asyncio.Event().wait()

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""
#: Targets at 16 clients: rate ratio to bare, p95 ratio to bare, worker + API CPU per session.
RATE_RATIO, P95_RATIO, CPU_PER_SESSION_MS = 0.9, 2.0, 30.0


def cpu_s(pid: int) -> float:
    """User + system CPU seconds the process ``pid`` has spent (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Level:
    """What one system did at one ``--clients`` level, over the rounds."""

    rates: list[float] = field(default_factory=list)
    took: list[float] = field(default_factory=list)
    cpu: dict[str, list[float]] = field(default_factory=dict)


@dataclass
class Stack:
    """The processes: the dev server's, the bare worker's, Baton's API and worker."""

    address: str
    base: str
    pids: dict[str, int]


@contextlib.contextmanager
def processes(args: argparse.Namespace, tmp: Path) -> Iterator[Stack]:
    """The dev server, the bare worker, `baton api` and `baton worker`, all ready."""
    with dev_server(args, tmp, "creation") as (server, env):
        worker = spawn(["worker"], env, tmp / "worker.log")
        bare = subprocess.Popen(
            [sys.executable, "-c", BARE_WORKER, server.address, BARE_QUEUE, str(ROOT)],
            stdout=subprocess.PIPE,
        )
        try:
            with api_process(env, tmp) as (base, api):
                wait(lambda: polling(env, worker.pid), 120, "Baton's worker to poll")
                assert bare.stdout is not None
                assert bare.stdout.readline().strip() == b"ready"
                assert server._proc is not None
                pids = {"temporal": server._proc.pid, "api": api, "worker": worker.pid}
                yield Stack(server.address, base, pids | {"bare worker": bare.pid})
        finally:
            for proc in (bare, worker):
                stop_process(proc)


async def burst(
    create: Callable[[int], Awaitable[None]], clients: int, total: int
) -> tuple[float, list[float]]:
    """``total`` creations by ``clients`` concurrent loops; (wall s, each one's s)."""
    took: list[float] = []
    counter = iter(range(total))

    async def loop() -> None:
        for i in counter:
            t = time.perf_counter()
            await create(i)
            took.append(time.perf_counter() - t)

    start = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(clients)))
    return time.perf_counter() - start, took


async def run(args: argparse.Namespace, stack: Stack) -> None:
    """Warm both systems up, then the rounds; print the figures and the targets."""
    client = await Client.connect(stack.address)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=stack.base, timeout=300, limits=limits) as http:
        spec = {"playbook": [{"reply": "ok"}]}
        body = {"slug": AGENT, "name": "Creation bench", "spec": spec}
        (await http.post("/v1/agents", json=body)).raise_for_status()
        (await http.post(f"/v1/agents/{AGENT}/publish")).raise_for_status()
        created: list[str] = []

        async def baton(i: int) -> None:
            r = await http.post(
                "/v1/sessions", json={"agent": AGENT, "prompt": f"hello {i}", "sync": True}
            )
            r.raise_for_status()
            created.append(r.json()["session_id"])

        bare_ids: list[str] = []

        async def bare(i: int) -> None:
            wid = f"bare-{uuid.uuid4()}"
            await client.execute_workflow(
                "BenchBareTurn", f"hello {i}", id=wid, task_queue=BARE_QUEUE
            )
            bare_ids.append(wid)

        systems = {"bare": bare, "baton": baton}
        for create in systems.values():  # untimed: imports, caches, connections
            await burst(create, 4, args.warmup)
        levels = {(n, c): Level() for n in systems for c in args.clients}
        for rnd in range(args.rounds):
            order = list(systems) if rnd % 2 == 0 else list(reversed(systems))
            for clients in args.clients:
                for name in order:
                    before = {k: cpu_s(pid) for k, pid in stack.pids.items()}
                    wall, took = await burst(systems[name], clients, args.sessions)
                    after = {k: cpu_s(pid) for k, pid in stack.pids.items()}
                    level = levels[(name, clients)]
                    level.rates.append(args.sessions / wall)
                    level.took += took
                    for k in before:
                        per = 1000 * (after[k] - before[k]) / args.sessions
                        level.cpu.setdefault(k, []).append(per)
                    print(
                        f"round {rnd + 1}  {name:<5} {clients:>3} clients  "
                        f"{args.sessions / wall:6.1f}/s",
                        flush=True,
                    )
        history = await events(client, http, created[-1], bare_ids[-1])
    report(args, levels, history)


async def events(client: Client, http: httpx.AsyncClient, sid: str, bare_id: str) -> str:
    """History events of a new session after its first turn, of one more turn, and of
    one bare run."""
    first = len((await client.get_workflow_handle(sid).fetch_history()).events)
    r = await http.post(f"/v1/sessions/{sid}/messages", json={"prompt": "again", "sync": True})
    r.raise_for_status()
    second = len((await client.get_workflow_handle(sid).fetch_history()).events)
    bare = len((await client.get_workflow_handle(bare_id).fetch_history()).events)
    return (
        f"history events: a new session after its first turn {first}, one more turn "
        f"+{second - first}; a bare run {bare}"
    )


def report(args: argparse.Namespace, levels: dict[tuple[str, int], Level], history: str) -> None:
    """The figures per level, then the targets at the first level."""
    print(f"\n== session creation ({args.rounds} rounds x {args.sessions}, order rotating) ==")
    for clients in args.clients:
        floor = levels[("bare", clients)]
        for name in ("bare", "baton"):
            lv = levels[(name, clients)]
            ratio = statistics.median(lv.rates) / statistics.median(floor.rates)
            cpu = "  ".join(f"{k} {statistics.median(v):5.1f}" for k, v in lv.cpu.items())
            print(
                f"  {clients:>3} clients  {name:<5} {statistics.median(lv.rates):6.1f}/s "
                f"{ratio:5.2f}x bare  p50 {1000 * statistics.median(lv.took):7.1f} ms  "
                f"p95 {1000 * p95(lv.took):7.1f} ms   CPU ms per creation: {cpu}"
            )
    print(f"  {history}")
    clients = args.clients[0]
    bare, baton = levels[("bare", clients)], levels[("baton", clients)]
    rate = statistics.median(baton.rates) / statistics.median(bare.rates)
    tail = p95(baton.took) / p95(bare.took)
    spent = statistics.median(baton.cpu["api"]) + statistics.median(baton.cpu["worker"])

    def verdict(ok: bool) -> str:
        return "MET" if ok else "NOT MET"

    print("\n== targets ==")
    print(
        f"  rate at {clients} clients   {rate:5.2f}x bare   "
        f"target >= {RATE_RATIO}x: {verdict(rate >= RATE_RATIO)}"
    )
    print(
        f"  p95 at {clients} clients    {tail:5.2f}x bare   "
        f"target <= {P95_RATIO}x: {verdict(tail <= P95_RATIO)}"
    )
    print(
        f"  API + worker CPU   {spent:5.1f} ms per session   "
        f"target <= {CPU_PER_SESSION_MS:g} ms: {verdict(spent <= CPU_PER_SESSION_MS)}"
    )


def main() -> None:
    """Parse flags, start the processes, run the bench."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--clients", default="16,64", help="concurrent clients per level (comma-separated)"
    )
    parser.add_argument("--sessions", type=int, default=160, help="creations per level and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=20, help="untimed creations per system")
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()
    args.clients = [int(c) for c in args.clients.split(",")]
    with tempfile.TemporaryDirectory(prefix="baton-creation-") as d, processes(args, Path(d)) as s:
        asyncio.run(run(args, s))


if __name__ == "__main__":
    main()
