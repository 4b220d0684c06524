"""Scale-out on one machine: PostgreSQL, one Temporal dev server,
2 `baton api` and 3 `baton worker` processes sharing them.

Sessions (each a tool call, a delegation and a policy-reviewed invoke_agent) are
launched round-robin through both APIs, each one's SSE stream is read from the other
API, reviews are approved through the APIs, one worker is SIGKILLed and one API
restarted mid-run. Every session must finish with exactly the expected messages and
events, and every review must be decided exactly once.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from temporalio.testing import WorkflowEnvironment

from baton.storage.db import init_db, make_engine
from worker.stack import free_port

BATON = str(Path(sys.executable).parent / "baton")

#: Root sessions in the run (the scale-out target is 100); override with BATON_SCALE_SESSIONS.
SESSIONS = int(os.environ.get("BATON_SCALE_SESSIONS", "100"))
#: The whole run (launch → all settled) must fit in this many seconds.
RUN_BUDGET_S = 420.0

LEAD_PLAYBOOK = [
    {"when": "^invoke_agent: ", "reply": "done: {last_message}"},
    {
        "when": "^delegate_to: ",
        "reply": "Asking the checker.",
        "tool_calls": [
            {"tool": "invoke_agent", "args": {"slug": "checker", "prompt": "check", "sync": True}}
        ],
    },
    {
        "when": "^calculator: ",
        "reply": "Delegating.",
        "tool_calls": [{"tool": "delegate_to", "args": {"agent_id": "helper", "task": "help"}}],
    },
    {
        "reply": "Computing.",
        "tool_calls": [{"tool": "calculator", "args": {"expression": "6*7"}}],
    },
]


def _process_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BATON_", "TEMPORAL_"))}
    env.update(extra)
    return env


class Processes:
    """The real `baton api` / `baton worker` subprocesses of the run, logs in ``folder``."""

    def __init__(self, folder: Path, env: dict[str, str]) -> None:
        self.folder = folder
        self.env = env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *args: str) -> None:
        log = (self.folder / f"{name}.log").open("ab")
        self.procs[name] = subprocess.Popen(
            [BATON, *args], env=self.env, stdout=log, stderr=subprocess.STDOUT
        )

    def kill(self, name: str) -> None:
        self.procs[name].kill()
        self.procs[name].wait(timeout=30)

    def stop(self, name: str) -> int:
        self.procs[name].send_signal(signal.SIGTERM)
        return self.procs[name].wait(timeout=60)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=45)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture
def scale_db(pg_url: str) -> Iterator[str]:
    """A database of its own in the throwaway PostgreSQL cluster, with Baton's schema."""
    name = f"scale_{uuid.uuid4().hex[:8]}"
    admin = pg_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = pg_url.rsplit("/", 1)[0] + f"/{name}"
    engine = make_engine(url)
    init_db(engine)  # once, before five processes start (each would create_all)
    engine.dispose()
    yield url


@dataclass
class Stream:
    """What one session's SSE stream delivered, across reconnects."""

    ids: list[int] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    reconnects: int = 0


async def read_stream(base: str, sid: str, out: Stream, deadline: float) -> None:
    """Follow ``sid``'s events until idle, resuming with Last-Event-ID after any cut."""
    while time.monotonic() < deadline:
        headers = {"Last-Event-ID": str(out.ids[-1])} if out.ids else {}
        try:
            async with (
                httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(30, read=60)) as http,
                http.stream(
                    "GET", f"/v1/sessions/{sid}/events", params={"until": "idle"}, headers=headers
                ) as resp,
            ):
                resp.raise_for_status()
                event: dict[str, str] = {}
                async for line in resp.aiter_lines():
                    if line:
                        key, _, value = line.partition(":")
                        event[key] = value.strip()
                        continue
                    if "id" in event:
                        out.ids.append(int(event["id"]))
                        out.kinds.append(event.get("event", ""))
                    event = {}
                return
        except (httpx.TransportError, httpx.HTTPStatusError):
            out.reconnects += 1
            await asyncio.sleep(0.5)
    pytest.fail(f"stream of {sid} did not end")


async def wait_ready(base: str, timeout: float = 120) -> None:
    """Until ``base``/readyz answers 200."""
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(base_url=base, timeout=10) as http:
        while time.monotonic() < deadline:
            try:
                if (await http.get("/readyz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.3)
    pytest.fail(f"{base} never became ready")


class Approver:
    """Approves every pending review once, through both APIs alternately."""

    def __init__(self, bases: list[str]) -> None:
        self.bases = bases
        self.decided: dict[str, int] = {}  # review id -> HTTP status of the applied decision
        self.retried_conflicts = 0
        self.done = asyncio.Event()

    async def run(self) -> None:
        turn = 0
        while not self.done.is_set():
            base = self.bases[turn % 2]
            turn += 1
            try:
                async with httpx.AsyncClient(base_url=base, timeout=30) as http:
                    listed = await http.get(
                        "/v1/reviews", params={"status": "pending", "limit": 200}
                    )
                    for review in listed.json()["data"]:
                        if review["id"] not in self.decided:
                            await self._decide(http, review["id"])
            except httpx.TransportError:
                pass  # this API is restarting: the other one serves the next round
            await asyncio.sleep(0.2)

    async def _decide(self, http: httpx.AsyncClient, review_id: str) -> None:
        for attempt in range(3):
            try:
                resp = await http.post(
                    f"/v1/reviews/{review_id}/decision", json={"decision": "allow_once"}
                )
            except httpx.TransportError:
                await asyncio.sleep(0.5)
                continue
            if resp.status_code == 409 and attempt > 0:
                # The first attempt's request was applied before its connection broke.
                self.retried_conflicts += 1
            else:
                # 202: signalled, not settled yet (its workflow was between workers).
                assert resp.status_code in (200, 202), resp.text
            self.decided[review_id] = resp.status_code
            return


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_two_apis_three_workers_share_the_load_through_faults(
    scale_db: str, temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """100 sessions over 2 APIs and 3 workers, a worker SIGKILLed and an API restarted: all
    finish, no message or event duplicated or missing, every review decided once."""
    queue = f"scale-{uuid.uuid4()}"
    env = _process_env(
        BATON_DATABASE_URL=scale_db,
        BATON_TEMPORAL_ADDRESS=temporal_env.client.service_client.config.target_host,
        BATON_TEMPORAL_ENV_CONFIG="false",
        BATON_TASK_QUEUE=queue,
        BATON_WORKER_GRACEFUL_SHUTDOWN_S="5",
    )
    procs = Processes(tmp_path, env)
    ports = [free_port(), free_port()]
    bases = [f"http://127.0.0.1:{p}" for p in ports]
    try:
        for i in range(3):
            procs.start(f"worker{i}", "worker")
        for i, port in enumerate(ports):
            procs.start(f"api{i}", "api", "--port", str(port))
        await asyncio.gather(*(wait_ready(b) for b in bases))
        await _run(procs, bases, ports)
    finally:
        procs.stop_all()


async def _run(procs: Processes, bases: list[str], ports: list[int]) -> None:
    async with httpx.AsyncClient(base_url=bases[0], timeout=60) as http:
        for slug, spec in (
            (
                "helper",
                {
                    "playbook": [{"reply": "helped"}],
                    "delegation": {"available_for_delegation": True},
                },
            ),
            ("checker", {"playbook": [{"reply": "checked"}]}),
            ("lead", {"tools": ["calculator"], "playbook": LEAD_PLAYBOOK}),
        ):
            created = await http.post("/v1/agents", json={"slug": slug, "name": slug, "spec": spec})
            assert created.status_code == 201, created.text
            assert (await http.post(f"/v1/agents/{slug}/publish")).status_code == 201

    started = time.monotonic()
    deadline = started + RUN_BUDGET_S
    approver = Approver(bases)
    approving = asyncio.create_task(approver.run())
    limit = asyncio.Semaphore(16)

    async def launch(i: int) -> str:
        async with limit, httpx.AsyncClient(base_url=bases[i % 2], timeout=60) as http:
            resp = await http.post("/v1/sessions", json={"agent": "lead", "prompt": f"go {i}"})
            assert resp.status_code == 201, resp.text
            sid: str = resp.json()["session_id"]
            return sid

    sids = list(await asyncio.gather(*(launch(i) for i in range(SESSIONS))))
    streams = [Stream() for _ in sids]
    readers = [
        asyncio.create_task(read_stream(bases[(i + 1) % 2], sid, streams[i], deadline))
        for i, sid in enumerate(sids)
    ]

    async def faults() -> None:
        while len(approver.decided) < SESSIONS // 4:
            await asyncio.sleep(0.2)
        procs.kill("worker0")  # mid-run: turns, delegations and review waits in flight
        while len(approver.decided) < SESSIONS // 2:
            await asyncio.sleep(0.2)
        assert await asyncio.to_thread(procs.stop, "api1") == 0
        procs.start("api1", "api", "--port", str(ports[1]))
        await wait_ready(bases[1])

    faulting = asyncio.create_task(faults())
    # A failing approver or fault injector must fail the run, not leave readers waiting.
    everything = asyncio.gather(*readers, faulting)
    watched: set[asyncio.Future[Any]] = {everything, approving}
    done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
    if approving in done:
        everything.cancel()
        approving.result()
        pytest.fail("the approver stopped early")
    everything.result()
    elapsed = time.monotonic() - started
    approver.done.set()
    await approving

    async with httpx.AsyncClient(base_url=bases[0], timeout=60) as http:
        expected_roles: list[str] | None = None
        for i, sid in enumerate(sids):
            detail = (await http.get(f"/v1/sessions/{sid}")).json()
            assert detail["status"] == "idle", (sid, detail)
            transcript = (await http.get(f"/v1/sessions/{sid}/transcript")).json()["messages"]
            ids = [m["id"] for m in transcript]
            assert len(ids) == len(set(ids)), f"duplicated message in {sid}"
            roles = [m["role"] for m in transcript]
            expected_roles = expected_roles or roles
            assert roles == expected_roles, (sid, roles)
            assert transcript[0]["text"] == f"go {i}"
            assert transcript[-1]["text"].startswith("done: {"), transcript[-1]
            assert transcript[-1]["text"].endswith('"status": "completed", "response": "checked"}')
            # The live stream (across API restarts) saw exactly the durable log.
            full = Stream()
            await read_stream(bases[1], sid, full, time.monotonic() + 60)
            got = streams[i].ids
            assert got == sorted(set(got)), f"duplicated or reordered events in {sid}"
            assert got == full.ids, f"missing events in {sid}"
        assert expected_roles is not None and expected_roles.count("tool") == 3

        allowed = (await http.get("/v1/reviews", params={"status": "allowed", "limit": 200})).json()
        pending = (await http.get("/v1/reviews", params={"status": "pending"})).json()
    assert pending["count"] == 0
    assert allowed["count"] == SESSIONS == len(approver.decided)
    assert {r["id"] for r in allowed["data"]} == set(approver.decided)
    assert all(r["decision"] == "allow_once" for r in allowed["data"])
    reconnects = sum(s.reconnects for s in streams)
    print(
        f"\nscale-out: {SESSIONS} sessions ({SESSIONS * 6} model turns) in {elapsed:.1f} s, "
        f"{reconnects} SSE reconnects, {approver.retried_conflicts} retried decisions"
    )
