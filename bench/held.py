"""The scale target in one run: 10,000 idle sessions AND 1,000 waiting on a review,
held by one worker: worker RSS <= 500 MB, and the API still answering p95 <= 50 ms.

The stack, as a deployment runs it: a Temporal dev server (``worker.stack.DevServer``,
in memory), a SQLite file in a temp dir (or ``--database-url``), ONE ``baton worker``
child process (its ``VmRSS`` is its own) and ONE ``baton api`` child process (uvicorn,
real HTTP), on one task queue. This process builds the load itself through
``baton.runs.launch.launch_session`` (as ``bench/idle.py`` does):

* ``--idle`` sessions of an instant scripted agent, each first turn answered; their runs
  complete ``--idle-timeout`` seconds later and the next message
  starts the next run (update-with-start);
* then ``--reviewing`` sessions of an agent whose playbook calls ``list_agents``: with
  no policy stored that call is reviewed (seed 003), so each run stays open waiting on
  the ``review_decision`` Signal with the review timeout (``--review-timeout``): these
  are the runs the worker holds, in its sticky cache while it has room.

The API is measured twice with the same mix of real requests, one at a time, in a
shuffled order each round (``--rounds`` rounds, one of each request per round):

* **baseline**: a nearly empty deployment, ``--rounds`` idle sessions (completed) and
  ``--rounds`` pending reviews, just what the requests need;
* **held**: the same requests once the load is built and every idle run has completed.

The requests: ``GET /v1/sessions/{id}``, ``GET /v1/sessions?limit=50``,
``GET /v1/reviews?status=pending``, ``GET /v1/sessions/{id}/transcript?limit=100``,
``POST /v1/sessions/{id}/messages`` (async: answered once the run accepted it; here a
completed run, so the restart) and ``POST /v1/reviews/{id}/decision`` (``allow_once``:
answered once the session settled it). Each line prints p50/p95, the held/baseline
ratio and the target; then the worker's RSS (and its sticky cache size from its
Prometheus endpoint, ``temporal_sticky_cache_size``) against 500 MB.

Run from the repo root (not part of ``make test``)::

    .venv/bin/python bench/held.py --idle 500 --reviewing 50 --idle-timeout 20   # smoke
    .venv/bin/python bench/held.py                    # 10,000 + 1,000 (tens of minutes)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]
if __name__ == "__main__":
    # `python bench/held.py` puts bench/ on sys.path, not the repo root.
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from sqlalchemy import func  # noqa: E402
from sqlalchemy.engine import Engine  # noqa: E402
from sqlmodel import select  # noqa: E402
from temporalio.client import Client  # noqa: E402
from temporalio.contrib.pydantic import pydantic_data_converter  # noqa: E402

from baton.agents import registry  # noqa: E402
from baton.agents.spec import AgentSpec  # noqa: E402
from baton.errors import AgentNotFound  # noqa: E402
from baton.settings import Settings  # noqa: E402
from baton.storage.db import ReviewRow, init_db, make_engine, session_scope  # noqa: E402
from bench.idle import launch_all, pct, polling, rss_mb, running  # noqa: E402
from worker.stack import DevServer, free_port, stop_process  # noqa: E402

IDLE_AGENT = "held-bench-idle"
LISTER_AGENT = "held-bench-lister"
#: list_agents with no policy stored is reviewed (seed 003: review is no row); after
#: the decision the tool result comes back and the turn ends with "listed".
LISTER_PLAYBOOK = [
    {"when": "^list_agents: ", "reply": "listed"},
    {"when": "go", "reply": "Listing.", "tool_calls": [{"tool": "list_agents", "args": {}}]},
]
TARGET_MB = 500.0
#: Untimed rounds first (the API's first requests import and compile).
WARMUP_ROUNDS = 10
TARGET_P95_MS = 50.0
#: The reads a client makes most, list and get: p95 held within 10 % of the baseline's.
UNCHANGED = ("GET /v1/sessions/{id}", "GET /v1/sessions?limit=50")
UNCHANGED_RATIO = 1.1
REQUESTS = (
    "GET /v1/sessions/{id}",
    "GET /v1/sessions?limit=50",
    "GET /v1/reviews?status=pending",
    "GET /v1/sessions/{id}/transcript?limit=100",
    "POST /v1/sessions/{id}/messages",
    "POST /v1/reviews/{id}/decision",
)


def sticky_cache_size(metrics_url: str) -> float | None:
    """The worker's ``temporal_sticky_cache_size`` gauge (cached runs), None if absent."""
    text = httpx.get(metrics_url, timeout=10).text
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("temporal_sticky_cache_size")
    ]
    return sum(values) if values else None


def pending_review_ids(engine: Engine, session_ids: set[str]) -> list[str]:
    """Pending reviews of ``session_ids`` (one per reviewing session)."""
    with session_scope(engine) as s:
        rows = s.exec(
            select(ReviewRow.id, ReviewRow.session_id).where(ReviewRow.status == "pending")
        ).all()
    return [rid for rid, sid in rows if sid in session_ids]


def count_pending(engine: Engine) -> int:
    with session_scope(engine) as s:
        return int(
            s.exec(
                select(func.count()).select_from(ReviewRow).where(ReviewRow.status == "pending")
            ).one()
        )


@contextlib.contextmanager
def child(args: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m cli ARGS`` as a child process (its output to ``log``), stopped on exit."""
    out: IO[bytes] = log.open("ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", *args], cwd=ROOT, env=env, stdout=out, stderr=out
    )
    try:
        yield proc
    finally:
        stop_process(proc, timeout=30)
        out.close()


class Mix:
    """The API requests, timed one at a time; each targets sessions/reviews it is given."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http
        #: Decisions answered 202 (delivered, not settled within the API's wait).
        self.unsettled = 0

    async def timed(self, call: Callable[[], Awaitable[httpx.Response]], ok: int) -> float:
        t0 = time.perf_counter()
        r = await call()
        took = time.perf_counter() - t0
        if r.status_code == 202 and ok == 200 and r.request.url.path.endswith("/decision"):
            self.unsettled += 1
        else:
            assert r.status_code == ok, f"{r.request.url}: {r.status_code} {r.text[:300]}"
        return took

    async def run(
        self, readers: list[str], messaged: list[str], decided: list[str]
    ) -> dict[str, list[float]]:
        """One round per ``messaged`` session, each request once in a shuffled order:
        seconds per request. Round i reads a random one of ``readers``, messages
        ``messaged[i]`` and decides review ``decided[i]``."""
        rounds = len(messaged)
        assert len(decided) == rounds, "one review per round"
        took: dict[str, list[float]] = {k: [] for k in REQUESTS}
        h = self.http
        for i in range(rounds):
            sid = random.choice(readers)
            calls: dict[str, tuple[Callable[[], Awaitable[httpx.Response]], int]] = {
                REQUESTS[0]: (lambda sid=sid: h.get(f"/v1/sessions/{sid}"), 200),
                REQUESTS[1]: (lambda: h.get("/v1/sessions", params={"limit": 50}), 200),
                REQUESTS[2]: (lambda: h.get("/v1/reviews", params={"status": "pending"}), 200),
                REQUESTS[3]: (
                    lambda sid=sid: h.get(f"/v1/sessions/{sid}/transcript", params={"limit": 100}),
                    200,
                ),
                REQUESTS[4]: (
                    lambda m=messaged[i]: h.post(
                        f"/v1/sessions/{m}/messages", json={"prompt": "again"}
                    ),
                    200,
                ),
                REQUESTS[5]: (
                    lambda r=decided[i]: h.post(
                        f"/v1/reviews/{r}/decision", json={"decision": "allow_once"}
                    ),
                    200,
                ),
            }
            order = list(calls)
            random.shuffle(order)
            for name in order:
                call, ok = calls[name]
                took[name].append(await self.timed(call, ok))
        return took


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.t0 = time.monotonic()
        self.figures: dict[str, Any] = {}

    def say(self, what: str) -> None:
        print(f"[{time.monotonic() - self.t0:7.1f} s] {what}", flush=True)

    async def wait_running(self, want: int, timeout: float) -> int:
        """Wait (visibility) until at most ``want`` runs of the queue are RUNNING."""
        deadline = time.monotonic() + timeout
        while (left := await running(self.client, self.queue)) > want:
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(2)
        return left

    async def wait_pending(self, want: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while (n := await asyncio.to_thread(count_pending, self.engine)) < want:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {n} of {want} reviews pending after {timeout:g} s")
            await asyncio.sleep(1)

    async def build(self, idle: int, reviewing: int, label: str) -> tuple[list[str], list[str]]:
        """``idle`` idle sessions then ``reviewing`` sessions each waiting on a review; once
        every idle run has completed: (idle ids, pending review ids)."""
        args = self.args
        self.say(f"{label}: launching {idle} idle sessions")
        before_running = await running(self.client, self.queue)
        t0 = time.monotonic()
        idle_ids = await launch_all(
            self.client,
            self.engine,
            self.queue,
            self.config,
            idle,
            args.concurrency,
            agent=IDLE_AGENT,
        )
        self.figures[f"{label}:idle_launch_s"] = time.monotonic() - t0
        self.say(f"{label}: launching {reviewing} reviewing sessions")
        pending_before = await asyncio.to_thread(count_pending, self.engine)
        t0 = time.monotonic()
        reviewing_ids = await launch_all(
            self.client,
            self.engine,
            self.queue,
            self.config,
            reviewing,
            args.concurrency,
            agent=LISTER_AGENT,
            prompt="go",
            sync=False,
        )
        await self.wait_pending(pending_before + reviewing, timeout=600)
        self.figures[f"{label}:reviewing_launch_s"] = time.monotonic() - t0
        self.say(f"{label}: {reviewing} reviews pending; waiting for the idle runs to complete")
        await asyncio.sleep(args.idle_timeout + 2)
        # Only the reviewing runs (and those a baseline left) stay open.
        left = await self.wait_running(before_running + reviewing, timeout=300 + idle / 20)
        self.figures[f"{label}:running"] = left
        review_ids = await asyncio.to_thread(pending_review_ids, self.engine, set(reviewing_ids))
        return idle_ids, review_ids

    def sample(self, label: str) -> None:
        self.figures[f"{label}:worker_rss"] = rss_mb(self.worker.pid)
        self.figures[f"{label}:api_rss"] = rss_mb(self.api.pid)
        self.figures[f"{label}:cache"] = sticky_cache_size(self.metrics_url)

    async def run(self) -> None:
        args = self.args
        # SIGTERM (a background job ignores SIGINT) cancels the run, so the `finally`s
        # below stop the worker, the API and the dev server instead of orphaning them.
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        tmp = Path(tempfile.mkdtemp(prefix="baton-held-bench-"))
        server = DevServer(port=free_port(), ui_port=free_port(), db_file=None)
        server.start()
        db_url = args.database_url or f"sqlite:///{tmp / 'held.db'}"
        self.engine = make_engine(db_url)
        init_db(self.engine)
        with session_scope(self.engine) as s:
            for slug, spec in (
                (IDLE_AGENT, {"playbook": [{"reply": "ok"}]}),
                (LISTER_AGENT, {"playbook": LISTER_PLAYBOOK}),
            ):
                try:
                    registry.get_agent(s, slug=slug)
                except AgentNotFound:  # a --database-url that has seen an earlier run keeps it
                    registry.create_agent(
                        s, slug=slug, name=slug, spec=AgentSpec.model_validate(spec)
                    )
                    registry.publish(s, slug=slug)
        self.queue = f"held-bench-{os.getpid()}"
        self.config = (
            Settings()
            .session_config()
            .model_copy(
                update={
                    "idle_timeout_s": args.idle_timeout,
                    "review_timeout_s": args.review_timeout,
                }
            )
        )
        metrics_port, api_port = free_port(), free_port()
        self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        env = {
            **os.environ,
            "BATON_DATABASE_URL": db_url,
            "BATON_TEMPORAL_ADDRESS": server.address,
            "BATON_TEMPORAL_ENV_CONFIG": "false",
            "BATON_TASK_QUEUE": self.queue,
            # What the API's own launches and restarts use (this bench's sessions carry
            # their config in their input).
            "BATON_SESSION_IDLE_TIMEOUT": str(args.idle_timeout),
            "BATON_REVIEW_TIMEOUT": str(args.review_timeout),
        }
        self.client = await Client.connect(server.address, data_converter=pydantic_data_converter)
        print(f"dev server {server.address}; DB {self.engine.url.render_as_string()}; logs {tmp}")
        try:
            with (
                child(
                    ["worker"],
                    {**env, "BATON_METRICS_BIND": f"127.0.0.1:{metrics_port}"},
                    tmp / "worker.log",
                ) as self.worker,
                child(["api", "--port", str(api_port)], env, tmp / "api.log") as self.api,
            ):
                await self.started(api_port)
                await asyncio.sleep(2)  # let start-up allocation settle
                self.sample("start")
                async with httpx.AsyncClient(
                    base_url=f"http://127.0.0.1:{api_port}", timeout=120
                ) as http:
                    mix = Mix(http)
                    n, warm = args.rounds, min(WARMUP_ROUNDS, args.rounds)
                    ids, reviews = await self.build(n + warm, n + warm, "baseline")
                    self.sample("baseline_built")
                    self.say(f"baseline: {warm} warm-up rounds, then {n} rounds of the mix")
                    await mix.run(ids, ids[:warm], reviews[:warm])
                    self.figures["baseline"] = await mix.run(ids[warm:], ids[warm:], reviews[warm:])
                    self.sample("baseline_after")
                    ids, reviews = await self.build(args.idle, args.reviewing, "held")
                    self.sample("held")
                    self.say(f"held: {n} rounds of the request mix")
                    pick = random.sample(range(len(ids)), n)
                    self.figures["held"] = await mix.run(
                        ids, [ids[i] for i in pick], random.sample(reviews, n)
                    )
                    self.sample("held_after")
        finally:
            self.engine.dispose()
            server.stop()
        self.report()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)

    async def started(self, api_port: int) -> None:
        """Wait for the worker to poll the queue and the API to answer."""
        deadline = time.monotonic() + 120
        while not await polling(self.client, self.queue, self.worker.pid):
            if self.worker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the worker did not start (see worker.log)")
            await asyncio.sleep(0.2)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{api_port}") as http:
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get("/v1/sessions", params={"limit": 1})).status_code == 200:
                        return
                if self.api.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the API did not start (see api.log)")
                await asyncio.sleep(0.2)

    def report(self) -> None:
        a, f = self.args, self.figures
        base, held = f["baseline"], f["held"]
        print()
        print(
            f"== {a.idle} idle + {a.reviewing} reviewing sessions on one worker "
            f"(idle timeout {a.idle_timeout:g} s; {a.rounds} rounds, one request at a time) =="
        )
        print(
            f"  launch: {a.idle} idle in {f['held:idle_launch_s']:.0f} s, "
            f"{a.reviewing} reviewing in {f['held:reviewing_launch_s']:.0f} s; "
            f"RUNNING once idle: {f['held:running']}"
        )

        def mb(key: str) -> str:
            return f"{f[key]:.0f} MB"

        def cached(key: str) -> str:
            return "?" if f[key] is None else f"{f[key]:.0f}"

        print(f"{'':36}{'worker RSS':>12}{'cached runs':>13}{'API RSS':>10}")
        for label, key in (
            ("at start", "start"),
            ("baseline built", "baseline_built"),
            ("after the baseline mix", "baseline_after"),
            ("held (idle completed, reviews open)", "held"),
            ("after the held mix", "held_after"),
        ):
            print(
                f"  {label:<34}{mb(key + ':worker_rss'):>12}{cached(key + ':cache'):>13}"
                f"{mb(key + ':api_rss'):>10}"
            )
        print()
        print(f"  {'request':<44}{'baseline p50/p95':>20}{'held p50/p95':>20}{'p95 ratio':>11}")
        every_base = [x for v in base.values() for x in v]
        every_held = [x for v in held.values() for x in v]
        for name in REQUESTS:
            b, h = base[name], held[name]
            print(
                f"  {name:<44}{statistics.median(b) * 1000:9.1f}/{pct(b, 95) * 1000:6.1f} ms"
                f"{statistics.median(h) * 1000:11.1f}/{pct(h, 95) * 1000:6.1f} ms"
                f"{pct(h, 95) / pct(b, 95):10.2f}x  "
                f"{'MET' if pct(h, 95) * 1000 <= TARGET_P95_MS else 'NOT MET'}"
            )
        b95, h95 = pct(every_base, 95) * 1000, pct(every_held, 95) * 1000
        print(
            f"  {'all requests':<44}{statistics.median(every_base) * 1000:9.1f}/{b95:6.1f} ms"
            f"{statistics.median(every_held) * 1000:11.1f}/{h95:6.1f} ms{h95 / b95:10.2f}x"
        )
        print()
        rss = max(f["held:worker_rss"], f["held_after:worker_rss"])
        print(
            f"  target: worker RSS <= {TARGET_MB:.0f} MB: {rss:.0f} MB "
            f"{'MET' if rss <= TARGET_MB else 'NOT MET'}"
        )
        print(
            f"  target: API p95 <= {TARGET_P95_MS:.0f} ms while held (all requests): "
            f"{h95:.1f} ms ({h95 / b95:.2f}x the baseline) "
            f"{'MET' if h95 <= TARGET_P95_MS else 'NOT MET'}"
        )
        for name in UNCHANGED:
            ratio = pct(held[name], 95) / pct(base[name], 95)
            print(
                f"  target: {name} p95 held within {UNCHANGED_RATIO - 1:.0%} of the baseline's: "
                f"{ratio:.2f}x {'MET' if ratio <= UNCHANGED_RATIO else 'NOT MET'}"
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--idle", type=int, default=10_000, help="idle sessions")
    p.add_argument("--reviewing", type=int, default=1_000, help="sessions waiting on a review")
    p.add_argument("--rounds", type=int, default=100, help="rounds of the request mix")
    p.add_argument("--concurrency", "-c", type=int, default=32, help="launches in flight")
    p.add_argument(
        "--idle-timeout", type=float, default=60.0, help="the sessions' idle timeout (s)"
    )
    p.add_argument(
        "--review-timeout", type=float, default=4 * 3600.0, help="the reviews' timeout (s)"
    )
    p.add_argument("--database-url", help="Baton's DB (default: a SQLite file in a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (DB, logs)")
    asyncio.run(Bench(p.parse_args()).run())


if __name__ == "__main__":
    main()
