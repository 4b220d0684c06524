"""``baton step``: run an agent as a workflow-agent step, and decide its handoff (talks to
the API)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from typer.core import TyperGroup

from cli.common import ApiOption, api_client, checked, console, err_console

STEP_DONE = ("completed", "failed", "rejected", "awaiting_handoff")
STEP_DECISIONS = ("approve", "revise", "reject")


class _StepGroup(TyperGroup):
    """``baton step``: ``run`` is the default subcommand, so ``baton step AGENT -i …``
    (the pre-issue-12 form) still runs a step; ``approve|revise|reject|run`` are the
    subcommands (an agent with one of those slugs: ``baton step run approve -i …``)."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:  # type: ignore[override]
        if args and args[0] not in self.commands and args[0] not in ctx.help_option_names:
            args = ["run", *args]
        return super().parse_args(ctx, args)


app = typer.Typer(
    cls=_StepGroup,
    help="Workflow-agent steps: run one (the default), decide its handoff (talks to the API).",
)


@app.command("run")
def step(
    ref: Annotated[str, typer.Argument(help="AGENT or AGENT@VERSION (a slug is pinned at launch)")],
    input_file: Annotated[
        Path, typer.Option("--input", "-i", help="The step's input: a text or JSON file.")
    ],
    schema: Annotated[
        Path | None, typer.Option(help="JSON Schema file the deliverable must validate against.")
    ] = None,
    handoff: Annotated[bool, typer.Option(help="Wait for a human's approval.")] = False,
    max_attempts: Annotated[int, typer.Option(help="Attempts (invalid deliverables).")] = 3,
    api_url: Annotated[
        str | None, typer.Option("--api", help="Baton API base URL (default BATON_API_URL).")
    ] = None,
) -> None:
    """Run an agent as a workflow-agent step and show its progress and deliverable."""
    import time

    try:
        text = input_file.read_text(encoding="utf-8")
        body: dict[str, object] = {"agent": ref, "handoff": handoff}
        try:
            body["input"] = json.loads(text) if input_file.suffix == ".json" else text
        except ValueError:
            body["input"] = text
        if schema is not None:
            body["output_schema"] = json.loads(schema.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        err_console.print(f"[bold red]error[/] cannot read the input or schema: {exc}")
        raise typer.Exit(1) from exc
    body["retry"] = {"max_attempts": max_attempts}
    with api_client(api_url) as http:
        launched = checked(http.post("/v1/steps", json=body))
        step_id = str(launched["step_id"])
        console.print(f"[dim]{step_id} · {launched['agent']}@{launched['version']}[/]")
        state: dict[str, object] = launched
        with console.status("running …") as spinner:
            while state["status"] not in STEP_DONE:
                time.sleep(0.5)
                state = checked(http.get(f"/v1/steps/{step_id}"))
                spinner.update(f"{state['status']} · attempt {state.get('attempts', 0)}")
    console.print(f"status: [bold]{state['status']}[/] after {state['attempts']} attempt(s)")
    if state.get("deliverable") is not None:
        console.print_json(json.dumps(state["deliverable"]))
    if state.get("error"):
        console.print(f"[red]{escape(str(state['error']))}[/]")
    if state["status"] == "awaiting_handoff":
        console.print(
            f"decide: POST /v1/steps/{step_id}/handoff "
            '{"decision": "approve" | "revise" | "reject", "feedback": …}'
        )
        console.print(
            f"  or: baton step approve {step_id}  ·  baton step revise {step_id} "
            f'--feedback "…"  ·  baton step reject {step_id}',
            soft_wrap=True,
            highlight=False,
        )
    if state["status"] in ("failed", "rejected"):
        raise typer.Exit(1)


def _handoff(step_id: str, decision: str, feedback: str | None, api_url: str | None) -> None:
    """Deliver a handoff decision and print the step as the API returns it after it."""
    body: dict[str, object] = {"decision": decision}
    if feedback is not None:
        body["feedback"] = feedback
    with api_client(api_url) as http:
        state = checked(http.post(f"/v1/steps/{step_id}/handoff", json=body))
    console.print(
        f"{step_id}: {decision} → [bold]{state['status']}[/] after {state['attempts']} attempt(s)",
        soft_wrap=True,
        highlight=False,
    )


StepIdArg = Annotated[str, typer.Argument(help="step-… id (awaiting_handoff)")]
FeedbackOption = Annotated[
    str | None, typer.Option(help="Feedback for the agent (revise) or the reason (reject).")
]


@app.command("approve")
def step_approve(step_id: StepIdArg, api_url: ApiOption = None) -> None:
    """Accept the deliverable of a step awaiting handoff: it completes."""
    _handoff(step_id, "approve", None, api_url)


@app.command("revise")
def step_revise(
    step_id: StepIdArg, feedback: FeedbackOption = None, api_url: ApiOption = None
) -> None:
    """Send the deliverable back with feedback: the agent makes another attempt."""
    _handoff(step_id, "revise", feedback, api_url)


@app.command("reject")
def step_reject(
    step_id: StepIdArg, feedback: FeedbackOption = None, api_url: ApiOption = None
) -> None:
    """Refuse the deliverable: the step ends rejected."""
    _handoff(step_id, "reject", feedback, api_url)
