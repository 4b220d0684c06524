"""Per-turn latency and throughput of Baton sessions against a bare Temporal floor.

One process, one in-memory Temporal dev server (the ``temporal`` binary next to
this Python, never downloaded; its transfer-queue poll limit raised, see
``DEV_SERVER_ARGS``) and a SQLite file in a temp dir (or ``--database-url``).
Two systems run on the same server, interleaved round by round:

* **bare**: a minimal workflow defined here. Each turn is an Update (the first
  one update-with-start, like Baton) whose handler runs ONE no-op activity. No
  DB, no model: the floor Temporal itself imposes on a turn.
* **baton**: the real ``SessionWorkflow`` on the real worker
  (``worker.factory.build_worker``), driven by ``baton.runs.launch.launch_session``
  and ``send_message`` with ``sync=True``, with an agent whose playbook answers
  ``ok`` (the offline scripted model: an instant model).

Measured: (a) sequential per-turn latency in one session after warm-up (median
and p95), (b) throughput: N concurrent sessions each doing T turns (the first
is the session start), total turns / wall seconds, with the CPU each turn cost
this process and the dev server. Printed: both tables, the ratios (latency
baton/bare, throughput baton/bare) against the targets, and (unless
``--no-profile``) where Baton's per-turn time goes: history-timestamp phases,
in-process timers around Baton's turn internals (monkeypatched here, product
code untouched) and bare variants with one Baton ingredient added each.

Run from the repo root (not part of ``make test``)::

    .venv/bin/python bench/turns.py            # or: .venv/bin/python -m bench.turns
    .venv/bin/python bench/turns.py --sessions 20 --turns 5 --seq-turns 30 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

if __name__ == "__main__":
    # `python bench/turns.py` puts bench/ on sys.path, not the repo root: the packages
    # below are imported from the root, and the sandbox re-imports `bench.turns`.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pydantic import BaseModel
from temporalio import activity, workflow

with workflow.unsafe.imports_passed_through():
    from concurrent.futures import ThreadPoolExecutor

    import sqlalchemy as sa
    from sqlalchemy.engine import Engine
    from temporalio.api.enums.v1 import EventType
    from temporalio.client import (
        Client,
        Interceptor,
        WithStartWorkflowOperation,
        WorkflowHandle,
        WorkflowUpdateStage,
    )
    from temporalio.common import WorkflowIDConflictPolicy
    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.testing import WorkflowEnvironment
    from temporalio.worker import (
        ActivityInboundInterceptor,
        ExecuteActivityInput,
        Worker,
    )
    from temporalio.worker import Interceptor as WorkerInterceptor
    from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

    import activities.turns as act_mod
    import baton.runs.launch as launch_mod
    from baton.agents import registry
    from baton.agents.spec import AgentSpec
    from baton.contracts.search import SA_STATUS, SEARCH_ATTRIBUTES
    from baton.contracts.workflow_io import Provenance, SessionConfig, TurnOutcome, UserMessage
    from baton.storage.db import init_db, make_engine, session_scope
    from worker.factory import PASSTHROUGH, build_worker
    from worker.stack import DEV_SERVER_TUNING, temporal_binary

LATENCY_TARGET = 1.5  # baton per-turn latency <= 1.5x bare
THROUGHPUT_TARGET = 0.7  # baton turns/s >= 0.7x bare
#: Unique per run so that ``--database-url`` can point at a DB that has seen earlier runs.
AGENT = f"bench-{uuid.uuid4().hex[:8]}"
#: The dev server runs ONE history shard, and its transfer-queue reader is limited to
#: 20 polls/s per shard. The workflow task that follows an activity completion goes
#: through that queue, so past ~20 turns/s every turn waits for the next 50 ms tick:
#: sequential turns of both systems snap to ~50 ms and hide the difference being
#: measured. Raise the limit (``--server-defaults`` keeps it, to see the effect).
DEV_SERVER_ARGS = DEV_SERVER_TUNING
CONFIG = SessionConfig()  # production defaults (heartbeat 30 s, model timeout 600 s)


# --- the bare floor -------------------------------------------------------------------


class BareInput(BaseModel):
    """Bare workflow input; the flags add one Baton ingredient each (profile only)."""

    session_id: str
    heartbeat: bool = False  # the activity heartbeats once, like Baton's model_turn
    upsert: bool = False  # two search-attribute upserts per turn, like Baton's status


class BareActivityInput(BaseModel):
    message_id: str
    prompt: str


@activity.defn(name="bench_noop_turn")
async def noop_turn(inp: BareActivityInput) -> TurnOutcome:
    """The instant 'turn': no DB, no model."""
    return TurnOutcome(message_id=inp.message_id, preview="ok")


@activity.defn(name="bench_noop_turn_hb")
async def noop_turn_hb(inp: BareActivityInput) -> TurnOutcome:
    """The instant turn with one heartbeat (Baton's model_turn heartbeats at once)."""
    activity.heartbeat()
    return TurnOutcome(message_id=inp.message_id, preview="ok")


@workflow.defn(name="BenchBare")
class BareWorkflow:
    """One session: every ``turn`` Update runs one no-op activity and returns its result."""

    @workflow.init
    def __init__(self, inp: BareInput) -> None:
        self._inp = inp
        self._turn = 0
        self._busy = False

    @workflow.run
    async def run(self, inp: BareInput) -> int:
        await workflow.wait_condition(lambda: False)
        return self._turn

    @workflow.update(name="turn")
    async def turn(self, msg: UserMessage) -> TurnOutcome:
        self._busy = True
        if self._inp.upsert:
            workflow.upsert_search_attributes([SA_STATUS.value_set("running")])
        try:
            self._turn += 1
            mid = f"{self._inp.session_id}:t{self._turn}"
            if self._inp.heartbeat:
                return await workflow.execute_activity(
                    noop_turn_hb,
                    BareActivityInput(message_id=mid, prompt=msg.prompt),
                    start_to_close_timeout=timedelta(seconds=60),
                    heartbeat_timeout=timedelta(seconds=CONFIG.heartbeat_timeout_s),
                )
            return await workflow.execute_activity(
                noop_turn,
                BareActivityInput(message_id=mid, prompt=msg.prompt),
                start_to_close_timeout=timedelta(seconds=60),
            )
        finally:
            self._busy = False
            if self._inp.upsert:
                workflow.upsert_search_attributes([SA_STATUS.value_set("idle")])

    @turn.validator
    def _validate(self, msg: UserMessage) -> None:
        if self._busy or not msg.prompt.strip():
            raise ValueError("busy or empty prompt")


def build_bare_worker(client: Client, task_queue: str) -> Worker:
    """Same knobs as ``build_worker`` (sandbox, passthrough, thread pool, concurrency)."""
    return Worker(
        client,
        task_queue=task_queue,
        workflows=[BareWorkflow],
        activities=[noop_turn, noop_turn_hb],
        activity_executor=ThreadPoolExecutor(max_workers=64),
        max_concurrent_activities=64,
        workflow_runner=SandboxedWorkflowRunner(
            restrictions=SandboxRestrictions.default.with_passthrough_modules(*PASSTHROUGH)
        ),
    )


# --- drivers: one "session" = a first turn (update-with-start) then Updates -------------


class Driver:
    """Starts a session with its first turn and sends further turns; returns a token."""

    name = ""

    async def start(self) -> Any:
        raise NotImplementedError

    async def turn(self, session: Any) -> None:
        raise NotImplementedError


class BareDriver(Driver):
    def __init__(
        self, client: Client, task_queue: str, *, heartbeat: bool = False, upsert: bool = False
    ) -> None:
        self.client = client
        self.task_queue = task_queue
        self.flags = {"heartbeat": heartbeat, "upsert": upsert}
        self.name = "bare" + "".join(f"+{k}" for k, v in self.flags.items() if v)

    async def start(self) -> WorkflowHandle[Any, Any]:
        sid = f"bare-{uuid.uuid4()}"
        op: WithStartWorkflowOperation[Any, Any] = WithStartWorkflowOperation(
            BareWorkflow.run,
            BareInput(session_id=sid, **self.flags),
            id=sid,
            task_queue=self.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
        )
        handle = await self.client.start_update_with_start_workflow(
            "turn",
            UserMessage(prompt="hello"),
            start_workflow_operation=op,
            wait_for_stage=WorkflowUpdateStage.COMPLETED,
            id=f"{sid}:message-1",
            result_type=TurnOutcome,
        )
        await handle.result()
        return await op.workflow_handle()

    async def turn(self, session: WorkflowHandle[Any, Any]) -> None:
        update = await session.start_update(
            "turn",
            UserMessage(prompt="hello"),
            wait_for_stage=WorkflowUpdateStage.COMPLETED,
            id=f"{session.id}:message-{uuid.uuid4()}",
            result_type=TurnOutcome,
        )
        await update.result()


class BatonDriver(Driver):
    name = "baton"

    def __init__(self, client: Client, engine: Engine, task_queue: str) -> None:
        self.client = client
        self.engine = engine
        self.task_queue = task_queue

    async def start(self) -> str:
        launched = await launch_mod.launch_session(
            self.client,
            self.engine,
            task_queue=self.task_queue,
            config=CONFIG,
            ref=AGENT,
            prompt="hello",
            provenance=Provenance(),
            sync=True,
        )
        assert launched.response == "ok", launched
        return launched.session_id

    async def turn(self, session: str) -> None:
        _, text = await launch_mod.send_message(
            self.client, self.engine, session_id=session, prompt="hello", sync=True
        )
        assert text == "ok", text


# --- measurements -----------------------------------------------------------------------


@dataclass
class Stats:
    """Samples of one system, pooled over rounds."""

    seq: list[float] = field(default_factory=list)  # sequential per-turn latency (s)
    starts: list[float] = field(default_factory=list)  # first turn (session start) latency
    load: list[float] = field(default_factory=list)  # per-turn latency under load
    turns: int = 0  # throughput phase: turns completed
    wall: float = 0.0  # throughput phase: wall seconds
    cpu_py: float = 0.0  # throughput phase: CPU seconds of this process (client + worker)
    cpu_server: float | None = 0.0  # throughput phase: CPU seconds of the dev server
    seq_sessions: list[Any] = field(default_factory=list)

    @property
    def tps(self) -> float:
        return self.turns / self.wall if self.wall else 0.0


def pct(xs: Sequence[float], p: float) -> float:
    """The p-th percentile (nearest rank)."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(p / 100 * len(s) + 0.5) - 1))]


async def timed(fn: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = await fn()
    return time.perf_counter() - t0, out


def children_cpu() -> float | None:
    """CPU seconds (user + system) of this process's children, i.e. the dev server.

    Linux only (``/proc``); None elsewhere.
    """
    try:
        ticks = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for children in Path("/proc/self/task").glob("*/children"):
            for pid in children.read_text().split():
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / ticks
        return total
    except (OSError, ValueError, IndexError):
        return None


async def sequential(driver: Driver, stats: Stats, *, warmup: int, turns: int) -> None:
    """One session: start, ``warmup`` untimed turns, then ``turns`` timed ones."""
    dt, session = await timed(driver.start)
    stats.starts.append(dt)
    stats.seq_sessions.append(session)
    for _ in range(warmup):
        await driver.turn(session)
    for _ in range(turns):
        dt, _ = await timed(lambda: driver.turn(session))
        stats.seq.append(dt)


async def throughput(driver: Driver, stats: Stats, *, sessions: int, turns: int) -> None:
    """``sessions`` concurrent sessions of ``turns`` turns each (the first is the start)."""

    async def one() -> list[float]:
        out: list[float] = []
        dt, session = await timed(driver.start)
        out.append(dt)
        for _ in range(turns - 1):
            dt, _ = await timed(lambda: driver.turn(session))
            out.append(dt)
        return out

    t0, py0, srv0 = time.perf_counter(), time.process_time(), children_cpu()
    results = await asyncio.gather(*(one() for _ in range(sessions)))
    stats.wall += time.perf_counter() - t0
    stats.cpu_py += time.process_time() - py0
    srv1 = children_cpu()
    if stats.cpu_server is not None and srv0 is not None and srv1 is not None:
        stats.cpu_server += srv1 - srv0
    else:
        stats.cpu_server = None
    stats.turns += sessions * turns
    for r in results:
        stats.load.extend(r)


# --- profile: where Baton's per-turn time goes --------------------------------------------


class Timers:
    """Named accumulators (seconds), filled by the wrappers below while ``on``."""

    def __init__(self) -> None:
        self.on = False
        self.totals: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)

    def add(self, name: str, dt: float) -> None:
        if self.on:
            self.totals[name] += dt
            self.counts[name] += 1

    def reset(self) -> None:
        self.totals.clear()
        self.counts.clear()


TIMERS = Timers()


class _ActivityTimer(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        t0 = time.perf_counter()
        try:
            return await super().execute_activity(input)
        finally:
            TIMERS.add(f"activity {activity.info().activity_type}", time.perf_counter() - t0)


class TimingInterceptor(Interceptor, WorkerInterceptor):
    """Client interceptor that workers pick up: times every activity execution."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _ActivityTimer(next)


@contextlib.contextmanager
def patched(obj: Any, attr: str, wrapper: Callable[[Any], Any]) -> Iterator[None]:
    original = getattr(obj, attr)
    setattr(obj, attr, wrapper(original))
    try:
        yield
    finally:
        setattr(obj, attr, original)


def _time_sync(name: str) -> Callable[[Any], Any]:
    def wrap(fn: Any) -> Any:
        @functools.wraps(fn)
        def inner(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                TIMERS.add(name, time.perf_counter() - t0)

        return inner

    return wrap


def _time_to_thread(fn: Any) -> Any:
    """asyncio.to_thread, timed per callee: awaited time and time inside the thread."""

    @functools.wraps(fn)
    async def inner(func: Any, /, *a: Any, **kw: Any) -> Any:
        name = getattr(func, "__name__", "?").lstrip("_")

        def in_thread() -> Any:
            t0 = time.perf_counter()
            try:
                return func(*a, **kw)
            finally:
                TIMERS.add(f"to_thread {name}: in thread", time.perf_counter() - t0)

        t0 = time.perf_counter()
        try:
            return await fn(in_thread)
        finally:
            TIMERS.add(f"to_thread {name}: awaited", time.perf_counter() - t0)

    return inner


def _time_stream(fn: Any) -> Any:
    """model_request_stream: time from opening the stream to closing it."""

    @contextlib.asynccontextmanager
    @functools.wraps(fn)
    async def inner(*a: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            async with fn(*a, **kw) as stream:
                yield stream
        finally:
            TIMERS.add("model_request_stream (open..close)", time.perf_counter() - t0)

    return inner


def _time_session_scope(name: str) -> Callable[[Any], Any]:
    def wrap(fn: Any) -> Any:
        @contextlib.contextmanager
        @functools.wraps(fn)
        def inner(engine: Engine) -> Iterator[Any]:
            t0 = time.perf_counter()
            try:
                with fn(engine) as s:
                    yield s
            finally:
                TIMERS.add(name, time.perf_counter() - t0)

        return inner

    return wrap


@contextlib.contextmanager
def instrumented() -> Iterator[None]:
    """Timing wrappers around Baton's turn internals (this process only; no code change)."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(patched(asyncio, "to_thread", _time_to_thread))
        stack.enter_context(patched(act_mod, "model_request_stream", _time_stream))
        stack.enter_context(patched(act_mod, "build_model", _time_sync("build_model")))
        stack.enter_context(patched(act_mod, "to_model_messages", _time_sync("to_model_messages")))
        stack.enter_context(
            patched(act_mod, "session_scope", _time_session_scope("DB txn (activities)"))
        )
        stack.enter_context(
            patched(launch_mod, "session_scope", _time_session_scope("DB txn (client)"))
        )
        TIMERS.reset()
        TIMERS.on = True
        try:
            yield
        finally:
            TIMERS.on = False


def _ms(ts: Any) -> float:
    return float(ts.ToMicroseconds()) / 1000.0


async def history_phases(client: Client, workflow_id: str, skip: int) -> dict[str, list[float]]:
    """Server-side phases of each update turn after the first ``skip``, from history (ms).

    The update arrives and a workflow task accepts it and schedules the activity
    (wft1); the activity is dispatched and runs; its completion makes the server
    schedule a second workflow task (wft2), which a worker picks up and completes
    the update with.
    """
    events = [e async for e in client.get_workflow_handle(workflow_id).fetch_history_events()]
    phases: dict[str, list[float]] = defaultdict(list)
    marks: dict[str, float] = {}
    wft: list[float] = []  # scheduled, started, completed of the latest workflow task
    n = 0
    for e in events:
        t = _ms(e.event_time)
        et = e.event_type
        if et == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
            wft = [t]
        elif et in (
            EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED,
            EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED,
        ):
            wft.append(t)
            if len(wft) == 3 and "act_done" in marks:
                marks["wft2"], marks["wft2_start"], marks["wft2_done"] = wft
        elif et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED and wft:
            marks["arrived"] = wft[0]
        elif et == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            marks["act_sched"] = t
        elif et == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            marks["act_start"] = t
        elif et == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            marks["act_done"] = t
        elif et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED:
            n += 1
            m = marks
            if n > skip and len(m) == 7:
                for name, a, b in (
                    ("wft1: update arrived..activity scheduled", "arrived", "act_sched"),
                    ("activity: scheduled..started", "act_sched", "act_start"),
                    ("activity: started..completed", "act_start", "act_done"),
                    ("wft2: activity completed..task scheduled", "act_done", "wft2"),
                    ("wft2: task scheduled..started (matching)", "wft2", "wft2_start"),
                    ("wft2: task started..completed (worker)", "wft2_start", "wft2_done"),
                    ("server total: arrived..update completed", "arrived", "wft2_done"),
                ):
                    phases[name].append(m[b] - m[a])
            marks = {}
    return phases


# --- setup and report ---------------------------------------------------------------------


def publish_instant_agent(engine: Engine) -> None:
    """An agent whose scripted model answers ``ok`` at once (no chunk delay)."""
    with session_scope(engine) as s:
        spec = AgentSpec.model_validate({"playbook": [{"reply": "ok"}]})
        registry.create_agent(s, slug=AGENT, name="Bench instant", spec=spec)
        registry.publish(s, slug=AGENT)


def row(name: str, xs: Sequence[float]) -> str:
    if not xs:
        return f"  {name:<34} (no samples)"
    ms = [x * 1000 for x in xs]
    return (
        f"  {name:<34} n={len(ms):<4} median {statistics.median(ms):7.1f} ms"
        f"   p95 {pct(ms, 95):7.1f} ms   mean {statistics.fmean(ms):7.1f} ms"
    )


def report(bare: Stats, baton: Stats, args: argparse.Namespace) -> None:
    print()
    db = "PostgreSQL" if (args.database_url or "").startswith("postgres") else "SQLite"
    if args.sqlite_synchronous and db == "SQLite":
        db += f" synchronous={args.sqlite_synchronous}"
    server = "dev server defaults" if args.server_defaults else "transferProcessorMaxPollRPS raised"
    print(
        f"N={args.sessions} T={args.turns} seq-turns={args.seq_turns} rounds={args.rounds}"
        f" ({db}; {server}; {os.cpu_count()} CPUs)"
    )
    print(
        f"== sequential: 1 session, {args.warmup} warm-up + {args.seq_turns} timed turns,"
        f" x{args.rounds} rounds =="
    )
    print(row("bare  per-turn", bare.seq))
    print(row("baton per-turn", baton.seq))
    print(row("bare  session start (1st turn)", bare.starts))
    print(row("baton session start (1st turn)", baton.starts))
    print()
    print(
        f"== throughput: {args.sessions} concurrent sessions x {args.turns} turns,"
        f" x{args.rounds} rounds =="
    )
    for name, st in (("bare ", bare), ("baton", baton)):
        print(
            f"  {name} {st.turns} turns in {st.wall:6.2f} s = {st.tps:7.1f} turns/s"
            f"   (per-turn under load: median {statistics.median(st.load) * 1000:.1f} ms,"
            f" p95 {pct(st.load, 95) * 1000:.1f} ms)"
        )
    for name, st in (("bare ", bare), ("baton", baton)):
        server = (
            f"dev server {st.cpu_server / st.turns * 1000:5.2f} ms"
            if st.cpu_server is not None
            else "dev server n/a"
        )
        py = st.cpu_py / st.turns * 1000
        print(f"  {name} CPU per turn: python (client + worker) {py:5.2f} ms, {server}")
    lat = statistics.median(baton.seq) / statistics.median(bare.seq)
    lat95 = pct(baton.seq, 95) / pct(bare.seq, 95)
    thr = baton.tps / bare.tps
    print()
    print("== ratios (baton / bare) ==")
    print(
        f"  per-turn latency (median) {lat:5.2f}x   target <= {LATENCY_TARGET}x  "
        f"{'MET' if lat <= LATENCY_TARGET else 'NOT MET'}   (p95 ratio {lat95:.2f}x)"
    )
    print(
        f"  throughput                {thr:5.2f}x   target >= {THROUGHPUT_TARGET}x  "
        f"{'MET' if thr >= THROUGHPUT_TARGET else 'NOT MET'}"
    )


async def profile(
    client: Client,
    bare_q: str,
    baton: BatonDriver,
    bare: Stats,
    batons: Stats,
    args: argparse.Namespace,
) -> list[str]:
    """Attribute Baton's extra time: history phases, in-process timers, bare variants.

    Runs before the throughput phase (a burst of load leaves the dev server's
    matching slow for a few seconds, which would distort sequential timings).
    """
    out: list[str] = []
    merged: dict[str, dict[str, list[float]]] = {}
    for name, ids in (
        ("bare", [h.id for h in bare.seq_sessions]),
        ("baton", list(batons.seq_sessions)),
    ):
        merged[name] = defaultdict(list)
        for wid in ids:
            for k, v in (await history_phases(client, wid, skip=1 + args.warmup)).items():
                merged[name][k].extend(v)
    out += [
        "",
        "== profile: server-side phases of a sequential turn (history timestamps, median ms) ==",
        f"  {'phase':<44} {'bare':>7} {'baton':>7} {'extra':>7}",
    ]
    for k, v in merged["bare"].items():
        a, b = statistics.median(v), statistics.median(merged["baton"][k])
        out.append(f"  {k:<44} {a:7.1f} {b:7.1f} {b - a:+7.1f}")
    a, b = statistics.median(bare.seq) * 1000, statistics.median(batons.seq) * 1000
    out.append(f"  {'client-measured turn (see above)':<44} {a:7.1f} {b:7.1f} {b - a:+7.1f}")

    n = args.seq_turns
    session = await baton.start()
    for _ in range(args.warmup):
        await baton.turn(session)
    with instrumented():
        t0 = time.perf_counter()
        for _ in range(n):
            await baton.turn(session)
        wall = time.perf_counter() - t0
    out += [
        "",
        f"== profile: Baton turn internals, in-process timers ({n} sequential turns) ==",
        f"  {'client-measured turn (instrumented run)':<44} {wall / n * 1000:6.2f} ms/turn",
    ]
    for k in sorted(TIMERS.totals, key=lambda k: -TIMERS.totals[k]):
        per_turn = TIMERS.totals[k] / n * 1000
        out.append(f"  {k:<44} {per_turn:6.2f} ms/turn  ({TIMERS.counts[k] / n:.0f}/turn)")

    out += [
        "",
        "== profile: bare + one Baton ingredient at a time ==",
        f"  sequential: {n} turns; throughput: {args.sessions} sessions x {args.turns} turns;"
        " CPU ms per turn under load",
        f"  {'variant':<24} {'seq median':>10} {'seq p95':>8} {'turns/s':>8}"
        f" {'py CPU':>7} {'server CPU':>10}",
    ]
    for flags in ({}, {"heartbeat": True}, {"upsert": True}, {"heartbeat": True, "upsert": True}):
        driver = BareDriver(client, bare_q, **flags)
        st = Stats()
        await sequential(driver, st, warmup=args.warmup, turns=n)
        await asyncio.sleep(args.settle)
        await throughput(driver, st, sessions=args.sessions, turns=args.turns)
        server = st.cpu_server / st.turns * 1000 if st.cpu_server is not None else float("nan")
        out.append(
            f"  {driver.name:<24} {statistics.median(st.seq) * 1000:7.1f} ms"
            f" {pct(st.seq, 95) * 1000:5.1f} ms {st.tps:8.1f}"
            f" {st.cpu_py / st.turns * 1000:7.2f} {server:10.2f}"
        )
    return out


def bench_engine(url: str, synchronous: str | None) -> Engine:
    """Baton's engine for ``url``; ``synchronous`` overrides SQLite's PRAGMA (what-if only)."""
    engine = make_engine(url)
    if synchronous and engine.dialect.name == "sqlite":

        @sa.event.listens_for(engine, "connect")
        def _pragma(dbapi_conn: Any, _record: Any) -> None:
            cursor = dbapi_conn.cursor()
            cursor.execute(f"PRAGMA synchronous={synchronous}")
            cursor.close()

    init_db(engine)
    return engine


async def run(args: argparse.Namespace) -> None:
    t_start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="baton-bench-"))
    url = args.database_url or f"sqlite:///{tmp / 'baton.db'}"
    engine = bench_engine(url, args.sqlite_synchronous)
    publish_instant_agent(engine)
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(temporal_binary()),
        search_attributes=list(SEARCH_ATTRIBUTES),
        data_converter=pydantic_data_converter,
        dev_server_log_level="error",
        dev_server_extra_args=[] if args.server_defaults else DEV_SERVER_ARGS,
        interceptors=[TimingInterceptor()],
    )

    def progress(what: str) -> None:
        print(f"[{time.perf_counter() - t_start:5.1f} s] {what}", flush=True)

    progress(f"dev server up; DB {engine.url.render_as_string(hide_password=True)}")
    client = env.client
    bare_q, baton_q = f"bench-bare-{uuid.uuid4()}", f"bench-baton-{uuid.uuid4()}"
    bare_d = BareDriver(client, bare_q)
    baton_d = BatonDriver(client, engine, baton_q)
    bare, baton = Stats(), Stats()
    profile_lines: list[str] = []
    try:
        async with (
            build_bare_worker(client, bare_q),
            build_worker(client, engine=engine, task_queue=baton_q),
        ):
            # Warm both paths (sandbox imports, connections, caches) before timing.
            drivers: tuple[Driver, ...] = (bare_d, baton_d)
            for d in drivers:
                s = await d.start()
                for _ in range(args.warmup):
                    await d.turn(s)

            def ordered(r: int) -> list[tuple[Driver, Stats]]:
                pairs: list[tuple[Driver, Stats]] = [(bare_d, bare), (baton_d, baton)]
                return pairs[::-1] if r % 2 else pairs

            for r in range(args.rounds):
                for d, st in ordered(r):
                    await sequential(d, st, warmup=args.warmup, turns=args.seq_turns)
            progress("sequential latency done")
            if args.profile:
                profile_lines = await profile(client, bare_q, baton_d, bare, baton, args)
                progress("profile done")
            for r in range(args.rounds):
                for d, st in ordered(r):
                    await asyncio.sleep(args.settle)
                    await throughput(d, st, sessions=args.sessions, turns=args.turns)
            progress("throughput done")
    finally:
        await env.shutdown()
        engine.dispose()
        shutil.rmtree(tmp, ignore_errors=True)
    report(bare, baton, args)
    print("\n".join(profile_lines))
    print(f"\ntotal {time.perf_counter() - t_start:.1f} s")


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--sessions", "-n", type=int, default=20, help="concurrent sessions (N)")
    p.add_argument("--turns", "-t", type=int, default=5, help="turns per session (T)")
    p.add_argument("--seq-turns", type=int, default=30, help="timed sequential turns")
    p.add_argument("--warmup", type=int, default=3, help="untimed turns before timing")
    p.add_argument("--rounds", type=int, default=4, help="interleaved bare/baton rounds")
    p.add_argument(
        "--settle", type=float, default=1.0, help="idle seconds before each throughput run"
    )
    p.add_argument(
        "--server-defaults",
        action="store_true",
        help="keep the dev server's 20/s transfer-queue poll limit (turns snap to ~50 ms)",
    )
    p.add_argument(
        "--database-url",
        help="Baton's DB (default: a fresh SQLite file in a temp dir), e.g. postgresql+psycopg://…",
    )
    p.add_argument(
        "--sqlite-synchronous",
        choices=["OFF", "NORMAL", "FULL"],
        help="what-if: override SQLite's synchronous PRAGMA (default: Baton's, i.e. FULL)",
    )
    p.add_argument("--no-profile", dest="profile", action="store_false", help="skip profile")
    asyncio.run(run(p.parse_args(argv)))


if __name__ == "__main__":
    # Run as a script: use this file as `bench.turns` so the workflow sandbox can
    # re-import the bare workflow's module by name (it cannot re-import `__main__`).
    from bench.turns import main as _main

    _main()
