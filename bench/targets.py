"""Every performance target of bench/README.md in one run: the benches one after another,
their target lines gathered into one table at the end.

Each bench measures its own floor in the same run (bare Temporal, and the peer where it
has the same thing), so each line's ratio is within one bench's run:

* ``peer``: ``bench/peer.py``, every phase: one turn and 20 concurrent against bare, the
  peer and the peer behind an API; review decision -> turn resumed; a 10,000-message
  transcript; 20,000 sessions' list pages; idle SSE followers; 300 followers of one
  session;
* ``creation``: ``bench/creation.py``: sessions created by 16 clients against bare
  workflow starts, the API, the worker and Temporal as separate processes;
* ``crowd``: ``bench/crowd.py``: 300 followers of one session with the API and the worker
  as separate processes;
* ``recovery``: ``bench/recovery.py --sticky``: resume after ``kill -9`` of a worker
  holding idle sessions in its sticky cache;
* ``held``: ``bench/held.py``: the API's list and get with 20,000 idle sessions (and
  1,000 waiting on a review) held, against its near-empty baseline.

Run from the repo root on a quiet machine (not part of ``make test``; about an hour with
the defaults, most of it ``held`` building its 20,000 sessions)::

    .venv/bin/python bench/targets.py
    .venv/bin/python bench/targets.py --only peer,creation,crowd,recovery   # ~20 min
    .venv/bin/python bench/targets.py --held-idle 2000                # a shorter held run
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: The benches, in the order they run: name -> the script and its arguments.
BENCHES: dict[str, list[str]] = {
    "peer": ["bench/peer.py"],
    "creation": ["bench/creation.py", "--clients", "16"],
    "crowd": ["bench/crowd.py"],
    "recovery": ["bench/recovery.py", "--sticky"],
    "held": ["bench/held.py"],
}


def target_lines(output: str) -> list[str]:
    """The target lines of one bench's output, each once, in order: every line that ends
    with its verdict (``MET`` or ``NOT MET``, after a colon or a space); a bench that
    repeats its targets in a summary shows them once."""
    verdicts = (": MET", ": NOT MET", " MET", " NOT MET")
    lines = [line.rstrip() for line in output.splitlines()]
    return list(dict.fromkeys(line for line in lines if line.endswith(verdicts)))


def run(name: str, argv: Sequence[str]) -> tuple[list[str], float, int]:
    """Run one bench with this Python, its output passed through as it comes; (its target
    lines, seconds it took, its exit status)."""
    print(f"\n######## {name}: {' '.join(argv)}", flush=True)
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, *argv],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        sys.stdout.write(line)
        seen.append(line)
    status = proc.wait()
    return target_lines("".join(seen)), time.perf_counter() - started, status


def main(argv: Sequence[str] | None = None) -> None:
    """Parse flags, run the chosen benches, print every target line together."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("--only", default=",".join(BENCHES), help=f"which of {','.join(BENCHES)}")
    p.add_argument("--held-idle", type=int, default=20_000, help="idle sessions held.py holds")
    args = p.parse_args(argv)
    chosen = [x for x in args.only.split(",") if x]
    unknown = set(chosen) - set(BENCHES)
    if unknown:
        p.error(f"unknown bench(es) {', '.join(sorted(unknown))}: choose from {', '.join(BENCHES)}")
    results: dict[str, tuple[list[str], float, int]] = {}
    for name, bench in BENCHES.items():
        if name not in chosen:
            continue
        extra = ["--idle", str(args.held_idle)] if name == "held" else []
        results[name] = run(name, [*bench, *extra])
    print("\n######## every target, one run")
    failed = False
    for name, (lines, took, status) in results.items():
        note = "" if status == 0 else f", FAILED with exit status {status}"
        failed = failed or status != 0
        print(f"{name} ({took / 60:.1f} min{note})")
        for line in lines:
            print(f"  {line.strip()}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
