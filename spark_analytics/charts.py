"""One PNG per queue from its per-window aggregates (drawn on the driver with matplotlib's Agg backend).

Top panel: max lag in entries per follower and window. Bottom panel: max lag in time (age of the oldest entry the
follower lacks) and the out-of-sync threshold, so a fault shows as a ramp crossing the dashed line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt

from spark_analytics.transforms import LagConfig


@dataclass(slots=True)
class FollowerSeries:
    window_start_ms: list[int] = field(default_factory=list)
    lag_entries_max: list[float] = field(default_factory=list)
    lag_ms_max: list[float] = field(default_factory=list)


@dataclass(slots=True)
class QueueSeries:
    """Per follower, the window series of one queue."""

    group: str
    followers: dict[str, FollowerSeries] = field(default_factory=dict)

    def add(
        self,
        follower: str,
        window_start_ms: int,
        lag_entries_max: int | None,
        lag_ms_max: int | None,
    ) -> None:
        series = self.followers.setdefault(follower, FollowerSeries())
        series.window_start_ms.append(window_start_ms)
        series.lag_entries_max.append(float("nan") if lag_entries_max is None else lag_entries_max)
        series.lag_ms_max.append(float("nan") if lag_ms_max is None else lag_ms_max)


def draw_queue_chart(series: QueueSeries, config: LagConfig, path: Path) -> None:
    """Writes the chart of one queue to `path` (x axis: seconds since the queue's first window)."""
    starts = [start for f in series.followers.values() for start in f.window_start_ms]
    origin_ms = min(starts) if starts else 0
    figure, (entries_axis, time_axis) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for follower, data in sorted(series.followers.items()):
        seconds = [(start - origin_ms) / 1000 for start in data.window_start_ms]
        entries_axis.step(seconds, data.lag_entries_max, where="post", label=follower)
        time_axis.step(seconds, [ms / 1000 for ms in data.lag_ms_max], where="post", label=follower)
    entries_axis.axhline(config.lag_threshold_entries, linestyle="--", color="grey", linewidth=1)
    time_axis.axhline(config.lag_threshold_ms / 1000, linestyle="--", color="grey", linewidth=1)
    entries_axis.set_ylabel("max lag (entries)")
    time_axis.set_ylabel("max lag (s)")
    time_axis.set_xlabel(f"time (s), windows of {config.window_ms / 1000:g} s")
    entries_axis.set_title(f"replication lag of {series.group}")
    entries_axis.legend(loc="upper right", fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)
