"""One PNG per queue from its per-window aggregates (drawn on the driver with matplotlib's Agg backend).
Mirrored queues get a second one: each replica's times out of the ISR as bars on a timeline.

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


@dataclass(slots=True)
class IsrSeries:
    """One mirrored queue's replicas and their times out of the ISR (end None: not back when the telemetry ends)."""

    group: str
    replicas: set[str] = field(default_factory=set)
    episodes: list[tuple[str, int, int | None]] = field(default_factory=list)


def draw_isr_chart(series: IsrSeries, path: Path) -> None:
    """One row per replica, a red bar for each time out of the ISR (to the end of the chart when not back)."""
    times = [t for _, start, end in series.episodes for t in (start, end) if t is not None]
    origin_ms = min(times) if times else 0
    last_s = (max(times) - origin_ms) / 1000 if times else 1.0
    right_s = max(last_s * 1.05, 1.0)
    replicas = sorted(series.replicas | {replica for replica, _, _ in series.episodes})
    figure, axis = plt.subplots(figsize=(9, 1.2 + 0.5 * len(replicas)))
    for row, replica in enumerate(replicas):
        bars = [((start - origin_ms) / 1000, ((end if end is not None else origin_ms + right_s * 1000) - start) / 1000)
                for name, start, end in series.episodes if name == replica]
        axis.broken_barh(bars, (row - 0.35, 0.7), color="tab:red")
    axis.set_yticks(range(len(replicas)), replicas)
    axis.set_xlim(0, right_s)
    axis.set_xlabel("time (s) since the first change; red: out of the ISR")
    axis.set_title(f"ISR membership of {series.group}")
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)
