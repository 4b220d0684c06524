"""``baton usage`` and ``baton balance``: metered model usage (over the API) and the
organisation balance, the spending ceiling (on the database)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from cli.common import api_client, checked, console, db_session, fail

app = typer.Typer()
balance_app = typer.Typer(help="The organisation balance, the spending ceiling (database).")
app.add_typer(balance_app, name="balance")


@app.command()
def usage(
    by: Annotated[str, typer.Option(help="agent | session | step | day | model")] = "agent",
    api_url: Annotated[
        str | None, typer.Option("--api", help="Baton API base URL (default BATON_API_URL).")
    ] = None,
) -> None:
    """Metered model usage (tokens, cost) grouped by agent, session, step, day or model."""
    with api_client(api_url) as http:
        body = checked(http.get("/v1/usage", params={"group_by": by}))
        balance = checked(http.get("/v1/balance"))["balance"]
    table = Table(by, "requests", "tokens in", "tokens out", "cost (USD)", title="Usage")
    for g in body["data"]:  # type: ignore[attr-defined]
        table.add_row(
            g["key"],
            str(g["requests"]),
            str(g["input_tokens"]),
            str(g["output_tokens"]),
            "unknown" if g["cost_usd"] is None else f"{g['cost_usd']:.6f}",
        )
    console.print(table)
    console.print("balance: " + ("unlimited" if balance is None else f"${balance:.4f}"))


@balance_app.command("show")
def balance_show() -> None:
    """Print the balance (USD, or unlimited)."""
    from baton.runs import metering

    with db_session() as s:
        amount = metering.get_balance(s)
    console.print("balance: " + ("unlimited" if amount is None else f"${amount:.4f}"))


@balance_app.command("set")
def balance_set(
    amount: Annotated[str, typer.Argument(help="USD, e.g. 25 or 0.5; or `unlimited`.")],
) -> None:
    """Set the balance. Model calls are refused once it is spent (≤ 0). Works in auth
    mode too, where ``PUT /v1/balance`` is refused (no API user is an organisation admin)."""
    from pydantic import ValidationError

    from baton.errors import InvalidBalance
    from baton.runs import metering

    try:
        body = metering.BalanceUpdate.model_validate(
            {"balance": None if amount == "unlimited" else float(amount)}
        )
    except (ValidationError, ValueError) as exc:
        msg = f"amount must be a finite, non-negative number of USD or `unlimited`, not {amount!r}"
        raise fail(InvalidBalance(msg, path="amount")) from exc
    with db_session() as s:
        metering.set_balance(s, amount=body.balance)
    balance_show()
