"""The HTTP client of every connection a user's URL asks the worker to make (a spec's MCP
servers, webhook receivers): restricted by the outbound rule (:mod:`baton.outbound`).

Restricted (auth mode): every connection is checked on its resolved address and made to
that address, and proxies from the environment are ignored (a proxy would connect where
the rule cannot see). Unrestricted: httpx2's own client.
"""

from __future__ import annotations

from typing import Any

import httpcore2
import httpx2

from baton.outbound import GuardedBackend, OutboundPolicy


class _GuardedBackend(GuardedBackend, httpcore2.AsyncNetworkBackend):
    """:class:`baton.outbound.GuardedBackend` as the type httpcore2's pool takes."""


class _GuardedTransport(httpx2.AsyncHTTPTransport):
    """httpx2's transport whose connections go through :class:`baton.outbound.GuardedBackend`.

    httpx2 takes no network backend, its connection pool (httpcore2) does: the pool is
    built again with the same TLS context and the guarded backend, the only difference."""

    def __init__(self, policy: OutboundPolicy) -> None:
        super().__init__(trust_env=False)
        self._pool = httpcore2.AsyncConnectionPool(
            ssl_context=httpx2.create_ssl_context(trust_env=False),
            network_backend=_GuardedBackend(httpcore2.AnyIOBackend(), policy),
        )


def http_client(policy: OutboundPolicy, **kwargs: Any) -> httpx2.AsyncClient:
    """An ``httpx2.AsyncClient`` (``kwargs``: headers, timeout, …) whose connections obey
    ``policy``; a refused address raises :class:`baton.outbound.OutboundRefused` from the
    request."""
    if not policy.restricted:
        return httpx2.AsyncClient(**kwargs)
    return httpx2.AsyncClient(transport=_GuardedTransport(policy), trust_env=False, **kwargs)
