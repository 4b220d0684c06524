"""Capacity model: what it takes to serve N sessions a day, from CPU measured per turn here.

**Measure** (``--measure``, ~3 min): a throwaway PostgreSQL cluster (initdb + pg_ctl on a
free loopback port), a Temporal dev server with its SQLite on disk (``worker.stack.
DevServer``, as ``baton dev``), one real ``baton api`` and one real ``baton worker``
process; this process drives S concurrent sessions of T turns each over HTTP
(``POST /v1/sessions`` and ``POST …/messages`` with ``sync: true``; the offline scripted
model answers with a reply of ``--reply-chars``). Before and after, it reads from /proc
the CPU time (user + system, **not** wall time) of each process — the API, the worker, the
dev server, and PostgreSQL's postmaster with all its backends (exited backends are in
the postmaster's children's time) — and PostgreSQL's own counters (commits, rows
written, database size). Then per turn: CPU ms of each process, database commits, rows
and bytes, and the Temporal history (events, bytes, billable actions) of the sessions
run. The figures go to ``--out`` (JSON).

**Model** (always): from a measurement (``--measured``, default the checked-in
``bench/capacity_measured.json``) and the workload flags, the table of
``docs/capacity.md`` for 1,000 / 100,000 / 10,000,000 sessions a day: workers, API
replicas, Temporal (actions/s, history shards), database size and IOPS, payload bytes per
turn, and where the first bottleneck is. Every assumed figure is a named constant below
with where it comes from.

    .venv/bin/python bench/capacity.py                      # the table from the stored figures
    .venv/bin/python bench/capacity.py --measure            # measure here, store, then the table
    .venv/bin/python bench/capacity.py --turns-per-session 20 --review-rate 0.1
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __name__ == "__main__":
    # `python bench/capacity.py` puts bench/ on sys.path, not the repo root.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MEASURED = Path(__file__).with_name("capacity_measured.json")
BATON = str(Path(sys.executable).parent / "baton")
SIZES = (1_000, 100_000, 10_000_000)

# --- assumed figures (not measured here) -------------------------------------------------

#: Peak hour over the day's average rate (a diurnal web workload; assumed).
PEAK_FACTOR = 3.0
#: CPU a process is planned to use at peak, of the cores it has (headroom for GC,
#: replays, failover; assumed).
TARGET_UTILISATION = 0.6
#: One worker or API process uses at most one core (Python's GIL; Baton's blocking DB
#: work runs on threads that share it).
CORES_PER_PROCESS = 1.0
#: Availability floor: never fewer than 2 workers and 2 API replicas (deploy/ runs 2).
MIN_REPLICAS = 2
#: Seconds a real model call holds an activity slot (the scripted model measured here
#: answers at once; a hosted model takes seconds; assumed).
MODEL_SECONDS = 8.0
#: Activity slots of one worker (worker.factory's max_concurrent_activities).
SLOTS_PER_WORKER = 2048
#: Temporal Cloud: a namespace's default limit is 400 actions/s, raised automatically
#: from the last 7 days' use (docs.temporal.io, Cloud limits).
CLOUD_DEFAULT_APS = 400
#: Self-hosted Temporal: each history shard serialises its writes (one persistence
#: operation at a time, docs.temporal.io "What is a History Shard"); planned here at 100
#: workflow updates/s per shard (a few ms per database write, at half load; assumed).
UPDATES_PER_SHARD_S = 100.0
#: Temporal's docs: clusters run from 1 to 128K shards, "each shard responsible for tens
#: of thousands of workflow executions"; planned at 10,000 open runs per shard.
RUNS_PER_SHARD = 10_000
#: The smallest shard count planned for production (the count is fixed at cluster
#: creation, so it is sized for growth; assumed).
MIN_SHARDS = 512
#: Days an idle session's run stays open before it completes (BATON_SESSION_IDLE_TIMEOUT
#: is shorter; a session that is reopened starts a new run): runs open at once =
#: sessions/day x this (assumed 1 day).
OPEN_RUN_DAYS = 1.0
#: Days Baton's database keeps transcripts and events (assumed: 90 days; Baton deletes
#: nothing by itself).
RETENTION_DAYS = 90
#: Sustained write IOPS of one PostgreSQL primary on provisioned SSD (assumed; a cloud
#: volume class of this size), and the cores of the largest primary planned (assumed).
PG_MAX_IOPS = 20_000
PG_MAX_CORES = 64
#: Disk writes per commit: the WAL flush plus, amortised, data pages (assumed).
IOPS_PER_COMMIT = 1.5
#: The largest database planned on one primary before partitioning or archiving (assumed).
PG_MAX_TB = 16
#: A turn that waits on a review costs this much more than a plain turn (the Signal, one
#: more workflow task, the settle activity and its rows; assumed, not measured here).
REVIEW_EXTRA_WORK = 0.5


# --- measuring -------------------------------------------------------------------------


def cpu_seconds(pid: int, *, children: bool = False) -> float:
    """User + system CPU seconds of ``pid`` (and, with ``children``, of its exited and
    waited-for children); 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / os.sysconf("SC_CLK_TCK")


def tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid``, its exited children, and every live descendant."""
    total = cpu_seconds(pid, children=True)
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = list(Path(f"/proc/{parent}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                kids = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            for kid in kids:
                total += cpu_seconds(kid, children=True)
            todo += kids
    return total


class Postgres:
    """A throwaway PostgreSQL cluster (as tests/conftest.py makes one)."""

    def __init__(self) -> None:
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        if not found:
            raise SystemExit("PostgreSQL binaries missing: apt-get install postgresql")
        self.bindir = Path(found[-1]).parent
        self.root = Path(tempfile.mkdtemp(prefix="baton-capacity-pg-"))
        self.root.chmod(0o755)
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        from worker.stack import free_port

        self.port = free_port()
        self.url = f"postgresql+psycopg://baton@127.0.0.1:{self.port}/postgres"

    def _as_postgres(self, cmd: list[str]) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd

    def start(self) -> None:
        data = str(self.root / "data")
        subprocess.run(
            self._as_postgres(
                [str(self.bindir / "initdb"), "-D", data, "-U", "baton", "-A", "trust"]
            ),
            check=True,
            capture_output=True,
        )
        opts = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1"
        subprocess.run(
            self._as_postgres(
                [
                    str(self.bindir / "pg_ctl"),
                    "-D",
                    data,
                    "-o",
                    opts,
                    "-l",
                    str(self.root / "log"),
                    "-w",
                    "start",
                ]
            ),
            check=True,
            capture_output=True,
        )

    def pid(self) -> int:
        return int((self.root / "data" / "postmaster.pid").read_text().split()[0])

    def stop(self) -> None:
        subprocess.run(
            self._as_postgres(
                [str(self.bindir / "pg_ctl"), "-D", str(self.root / "data"), "-m", "fast", "stop"]
            ),
            check=False,
            capture_output=True,
        )
        shutil.rmtree(self.root, ignore_errors=True)


def pg_counters(url: str) -> dict[str, float]:
    """PostgreSQL's commits, rows written and size of the database (bytes)."""
    import psycopg

    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        row = conn.execute(
            "SELECT xact_commit, tup_inserted + tup_updated + tup_deleted,"
            " pg_database_size(current_database())"
            " FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    return {"commits": float(row[0]), "rows": float(row[1]), "bytes": float(row[2])}


#: History events that Temporal Cloud bills as actions (docs.temporal.io "Actions"):
#: a start, an accepted Update or a Signal, an activity scheduled, a timer started, a
#: local activity's marker, a search-attribute upsert is not billed.
BILLED_EVENTS = {
    "EVENT_TYPE_WORKFLOW_EXECUTION_STARTED",
    "EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED",
    "EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED",
    "EVENT_TYPE_ACTIVITY_TASK_SCHEDULED",
    "EVENT_TYPE_TIMER_STARTED",
    "EVENT_TYPE_MARKER_RECORDED",
    "EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED",
}


async def history_figures(address: str, session_ids: list[str]) -> dict[str, float]:
    """Events, bytes and billable actions of the sessions' Temporal histories, summed."""
    from temporalio.api.enums.v1 import EventType
    from temporalio.client import Client
    from temporalio.contrib.pydantic import pydantic_data_converter

    client = await Client.connect(address, data_converter=pydantic_data_converter)
    events = size = actions = payload = 0
    for sid in session_ids:
        history = await client.get_workflow_handle(sid).fetch_history()
        for event in history.events:
            events += 1
            size += event.ByteSize()
            if EventType.Name(event.event_type) in BILLED_EVENTS:
                actions += 1
            attrs = event.WhichOneof("attributes")
            if attrs:
                for field_, value in getattr(event, attrs).ListFields():
                    if field_.name in ("input", "result", "details", "heartbeat_details"):
                        payload += value.ByteSize()
    return {"events": events, "bytes": size, "actions": actions, "payload": payload}


async def drive(base: str, agent: str, sessions: int, turns: int, concurrency: int) -> list[str]:
    """``sessions`` sessions of ``turns`` sync turns each, ``concurrency`` at a time."""
    import httpx

    limit = asyncio.Semaphore(concurrency)

    async def one(i: int, http: httpx.AsyncClient) -> str:
        async with limit:
            made = await http.post(
                "/v1/sessions", json={"agent": agent, "prompt": f"hi {i}", "sync": True}
            )
            assert made.status_code == 201, made.text
            sid: str = made.json()["session_id"]
            for t in range(turns - 1):
                sent = await http.post(
                    f"/v1/sessions/{sid}/messages", json={"prompt": f"turn {t}", "sync": True}
                )
                assert sent.status_code == 200, sent.text
            return sid

    async with httpx.AsyncClient(base_url=base, timeout=120) as http:
        return list(await asyncio.gather(*(one(i, http) for i in range(sessions))))


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Run the stack, drive it, and return the per-turn figures (see the module doc)."""
    import httpx

    from baton.storage.db import init_db, make_engine
    from worker.stack import DevServer, free_port

    folder = Path(tempfile.mkdtemp(prefix="baton-capacity-"))
    pg = Postgres()
    pg.start()
    server = DevServer(port=free_port(), ui_port=free_port(), db_file=folder / "temporal.db")
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        engine = make_engine(pg.url)
        init_db(engine)
        engine.dispose()
        server.start()
        api_port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("BATON_", "TEMPORAL_"))}
        env.update(
            BATON_DATABASE_URL=pg.url,
            BATON_TEMPORAL_ADDRESS=server.address,
            BATON_TEMPORAL_ENV_CONFIG="false",
            BATON_TASK_QUEUE=f"capacity-{uuid.uuid4().hex[:8]}",
        )
        for name, cmd in (("worker", ["worker"]), ("api", ["api", "--port", str(api_port)])):
            log = (folder / f"{name}.log").open("ab")
            procs[name] = subprocess.Popen(
                [BATON, *cmd], env=env, stdout=log, stderr=subprocess.STDOUT
            )
        base = f"http://127.0.0.1:{api_port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{base}/readyz", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"the API did not become ready; logs in {folder}")
            time.sleep(0.5)
        agent = "capacity"
        reply = ("x" * (args.reply_chars - 1) + ".") if args.reply_chars > 1 else "ok"
        spec = {"playbook": [{"reply": reply}]}
        assert (
            httpx.post(
                f"{base}/v1/agents", json={"slug": agent, "name": "C", "spec": spec}
            ).status_code
            == 201
        )
        assert httpx.post(f"{base}/v1/agents/{agent}/publish").status_code == 201
        await drive(base, agent, sessions=4, turns=3, concurrency=4)  # warm every path

        pids = {"api": procs["api"].pid, "worker": procs["worker"].pid}
        temporal_pid = server._proc.pid if server._proc else 0
        before = {k: cpu_seconds(p) for k, p in pids.items()}
        before["temporal"] = tree_cpu(temporal_pid)
        before["database"] = tree_cpu(pg.pid())
        db0 = pg_counters(pg.url)
        started = time.monotonic()
        sids = await drive(base, agent, args.sessions, args.turns, args.concurrency)
        wall = time.monotonic() - started
        after = {k: cpu_seconds(p) for k, p in pids.items()}
        after["temporal"] = tree_cpu(temporal_pid)
        after["database"] = tree_cpu(pg.pid())
        db1 = pg_counters(pg.url)
        turns = args.sessions * args.turns
        history = await history_figures(server.address, sids)
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        server.stop()
        pg.stop()
        shutil.rmtree(folder, ignore_errors=True)
    return {
        "machine": f"{os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}",
        "sessions": args.sessions,
        "turns_per_session": args.turns,
        "concurrency": args.concurrency,
        "reply_chars": args.reply_chars,
        "turns": turns,
        "wall_s": round(wall, 2),
        "cpu_ms_per_turn": {k: round((after[k] - before[k]) / turns * 1000, 2) for k in after},
        "db_commits_per_turn": round((db1["commits"] - db0["commits"]) / turns, 2),
        "db_rows_per_turn": round((db1["rows"] - db0["rows"]) / turns, 2),
        "db_bytes_per_turn": round((db1["bytes"] - db0["bytes"]) / turns),
        "history_events_per_turn": round(history["events"] / turns, 2),
        "history_bytes_per_turn": round(history["bytes"] / turns),
        "payload_bytes_per_turn": round(history["payload"] / turns),
        "actions_per_turn": round(history["actions"] / turns, 2),
    }


# --- the model -------------------------------------------------------------------------


@dataclass
class Plan:
    """What one size needs (see :func:`plan`)."""

    sessions_per_day: int
    turns_per_s_avg: float
    turns_per_s_peak: float
    workers: int
    api_replicas: int
    temporal_cores: float
    actions_per_s_peak: float
    history_shards: int
    db_cores: float
    db_iops_peak: float
    db_gb_retained: float
    history_gb_per_day: float
    payload_bytes_per_turn: int
    bottleneck: str


def plan(m: dict[str, Any], sessions_per_day: int, args: argparse.Namespace) -> Plan:
    """The resources ``sessions_per_day`` sessions need, from measurement ``m``.

    A session is ``args.turns_per_session`` turns; ``args.review_rate`` of turns also wait
    on a review (one Signal, one more workflow task and a settle activity: counted as half
    a turn more work); a turn writes its transcript messages, ``args.message_bytes`` each
    beyond what was measured. Peak = :data:`PEAK_FACTOR` x the day's average.
    """
    cpu = m["cpu_ms_per_turn"]
    work = 1 + REVIEW_EXTRA_WORK * args.review_rate
    tps = sessions_per_day * args.turns_per_session / 86_400
    peak = tps * PEAK_FACTOR
    eff = peak * work

    def processes(ms: float) -> int:
        cores = float(eff * ms / 1000 / (CORES_PER_PROCESS * TARGET_UTILISATION))
        return max(MIN_REPLICAS, math.ceil(cores))

    in_flight = peak * MODEL_SECONDS
    workers = max(
        processes(cpu["worker"]), math.ceil(in_flight / (SLOTS_PER_WORKER * TARGET_UTILISATION))
    )
    api = processes(cpu["api"])
    temporal_cores = eff * cpu["temporal"] / 1000 / TARGET_UTILISATION
    actions = eff * m["actions_per_turn"]
    updates = eff * m["history_events_per_turn"] / 3  # a workflow update appends ~3 events
    open_runs = sessions_per_day * OPEN_RUN_DAYS
    shards_needed = max(updates / UPDATES_PER_SHARD_S, open_runs / RUNS_PER_SHARD, MIN_SHARDS)
    shards = 2 ** math.ceil(math.log2(shards_needed))
    db_cores = eff * cpu["database"] / 1000 / TARGET_UTILISATION
    iops = eff * m["db_commits_per_turn"] * IOPS_PER_COMMIT
    extra = max(0, args.message_bytes - m["reply_chars"]) * 2  # prompt + reply per turn
    db_bytes_turn = m["db_bytes_per_turn"] + extra
    db_gb = tps * 86_400 * RETENTION_DAYS * db_bytes_turn * work / 1e9
    hist_gb = tps * 86_400 * (m["history_bytes_per_turn"] + extra) * work / 1e9
    payload = int(m["payload_bytes_per_turn"] + extra)
    # Workers, APIs and Temporal's services scale out; one PostgreSQL primary does not:
    # the first bottleneck is the primary's ceiling used most.
    ceilings = {
        "PostgreSQL write IOPS": iops / PG_MAX_IOPS,
        "PostgreSQL CPU": db_cores / PG_MAX_CORES,
        "PostgreSQL size": db_gb / (PG_MAX_TB * 1000),
    }
    first, ratio = max(ceilings.items(), key=lambda kv: kv[1])
    bottleneck = f"{first}: {ratio:.0%} of one primary"
    if ratio < 0.05:
        bottleneck = f"none: 2 APIs + 2 workers for availability (most used: {bottleneck})"
    if actions > CLOUD_DEFAULT_APS:
        bottleneck += f"; on Temporal Cloud, {actions / CLOUD_DEFAULT_APS:.0f}x the default APS"
    return Plan(
        sessions_per_day=sessions_per_day,
        turns_per_s_avg=tps,
        turns_per_s_peak=peak,
        workers=workers,
        api_replicas=api,
        temporal_cores=temporal_cores,
        actions_per_s_peak=actions,
        history_shards=shards,
        db_cores=db_cores,
        db_iops_peak=iops,
        db_gb_retained=db_gb,
        history_gb_per_day=hist_gb,
        payload_bytes_per_turn=payload,
        bottleneck=bottleneck,
    )


def human(n: float) -> str:
    """A count for the table: 0.42, 12, 1.2k, 3.4M."""
    if n < 10:
        return f"{n:.2g}" if n < 1 else f"{n:.1f}"
    for unit, size in (("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n:.0f}"


def table(m: dict[str, Any], args: argparse.Namespace) -> str:
    """The Markdown table of docs/capacity.md for :data:`SIZES`."""
    plans = [plan(m, size, args) for size in SIZES]
    rows: list[tuple[str, Callable[[Plan], str]]] = [
        (
            "turns/s, average / peak",
            lambda p: f"{human(p.turns_per_s_avg)} / {human(p.turns_per_s_peak)}",
        ),
        ("`baton worker` processes", lambda p: str(p.workers)),
        ("`baton api` replicas", lambda p: str(p.api_replicas)),
        ("Temporal CPU at peak (cores)", lambda p: human(p.temporal_cores)),
        ("Temporal actions/s at peak", lambda p: human(p.actions_per_s_peak)),
        ("history shards (self-hosted)", lambda p: str(p.history_shards)),
        ("PostgreSQL CPU at peak (cores)", lambda p: human(p.db_cores)),
        ("PostgreSQL write IOPS at peak", lambda p: human(p.db_iops_peak)),
        (f"PostgreSQL size, {RETENTION_DAYS} days (GB)", lambda p: human(p.db_gb_retained)),
        ("Temporal history written/day (GB)", lambda p: human(p.history_gb_per_day)),
        ("payload bytes per turn", lambda p: human(p.payload_bytes_per_turn)),
        ("first bottleneck", lambda p: p.bottleneck),
    ]
    head = "| | " + " | ".join(f"{s:,} sessions/day" for s in SIZES) + " |"
    lines = [head, "|---" * (len(SIZES) + 1) + "|"]
    lines += [f"| {name} | " + " | ".join(cell(p) for p in plans) + " |" for name, cell in rows]
    return "\n".join(lines)


def measured_lines(m: dict[str, Any]) -> str:
    """The measured figures, one line each, for docs/capacity.md."""
    cpu = m["cpu_ms_per_turn"]
    return "\n".join(
        [
            f"- measured on {m['machine']}: {m['turns']} turns ({m['sessions']} sessions x "
            f"{m['turns_per_session']} turns, {m['concurrency']} at a time, reply "
            f"{m['reply_chars']} chars) in {m['wall_s']} s",
            "- CPU per turn (user + system): "
            + ", ".join(f"{k} {v} ms" for k, v in cpu.items())
            + f"; total {sum(cpu.values()):.1f} ms",
            f"- PostgreSQL per turn: {m['db_commits_per_turn']} commits, "
            f"{m['db_rows_per_turn']} rows written, {m['db_bytes_per_turn']:,} bytes of growth",
            f"- Temporal per turn: {m['history_events_per_turn']} history events, "
            f"{m['history_bytes_per_turn']:,} history bytes ({m['payload_bytes_per_turn']:,} of "
            f"them payloads), {m['actions_per_turn']} billable actions",
        ]
    )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure", action="store_true", help="measure here first (~3 min)")
    parser.add_argument("--measured", type=Path, default=MEASURED, help="stored measurement")
    parser.add_argument("--out", type=Path, default=MEASURED, help="where --measure stores it")
    parser.add_argument("-n", "--sessions", type=int, default=40, help="sessions measured")
    parser.add_argument("-t", "--turns", type=int, default=5, help="turns per measured session")
    parser.add_argument("-c", "--concurrency", type=int, default=8, help="sessions at a time")
    parser.add_argument("--reply-chars", type=int, default=400, help="the scripted reply's size")
    parser.add_argument(
        "--turns-per-session", type=float, default=10, help="model: turns a session"
    )
    parser.add_argument(
        "--review-rate", type=float, default=0.05, help="model: turns with a review"
    )
    parser.add_argument(
        "--message-bytes", type=int, default=2000, help="model: bytes of a prompt or a reply"
    )
    return parser.parse_args(argv)


def main(args: argparse.Namespace) -> None:
    if args.measure:
        figures = asyncio.run(measure(args))
        args.out.write_text(json.dumps(figures, indent=2) + "\n")
        print(f"stored in {args.out}")
    m = json.loads(args.measured.read_text())
    print(measured_lines(m))
    print(
        f"\nworkload: {args.turns_per_session:g} turns a session, {args.review_rate:.0%} of "
        f"turns reviewed, {args.message_bytes:,}-byte messages, peak {PEAK_FACTOR:g}x average\n"
    )
    print(table(m, args))


if __name__ == "__main__":
    main(parse())
