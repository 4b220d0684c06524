"""The outbound rule (baton.outbound): in auth mode a spec's MCP server URL never reaches a
loopback, link-local (metadata), private or other non-public address unless
BATON_OUTBOUND_ALLOW lists it, checked on the resolved address and connected to exactly
that address. Real loopback listeners count the connections that reach them."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpcore2
import pytest
from pydantic import ValidationError
from sqlalchemy.engine import Engine
from temporalio.testing import WorkflowEnvironment

from activities.mcp_tools import discover
from baton.contracts.values import McpServerRef
from baton.outbound import OPEN, GuardedBackend, OutboundPolicy, OutboundRefused, parse_networks
from baton.settings import Settings
from baton.storage.db import SessionRow, session_scope
from tests.test_api_reviews import poll, running_stack
from tests.test_auth import Users, add_user


class Listener:
    """A TCP listener on a loopback address that counts the connections it accepts (and
    closes each at once: what matters is whether anything connected at all)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen(16)
        self.host, self.port = self.sock.getsockname()[:2]
        self.accepted = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()
        self._thread.join(timeout=5)


@pytest.fixture
def listener() -> Iterator[Listener]:
    """A counting listener on 127.0.0.1."""
    found = Listener()
    try:
        yield found
    finally:
        found.close()


def _server(url: str) -> McpServerRef:
    return McpServerRef(name="probe", url=url)


def _discover(url: str, policy: OutboundPolicy) -> list[Any]:
    return asyncio.run(discover([_server(url)], allowed=None, blocked=[], policy=policy))


RESTRICTED = OutboundPolicy(restricted=True)


# --- the rule ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.255.255.254",
        "::1",
        "0.0.0.0",
        "::",
        "169.254.169.254",  # the metadata service of AWS, GCP, Azure
        "fd00:ec2::254",  # AWS's IPv6 metadata address
        "fe80::1%eth0",
        "10.0.0.1",
        "172.16.0.1",
        "172.31.255.255",
        "192.168.1.1",
        "100.64.0.1",  # shared address space (Alibaba's metadata at 100.100.100.200)
        "::ffff:127.0.0.1",
        "::ffff:169.254.169.254",
        "224.0.0.1",
        "192.0.2.1",
    ],
)
def test_auth_mode_refuses_non_public_addresses(address: str) -> None:
    """Loopback, unspecified, link-local (metadata), private, shared, IPv4-mapped,
    multicast and documentation addresses are refused in auth mode, allowed outside it."""
    assert not RESTRICTED.permits(address)
    assert OPEN.permits(address)


@pytest.mark.parametrize("address", ["8.8.8.8", "172.32.0.1", "2606:4700:4700::1111"])
def test_auth_mode_permits_public_addresses(address: str) -> None:
    """A global unicast address (172.32.0.1 is one past the private 172.16/12) is permitted."""
    assert RESTRICTED.permits(address)


def test_the_allow_list_opens_exactly_its_networks() -> None:
    """``127.0.0.1/32,10.0.0.0/8``: 127.0.0.1 (also IPv4-mapped), 10.0.0.0 and
    10.255.255.255 pass; 127.0.0.2 (one past the /32) and 192.168.0.1 stay refused."""
    policy = OutboundPolicy(restricted=True, allow=parse_networks("127.0.0.1/32,10.0.0.0/8"))
    assert policy.permits("127.0.0.1") and policy.permits("::ffff:127.0.0.1")
    assert not policy.permits("127.0.0.2")
    assert policy.permits("10.0.0.0") and policy.permits("10.255.255.255")
    assert not policy.permits("192.168.0.1")


def test_settings_build_the_policy_and_refuse_a_bad_allow_list() -> None:
    """BATON_OUTBOUND_ALLOW takes CIDRs separated by commas or spaces; auth on restricts,
    auth off does not; an entry that is no network is refused when settings are read."""
    on = Settings(_env_file=None, auth="on", outbound_allow="127.0.0.1/32, 10.0.0.0/8 ::1")
    assert on.outbound_policy().restricted
    assert [str(n) for n in on.outbound_policy().allow] == ["127.0.0.1/32", "10.0.0.0/8", "::1/128"]
    assert not Settings(_env_file=None, outbound_allow="10.0.0.0/8").outbound_policy().restricted
    with pytest.raises(ValidationError, match="not an IP network"):
        Settings(_env_file=None, outbound_allow="10.0.0.0/8,intranet")


# --- real connections -----------------------------------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_auth_mode_never_connects_to_a_loopback_mcp_server(listener: Listener, host: str) -> None:
    """Discovering the tools of ``http://<loopback>:<port>/mcp`` in auth mode (by address or
    by a name resolving to it) reports the refusal as the server's error, and the listener
    accepts no connection."""
    (snap,) = _discover(f"http://{host}:{listener.port}/mcp", RESTRICTED)
    assert snap.name == "" and "OutboundRefused" in snap.error
    assert "BATON_OUTBOUND_ALLOW" in snap.error
    assert listener.accepted == 0


def test_allowed_or_outside_auth_mode_the_listener_is_reached(listener: Listener) -> None:
    """The same URL reaches the listener when BATON_OUTBOUND_ALLOW lists 127.0.0.1/32 and
    when auth is off (the server then fails as no MCP server: a connection error)."""
    url = f"http://127.0.0.1:{listener.port}/mcp"
    allowed = OutboundPolicy(restricted=True, allow=parse_networks("127.0.0.1/32"))
    (snap,) = _discover(url, allowed)
    assert snap.error and "OutboundRefused" not in snap.error
    reached = listener.accepted
    assert reached >= 1
    (snap,) = _discover(url, OPEN)
    assert snap.error and listener.accepted > reached


def test_a_name_is_connected_at_the_address_that_was_checked() -> None:
    """DNS cannot rebind: the guarded backend resolves a name once and connects to that
    address, so a resolver answering an allowed address, then a forbidden one, only ever
    leads to the allowed listener (127.0.0.1, allowed) and never to the other (127.0.0.2)."""
    allowed = Listener("127.0.0.1")
    forbidden = Listener("127.0.0.2", allowed.port)
    answers = [["127.0.0.1"]]
    asked: list[str] = []

    async def rebinding(host: str, port: int) -> list[str]:
        asked.append(host)
        return answers.pop() if answers else ["127.0.0.2"]

    policy = OutboundPolicy(restricted=True, allow=parse_networks("127.0.0.1/32"))
    backend = GuardedBackend(httpcore2.AnyIOBackend(), policy, resolver=rebinding)

    async def connect() -> None:
        stream = await backend.connect_tcp("rebind.example", allowed.port, timeout=5)
        await stream.aclose()
        with pytest.raises(OutboundRefused, match=r"127\.0\.0\.2"):
            await backend.connect_tcp("rebind.example", allowed.port, timeout=5)

    try:
        asyncio.run(connect())
        poll(lambda: allowed.accepted == 1, "the allowed listener's connection")
        assert asked == ["rebind.example", "rebind.example"]
        assert forbidden.accepted == 0
    finally:
        allowed.close()
        forbidden.close()


def test_an_auth_mode_stack_refuses_a_specs_loopback_mcp_server(
    temporal_env: WorkflowEnvironment, tmp_path: Path, listener: Listener
) -> None:
    """End to end, ``baton``'s services in auth mode (the worker built from the settings):
    a session of an agent whose spec lists a loopback MCP server runs its turn, records the
    server's refusal in its snapshot, and the listener is never contacted."""
    tokens: dict[str, str] = {}

    def prepare(engine: Engine) -> None:
        tokens["alice"] = add_user(engine, "alice")

    with running_stack(temporal_env, tmp_path / "outbound.db", prepare, auth="on") as stack:
        users = Users(stack.url, tokens)
        try:
            http = users["alice"]
            spec = {
                "mcp_servers": [{"name": "probe", "url": f"http://127.0.0.1:{listener.port}/mcp"}],
                "playbook": [{"reply": "done"}],
            }
            created = http.post("/v1/agents", json={"slug": "prober", "name": "P", "spec": spec})
            assert created.status_code == 201, created.text
            assert http.post("/v1/agents/prober/publish").status_code == 201
            launched = http.post(
                "/v1/sessions", json={"agent": "prober", "prompt": "go", "sync": True}
            )
            assert launched.status_code == 201, launched.text
            sid = launched.json()["session_id"]

            def snapshot() -> dict[str, Any] | None:
                with session_scope(stack.engine) as s:
                    row = s.get(SessionRow, sid)
                    return row.resolved_agent if row is not None else None

            resolved = poll(snapshot, "the session's snapshot")
            (tool,) = resolved["mcp_tools"]
            assert "OutboundRefused" in tool["error"]
            assert listener.accepted == 0
        finally:
            users.close()
