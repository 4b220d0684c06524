"""``baton run``, ``baton fork`` and ``baton trace``: start (or fork) a session on a
running Baton and stream its events, and print a run's delegation tree (talks to the API).
The renderers here (``follow``, ``print_transcript``, ``render_trace``) are shared with
``baton demo``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any

import httpx
import typer
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

from cli.common import api_client, checked, console

app = typer.Typer()


def follow(
    http: httpx.Client,
    session_id: str,
    after: int = 0,
    on_review: Callable[[dict[str, str]], None] | None = None,
) -> tuple[int, bool]:
    """Print a session's events until it is idle: streamed text, tool calls, reviews, status.

    ``on_review`` is called with each ``review_requested`` event's data, also those
    forwarded from the run's delegations (the demo approves there). Returns the last
    event id (to resume the next turn from) and whether the turn ended in an error.
    """
    last = after
    failed = False
    streaming: set[str] = set()
    headers = {"Last-Event-ID": str(after)}
    with http.stream(
        "GET", f"/v1/sessions/{session_id}/events?until=idle", headers=headers, timeout=None
    ) as resp:
        resp.raise_for_status()
        event: dict[str, str] = {}
        for line in resp.iter_lines():
            if line:
                key, _, value = line.partition(":")
                event[key] = value.strip()
                continue
            if "data" not in event:
                event = {}
                continue
            last = int(event.get("id", last))
            kind, data = event.get("event", ""), json.loads(event["data"])
            event = {}
            if kind == "chunk":
                streaming.add(data["message_id"])
                console.print(escape(data["text"]), end="", style="bold")
            elif kind == "message" and data["role"] == "assistant":
                if data["message_id"] not in streaming:
                    console.print(escape(data["text"]), end="", style="bold")
                console.print()
                for call in data.get("tool_calls") or []:
                    console.print(f"  [yellow]→ {call['name']}[/]({json.dumps(call['args'])})")
            elif kind == "message" and data["role"] == "tool":
                console.print(f"  [cyan]← {data['tool_name']}[/]: {escape(data['text'])}")
            elif kind == "message" and data["role"] == "error":
                failed = True
                console.print(f"  [red]error[/]: {escape(data['text'])}")
            elif kind == "status":
                console.print(f"[dim]· {data['status']}[/]")
            elif kind in ("review_requested", "delegation_review_requested"):
                target = f" → {data['target']}" if data.get("target") else ""
                console.print(
                    f"  [bold magenta]⏸ review[/] {escape(data['caller'])} wants to "
                    f"{data['operation']}{target}: {escape(data.get('preview') or '')} "
                    f"[dim]({data['review_id']})[/]"
                )
                if on_review is not None:
                    on_review(data)
                else:
                    console.print(f"    [dim]{escape(review_hint(data['review_id']))}[/]")
            elif kind == "delegation_start":
                console.print(
                    f"  [blue]⇢ {data.get('kind', 'delegation')} → {data['target_agent_id']}[/]"
                    f" (depth {data['depth']}): {escape(str(data['task']))[:100]}"
                )
            elif kind == "delegation_complete":
                outcome = data["status"] + (f": {data['error']}" if data.get("error") else "")
                console.print(
                    f"  [blue]⇠ {data['target_agent_id']} {escape(outcome)}[/] "
                    f"{escape(str(data.get('result_preview') or ''))[:100]}"
                )
            elif kind in ("review_resolved", "delegation_review_resolved"):
                console.print(
                    f"  [magenta]▶ review {data['status']}[/] by {escape(str(data['decided_by']))}"
                )
    return last, failed


def review_hint(review_id: str) -> str:
    """How to decide a review from the shell, and how long it waits.

    The wait is this process's ``BATON_REVIEW_TIMEOUT`` (seconds): the worker that runs
    the session reads the same setting, after which the review is denied (Gamut X-Agent Policies).
    """
    from baton.settings import get_settings

    timeout = get_settings().review_timeout
    return (
        f"approve: baton reviews approve {review_id}  ·  deny: baton reviews deny {review_id}"
        f"  ·  denied automatically {timeout:g} s after it opened (BATON_REVIEW_TIMEOUT)"
    )


def transcript_messages(http: httpx.Client, session_id: str) -> tuple[str, list[dict[str, Any]]]:
    """``(status, every message)`` of a session's transcript, its pages followed by cursor
    (``GET /v1/sessions/{id}/transcript`` is always paged)."""
    url = f"/v1/sessions/{session_id}/transcript"
    params: dict[str, str | int] = {"limit": 500}
    messages: list[dict[str, Any]] = []
    while True:
        body: dict[str, Any] = checked(http.get(url, params=params))
        messages += body["messages"]
        if not body.get("next_cursor"):
            return str(body["status"]), messages
        params["cursor"] = str(body["next_cursor"])


def print_transcript(http: httpx.Client, session_id: str) -> None:
    """The transcript as a Rich table (every page)."""
    status, messages = transcript_messages(http, session_id)
    table = Table("role", "agent", "text", title=f"Transcript · {status}", show_lines=True)
    for m in messages:
        role = m["role"] + (f" ({m['tool_name']})" if m.get("tool_name") else "")
        text = m["text"]
        if m.get("tool_calls"):
            text += "\n" + ", ".join(f"→ {c['name']}" for c in m["tool_calls"])
        table.add_row(role, m["agent"], escape(text))
    console.print(table)


@app.command()
def run(
    ref: Annotated[
        str | None, typer.Argument(help="AGENT or AGENT@VERSION (omit with --team)")
    ] = None,
    prompt: Annotated[str, typer.Argument(help="The message.")] = "",
    team: Annotated[str | None, typer.Option(help="Run a team: its lead answers.")] = None,
    solo: Annotated[bool, typer.Option(help="No ad-hoc delegation in this session.")] = False,
    session_id: Annotated[
        str | None,
        typer.Option("--session", help="Send the message to this session (session-… id)."),
    ] = None,
    if_busy: Annotated[
        str,
        typer.Option(
            "--if-busy",
            help="With --session, while a turn runs: reject | enqueue (run it next) | "
            "interrupt (stop the running turn).",
        ),
    ] = "reject",
    api_url: Annotated[
        str | None, typer.Option("--api", help="Baton API base URL (default BATON_API_URL).")
    ] = None,
) -> None:
    """Start a session on a running Baton (``baton dev``) and stream the reply; with
    ``--session``, send the message to that session and print its reply.

    Sends BATON_TOKEN as the bearer token when set (auth mode).
    """
    if (team or session_id) and ref and not prompt:  # `baton run --team desk "prompt"`
        prompt, ref = ref, None
    if session_id is not None:
        _send(session_id, prompt, if_busy, api_url)
        return
    body: dict[str, object] = {"prompt": prompt, "disable_delegation": solo}
    if team:
        body["team"] = team
    if ref:
        body["agent"] = ref
    with api_client(api_url) as http:
        session = checked(http.post("/v1/sessions", json=body))
        console.print(f"[dim]{session['session_id']} · {session['agent']}@{session['version']}[/]")
        _, failed = follow(http, str(session["session_id"]))
        console.print(f"[dim]{session['workflow_url']}[/]", soft_wrap=True)
        if failed:
            raise typer.Exit(1)


def _send(session_id: str, prompt: str, if_busy: str, api_url: str | None) -> None:
    """``baton run --session``: one message, waited for (an enqueued one runs after the
    turns before it); its reply, or the API's refusal (``session_busy``, ``queue_full``)."""
    body = {"prompt": prompt, "sync": True, "if_busy": if_busy}
    with api_client(api_url) as http:
        sent = checked(http.post(f"/v1/sessions/{session_id}/messages", json=body))
    console.print(escape(str(sent.get("response") or "")), soft_wrap=True, highlight=False)


def _usage_line(u: dict[str, object]) -> str:
    """``tokens in/out · cost · model time`` of a trace node; an unpriced model's cost
    (``cost_usd`` null: no price known for it) reads "cost unknown", never $0."""
    cost = u.get("cost_usd")
    priced = f"${cost:.4f}" if isinstance(cost, int | float) else "unknown"
    return (
        f"tokens in/out {u['input_tokens']}/{u['output_tokens']} · cost {priced}"
        f" · model time {u['wall_ms']} ms"
    )


def render_trace(node: dict[str, object]) -> Tree:
    """The delegation tree (``GET /v1/sessions/{id}/trace``) as a Rich tree: per node the
    agent, the session's id and status, the delegation's kind and status, usage, the
    delegation's wall-clock time and the node's Temporal UI link; the
    run tree's UI list under the root."""

    def label(n: dict[str, object]) -> str:
        d = n.get("delegation") or {}
        assert isinstance(d, dict)
        how = f"[blue]{d['kind']}[/] " if d else ""
        alias = f" ({d['alias']})" if d.get("alias") else ""
        outcome = f" · delegation {d['status']}" if d.get("status") else ""
        wall = f" · delegation wall {d['wall_ms']} ms" if d.get("wall_ms") is not None else ""
        step = n["usage"]
        assert isinstance(step, dict)
        text = (
            f"{how}[bold]{n['agent']}@{n['version']}[/]{alias} · session {n['session_id']}"
            f" ({n['status']}){outcome}\n{_usage_line(step)}{wall}"
        )
        if d.get("task"):
            text += f"\n[dim]{escape(str(d['task']))[:120]}[/]"
        if d.get("error"):
            text += f"\n[red]{escape(str(d['error']))[:160]}[/]"
        if n.get("workflow_url"):  # the node's Temporal UI page
            text += f"\n[dim]Temporal UI: {escape(str(n['workflow_url']))}[/]"
        return text

    def grow(tree: Tree, n: dict[str, object]) -> None:
        for child in n.get("children") or []:  # type: ignore[attr-defined]
            grow(tree.add(label(child)), child)

    total = node["subtree_usage"]
    assert isinstance(total, dict)
    head = f"{label(node)}\n[green]run total: {_usage_line(total)}[/]"
    if node.get("run_tree_url"):
        head += f"\n[dim]run tree in the Temporal UI: {escape(str(node['run_tree_url']))}[/]"
    if node.get("forked_from"):
        sandbox = " · [yellow]sandbox (the draft)[/]" if node.get("sandbox") else ""
        head += (
            f"\n[magenta]forked from {escape(str(node['forked_from']))} after "
            f"{escape(str(node['fork_point']))}[/]{sandbox}"
        )
    tree = Tree(head)
    grow(tree, node)
    return tree


@app.command()
def trace(
    session_id: Annotated[str, typer.Argument(help="session-… id (the run's root)")],
    api_url: Annotated[
        str | None, typer.Option("--api", help="Baton API base URL (default BATON_API_URL).")
    ] = None,
) -> None:
    """Print a session's delegation tree: who delegated to whom, tokens, cost, wall-clock."""
    with api_client(api_url) as http:
        body = checked(http.get(f"/v1/sessions/{session_id}/trace"))
    console.print(render_trace(body))


@app.command()
def fork(
    session_id: Annotated[str, typer.Argument(help="session-… id of the original")],
    after: Annotated[
        str, typer.Option("--after", help="The message id the fork ends at (inclusive).")
    ],
    agent: Annotated[
        str | None,
        typer.Option(help="AGENT@VERSION to run instead of the original's pin (or AGENT@draft)."),
    ] = None,
    prompt: Annotated[
        str | None, typer.Option(help="Replaces the original's next user message.")
    ] = None,
    sandbox: Annotated[
        bool, typer.Option(help="The authoring sandbox: needed to run AGENT@draft.")
    ] = False,
    api_url: Annotated[
        str | None, typer.Option("--api", help="Baton API base URL (default BATON_API_URL).")
    ] = None,
) -> None:
    """Fork a session after a message and stream the fork's reply (docs/change-safely.md,
    Fork a session). The original is never touched."""
    body: dict[str, object] = {"after_message_id": after, "sandbox": sandbox}
    if agent:
        body["agent"] = agent
    if prompt is not None:
        body["prompt"] = prompt
    with api_client(api_url) as http:
        started = checked(http.post(f"/v1/sessions/{session_id}/fork", json=body))
        console.print(
            f"[dim]{started['session_id']} · {started['agent']}@{started['version']} · "
            f"forked from {started['forked_from']} after {started['fork_point']}[/]"
        )
        _, failed = follow(http, str(started["session_id"]))
        console.print(f"[dim]{started['workflow_url']}[/]", soft_wrap=True)
        if failed:
            raise typer.Exit(1)
