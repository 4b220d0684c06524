"""Followers of one session as a deployment runs them: the API, the worker and Temporal each
a process of its own, the followers clients in another.

``bench/peer.py``'s ``crowd`` phase measures the same thing in the shape ``baton dev``
runs (the API and the worker in one process, one event loop): there the API's writes to
300 followers and the worker's model call share a loop. Here ``baton api`` and
``baton worker`` are separate processes (``bench/creation.py``'s stack), so what the
followers cost lands on the API process alone, as in every deployment of deploy/.

One session of an instant scripted agent; rounds interleaved, each with 1 and with
``--followers`` followers of that session (a child process holding that many
``GET /v1/sessions/{id}/events`` streams, ``bench/peer.py``'s ``FOLLOWERS_CHILD``); in
each, ``--turns`` sync ``POST /v1/sessions/{id}/messages`` timed one at a time, and the
API process's CPU per turn (``/proc``, over each round's turns). Printed: p50/p95 per
crowd, the ratio of the p50s against the target (300 followers change the turn's latency
by 20 % at most).

With SQLite (the default) the API learns of the worker's events from its poller (every
200 ms); with PostgreSQL (``--database-url``) from NOTIFY at each commit.

Run from the repo root (not part of ``make test``)::

    .venv/bin/python bench/crowd.py
    .venv/bin/python bench/crowd.py --followers 300 --turns 10 --rounds 4
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
if __name__ == "__main__":
    # `python bench/crowd.py` puts bench/ on sys.path, not the repo root.
    sys.path.insert(0, str(ROOT))

from bench.creation import cpu_s, processes  # noqa: E402
from bench.peer import CROWD_FOLLOWERS, CROWD_RATIO, FOLLOWERS_CHILD  # noqa: E402
from bench.recovery import p95  # noqa: E402

AGENT = "crowd-bench"


async def crowd(args: argparse.Namespace, base: str, api_pid: int) -> None:
    """Publish the agent, start the session, run the rounds, print the figures."""
    async with httpx.AsyncClient(base_url=base, timeout=300) as http:
        spec = {"playbook": [{"reply": "ok"}]}
        body = {"slug": AGENT, "name": "Crowd bench", "spec": spec}
        (await http.post("/v1/agents", json=body)).raise_for_status()
        (await http.post(f"/v1/agents/{AGENT}/publish")).raise_for_status()
        r = await http.post("/v1/sessions", json={"agent": AGENT, "prompt": "hi", "sync": True})
        r.raise_for_status()
        sid = r.json()["session_id"]

        async def turn() -> float:
            t = time.perf_counter()
            r = await http.post(f"/v1/sessions/{sid}/messages", json={"prompt": "go", "sync": True})
            r.raise_for_status()
            return time.perf_counter() - t

        big = args.followers
        took: dict[int, list[float]] = {1: [], big: []}
        cpu: dict[int, list[float]] = {1: [], big: []}
        for rnd in range(args.rounds):
            for n in (1, big) if rnd % 2 == 0 else (big, 1):
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-c", FOLLOWERS_CHILD, base, sid, str(n),
                    stdout=subprocess.PIPE,
                )  # fmt: skip
                try:
                    assert proc.stdout is not None
                    line = await asyncio.wait_for(proc.stdout.readline(), 300)
                    assert line.strip() == b"ready", line
                    await asyncio.sleep(1.0)  # every follower caught up
                    await turn()  # untimed
                    c0 = cpu_s(api_pid)  # clock ticks: over the round, not per turn
                    for _ in range(args.turns):
                        took[n].append(await turn())
                    cpu[n].append(1000 * (cpu_s(api_pid) - c0) / args.turns)
                finally:
                    proc.kill()
                    await proc.wait()
                print(f"round {rnd + 1}  {n:>4} follower(s) done", flush=True)
    print("\n== one session's turn (POST messages sync), API and worker separate ==")
    for n in (1, big):
        print(
            f"  {n:>4} follower(s)  p50 {1000 * statistics.median(took[n]):7.1f} ms  "
            f"p95 {1000 * p95(took[n]):7.1f} ms   API CPU per turn "
            f"{statistics.median(cpu[n]):5.1f} ms"
        )
    ratio = statistics.median(took[big]) / statistics.median(took[1])
    verdict = "MET" if ratio <= CROWD_RATIO else "NOT MET"
    print(
        f"\n== targets ==\n  {big} followers, one session (split)  {ratio:5.2f}x the turn with "
        f"1 follower   target <= {CROWD_RATIO}x: {verdict}"
    )


def main() -> None:
    """Parse flags, start the processes, run the bench."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--followers", type=int, default=CROWD_FOLLOWERS)
    parser.add_argument("--turns", type=int, default=10, help="timed turns per round and crowd")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="baton-crowd-") as d, processes(args, Path(d)) as s:
        asyncio.run(crowd(args, s.base, s.pids["api"]))


if __name__ == "__main__":
    main()
