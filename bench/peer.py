"""Baton against the bare Temporal floor and a peer (pydantic-ai's durable Temporal agent), in
one run.

One in-memory dev server started exactly as ``baton dev`` starts it
(:class:`worker.stack.DevServer`), one OpenAI-compatible stub model over HTTP that answers
``ok`` at once (``tests/openai_stub.py``), and four systems on it, interleaved round by round:

* **bare**: a workflow (defined here) that runs ONE no-op activity and returns. No DB, no
  model, no HTTP: the floor Temporal imposes on a durable turn.
* **peer**: pydantic-ai's durable agent, an ``Agent`` with the ``TemporalDurability``
  capability (what pydantic-ai 2.68 recommends over the deprecated ``TemporalAgent``),
  run in a workflow registered by ``PydanticAIPlugin``; one model turn against the stub.
* **peer-api**: the same peer behind a minimal HTTP API of its own (FastAPI under uvicorn,
  ``POST /turn`` runs the workflow to its end): the peer in the shape Baton is measured in.
* **baton**: the real API and worker in one process as ``baton dev`` runs them
  (:class:`worker.stack.ServicesThread`), driven over real HTTP: one turn is
  ``POST /v1/sessions`` with ``sync: true`` (a new session, its first reply), the model the
  same stub (``openai-chat:stub-model``).

Each "turn" of every system is a new workflow answering one prompt, so the three are the
same unit of work. Then Baton alone: a review decision until the turn resumed, a paged
transcript of 10,000 messages and a turn on it, and 400 SSE followers. Every target is
printed with Baton's value and, where the peer has the same thing, the peer's.

Run from the repo root (not part of ``make test``)::

    .venv/bin/python bench/peer.py                 # the defaults (~2-3 min)
    .venv/bin/python bench/peer.py --rounds 2 --seq 20 --followers 100
    .venv/bin/python bench/peer.py --py-spy /tmp/baton.svg   # flame graph of the Baton phase
    .venv/bin/python bench/peer.py --phases review --systems bare,baton  # the review path alone
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

if __name__ == "__main__":
    # `python bench/peer.py` puts bench/ on sys.path, not the repo root: the packages below
    # are imported from the root (the sandbox re-imports `bench.systems` by that name).
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pydantic import BaseModel

from bench.peer_agent import MODEL
from bench.systems import REPLY, BareTurn, PeerTurn, noop

# --- targets -------------------------------------------------------------------

TURN_RATIO = 1.5  # one turn <= 1.5x bare (and below the peer's ratio)
THROUGHPUT_RATIO = 0.8  # 20 concurrent: >= 0.8x bare's turns/s (and above the peer's)
REVIEW_P50_MS = 100.0  # decision -> turn resumed (tool result recorded)
REVIEW_P95_MS = 200.0
TRANSCRIPT_P95_MS = 100.0  # GET /transcript, paged
TRANSCRIPT_MESSAGES = 10_000
SSE_FOLLOWERS = 400
#: Idle followers may cost the SQLite poller's reads (5/s) and little more, whatever their
#: number; a follower that polls would read the log every 200 ms (two queries).
MAX_IDLE_SQL_PER_S = 10
#: Sessions in the list the ``pages`` phase reads, and the depth of its deep page.
LIST_SESSIONS, LIST_DEPTH = 20_000, 19_900
#: Any page of the session list (cursor paging): p95 within 20 % of the first page's.
PAGE_P95_RATIO = 1.2
#: Followers of ONE session in the ``crowd`` phase; its turn may slow by 20 % at most.
CROWD_FOLLOWERS, CROWD_RATIO = 300, 1.2
#: The ``crowd`` phase's followers, run in a child process: ``argv`` = base URL, session id,
#: how many; each follows from the log's newest event; prints ``ready`` once every stream
#: is open, then reads them until killed.
FOLLOWERS_CHILD = """
import asyncio, sys
import httpx

async def main(base, sid, n):
    opened = 0
    ready = asyncio.Event()
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=base, timeout=None, limits=limits) as http:
        # Where the log ends now (the session is idle, so this stream closes at once): the
        # followers start there, as a client that has shown the transcript does, and no
        # catch-up read of the whole log by each of them overlaps the timed turns.
        newest = 0
        async with http.stream("GET", f"/v1/sessions/{sid}/events?until=idle") as resp:
            async for line in resp.aiter_lines():
                if line.startswith("id:"):
                    newest = int(line[3:])
        async def follow():
            nonlocal opened
            async with http.stream("GET", f"/v1/sessions/{sid}/events?after={newest}") as resp:
                assert resp.status_code == 200
                opened += 1
                if opened == n:
                    ready.set()
                async for _ in resp.aiter_raw():
                    pass
        tasks = [asyncio.create_task(follow()) for _ in range(n)]
        await ready.wait()
        print("ready", flush=True)
        await asyncio.gather(*tasks)

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""
#: The phases, in the order they run (``--phases``); ``--turns-only`` is ``--phases turns``.
PHASES = ("turns", "review", "transcript", "pages", "sse", "crowd")


def pct(xs: Sequence[float], p: float) -> float:
    """The p-th percentile (nearest rank) of ``xs``."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(p / 100 * len(s) + 0.5) - 1))]


def ms(xs: Sequence[float]) -> str:
    """``p50 … ms  p95 … ms`` of samples in seconds."""
    if not xs:
        return "(no samples)"
    return f"p50 {statistics.median(xs) * 1000:7.1f} ms   p95 {pct(xs, 95) * 1000:7.1f} ms"


def verdict(ok: bool) -> str:
    return "MET" if ok else "NOT MET"


#: The peer's two views: its workflow started by a Temporal client in the bench's process
#: (``peer``), and the same behind a minimal HTTP API of its own (``peer-api``, as a user
#: would put one in front of it; Baton's turn always comes through its API).
PEERS = ("peer", "peer-api")


def turn_targets(
    seq: dict[str, list[float]], tps: dict[str, list[float]], concurrency: int
) -> list[str]:
    """The one-turn and throughput target lines from each system's sequential turn
    latencies and turns/s (``bare`` required), Baton judged against bare and against each
    view of the peer that ran (:data:`PEERS`). Without either (``--systems bare,baton``)
    the peer prints ``n/a`` and only the ratio to bare is judged. No lines without
    ``baton``."""
    if "baton" not in seq:
        return []
    bare50, bare_tps = statistics.median(seq["bare"]), statistics.median(tps["bare"])
    b = statistics.median(seq["baton"]) / bare50
    bt = statistics.median(tps["baton"]) / bare_tps
    peers = [p for p in PEERS if p in seq]
    p50 = {p: statistics.median(seq[p]) / bare50 for p in peers}
    ptps = {p: statistics.median(tps[p]) / bare_tps for p in peers}
    turn_ok = b <= TURN_RATIO and all(b < v for v in p50.values())
    tps_ok = bt >= THROUGHPUT_RATIO and all(bt > v for v in ptps.values())

    def shown(ratios: dict[str, float]) -> str:
        return "   ".join(f"{p} {v:5.2f}x" for p, v in ratios.items()) or "peer   n/a"

    return [
        f"  one turn (HTTP, sync)       baton {b:5.2f}x bare   {shown(p50)}   "
        f"target <= {TURN_RATIO}x and < each peer: {verdict(turn_ok)}",
        f"  {concurrency} concurrent throughput    baton {bt:5.2f}x bare   "
        f"{shown(ptps)}   target >= {THROUGHPUT_RATIO}x and > each peer: {verdict(tps_ok)}",
    ]


class PeerPrompt(BaseModel):
    """The body of the peer API's ``POST /turn``."""

    prompt: str


def peer_api(address: str, task_queue: str) -> Any:
    """The peer behind a minimal HTTP API (FastAPI): ``POST /turn {"prompt": …}`` runs one
    :class:`PeerTurn` workflow to its end through a client of its own and answers
    ``{"workflow_id", "response"}``; what a user would put in front of the peer to serve
    turns over HTTP as Baton's API does."""
    from contextlib import asynccontextmanager

    from fastapi import FastAPI
    from pydantic_ai.durable_exec.temporal import PydanticAIPlugin
    from temporalio.client import Client

    clients: list[Client] = []

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> Any:
        clients.append(await Client.connect(address, plugins=[PydanticAIPlugin()]))
        yield

    app = FastAPI(lifespan=lifespan)

    @app.post("/turn")
    async def turn(body: PeerPrompt) -> dict[str, str]:
        wid = f"peer-api-{uuid.uuid4()}"
        out = await clients[0].execute_workflow(
            PeerTurn.run, body.prompt, id=wid, task_queue=task_queue
        )
        return {"workflow_id": wid, "response": str(out)}

    return app


def phases_of(phases: str, *, turns_only: bool) -> list[str]:
    """The phases to run, in :data:`PHASES` order, from ``--phases`` (comma-separated) and
    ``--turns-only`` (an alias of ``--phases turns``). Raises ValueError on an unknown one."""
    chosen = ["turns"] if turns_only else [x for x in phases.split(",") if x]
    unknown = set(chosen) - set(PHASES)
    if unknown:
        raise ValueError(
            f"unknown phase(s) {', '.join(sorted(unknown))}: choose from {', '.join(PHASES)}"
        )
    return [x for x in PHASES if x in chosen]


def serve_thread(app: Any) -> tuple[Any, str]:
    """``app`` under uvicorn on a free loopback port in a daemon thread; (server, base URL)."""
    import uvicorn

    from worker.stack import free_port

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    threading.Thread(target=server.run, daemon=True, name="bench-stub").start()
    deadline = time.monotonic() + 15
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{app!r} did not start on port {port}")
        time.sleep(0.02)
    return server, f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def py_spy(path: str | None) -> Iterator[None]:
    """``py-spy record`` of this process into ``path`` (an SVG) while the body runs."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not path or not Path(exe).exists():
        if path:
            print(f"(py-spy not found at {exe}: no profile)")
        yield
        return
    fmt = ["--format", "raw"] if path.endswith(".txt") else []  # collapsed stacks, for scripts
    proc = subprocess.Popen(
        [
            exe,
            "record",
            "--pid",
            str(os.getpid()),
            "--rate",
            os.environ.get("BENCH_PY_SPY_RATE", "100"),
            "--nonblocking",
            "-o",
            path,
            *fmt,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)  # let it attach
    try:
        yield
    finally:
        proc.send_signal(2)  # SIGINT: py-spy writes the file and exits
        proc.wait(timeout=60)
        print(f"py-spy flame graph: {path}")


class SqlCounter:
    """SQL statements this process runs, counted by a SQLAlchemy engine event."""

    def __init__(self) -> None:
        import sqlalchemy as sa
        from sqlalchemy.engine import Engine

        self.count = 0
        self._lock = threading.Lock()
        sa.event.listen(Engine, "before_cursor_execute", self._on)

    def _on(self, *_: Any) -> None:
        with self._lock:
            self.count += 1


class Bench:
    """The three systems on one dev server, and the measurements."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.lines: list[str] = []
        self.targets: list[str] = []
        self.t0 = time.perf_counter()

    def say(self, what: str) -> None:
        print(f"[{time.perf_counter() - self.t0:6.1f} s] {what}", flush=True)

    def out(self, line: str = "") -> None:
        """A report line: printed now (a later phase may fail) and again in the summary."""
        print(line, flush=True)
        self.lines.append(line)

    async def phase(self, name: str, run: Callable[[], Awaitable[None]]) -> None:
        """Run one Baton-only phase; a failure (e.g. an older commit timing out) is
        reported as that phase's result and the others still run."""
        try:
            await run()
        except Exception as exc:
            self.out(f"== {name}: FAILED ({type(exc).__name__}: {str(exc)[:200]}) ==")
            self.targets.append(f"  {name:<28} FAILED: {type(exc).__name__}")

    # --- drivers: one turn of each system ------------------------------------------------

    async def bare_turn(self) -> str:
        wid = f"bare-{uuid.uuid4()}"
        out = await self.client.execute_workflow(
            BareTurn.run, "hello", id=wid, task_queue=self.bare_q
        )
        assert out == REPLY, out
        return wid

    async def peer_turn(self) -> str:
        wid = f"peer-{uuid.uuid4()}"
        out = await self.peer_client.execute_workflow(
            PeerTurn.run, "hello", id=wid, task_queue=self.peer_q
        )
        assert out == REPLY, out
        return wid

    async def peer_api_turn(self) -> str:
        r = await self.http.post(f"{self.peer_url}/turn", json={"prompt": "hello"})
        assert r.status_code == 200 and r.json()["response"] == REPLY, r.text
        return str(r.json()["workflow_id"])

    async def baton_turn(self) -> str:
        r = await self.http.post(
            "/v1/sessions", json={"agent": self.agent, "prompt": "hello", "sync": True}
        )
        assert r.status_code == 201 and r.json()["response"] == REPLY, r.text
        return str(r.json()["session_id"])

    # --- phases ------------------------------------------------------------------------------

    async def sequential(self, turn: Callable[[], Awaitable[Any]], n: int) -> list[float]:
        out = []
        for _ in range(n):
            t = time.perf_counter()
            await turn()
            out.append(time.perf_counter() - t)
        return out

    async def concurrent(
        self, turn: Callable[[], Awaitable[Any]], c: int, k: int
    ) -> tuple[float, float]:
        """``c`` concurrent loops of ``k`` turns: (turns/s, CPU s of this process per turn)."""

        async def loop() -> None:
            for _ in range(k):
                await turn()

        t, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(loop() for _ in range(c)))
        wall = time.perf_counter() - t
        return c * k / wall, (time.process_time() - cpu) / (c * k)

    async def history_counts(self, workflow_id: str) -> Counter[str]:
        """Activities by type, workflow tasks and markers (patches, local activities) of one run."""
        from temporalio.api.enums.v1 import EventType

        counts: Counter[str] = Counter()
        handle = self.client.get_workflow_handle(workflow_id)
        async for e in handle.fetch_history_events():
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                counts[
                    f"activity {e.activity_task_scheduled_event_attributes.activity_type.name}"
                ] += 1
            elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
                counts["workflow tasks"] += 1
            elif e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
                counts["markers"] += 1
            counts["events"] += 1
        return counts

    async def publish(self, slug: str, spec: dict[str, Any]) -> None:
        r = await self.http.post("/v1/agents", json={"slug": slug, "name": slug, "spec": spec})
        assert r.status_code == 201, r.text
        r = await self.http.post(f"/v1/agents/{slug}/publish")
        assert r.status_code == 201, r.text

    # --- the run -----------------------------------------------------------------------------

    async def run(self) -> None:
        import httpx
        from pydantic_ai.durable_exec.temporal import PydanticAIPlugin
        from temporalio.client import Client
        from temporalio.contrib.pydantic import pydantic_data_converter
        from temporalio.worker import Worker
        from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

        from baton.settings import Settings
        from baton.storage.db import init_db, make_engine
        from tests.openai_stub import OpenAIStub
        from worker.factory import PASSTHROUGH
        from worker.stack import DevServer, ServicesThread, free_port

        args = self.args
        tmp = Path(tempfile.mkdtemp(prefix="baton-peer-bench-"))
        self.stub = OpenAIStub(reply=REPLY)
        stub_server, stub_url = serve_thread(self.stub.app)
        os.environ["OPENAI_BASE_URL"] = f"{stub_url}/v1"
        os.environ.setdefault("OPENAI_API_KEY", "bench-key")
        server = DevServer(port=free_port(), ui_port=free_port(), db_file=None)
        server.start()
        self.say(f"dev server on {server.address}; stub model on {stub_url}")
        url = args.database_url or f"sqlite:///{tmp / 'baton.db'}"
        engine = make_engine(url)
        init_db(engine)
        self.engine = engine
        settings = Settings(
            database_url=url,
            temporal_address=server.address,
            task_queue=f"bench-baton-{uuid.uuid4()}",
            model=MODEL,
            review_timeout=120,
        )
        services = ServicesThread(settings, api_port=free_port())
        services.start()
        self.client = await Client.connect(server.address, data_converter=pydantic_data_converter)
        # PydanticAIPlugin is a client plugin too: its data converter, and the worker's
        # sandbox passthrough and activities for every agent its workflows list.
        self.peer_client = await Client.connect(server.address, plugins=[PydanticAIPlugin()])
        self.bare_q, self.peer_q = f"bench-bare-{uuid.uuid4()}", f"bench-peer-{uuid.uuid4()}"
        sandbox = SandboxedWorkflowRunner(
            restrictions=SandboxRestrictions.default.with_passthrough_modules(*PASSTHROUGH)
        )
        bare_worker = Worker(
            self.client,
            task_queue=self.bare_q,
            workflows=[BareTurn],
            activities=[noop],
            workflow_runner=sandbox,
        )
        peer_worker = Worker(self.peer_client, task_queue=self.peer_q, workflows=[PeerTurn])
        peer_server, self.peer_url = serve_thread(peer_api(server.address, self.peer_q))
        self.agent = f"bench-{uuid.uuid4().hex[:8]}"
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        try:
            async with (
                bare_worker,
                peer_worker,
                httpx.AsyncClient(base_url=services.api_url, timeout=120, limits=limits) as http,
            ):
                self.http = http
                await self.publish(self.agent, {"system_prompt": "Answer briefly.", "model": MODEL})
                if "turns" in args.phases:
                    await self.turns()
                if "review" in args.phases:
                    await self.phase("review", self.review)
                if "transcript" in args.phases:
                    await self.phase("transcript", self.transcript)
                if "pages" in args.phases:
                    await self.phase("session list pages", self.pages)
                if "sse" in args.phases:
                    await self.phase("SSE followers", self.followers)
                if "crowd" in args.phases:
                    await self.phase("followers of one session", self.crowd)
                self.report_targets()
        finally:
            services.stop()
            peer_server.should_exit = True
            server.stop()
            stub_server.should_exit = True
            engine.dispose()
            shutil.rmtree(tmp, ignore_errors=True)
        print("\n== summary ==")
        print("\n".join(self.lines))
        print(f"\ntotal {time.perf_counter() - self.t0:.1f} s")

    async def turns(self) -> None:
        args = self.args
        every = {
            "bare": self.bare_turn,
            "peer": self.peer_turn,
            "peer-api": self.peer_api_turn,
            "baton": self.baton_turn,
        }
        systems = {k: v for k, v in every.items() if k in args.systems.split(",")}
        for turn in systems.values():  # warm-up: sandbox imports, connections, caches
            for _ in range(args.warmup):
                await turn()
        self.say("warmed up")
        seq: dict[str, list[float]] = {k: [] for k in systems}
        tps: dict[str, list[float]] = {k: [] for k in systems}
        cpu: dict[str, list[float]] = {k: [] for k in systems}
        order = list(systems)
        k = len(order)
        with py_spy(args.py_spy):
            for r in range(args.rounds):
                for name in order[r % k :] + order[: r % k]:  # interleaved, rotating
                    seq[name] += await self.sequential(systems[name], args.seq)
            self.say("sequential done")
            for r in range(args.rounds):
                for name in order[r % k :] + order[: r % k]:
                    await asyncio.sleep(args.settle)
                    t, c = await self.concurrent(systems[name], args.concurrency, args.per_loop)
                    tps[name].append(t)
                    cpu[name].append(c)
            self.say("concurrent done")
        if "bare" not in systems:  # a profiling run: the raw figures only
            for name in systems:
                self.out(f"  {name:<8} {ms(seq[name])}   {statistics.median(tps[name]):.1f}/s")
            return
        bare50 = statistics.median(seq["bare"])
        bare_tps = statistics.median(tps["bare"])
        self.out(
            f"== one turn, sequential ({args.rounds} rounds x {args.seq}, interleaved; "
            f"{os.cpu_count()} CPUs) =="
        )
        for name in systems:
            ratio = statistics.median(seq[name]) / bare50
            self.out(f"  {name:<8} {ms(seq[name])}   {ratio:5.2f}x bare")
        self.out(
            f"== {args.concurrency} concurrent x {args.per_loop} turns ({args.rounds} rounds; "
            "median turns/s; CPU of this process per turn) =="
        )
        for name in systems:
            t = statistics.median(tps[name])
            c = statistics.median(cpu[name]) * 1000
            self.out(f"  {name:<8} {t:7.1f} turns/s   {t / bare_tps:5.2f}x bare   CPU {c:5.1f} ms")
        # What one turn costs in Temporal terms, from each system's history.
        self.out("== per turn, from history (activities, workflow tasks, events) ==")
        for name, turn in systems.items():
            counts = await self.history_counts(await turn())
            self.out(f"  {name:<8} " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        self.targets += turn_targets(seq, tps, args.concurrency)

    def report_targets(self) -> None:
        if not self.targets:
            return
        self.out()
        self.out("== targets ==")
        for line in self.targets:
            self.out(line)

    async def review(self) -> None:
        """Decision through the API -> the turn resumed (tool result recorded), p50; a bare
        turn after each decision (the floor in the same conditions); where the time goes,
        from the history of every reviewed run."""
        from datetime import datetime

        slug = f"bench-lister-{uuid.uuid4().hex[:6]}"
        # list_agents with no policy stored is reviewed (seed 003: review is no row).
        playbook = [
            {"when": "^list_agents: ", "reply": "listed"},
            {
                "when": "go",
                "reply": "Listing.",
                "tool_calls": [{"tool": "list_agents", "args": {}}],
            },
        ]
        await self.publish(slug, {"playbook": playbook, "model": "scripted"})
        with_bare = "bare" in self.args.systems.split(",")
        for _ in range(self.args.warmup if "turns" not in self.args.phases else 0):
            await self.bare_turn()  # the bare worker's sandbox and connections, as `turns` does
        resumed: dict[str, list[float]] = {"async": [], "sync": []}
        answered: list[float] = []
        bare: list[float] = []
        paths: list[dict[str, float]] = []
        with py_spy(self.args.py_spy if self.args.phases[0] == "review" else None):
            for i in range(2 * self.args.reviews):
                # Alternating: the caller waits on the turn (sync: true, its POST answered
                # when the turn ends) or not; the decision's path is the same workflow's.
                mode = ("async", "sync")[i % 2]
                body = {"agent": slug, "prompt": "go", "sync": mode == "sync"}
                caller = asyncio.create_task(self.http.post("/v1/sessions", json=body))
                sid, rid = await self._pending_review(caller)
                t0 = time.time()
                d = await self.http.post(
                    f"/v1/reviews/{rid}/decision", json={"decision": "allow_once"}
                )
                answered.append(time.time() - t0)
                assert d.status_code == 200, d.text
                at = datetime.fromisoformat(await self._tool_result_at(sid)).timestamp()
                resumed[mode].append(at - t0)
                r = await caller
                assert r.status_code in (201, 202), r.text
                paths.append(await self.review_path(sid, t0, at))
                if with_bare:
                    t = time.perf_counter()
                    await self.bare_turn()
                    bare.append(time.perf_counter() - t)
        self.out("== review decision (POST /v1/reviews/{id}/decision allow_once) ==")
        self.out(f"  decision answered (HTTP 200)     {ms(answered)}")
        for mode, took in resumed.items():
            self.out(f"  turn resumed, {mode:<5} caller      {ms(took)}")
        if bare:
            self.out(f"  bare turn, one after each review {ms(bare)}")
        self.out("  where it goes (p50 ms after the POST was sent; from each run's history):")
        order = {k: i for p in reversed(paths) for i, k in enumerate(p)}  # first run's order
        names = sorted(
            order, key=lambda k: (statistics.median(p[k] for p in paths if k in p), order[k])
        )
        for name in names:
            xs = [p[name] for p in paths if name in p]
            self.out(f"    {statistics.median(xs) * 1000:7.1f}  {name} ({len(xs)}/{len(paths)})")
        floor = f"   bare turn p50 {statistics.median(bare) * 1000:5.1f} ms" if bare else ""
        for mode, took in resumed.items():
            p50, p95 = statistics.median(took) * 1000, pct(took, 95) * 1000
            self.targets.append(
                f"  review -> resumed ({mode:<5})  baton p50 {p50:5.1f} ms p95 {p95:5.1f} ms"
                f"{floor}   peer n/a (a deferred tool ends its run)   target p50 <= "
                f"{REVIEW_P50_MS:.0f} ms, p95 <= {REVIEW_P95_MS:.0f} ms: "
                + verdict(p50 <= REVIEW_P50_MS and p95 <= REVIEW_P95_MS)
            )

    async def review_path(self, sid: str, t0: float, tool_at: float) -> dict[str, float]:
        """Seconds from ``t0`` (the decision POST sent) to each step of the run's resumption:
        the Signal, then every history event until a workflow task is scheduled after the
        tool result was stored (named by type and activity type; a local activity's marker
        carries its workflow task's completion time; patch markers left out), and the tool
        row's ``created_at``. The server's clock is this
        machine's."""
        from temporalio.api.enums.v1 import EventType

        out: dict[str, float] = {}
        signaled = False
        types: dict[int, str] = {}
        seen: Counter[str] = Counter()
        async for e in self.client.get_workflow_handle(sid).fetch_history_events():
            name = EventType.Name(e.event_type).removeprefix("EVENT_TYPE_").lower()
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
                signaled = True
            if not signaled:
                continue
            at = e.event_time.ToDatetime().timestamp()
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                types[e.event_id] = e.activity_task_scheduled_event_attributes.activity_type.name
                name += f" {types[e.event_id]}"
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                name += f" {types.get(e.activity_task_started_event_attributes.scheduled_event_id)}"
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
                sched = e.activity_task_completed_event_attributes.scheduled_event_id
                name += f" {types.get(sched)}"
            if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
                marker = e.marker_recorded_event_attributes
                if marker.marker_name != "core_local_activity":
                    continue  # a patch marker
                # Written with the workflow task's completion: its time is that task's.
                data = json.loads(marker.details["data"].payloads[0].data)
                name = f"marker: local activity {data['activity_type']}"
            seen[name] += 1
            label = name if seen[name] == 1 else f"{name} #{seen[name]}"
            out[label] = at - t0
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED and at > tool_at:
                break  # the markers and commands of the task that stored the result are in
        out["tool result row written"] = tool_at - t0
        return out

    async def _pending_review(self, caller: asyncio.Task[Any]) -> tuple[str, str]:
        """The pending review the session ``caller`` is creating opened: (session id, review
        id). Reviews are decided one at a time here, so the only pending one is its."""
        for _ in range(2000):
            if caller.done() and caller.result().status_code not in (201, 202):
                raise RuntimeError(caller.result().text)
            r = await self.http.get("/v1/reviews", params={"status": "pending"})
            data = r.json()["data"]
            if data:
                return str(data[0]["session_id"]), str(data[0]["id"])
            await asyncio.sleep(0.01)
        raise RuntimeError("no review")

    async def _tool_result_at(self, sid: str) -> str:
        for _ in range(400):
            r = await self.http.get(f"/v1/sessions/{sid}/transcript")
            for m in r.json()["messages"]:
                if m["role"] == "tool":
                    return str(m["at"])
            # The row's own created_at is the figure: polling sooner adds no precision, only
            # API work competing with the worker while it resumes the turn.
            await asyncio.sleep(0.05)
        raise RuntimeError("no tool result")

    async def transcript(self) -> None:
        """10,000 messages: paged GET p95, and a model turn on the session."""
        import sqlalchemy as sa

        from baton.contracts.values import position
        from baton.storage.db import MessageRow, SessionRow, session_scope, utcnow

        r = await self.http.post(
            "/v1/sessions", json={"agent": self.agent, "prompt": "hello", "sync": True}
        )
        sid = r.json()["session_id"]
        n = TRANSCRIPT_MESSAGES
        now = utcnow()
        rows = [
            {
                "id": f"{sid}:bulk{i}",
                "session_id": sid,
                # Before the real turns (turn 0 does not exist): the session's own turn 1
                # stays the newest, the next one is turn 2.
                "position": f"0.{i:06d}",
                "role": "user" if i % 2 == 0 else "assistant",
                "agent_slug": self.agent,
                "text": f"message {i} " + "lorem ipsum " * 8,
                "is_error": False,
                "created_at": now,
            }
            for i in range(n - 2)
        ]
        with session_scope(self.engine) as s:
            s.execute(sa.insert(MessageRow), rows)
            s.execute(
                sa.update(SessionRow)
                .where(SessionRow.id == sid)
                .values(message_count=SessionRow.message_count + len(rows))
            )
        assert position(1, 0, 0) > rows[-1]["position"]
        self.say(f"seeded {n} messages")
        page = self.args.page
        paged: list[float] = []
        cursor: str | None = None
        seen = 0
        while True:
            params: dict[str, Any] = {"limit": page}
            if cursor:
                params["cursor"] = cursor
            t = time.perf_counter()
            got = await self.http.get(f"/v1/sessions/{sid}/transcript", params=params)
            paged.append(time.perf_counter() - t)
            body = got.json()
            seen += len(body["messages"])
            cursor = body.get("next_cursor")
            if not cursor:
                break
        # Code without paging (a before/after run) answers the whole transcript at once.
        assert seen == n or "next_cursor" not in body, seen
        t = time.perf_counter()
        whole = await self.http.get(f"/v1/sessions/{sid}/transcript")
        whole_s = time.perf_counter() - t
        self.stub.requests.clear()
        big = []
        for _ in range(3):
            t = time.perf_counter()
            await self._message(sid)
            big.append(time.perf_counter() - t)
        sent = len(self.stub.requests[-1]["messages"])
        self.out(f"== transcript of {n} messages ==")
        self.out(f"  GET transcript?limit={page} ({len(paged)} pages)  {ms(paged)}")
        self.out(
            f"  GET transcript (whole, unpaged)    {whole_s * 1000:7.1f} ms "
            f"({len(whole.json()['messages'])} messages)"
        )
        self.out(f"  a turn on it (POST messages sync)  {ms(big)}   model got {sent} messages")
        p95 = pct(paged, 95) * 1000
        self.targets.append(
            f"  transcript 10k paged p95     baton {p95:6.1f} ms   peer n/a (no transcript "
            f"API)   target <= {TRANSCRIPT_P95_MS:.0f} ms: {verdict(p95 <= TRANSCRIPT_P95_MS)}"
        )
        self.targets.append(
            f"  a turn on 10k messages       baton {statistics.median(big) * 1000:6.1f} ms, "
            f"model sent {sent} of {n + 1} messages (bounded context window): "
            f"{verdict(sent < n)}"
        )

    async def pages(self) -> None:
        """20,000 sessions: p95 of the session list's first page, of the page at depth
        19,900 by ``offset`` and by ``cursor`` (interleaved, one request at a time)."""
        from datetime import timedelta

        import sqlalchemy as sa

        from baton.runs import session_store
        from baton.storage.db import SessionRow, session_scope, utcnow

        n, depth, limit = LIST_SESSIONS, LIST_DEPTH, 50
        start = utcnow() - timedelta(days=1)
        rows = [
            {
                "id": f"session-{uuid.uuid4()}",
                "name": f"bulk {i}",
                "agent_slug": self.agent,
                "agent_version": 1,
                "status": "idle",
                "depth": 0,
                "sandbox": False,
                "message_count": 0,
                "input_tokens": 0,
                "output_tokens": 0,
                "created_at": start + timedelta(milliseconds=i),
                "last_activity_at": start + timedelta(milliseconds=i),
            }
            for i in range(n)
        ]
        with session_scope(self.engine) as s:
            s.execute(sa.insert(SessionRow), rows)
            total = s.execute(sa.select(sa.func.count()).select_from(SessionRow)).scalar_one()
            # the cursor a client walking the pages would hold at that depth
            deep, _, _ = session_store.page_sessions(s, limit=1, offset=depth - 1)
            cursor = session_store.session_cursor(deep[0])
        self.say(f"seeded {n} sessions ({total} in all)")
        kinds: dict[str, dict[str, Any]] = {
            "first page": {"limit": limit},
            f"offset={depth}": {"limit": limit, "offset": depth},
            f"cursor at {depth}": {"limit": limit, "cursor": cursor},
        }
        took: dict[str, list[float]] = {k: [] for k in kinds}
        for params in kinds.values():  # warm the statement caches
            r = await self.http.get("/v1/sessions", params=params)
            assert r.status_code == 200, r.text
        for _ in range(self.args.page_requests):
            for name, params in kinds.items():
                t = time.perf_counter()
                r = await self.http.get("/v1/sessions", params=params)
                took[name].append(time.perf_counter() - t)
                assert r.status_code == 200 and len(r.json()["data"]) == limit, r.text
        first95 = pct(took["first page"], 95)
        self.out(f"== session list of {total} sessions (limit={limit}, one at a time) ==")
        for name, xs in took.items():
            ratio = pct(xs, 95) / first95
            self.out(f"  GET /v1/sessions {name:<16} {ms(xs)}   {ratio:5.2f}x first")
        ratio = pct(took[f"cursor at {depth}"], 95) / first95
        self.targets.append(
            f"  deep page (cursor) p95       baton {ratio:5.2f}x the first page   offset "
            f"{pct(took[f'offset={depth}'], 95) / first95:5.2f}x   peer n/a (no API)   "
            f"target <= {PAGE_P95_RATIO}x: {verdict(ratio <= PAGE_P95_RATIO)}"
        )

    async def _message(self, sid: str) -> None:
        r = await self.http.post(
            f"/v1/sessions/{sid}/messages", json={"prompt": "hello", "sync": True}
        )
        assert r.status_code == 200 and r.json()["response"] == REPLY, r.text

    async def followers(self) -> None:
        """400 SSE followers of idle sessions: this process's CPU and SQL while they wait."""
        n, per = self.args.followers, 20
        sids = []
        for _ in range(max(1, n // per)):
            r = await self.http.post(
                "/v1/sessions", json={"agent": self.agent, "prompt": "hello", "sync": True}
            )
            sids.append(r.json()["session_id"])
        import sqlalchemy as sa

        with self.engine.connect() as conn:
            newest = conn.execute(sa.text("SELECT MAX(id) FROM events")).scalar_one()
        counter = SqlCounter()
        idle_s = self.args.idle_s

        async def window() -> tuple[float, int]:
            cpu, sql = time.process_time(), counter.count
            await asyncio.sleep(idle_s)
            return (time.process_time() - cpu) / idle_s, counter.count - sql

        base_cpu, base_sql = await window()
        opened = asyncio.Event()
        connected = 0
        first_event: dict[int, float] = {}
        woken = asyncio.Event()

        async def follow(i: int, sid: str) -> None:
            nonlocal connected
            # Resume after everything there is: the follower waits for the next event.
            async with self.http.stream(
                "GET", f"/v1/sessions/{sid}/events", params={"after": newest}
            ) as resp:
                assert resp.status_code == 200
                connected += 1
                if connected == n:
                    opened.set()
                async for line in resp.aiter_lines():
                    if line.startswith("id:"):
                        first_event.setdefault(i, time.perf_counter())
                        if sum(1 for j in first_event if j % len(sids) == 0) >= n // len(sids):
                            woken.set()

        tasks = [asyncio.create_task(follow(i, sids[i % len(sids)])) for i in range(n)]
        try:
            await asyncio.wait_for(opened.wait(), 120)
            await asyncio.sleep(1.0)
            cpu, sql = await window()
            # Wake: one session gets a new turn; time until all its followers saw an event.
            t = time.perf_counter()
            await self._message_async(sids[0])
            await asyncio.wait_for(woken.wait(), 60)
            wake = max(v for k, v in first_event.items() if k % len(sids) == 0) - t
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        self.out(f"== {n} SSE followers on {len(sids)} idle sessions ({idle_s:g} s windows) ==")
        self.out(f"  no followers:     CPU {base_cpu * 100:5.1f} % of a core, {base_sql} SQL")
        self.out(
            f"  {n} idle followers: CPU {cpu * 100:5.1f} % of a core, {sql} SQL "
            f"({sql / idle_s:.1f}/s)"
        )
        self.out(
            f"  a new turn reached all {n // len(sids)} followers of its session in "
            f"{wake * 1000:.0f} ms"
        )
        extra = (cpu - base_cpu) * 100
        polls = sql / idle_s
        self.targets.append(
            f"  {n} idle SSE followers       baton +{extra:4.1f} % CPU, {polls:.1f} SQL/s   "
            f"peer n/a   target: <= {MAX_IDLE_SQL_PER_S} SQL/s in all, CPU near zero: "
            f"{verdict(polls <= MAX_IDLE_SQL_PER_S and extra < 5)}"
        )

    async def crowd(self) -> None:
        """A sync turn on one session (``POST …/messages``) with 1 follower, then with
        ``--crowd`` followers of that session, rounds interleaved; the API's log reads per
        turn (SQL statements in this process: the worker's writes and the followers' reads)."""
        r = await self.http.post(
            "/v1/sessions", json={"agent": self.agent, "prompt": "hello", "sync": True}
        )
        sid = r.json()["session_id"]
        counter = SqlCounter()

        async def turns(n: int) -> list[float]:
            out = []
            for _ in range(n):
                t = time.perf_counter()
                await self._message(sid)
                out.append(time.perf_counter() - t)
            return out

        took: dict[int, list[float]] = {1: [], self.args.crowd: []}
        sql: dict[int, list[int]] = {1: [], self.args.crowd: []}
        for rnd in range(self.args.rounds):
            for n in (1, self.args.crowd) if rnd % 2 == 0 else (self.args.crowd, 1):
                # The followers are clients in a process of their own, as real ones are:
                # what the API process spends on them is what is measured.
                proc = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-c",
                    FOLLOWERS_CHILD,
                    str(self.http.base_url),
                    sid,
                    str(n),
                    stdout=subprocess.PIPE,
                )
                try:
                    assert proc.stdout is not None
                    line = await asyncio.wait_for(proc.stdout.readline(), 300)
                    assert line.strip() == b"ready", line
                    await asyncio.sleep(1.0)  # every follower caught up
                    await turns(1)  # untimed
                    for _ in range(self.args.crowd_turns):
                        c0 = counter.count
                        took[n] += await turns(1)
                        sql[n].append(counter.count - c0)
                finally:
                    proc.kill()
                    await proc.wait()
        big = self.args.crowd
        one50, big50 = statistics.median(took[1]), statistics.median(took[big])
        self.out(f"== one session's turn (POST messages sync) with 1 and {big} followers of it ==")
        for n in (1, big):
            per_turn = statistics.median(sql[n])
            self.out(f"  {n:>4} follower(s)  {ms(took[n])}   SQL per turn {per_turn:.0f}")
        ratio = big50 / one50
        self.targets.append(
            f"  {big} followers, one session  baton {ratio:5.2f}x the turn with 1 follower   "
            f"peer n/a (no SSE API)   target <= {CROWD_RATIO}x: {verdict(ratio <= CROWD_RATIO)}"
        )

    async def _message_async(self, sid: str) -> None:
        r = await self.http.post(f"/v1/sessions/{sid}/messages", json={"prompt": "hello"})
        assert r.status_code == 200, r.text


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    p.add_argument("--seq", type=int, default=20, help="sequential turns per system per round")
    p.add_argument("--warmup", type=int, default=5, help="untimed turns per system first")
    p.add_argument("--concurrency", "-c", type=int, default=20, help="concurrent loops")
    p.add_argument("--per-loop", type=int, default=5, help="turns per concurrent loop")
    p.add_argument("--settle", type=float, default=1.0, help="idle seconds before a burst")
    p.add_argument("--reviews", type=int, default=15, help="review decisions per caller mode")
    p.add_argument("--page", type=int, default=100, help="transcript page size")
    p.add_argument(
        "--page-requests", type=int, default=60, help="requests per kind of session-list page"
    )
    p.add_argument("--followers", type=int, default=SSE_FOLLOWERS, help="SSE followers")
    p.add_argument("--crowd", type=int, default=CROWD_FOLLOWERS, help="followers of one session")
    p.add_argument("--crowd-turns", type=int, default=10, help="timed turns per round and crowd")
    p.add_argument("--idle-s", type=float, default=10.0, help="CPU window with idle followers")
    p.add_argument(
        "--systems",
        default="bare,peer,peer-api,baton",
        help="which of bare,peer,peer-api,baton (profiling)",
    )
    p.add_argument(
        "--phases",
        default=",".join(PHASES),
        help=f"which of {','.join(PHASES)} to run (in that order)",
    )
    p.add_argument("--turns-only", action="store_true", help="alias of --phases turns")
    p.add_argument("--database-url", help="Baton's DB (default: a temp SQLite file)")
    p.add_argument("--py-spy", help="write a py-spy flame graph of the turn phases here")
    args = p.parse_args(argv)
    try:
        args.phases = phases_of(args.phases, turns_only=args.turns_only)
    except ValueError as exc:
        p.error(str(exc))
    asyncio.run(Bench(args).run())


if __name__ == "__main__":
    main()
