"""Where the engine may connect on behalf of what a user wrote: the one rule of outbound
addresses (docs/mcp.md, 'Outbound addresses').

A spec's ``mcp_servers`` names URLs the worker connects to (webhooks will name more). In
auth mode a spec's author is not the operator, so a URL must not reach what only the
worker can: loopback, link-local (cloud metadata services at 169.254.169.254 and
``fd00:ec2::254`` among them), private and other non-global addresses are refused unless
the operator lists them in ``BATON_OUTBOUND_ALLOW``. The rule is checked on the address a
connection is made to, after resolution, and the connection goes to that very address
(:class:`GuardedBackend`), so a name that resolves differently the next time (DNS
rebinding) cannot slip past it. Outside auth mode nothing is refused: every caller is the
local user, who can reach those addresses anyway.

Pure standard library: the backend wraps any httpcore-style network backend (``httpcore``
for httpx, ``httpcore2`` for httpx2) without importing one.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
#: ``resolver(host, port)`` → the addresses (text) a connection to ``host`` may go to.
Resolver = Callable[[str, int], Awaitable[list[str]]]

#: The variable an operator lists allowed networks in (what the refusal tells them to set).
ALLOW_VAR = "BATON_OUTBOUND_ALLOW"


class OutboundRefused(Exception):
    """A connection the outbound rule refuses: every address of the host is one a spec may
    not reach (the message names the host, its addresses and the setting that allows)."""


def parse_networks(text: str) -> tuple[Network, ...]:
    """Networks from ``text``: CIDRs or single addresses separated by commas or spaces
    (``127.0.0.1/32, 10.0.0.0/8 fd00::/8``). Raises ValueError naming a bad entry."""
    networks: list[Network] = []
    for entry in (e for e in re.split(r"[\s,]+", text.strip()) if e):
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError as exc:
            raise ValueError(f"{entry!r} is not an IP network (e.g. 10.0.0.0/8): {exc}") from None
    return tuple(networks)


def _address(text: str) -> Address:
    ip = ipaddress.ip_address(text.split("%", 1)[0])  # an IPv6 zone id is no part of it
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
    return ip


def is_public(ip: Address) -> bool:
    """Whether ``ip`` is a global unicast address: not loopback, link-local (metadata
    services), private, shared (100.64/10), reserved, documentation, unspecified or
    multicast (the IANA special-purpose registries Python's ``is_global`` follows)."""
    return ip.is_global and not ip.is_multicast


@dataclass(frozen=True)
class OutboundPolicy:
    """The outbound rule of one process: ``restricted`` (auth mode) refuses every address
    that is not :func:`is_public` unless it lies in one of the ``allow`` networks."""

    restricted: bool = False
    allow: tuple[Network, ...] = ()

    def permits(self, address: str) -> bool:
        """Whether a connection may go to ``address`` (an IP address as text)."""
        if not self.restricted:
            return True
        ip = _address(address)
        return is_public(ip) or any(ip in net for net in self.allow)

    def choose(self, host: str, addresses: Iterable[str]) -> list[str]:
        """The addresses of ``host`` a connection may go to, in resolution order. Raises
        OutboundRefused when there is none."""
        found = list(dict.fromkeys(addresses))
        allowed = [a for a in found if self.permits(a)]
        if not allowed:
            shown = ", ".join(found[:4]) or "no address"
            msg = (
                f"{host} resolves to {shown}: not a public address, and auth mode connects "
                f"to loopback, link-local, private or metadata addresses only when "
                f"{ALLOW_VAR} lists them"
            )
            raise OutboundRefused(msg)
        return allowed


#: The policy outside auth mode: nothing refused, nothing resolved ahead.
OPEN = OutboundPolicy()


async def resolve(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to for a TCP connection, in the resolver's order (an
    IP literal is itself)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


class GuardedBackend:
    """An httpcore-style ``AsyncNetworkBackend`` that resolves a host once, keeps the
    addresses ``policy`` permits (:meth:`OutboundPolicy.choose`) and connects to one of
    those exact addresses through ``inner``, so what was checked is what is reached. TLS
    still verifies the URL's host name (httpcore sends it as SNI). Unix sockets are
    refused when the policy is restricted. With an unrestricted policy it is ``inner``.
    """

    def __init__(self, inner: Any, policy: OutboundPolicy, resolver: Resolver = resolve) -> None:
        self._inner = inner
        self._policy = policy
        self._resolve = resolver

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> Any:
        """Connect to the first permitted address of ``host`` that answers; raises
        OutboundRefused (nothing permitted) or the last address's connect error."""
        if not self._policy.restricted:
            return await self._inner.connect_tcp(
                host,
                port,
                timeout=timeout,
                local_address=local_address,
                socket_options=socket_options,
            )
        async with asyncio.timeout(timeout):
            addresses = await self._resolve(host, port)
        failure: Exception | None = None
        for address in self._policy.choose(host, addresses):
            try:
                return await self._inner.connect_tcp(
                    address,
                    port,
                    timeout=timeout,
                    local_address=local_address,
                    socket_options=socket_options,
                )
            except Exception as exc:  # the next permitted address may answer
                failure = exc
        assert failure is not None
        raise failure

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> Any:
        """Unrestricted: ``inner``'s. Restricted: OutboundRefused (a socket file is local)."""
        if self._policy.restricted:
            raise OutboundRefused(f"auth mode never connects to a Unix socket ({path})")
        return await self._inner.connect_unix_socket(
            path, timeout=timeout, socket_options=socket_options
        )

    async def sleep(self, seconds: float) -> None:
        """``inner``'s (the pool's retry backoff)."""
        await self._inner.sleep(seconds)
