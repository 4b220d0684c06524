"""The activity DB work of one model turn: ``_prepare`` and ``_persist``, old code vs new.

``model_turn`` (activities/turns.py) runs two transactions per turn around its model
call: ``SessionActivities._prepare`` (the idempotency check, balance, the user message,
status ``running``, the agent snapshot, the context window) and ``_persist`` (metering,
the reply, status ``idle``, their events). The turn profile (bench/README.md) put them at 25 % of a
turn's busy samples. This times them alone, without Temporal or a model, on a real
database: per call, wall time and the calling thread's CPU time.

Old vs new in one run: ``--baseline REF`` (default :data:`BASELINE`, main before this
work) is exported with ``git archive`` to a temp dir and both trees run the same
measuring child, alternately, round after round (``--rounds``), each on a fresh schema
(``PYTHONPATH`` picks the tree; the child prints which one it imported). The ratio
new/old of the medians is printed per call and backend.

Sessions are recorded with their agent snapshot (as a launch does) outside the timing;
``--per-session`` turns run on each (1, the default: every turn is a new session's
first, as in bench/peer.py, whose ``_prepare`` parses the snapshot; 300: long sessions,
whose ``_prepare`` reads a 200-message context window).

Backends: a SQLite file in a temp dir (WAL, as ``make_engine`` sets it up) and, with
``--postgres``, a throwaway PostgreSQL cluster started as ``tests/conftest.py`` does
(``fsync=off``), or ``--database-url`` for one of your own (its tables are dropped).

Run from the repo root (not part of ``make test``)::

    .venv/bin/python bench/turn_db.py                    # SQLite, 3 rounds x 300 turns
    .venv/bin/python bench/turn_db.py --postgres         # SQLite and PostgreSQL
    .venv/bin/python bench/turn_db.py --per-session 300  # long sessions
    .venv/bin/python bench/turn_db.py --profile /tmp/p   # + cProfile of the new tree
"""

from __future__ import annotations

import argparse
import cProfile
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: The commit before the turn's DB work became prepared Core statements (the old path).
BASELINE = "4913462"
AGENT = "turn-db-bench"
#: What one turn's calls are reported as, in order.
CALLS = ("_prepare", "_persist")


# --- the child: one tree, one database ------------------------------------------------


def _child(args: argparse.Namespace) -> None:
    import sqlalchemy as sa
    from sqlmodel import SQLModel

    import activities.turns as turns
    from activities.turns import SessionActivities
    from baton.agents import registry
    from baton.agents.spec import AgentSpec
    from baton.contracts.activity_io import ModelTurnInput
    from baton.contracts.values import Usage, position
    from baton.contracts.workflow_io import Provenance
    from baton.runs import session_store
    from baton.storage.db import init_db, make_engine, session_scope

    engine = make_engine(args.database_url)
    SQLModel.metadata.drop_all(engine)
    with engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE IF EXISTS alembic_version"))
    init_db(engine)
    with session_scope(engine) as s:
        registry.create_agent(
            s, slug=AGENT, name="Bench", spec=AgentSpec.model_validate({"playbook": []})
        )
        registry.publish(s, slug=AGENT)
    acts = SessionActivities(engine)

    def new_session(n: int) -> str:
        # As baton.runs.launch records a session (outside the timing): the row with the
        # pinned agent's snapshot, which the workflow then carries (no load_agent), so the
        # session's first _prepare on a worker reads and parses the snapshot.
        sid = f"session-turn-db-bench-{n}"
        with session_scope(engine) as s:
            row = session_store.create_session(
                s,
                session_id=sid,
                agent_slug=AGENT,
                agent_version=1,
                provenance=Provenance(),
                name="bench",
            )
            row.resolved_agent = registry.resolve_agent(s, ref=f"{AGENT}@1").model_dump(mode="json")
            s.add(row)
        return sid

    usage = Usage(requests=1, input_tokens=120, output_tokens=8, cost_usd=None, wall_ms=3)
    samples: dict[str, list[tuple[int, int]]] = {c: [] for c in CALLS}

    profile = cProfile.Profile() if args.profile else None
    profiling = False

    def timed(name: str, fn: Callable[..., Any], *a: Any) -> Any:
        if profiling and profile is not None:
            profile.enable()
        w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        out = fn(*a)
        samples[name].append((time.perf_counter_ns() - w0, time.thread_time_ns() - c0))
        if profiling and profile is not None:
            profile.disable()
        return out

    sid = ""
    for n in range(args.warmup + args.turns):
        if n % args.per_session == 0:
            sid = new_session(n)
        turn = n % args.per_session + 1
        inp = ModelTurnInput(
            session_id=sid,
            agent_slug=AGENT,
            turn=turn,
            step=1,
            assistant_message_id=f"{sid}:t{turn}:s1:assistant",
            position=position(turn, 1, 1),
            user_message_id=f"{sid}:t{turn}:user",
            user_text=f"question {turn}",
            user_position=position(turn, 0, 0),
        )
        if n == args.warmup:
            samples = {c: [] for c in CALLS}
            profiling = True
        done, *_ = timed("_prepare", acts._prepare, inp)
        assert done is None, "a new turn found a stored reply"
        timed("_persist", acts._persist, inp, "ok", [], usage, "", 1, "stub-model")
    if profile is not None:
        profile.dump_stats(args.profile)
    engine.dispose()
    out = {
        "tree": str(Path(turns.__file__).resolve().parents[1]),
        "dialect": engine.dialect.name,
        "calls": {
            name: {
                "wall_us": statistics.median(w for w, _ in got) / 1000,
                "cpu_us": statistics.median(c for _, c in got) / 1000,
                "n": len(got),
            }
            for name, got in samples.items()
        },
    }
    print(json.dumps(out))


# --- the parent: trees, databases, rounds ----------------------------------------------


@contextmanager
def _exported(ref: str) -> Iterator[Path]:
    """``ref``'s tree in a temp dir (``git archive``: no worktree, nothing shared)."""
    tmp = Path(tempfile.mkdtemp(prefix="turn-db-baseline-"))
    try:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", ref], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def _postgres() -> Iterator[str]:
    """A throwaway PostgreSQL cluster on a free loopback port (as tests/conftest.py)."""
    from worker.stack import free_port

    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        sys.exit("PostgreSQL binaries missing (apt-get install postgresql)")
    bindir = Path(found[-1]).parent

    def as_pg(cmd: list[str]) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd

    root = Path(tempfile.mkdtemp(prefix="turn-db-pg-"))
    root.chmod(0o755)
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    data, port = root / "data", free_port()
    initdb = [str(bindir / "initdb"), "-D", str(data), "-U", "baton", "-A", "trust", "--no-sync"]
    subprocess.run(as_pg(initdb), check=True, capture_output=True)
    opts = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
    ctl = [str(bindir / "pg_ctl"), "-D", str(data)]
    start = [*ctl, "-o", opts, "-l", str(root / "log"), "-w", "start"]
    subprocess.run(as_pg(start), check=True, capture_output=True)
    try:
        yield f"postgresql+psycopg://baton@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(as_pg([*ctl, "-m", "immediate", "stop"]), capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def _run_child(tree: Path, url: str, args: argparse.Namespace, profile: str = "") -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--database-url", url]
    cmd += ["--turns", str(args.turns), "--warmup", str(args.warmup)]
    cmd += ["--per-session", str(args.per_session)]
    if profile:
        cmd += ["--profile", profile]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(cmd, cwd=tree, env=env, check=True, capture_output=True, text=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if Path(result["tree"]) != tree.resolve():
        sys.exit(f"the child imported {result['tree']}, not {tree}")
    return result


def _print_profile(path: str, top: int) -> None:
    import pstats

    print(f"\n== cProfile of the new tree's calls ({path}), by own time ==")
    stats = pstats.Stats(path)
    stats.sort_stats("tottime").print_stats(top)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=300, help="timed turns per child")
    ap.add_argument("--warmup", type=int, default=30, help="untimed turns per child first")
    ap.add_argument(
        "--per-session",
        type=int,
        default=1,
        help="turns per session (1: each turn a new session's first, as bench/peer.py)",
    )
    ap.add_argument("--rounds", type=int, default=3, help="old/new alternations per backend")
    ap.add_argument("--baseline", default=BASELINE, help="git ref of the old code path")
    ap.add_argument("--postgres", action="store_true", help="also a throwaway PostgreSQL")
    ap.add_argument("--database-url", default="", help="a PostgreSQL URL (tables dropped)")
    ap.add_argument("--profile", default="", help="cProfile the new tree's calls to PATH")
    ap.add_argument("--top", type=int, default=25, help="profile rows printed")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args)
        return

    with tempfile.TemporaryDirectory(prefix="turn-db-") as tmp, _exported(args.baseline) as old:
        backends: list[tuple[str, Callable[[], Any]]] = [
            ("sqlite", lambda: _nullctx(f"sqlite:///{tmp}/bench.db"))
        ]
        if args.database_url:
            backends.append(("postgresql", lambda: _nullctx(args.database_url)))
        elif args.postgres:
            backends.append(("postgresql", _postgres))
        print(
            f"{args.rounds} rounds x {args.turns} turns per tree (+{args.warmup} warm-up), "
            f"{args.per_session} turn(s) per session, "
            f"old = {args.baseline}, new = this tree; medians per call"
        )
        for backend, make in backends:
            with make() as url:
                got: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
                for rnd in range(args.rounds):
                    order = [("old", old), ("new", ROOT)]
                    for label, tree in order if rnd % 2 == 0 else order[::-1]:
                        _fresh(url)
                        got[label].append(_run_child(tree, url, args))
                print(f"\n== {backend} ==")
                print(
                    f"  {'call':10} {'old wall':>10} {'new wall':>10} {'ratio':>6}   "
                    f"{'old CPU':>9} {'new CPU':>9} {'ratio':>6}"
                )
                for call in CALLS:
                    row = {
                        (label, kind): statistics.median(r["calls"][call][kind] for r in runs)
                        for label, runs in got.items()
                        for kind in ("wall_us", "cpu_us")
                    }
                    ow, nw = row["old", "wall_us"], row["new", "wall_us"]
                    oc, nc = row["old", "cpu_us"], row["new", "cpu_us"]
                    print(
                        f"  {call:10} {ow:8.0f}us {nw:8.0f}us {nw / ow:5.2f}x   "
                        f"{oc:7.0f}us {nc:7.0f}us {nc / oc:5.2f}x"
                    )
                tw = [sum(r["calls"][c]["wall_us"] for c in CALLS) for r in got["old"]]
                nw2 = [sum(r["calls"][c]["wall_us"] for c in CALLS) for r in got["new"]]
                print(
                    f"  {'both':10} {statistics.median(tw):8.0f}us "
                    f"{statistics.median(nw2):8.0f}us "
                    f"{statistics.median(nw2) / statistics.median(tw):5.2f}x"
                )
                if args.profile and backend == "sqlite":
                    _fresh(url)
                    _run_child(ROOT, url, args, profile=args.profile)
    if args.profile:
        _print_profile(args.profile, args.top)


def _fresh(url: str) -> None:
    """A SQLite file starts empty (PostgreSQL's tables are dropped by the child)."""
    if url.startswith("sqlite:///"):
        for f in glob.glob(url.removeprefix("sqlite:///") + "*"):
            os.remove(f)


@contextmanager
def _nullctx(value: str) -> Iterator[str]:
    yield value


if __name__ == "__main__":
    main()
