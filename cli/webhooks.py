"""``baton webhooks``: subscribe a receiver to review, handoff and failure events, read
the delivery log and send a test (talks to the API; docs/webhooks.md)."""

from __future__ import annotations

from typing import Annotated, get_args

import typer
from rich.markup import escape
from rich.table import Table

from baton.webhooks.subscriptions import Event
from cli.common import ApiOption, api_client, checked, console

app = typer.Typer(help="Webhooks: signed notifications of reviews, handoffs and failures.")

#: Every event a subscription may ask for (the API's list).
EVENTS: tuple[str, ...] = get_args(Event)


@app.command("add")
def webhooks_add(
    url: Annotated[str, typer.Argument(help="The receiver: an http:// or https:// URL.")],
    event: Annotated[
        list[str] | None,
        typer.Option(
            "--event", "-e", help=f"An event to send (repeat; default all): {', '.join(EVENTS)}."
        ),
    ] = None,
    agent: Annotated[str | None, typer.Option(help="Only events of this agent.")] = None,
    team: Annotated[str | None, typer.Option(help="Only events of this team's runs.")] = None,
    balance_low: Annotated[
        float | None, typer.Option(help="USD threshold of balance.low (default 1).")
    ] = None,
    description: Annotated[str, typer.Option(help="A note for yourself.")] = "",
    api_url: ApiOption = None,
) -> None:
    """Subscribe URL; prints the signing secret, which is shown only this once."""
    body: dict[str, object] = {"url": url, "events": event or list(EVENTS)}
    for key, value in (("agent", agent), ("team", team), ("balance_low_usd", balance_low)):
        if value is not None:
            body[key] = value
    if description:
        body["description"] = description
    with api_client(api_url) as http:
        hook = checked(http.post("/v1/webhooks", json=body))
    console.print(f"[bold]{hook['id']}[/] → {escape(str(hook['url']))}", highlight=False)
    console.print(f"  events: {', '.join(hook['events'])}", highlight=False)  # type: ignore[arg-type]
    console.print(
        f"  secret: [bold]{hook['secret']}[/]  (shown once: verify each delivery's "
        "webhook-signature with it)",
        highlight=False,
        soft_wrap=True,
    )


@app.command("list")
def webhooks_list(api_url: ApiOption = None) -> None:
    """List your webhooks, newest first."""
    with api_client(api_url) as http:
        body = checked(http.get("/v1/webhooks", params={"limit": 200}))
    if not body["data"]:
        console.print("no webhooks")
    for hook in body["data"]:  # type: ignore[attr-defined]
        only = hook["agent"] or hook["team"]
        scope = f" · only {only}" if only else ""
        console.print(
            f"[bold]{hook['id']}[/] {escape(hook['url'])} · {', '.join(hook['events'])}{scope}",
            soft_wrap=True,
            highlight=False,
        )


@app.command("rm")
def webhooks_rm(
    webhook_id: Annotated[str, typer.Argument(help="webhook-… id")], api_url: ApiOption = None
) -> None:
    """Delete a webhook: nothing more is sent to it."""
    with api_client(api_url) as http:
        checked(http.delete(f"/v1/webhooks/{webhook_id}"))
    console.print(f"{webhook_id}: deleted")


@app.command("deliveries")
def webhooks_deliveries(
    webhook_id: Annotated[str, typer.Argument(help="webhook-… id")],
    limit: Annotated[int, typer.Option(min=1, max=200)] = 20,
    api_url: ApiOption = None,
) -> None:
    """The delivery log: status, attempts and the last error of each delivery."""
    with api_client(api_url) as http:
        body = checked(http.get(f"/v1/webhooks/{webhook_id}/deliveries", params={"limit": limit}))
    table = Table("delivery", "event", "status", "attempts", "last error", box=None)
    for d in body["data"]:  # type: ignore[attr-defined]
        code = f"HTTP {d['last_status_code']} " if d["last_status_code"] else ""
        error = escape(f"{code}{d['last_error'] or ''}".strip())
        table.add_row(d["id"], d["event"], d["status"], str(d["attempts"]), error)
    console.print(table if body["data"] else "no deliveries yet")


@app.command("test")
def webhooks_test(
    webhook_id: Annotated[str, typer.Argument(help="webhook-… id")], api_url: ApiOption = None
) -> None:
    """Send a signed webhook.test delivery; follow it with `baton webhooks deliveries`."""
    with api_client(api_url) as http:
        sent = checked(http.post(f"/v1/webhooks/{webhook_id}/test"))
    console.print(f"{sent['delivery_id']}: queued (baton webhooks deliveries {webhook_id})")


class LocalReceiver:
    """A webhook receiver on a free loopback port (``make demo``): verifies each delivery's
    Standard Webhooks signature with ``secret`` (set once subscribed), keeps one payload per
    ``webhook-id`` (a retry is a duplicate) and answers 204, or 400 to a bad signature."""

    def __init__(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        from standardwebhooks.webhooks import Webhook, WebhookVerificationError

        self.secret = ""
        self.received: dict[str, dict[str, object]] = {}
        self.refused = 0
        self.arrived = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                try:
                    payload = Webhook(receiver.secret).verify(body, dict(self.headers.items()))
                except (WebhookVerificationError, ValueError):
                    receiver.refused += 1
                    self.send_response(400)
                    self.end_headers()
                    return
                with receiver.arrived:
                    receiver.received.setdefault(str(payload["id"]), payload)
                    receiver.arrived.notify_all()
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass  # the demo prints what arrived itself

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/baton"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> LocalReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def wait_for(self, count: int, timeout: float) -> bool:
        """Whether ``count`` distinct deliveries arrived within ``timeout`` seconds."""
        with self.arrived:
            return self.arrived.wait_for(lambda: len(self.received) >= count, timeout)
