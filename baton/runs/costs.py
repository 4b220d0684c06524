"""Cost arithmetic shared by metering (``GET /v1/usage``) and the run tree's trace.

Its own module because metering settles token reservations in ``run_tree`` and the trace
in ``run_tree`` sums costs: neither may import the other back.
"""

from __future__ import annotations

from collections.abc import Iterable


def sum_costs(costs: Iterable[float | None]) -> float | None:
    """The total cost (USD) of model calls, or None when any one's cost is unknown (no
    price known for its model): a partial sum would read as a real, too-low figure.
    The rule of every total Baton shows: ``GET /v1/usage``, the trace.
    """
    total = 0.0
    for cost in costs:
        if cost is None:
            return None
        total += cost
    return total
