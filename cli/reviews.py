"""``baton reviews``: list and decide X-Agent policy reviews (talks to the API)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from cli.common import ApiOption, api_client, checked, console

app = typer.Typer(help="Decide X-Agent policy reviews (talks to the API).")


@app.command("list")
def reviews_list(
    status: Annotated[str | None, typer.Option(help="pending | allowed | denied | …")] = "pending",
    api_url: ApiOption = None,
) -> None:
    """List reviews (pending by default), newest first."""
    with api_client(api_url) as http:
        params = {"status": status} if status else {}  # the API reads `all` too
        body = checked(http.get("/v1/reviews", params=params | {"limit": 200}))
    # One review per line, ids first and never cut (they are what approve/deny take):
    # a table squeezes every other column to nothing in an 80-column terminal.
    if not body["data"]:
        console.print(
            f"no {status if status and status != 'all' else ''} reviews".replace("  ", " ")
        )
    for r in body["data"]:  # type: ignore[attr-defined]
        target = f" {r['target']}" if r["target"] else ""
        # A pending review's deadline: a decision received later is refused (too late).
        expires = r.get("expires_at") if r["status"] == "pending" else None
        until = f" · decide by {expires}" if expires else ""
        console.print(
            f"[bold]{r['id']}[/] {r['status']} · {r['caller']} → {r['operation']}{target}"
            f" · session {r['session_id']}{until}",
            soft_wrap=True,
            highlight=False,
        )
        if r["preview"]:
            console.print(f"    {escape(r['preview'][:200])}", soft_wrap=True, highlight=False)


def _decide(
    review_id: str,
    decision: str,
    scope: str | None,
    api_url: str | None,
    **edits: str | None,
) -> None:
    sent: dict[str, str | None] = {"decision": decision, "scope": scope}
    sent.update({field: value for field, value in edits.items() if value is not None})
    with api_client(api_url) as http:
        resp = http.post(f"/v1/reviews/{review_id}/decision", json=sent)
        body = checked(resp)
    if resp.status_code == 202:
        console.print(f"{review_id}: decision delivered; the session has not applied it yet")
    else:
        console.print(f"{review_id}: [bold]{body['status']}[/] (by {body['decided_by']})")


@app.command("approve")
def reviews_approve(
    review_id: Annotated[str, typer.Argument(help="review-… id")],
    always: Annotated[
        bool, typer.Option("--always", help="Save an allow policy (always_allow).")
    ] = False,
    scope: Annotated[
        str, typer.Option(help="With --always: 'target' (this agent) or 'all' (global).")
    ] = "target",
    edited_prompt: Annotated[
        str | None,
        typer.Option(
            "--edited-prompt",
            help="An invoke: send the target this prompt instead of the caller's (audited).",
        ),
    ] = None,
    edited_name: Annotated[
        str | None,
        typer.Option(
            "--edited-name",
            help="A create: the new agent gets this name instead of the caller's (audited).",
        ),
    ] = None,
    edited_instructions: Annotated[
        str | None,
        typer.Option(
            "--edited-instructions",
            help="A create: the new agent gets these instructions instead (audited).",
        ),
    ] = None,
    api_url: ApiOption = None,
) -> None:
    """Allow the reviewed operation (once, or --always), optionally edited: an invoke's
    prompt, a create's name and instructions."""
    decision = "always_allow" if always else "allow_once"
    _decide(
        review_id,
        decision,
        scope if always else None,
        api_url,
        edited_prompt=edited_prompt,
        edited_name=edited_name,
        edited_instructions=edited_instructions,
    )


@app.command("deny")
def reviews_deny(
    review_id: Annotated[str, typer.Argument(help="review-… id")], api_url: ApiOption = None
) -> None:
    """Deny the reviewed operation; the calling agent gets an error."""
    _decide(review_id, "deny", None, api_url)
