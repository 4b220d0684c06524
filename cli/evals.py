"""``baton eval``: replay an agent's recorded sessions (and, asked for, its recorded
workflow-agent steps) on a candidate and a baseline, with a progress bar while it runs,
then a table of what changed (docs/change-safely.md, Replay against a candidate). Talks to
the API."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cli.common import api_client, checked, console

app = typer.Typer()

#: Seconds between two polls of a running eval.
POLL_S = 0.5


def eval_body(
    candidate: str,
    baseline: str,
    sessions: int | None,
    session: list[str] | None,
    since: str | None,
    tools: str,
    on_miss: str,
    steps: int | None = None,
    step: list[str] | None = None,
    judge: str | None = None,
) -> dict[str, Any]:
    """The ``POST /v1/agents/{slug}/evals`` body of the command's options."""
    body: dict[str, Any] = {
        "candidate": candidate,
        "baseline": baseline,
        "tools": tools,
        "on_miss": on_miss,
    }
    if sessions is not None:
        body["sessions"] = sessions
    if session:
        body["session_ids"] = session
    if since is not None:
        body["since"] = since
    if steps is not None:
        body["steps"] = steps
    if step:
        body["step_ids"] = step
    if judge is not None:
        body["judge"] = judge
    return body


def wait_for_eval(http: httpx.Client, slug: str, summary: dict[str, Any]) -> dict[str, Any]:
    """Poll the eval until it ends, showing ``done`` of ``total`` as a progress bar; the
    ended eval with its report."""
    path = f"/v1/agents/{slug}/evals/{summary['id']}"
    columns = (
        TextColumn("replaying"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("replays"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("eval", total=int(summary["total"]))
        while True:
            body = checked(http.get(path))
            progress.update(task, completed=int(str(body["done"])))
            if body["status"] != "running":
                return body
            time.sleep(POLL_S)


def _tools(diff: list[dict[str, str]]) -> str:
    marks = {"same": "", "added": "+", "removed": "-"}
    changed = [f"{marks[d['op']]}{d['tool']}" for d in diff if d["op"] != "same"]
    return escape(" ".join(changed)) if changed else "same"


def _decisions(item: dict[str, Any]) -> str:
    if item["decisions"]["same"]:
        return "same"
    cand = item["decisions"]["candidate"]
    return escape(
        ", ".join(f"{d['operation']}→{d['target'] or '-'}: {d['outcome']}" for d in cand) or "none"
    )


def _deliverable(item: dict[str, Any]) -> str:
    """A step's schema pass and attempts per side (baseline → candidate) and the recorded
    handoff outcome; ``-`` for a session (it has no deliverable)."""
    if item.get("kind") != "step":
        return "-"
    d = item["deliverable"]

    def side(s: str) -> str:
        return f"{'pass' if d[s]['valid'] else 'fail'} ({d[s]['attempts']})"

    return f"{side('baseline')} → {side('candidate')} · {d['recorded_handoff']}"


def report_table(body: dict[str, Any]) -> Table:
    """Per session or step: changed?, similarity of the final answers (a step's:
    its deliverables), the tool diff, the candidate's decisions when they changed, a
    step's deliverable (schema pass and attempts, baseline → candidate, and the recorded
    handoff outcome), tokens and cost (baseline → candidate)."""
    table = Table(title=f"{body['id']} · {body['candidate']} against {body['baseline']}")
    # A session id is what a reader copies into `baton trace`: it folds, never elides.
    table.add_column("session", no_wrap=False, overflow="fold")
    for col in ("changed", "similarity", "tools", "decisions", "deliverable", "tokens", "cost $"):
        table.add_column(col)
    for item in (body.get("report") or {}).get("sessions", []):
        usage = item["usage"]
        flag = "regression" if item["regression"] else ("yes" if item["changed"] else "no")
        table.add_row(
            item["session_id"],
            flag,
            f"{item['final']['similarity']:.2f}",
            _tools(item["tools"]["diff"]),
            _decisions(item),
            _deliverable(item),
            f"{usage['baseline']['tokens']} → {usage['candidate']['tokens']}",
            f"{usage['baseline']['cost_usd']:.4f} → {usage['candidate']['cost_usd']:.4f}",
        )
    return table


def totals_line(body: dict[str, Any]) -> str:
    """The totals in one line."""
    t = (body.get("report") or {}).get("totals")
    if not t:
        return f"{body['status']}: no session replayed"
    steps = t.get("steps") or 0
    rate = t["deliverable_pass_rate"]
    step_part = (
        f" · {steps} steps, deliverables pass {rate['baseline']:.0%} → {rate['candidate']:.0%}"
        if steps and rate["baseline"] is not None and rate["candidate"] is not None
        else ""
    )
    return (
        f"{body['status']}: {t['sessions']} sessions{step_part} · {t['changed']} changed · "
        f"{t['regressions']} regressions · tools changed {t['tools_changed']} · decisions "
        f"changed {t['decisions_changed']} · tokens {t['tokens']['baseline']} → "
        f"{t['tokens']['candidate']} · cost ${t['cost_usd']['baseline']:.4f} → "
        f"${t['cost_usd']['candidate']:.4f} · errors {t['errors']['baseline']} → "
        f"{t['errors']['candidate']}"
    )


@app.command(name="eval")
def eval_(
    slug: Annotated[str, typer.Argument(help="The agent whose recorded sessions are replayed.")],
    candidate: Annotated[
        str, typer.Option(help="draft (the draft, in the sandbox) or SLUG@V.")
    ] = "draft",
    baseline: Annotated[str, typer.Option(help="live (the live revision now) or SLUG@V.")] = "live",
    sessions: Annotated[
        int | None, typer.Option(help="Replay the newest N recorded sessions (default 10).")
    ] = None,
    session: Annotated[
        list[str] | None, typer.Option(help="Replay this recorded session (repeatable).")
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(
            help="Only sessions created at or after this time (RFC 3339 with a timezone: "
            "2026-12-01T09:00:00Z)."
        ),
    ] = None,
    steps: Annotated[
        int | None,
        typer.Option(help="Also replay the newest N recorded workflow-agent steps (default 0)."),
    ] = None,
    step: Annotated[
        list[str] | None, typer.Option(help="Also replay this recorded step (repeatable).")
    ] = None,
    judge: Annotated[
        str | None,
        typer.Option(help="A model (as a spec's model) that judges each changed answer."),
    ] = None,
    tools: Annotated[
        str, typer.Option(help="recorded (answer from the recording) or live (run them).")
    ] = "recorded",
    on_miss: Annotated[
        str, typer.Option(help="A call the recording lacks: live (run it) or fail (refuse).")
    ] = "fail",
    json_file: Annotated[
        Path | None, typer.Option("--json", help="Write the ended eval and its report here.")
    ] = None,
    no_wait: Annotated[
        bool, typer.Option("--no-wait", help="Start the eval and print its id only.")
    ] = False,
    api_url: Annotated[
        str | None, typer.Option("--api", help="Baton API base URL (default BATON_API_URL).")
    ] = None,
) -> None:
    """Replay recorded sessions of SLUG (and with --steps or --step its recorded
    workflow-agent steps) on a candidate and on the baseline and compare them
    (docs/change-safely.md, Replay against a candidate). Exit 0 once the eval completed
    (the publish gate judges it, not this command), 1 when it failed or was cancelled."""
    body = eval_body(
        candidate, baseline, sessions, session, since, tools, on_miss, steps, step, judge
    )
    with api_client(api_url) as http:
        started = checked(http.post(f"/v1/agents/{slug}/evals", json=body))
        console.print(
            f"[dim]{started['id']} · {started['total']} sessions · {started['candidate']} "
            f"against {started['baseline']}[/]",
            soft_wrap=True,
        )
        if no_wait:
            return
        ended = wait_for_eval(http, slug, started)
    console.print(report_table(ended))
    console.print(totals_line(ended), soft_wrap=True)
    if ended.get("error"):
        console.print(f"[red]{escape(str(ended['error']))}[/]")
    if json_file is not None:
        json_file.write_text(json.dumps(ended, indent=2, ensure_ascii=False), encoding="utf-8")
    if ended["status"] != "completed":
        raise typer.Exit(1)
