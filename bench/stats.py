"""Statistics of a benchmark run: percentiles, rates and the raftmq/RabbitMQ ratios. Pure functions.

Percentiles use the nearest-rank definition (the smallest sample with at least p% of samples at or below it), so
p99.9 of 1,000 samples is the 999th smallest and every reported latency is a latency that was really observed.
Ratios are raftmq over RabbitMQ: above 1 is better for throughput, below 1 is better for latency.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LatencySummary:
    samples: int
    p50_ms: float | None
    p99_ms: float | None
    p999_ms: float | None
    max_ms: float | None


def percentile(sorted_values: Sequence[float], percent: float) -> float:
    """Nearest-rank percentile of already sorted values (0 < percent <= 100)."""
    if not sorted_values:
        raise ValueError("percentile of no samples")
    if not 0 < percent <= 100:
        raise ValueError(f"percent must be in (0, 100], got {percent}")
    rank = math.ceil(percent * len(sorted_values) / 100.0 - 1e-9)  # 1e-9: 99.9 * 1000 / 100 is not exact
    return sorted_values[max(rank, 1) - 1]


def summarize_latencies_ns(latencies_ns: Sequence[int]) -> LatencySummary:
    if not latencies_ns:
        return LatencySummary(0, None, None, None, None)
    ordered = sorted(latencies_ns)
    to_ms = 1e-6
    return LatencySummary(
        samples=len(ordered),
        p50_ms=percentile(ordered, 50) * to_ms,
        p99_ms=percentile(ordered, 99) * to_ms,
        p999_ms=percentile(ordered, 99.9) * to_ms,
        max_ms=ordered[-1] * to_ms,
    )


def rate_per_s(count: int, duration_s: float) -> float:
    return count / duration_s if duration_s > 0 else 0.0


def ratio(ours: float | None, theirs: float | None) -> float | None:
    """ours / theirs, or None when either is missing or theirs is zero."""
    if ours is None or theirs is None or theirs == 0:
        return None
    return ours / theirs


def format_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"
