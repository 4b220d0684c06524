"""Worker memory of many idle sessions: runs held open (as before) vs completed idle.

The scale target: 10,000 idle sessions held by one worker, worker RSS <= 500 MB. An
idle session's run completes after ``BATON_SESSION_IDLE_TIMEOUT``, so
an idle session should hold nothing in the worker. This measures it.

The stack: a Temporal dev server (the ``temporal`` binary next to this Python, in
memory), a SQLite file in a temp dir (or ``--database-url``), and per phase a fresh
``baton worker`` child process, so the RSS read from ``/proc/<pid>/status`` is the
worker's alone. This process launches the sessions itself through
``baton.runs.launch.launch_session`` (``sync``: each first turn answered), ``--concurrency``
at a time, with an instant scripted agent. Two phases, each on its own task queue:

* **held**: ``--sessions`` sessions whose config has ``idle_timeout_s=None`` — what every
  session did before: its run stays open (RUNNING) forever, waiting for a message;
* **completed**: as many sessions with ``idle_timeout_s=--idle-timeout``: each run
  completes that long after its turn.

Per phase: worker RSS once it polls, after the last session's first turn, and (completed)
after the idle timeout has passed for every session; RUNNING workflows of the phase's
queue (visibility); then the next message to ``--probe`` of the sessions, one at a time
(p50/p95): a cached or evicted open run vs a completed run started again
(update-with-start); and ``--restart-parts`` completed sessions' restarts timed part by
part (the refused Update, the resume read, the update-with-start, then an Update to the
open run for comparison).

Run from the repo root (not part of ``make test``)::

    .venv/bin/python bench/idle.py                       # 2,000 sessions per phase
    .venv/bin/python bench/idle.py --sessions 10000 --concurrency 48 --no-held
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if __name__ == "__main__":
    # `python bench/idle.py` puts bench/ on sys.path, not the repo root.
    sys.path.insert(0, str(ROOT))

from sqlalchemy.engine import Engine  # noqa: E402
from temporalio.api.enums.v1 import TaskQueueType  # noqa: E402
from temporalio.api.taskqueue.v1 import TaskQueue  # noqa: E402
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest  # noqa: E402
from temporalio.client import Client, WithStartWorkflowOperation  # noqa: E402
from temporalio.client import WorkflowUpdateStage as Stage  # noqa: E402
from temporalio.contrib.pydantic import pydantic_data_converter  # noqa: E402
from temporalio.service import RPCError  # noqa: E402

from baton.agents import registry  # noqa: E402
from baton.agents.spec import AgentSpec  # noqa: E402
from baton.contracts.workflow_io import Provenance, SessionConfig, UserMessage  # noqa: E402
from baton.errors import AgentNotFound, EngineUnavailable  # noqa: E402
from baton.runs import launch  # noqa: E402
from baton.settings import Settings  # noqa: E402
from baton.storage.db import init_db, make_engine, session_scope  # noqa: E402
from worker.stack import DevServer, free_port, stop_process  # noqa: E402

AGENT = "idle-bench"
#: The parts of a restart that ``--restart-parts`` times.
RESTART_PARTS = (
    "the Update to the completed run (refused NOT_FOUND)",
    "reading the resume point",
    "update-with-start of the next run, to the reply",
    "for comparison: an Update to the open run, to the reply",
)
#: Tries of one launch refused by Temporal (EngineUnavailable: transient under load).
LAUNCH_ATTEMPTS = 5
TARGET_MB = 500.0
ACCEPTED = Stage.ACCEPTED


def rss_mb(pid: int) -> float:
    """Resident set size of process ``pid`` in MB (``VmRSS`` of /proc/<pid>/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def pct(values: list[float], p: float) -> float:
    """The ``p``-th percentile (nearest rank)."""
    ordered = sorted(values)
    return ordered[max(0, round(p / 100 * len(ordered)) - 1)]


async def polling(client: Client, queue: str, pid: int) -> bool:
    """Whether worker ``pid`` polls ``queue``'s workflow tasks (identity ``<pid>@host``)."""
    found = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
        )
    )
    return any(p.identity.startswith(f"{pid}@") for p in found.pollers)


async def running(client: Client, queue: str) -> int:
    """RUNNING workflows of ``queue`` (visibility: it lags a moment)."""
    found = await client.count_workflows(f"TaskQueue = '{queue}' AND ExecutionStatus = 'Running'")
    return found.count


async def launch_all(
    client: Client,
    engine: Engine,
    queue: str,
    config: SessionConfig,
    n: int,
    concurrency: int,
    *,
    agent: str = AGENT,
    prompt: str = "hello",
    sync: bool = True,
) -> list[str]:
    """Start ``n`` sessions of ``agent``, ``concurrency`` at a time; their ids. ``sync``:
    each launch returns with its first turn answered, else once the turn is accepted."""
    gate = asyncio.Semaphore(concurrency)
    started = time.monotonic()
    done = retried = 0

    async def one(i: int) -> str:
        nonlocal done, retried
        sid = f"session-{uuid.uuid4()}"
        async with gate:
            for attempt in range(1, LAUNCH_ATTEMPTS + 1):
                try:
                    # Idempotent ids, as a delegation launches: a retry attaches to the first.
                    launched = await launch.launch_session(
                        client,
                        engine,
                        task_queue=queue,
                        config=config,
                        ref=agent,
                        prompt=f"{prompt} {i}",
                        provenance=Provenance(),
                        sync=sync,
                        session_id=sid,
                        update_id=f"{sid}:message-1",
                    )
                    break
                except EngineUnavailable:  # e.g. a workflow task timed out under load
                    if attempt == LAUNCH_ATTEMPTS:
                        raise
                    retried += 1
                    await asyncio.sleep(attempt)
        done += 1
        if done % 1000 == 0:
            rate = done / (time.monotonic() - started)
            print(f"    {done} sessions ({rate:.0f}/s)", flush=True)
        return launched.session_id

    ids = list(await asyncio.gather(*(one(i) for i in range(n))))
    if retried:
        print(f"    {retried} launches retried (Temporal refused them for a moment)", flush=True)
    return ids


async def probe(client: Client, engine: Engine, ids: list[str], count: int) -> list[float]:
    """Seconds for the next message to each of ``count`` random sessions, one at a time."""
    took = []
    for sid in random.sample(ids, min(count, len(ids))):
        t0 = time.perf_counter()
        _, text = await launch.send_message(
            client, engine, session_id=sid, prompt="again", sync=True
        )
        took.append(time.perf_counter() - t0)
        assert text, sid
    return took


async def restart_parts(client: Client, engine: Engine, ids: list[str]) -> dict[str, float]:
    """p50 ms of the parts of ``deliver_update`` restarting each completed session in
    ``ids``: the Update its completed run refuses, the resume read, the update-with-start
    to the reply; then an Update to the now open run, to the reply, for comparison."""
    parts: dict[str, list[float]] = {k: [] for k in RESTART_PARTS}
    for sid in ids:
        arg = UserMessage(prompt="again")
        t0 = time.perf_counter()
        try:
            await client.get_workflow_handle(sid).start_update(
                launch.UPDATE, arg, id=str(uuid.uuid4()), wait_for_stage=ACCEPTED
            )
            raise RuntimeError(f"{sid}: its run was still open")
        except RPCError:
            pass
        t1 = time.perf_counter()
        point, name = await asyncio.to_thread(launch._resume_point, engine, sid)
        t2 = time.perf_counter()
        start: WithStartWorkflowOperation[Any, Any] = WithStartWorkflowOperation(
            launch.WORKFLOW, point.input, **launch._restart_options(point, name, client.namespace)
        )
        await client.execute_update_with_start_workflow(
            launch.UPDATE, arg, start_workflow_operation=start, id=str(uuid.uuid4())
        )
        t3 = time.perf_counter()
        await client.get_workflow_handle(sid).execute_update(
            launch.UPDATE, arg, id=str(uuid.uuid4())
        )
        t4 = time.perf_counter()
        for key, took in zip(RESTART_PARTS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            parts[key].append(took)
    return {k: statistics.median(v) * 1000 for k, v in parts.items()}


async def phase(
    name: str,
    args: argparse.Namespace,
    client: Client,
    engine: Engine,
    env: dict[str, str],
    tmp: Path,
) -> dict[str, float]:
    """One phase with its own worker process; returns its figures."""
    queue = f"idle-bench-{name}-{uuid.uuid4().hex[:6]}"
    idle = None if name == "held" else args.idle_timeout
    config = Settings().session_config().model_copy(update={"idle_timeout_s": idle})
    log = (tmp / f"worker-{name}.log").open("ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", "worker"],
        cwd=ROOT,
        env={**env, "BATON_TASK_QUEUE": queue},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 120
        while not await polling(client, queue, proc.pid):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"worker did not start; see {log.name}")
            await asyncio.sleep(0.2)
        await asyncio.sleep(2)  # let start-up allocation settle
        figures = {"start": rss_mb(proc.pid)}
        print(f"  {name}: worker up, RSS {figures['start']:.0f} MB; launching", flush=True)
        t0 = time.monotonic()
        ids = await launch_all(client, engine, queue, config, args.sessions, args.concurrency)
        figures["launch_s"] = time.monotonic() - t0
        await asyncio.sleep(2)
        figures["after_turns"] = rss_mb(proc.pid)
        figures["running_after_turns"] = await running(client, queue)
        if idle is not None:
            # The last session went idle just now: wait out its timeout, then let the
            # worker finish the completions.
            await asyncio.sleep(idle + args.settle)
            deadline = time.monotonic() + 300
            while (left := await running(client, queue)) > 0 and time.monotonic() < deadline:
                await asyncio.sleep(1)
            figures["after_idle"] = rss_mb(proc.pid)
            figures["running_after_idle"] = left
        if idle is not None and args.restart_parts:
            # Sessions the probes below do not touch (they would be open again).
            parts = await restart_parts(client, engine, ids[-args.restart_parts :])
            figures.update({f"part:{k}": v for k, v in parts.items()})
            ids = ids[: -args.restart_parts]
        took = await probe(client, engine, ids, args.probe)
        figures["probe_p50_ms"] = statistics.median(took) * 1000
        figures["probe_p95_ms"] = pct(took, 95) * 1000
        figures["after_probe"] = rss_mb(proc.pid)
        return figures
    finally:
        stop_process(proc, timeout=30)
        log.close()


def report(args: argparse.Namespace, held: dict[str, float] | None, done: dict[str, float]) -> None:
    n = args.sessions
    print()
    print(
        f"{n} sessions per phase, concurrency {args.concurrency}, idle timeout "
        f"{args.idle_timeout:g} s, {args.probe} probe messages"
    )
    print(f"{'':32}{'held (before)':>16}{'completed idle':>16}")

    def line(label: str, a: float | None, b: float | None, unit: str = "MB") -> None:
        fa = f"{a:.0f} {unit}" if a is not None else "-"
        fb = f"{b:.0f} {unit}" if b is not None else "-"
        print(f"  {label:<30}{fa:>16}{fb:>16}")

    h = held or {}
    line("worker RSS at start", h.get("start"), done["start"])
    line("RSS after every first turn", h.get("after_turns"), done["after_turns"])
    line("RSS once idle", h.get("after_turns"), done["after_idle"])
    line("RSS after the probes", h.get("after_probe"), done["after_probe"])
    line("RUNNING runs once idle", h.get("running_after_turns"), done["running_after_idle"], "")
    line("launch wall time", h.get("launch_s"), done["launch_s"], "s")
    line("next message p50", h.get("probe_p50_ms"), done["probe_p50_ms"], "ms")
    line("next message p95", h.get("probe_p95_ms"), done["probe_p95_ms"], "ms")
    grown_done = done["after_idle"] - done["start"]
    per_done = f"{grown_done * 1024 / n:.1f} KB per session"
    if held is not None:
        grown_held = held["after_turns"] - held["start"]
        per_held = f"{grown_held * 1024 / n:.1f} KB per session"
        print(f"  idle growth over start: held {grown_held:.0f} MB ({per_held}), ", end="")
    else:
        print("  idle growth over start: ", end="")
    print(f"completed {grown_done:.0f} MB ({per_done})")
    met = "MET" if done["after_idle"] <= TARGET_MB else "NOT MET"
    print(
        f"  target: worker RSS <= {TARGET_MB:.0f} MB with {n} idle sessions: "
        f"{done['after_idle']:.0f} MB  {met}"
    )
    if held is not None:
        ratio = done["probe_p50_ms"] / held["probe_p50_ms"]
        print(f"  next message, restart vs open run: {ratio:.2f}x (p50)")
    if f"part:{RESTART_PARTS[0]}" in done:
        print(f"  a restart, part by part ({args.restart_parts} sessions, p50):")
        for key in RESTART_PARTS:
            print(f"    {key:<58}{done[f'part:{key}']:7.1f} ms")


async def run(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="baton-idle-bench-"))
    server = DevServer(port=free_port(), ui_port=free_port(), db_file=None)
    server.start()
    db_url = args.database_url or f"sqlite:///{tmp / 'idle.db'}"
    engine = make_engine(db_url)
    init_db(engine)
    with session_scope(engine) as s:
        spec = AgentSpec.model_validate({"playbook": [{"reply": "ok"}]})
        try:
            registry.get_agent(s, slug=AGENT)
        except AgentNotFound:  # a --database-url that has seen an earlier run keeps it
            registry.create_agent(s, slug=AGENT, name="Idle bench", spec=spec)
            registry.publish(s, slug=AGENT)
    env = {
        **os.environ,
        "BATON_DATABASE_URL": db_url,
        "BATON_TEMPORAL_ADDRESS": server.address,
    }
    client = await Client.connect(server.address, data_converter=pydantic_data_converter)
    print(f"dev server {server.address}; DB {engine.url.render_as_string(hide_password=True)}")
    try:
        held = await phase("held", args, client, engine, env, tmp) if args.held else None
        done = await phase("completed", args, client, engine, env, tmp)
    finally:
        engine.dispose()
        server.stop()
    report(args, held, done)
    print(f"(logs in {tmp})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--sessions", "-n", type=int, default=2000, help="sessions per phase")
    p.add_argument("--concurrency", "-c", type=int, default=32, help="launches in flight")
    p.add_argument(
        "--idle-timeout", type=float, default=30.0, help="idle timeout of the completed phase (s)"
    )
    p.add_argument("--settle", type=float, default=10.0, help="seconds past the idle timeout")
    p.add_argument("--probe", type=int, default=50, help="sessions sent a next message")
    p.add_argument(
        "--restart-parts",
        type=int,
        default=20,
        help="completed sessions whose restart is timed part by part (0: skip)",
    )
    p.add_argument("--database-url", help="Baton's DB (default: a SQLite file in a temp dir)")
    p.add_argument(
        "--no-held",
        dest="held",
        action="store_false",
        help="skip the held phase (the old behaviour), e.g. for 10,000 sessions",
    )
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
