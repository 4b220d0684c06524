"""docs/capacity.md holds the table that bench/capacity.py makes from the stored
measurement, and the model's rules hold at their edges."""

from __future__ import annotations

import json
import re
from pathlib import Path

from bench import capacity

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "capacity.md"


def measured() -> dict[str, object]:
    loaded: dict[str, object] = json.loads(capacity.MEASURED.read_text())
    return loaded


def test_the_documented_table_is_the_scripts_output() -> None:
    """The table between the capacity-table markers is what the script prints with its
    default workload from bench/capacity_measured.json, and so are the measured lines."""
    text = DOC.read_text()
    found = re.search(r"<!-- capacity-table:[^>]*-->\n(.*?)\n<!-- /capacity-table -->", text, re.S)
    assert found, "docs/capacity.md lost its capacity-table markers"
    assert found.group(1) == capacity.table(measured(), capacity.parse([]))
    assert capacity.measured_lines(measured()) in text


def test_the_availability_floor_holds_at_the_smallest_size() -> None:
    """However little load, the plan keeps 2 workers and 2 API replicas, and the shard
    count is a power of two of at least the production minimum."""
    small = capacity.plan(measured(), 1, capacity.parse([]))
    assert (small.workers, small.api_replicas) == (2, 2)
    assert small.history_shards == capacity.MIN_SHARDS
    big = capacity.plan(measured(), 10**9, capacity.parse([]))
    assert big.history_shards & (big.history_shards - 1) == 0
    assert big.history_shards > capacity.MIN_SHARDS


def test_workers_scale_with_the_measured_worker_cpu() -> None:
    """Doubling the worker's CPU per turn doubles the workers a large size needs (within
    one for rounding up)."""
    m = measured()
    args = capacity.parse([])
    base = capacity.plan(m, 10_000_000, args).workers
    heavier = json.loads(json.dumps(m))
    heavier["cpu_ms_per_turn"]["worker"] *= 2
    assert abs(capacity.plan(heavier, 10_000_000, args).workers - 2 * base) <= 1
