"""How long the broker stopped confirming around each fault: the unavailability windows of a run (pure).

How it works: from the history alone. `confirm_gap_ms_max` is the longest stretch, while publishing, in which no
publish was confirmed (from one confirm's settle time to the next; the first and last confirm bound it, so slow
starts and tails are not counted). For each fault (kill, pause, partition, restart...), `first_confirm_after_ms`
is the time from the fault to the settle time of the first confirmed publish *sent* after it: how long a client
that starts a publish just after the fault waits before the broker takes one again (None when nothing sent after
it was confirmed; `sent_after` says whether anything was sent after it at all: publishers may have finished). `confirm_latency_ms_max` is the longest any one publish waited for its confirm: what the most
unlucky client saw (e.g. one connected to a node cut off from the majority). Phase markers ("purge", "drain", "closed", "connection-lost", "up", "leader") are not faults.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from itertools import pairwise

from chaos.history import Fault, Publish

MARKERS = frozenset({"purge", "drain", "closed", "connection-lost", "up", "leader"})


@dataclass(frozen=True, slots=True)
class FaultRecovery:
    kind: str
    target: str
    at_ms: float
    first_confirm_after_ms: float | None
    sent_after: bool = True


@dataclass(frozen=True, slots=True)
class Availability:
    confirm_gap_ms_max: float
    confirm_gap_start_ms: float | None
    faults: tuple[FaultRecovery, ...]
    confirm_latency_ms_max: float = 0.0

    def as_dict(self) -> dict[str, object]:
        return {"confirm_gap_ms_max": round(self.confirm_gap_ms_max, 1),
                "confirm_latency_ms_max": round(self.confirm_latency_ms_max, 1),
                "confirm_gap_start_ms": None if self.confirm_gap_start_ms is None
                else round(self.confirm_gap_start_ms, 1),
                "faults": [{"kind": f.kind, "target": f.target, "at_ms": round(f.at_ms, 1),
                            "first_confirm_after_ms": None if f.first_confirm_after_ms is None
                            else round(f.first_confirm_after_ms, 1), "sent_after": f.sent_after}
                           for f in self.faults]}


def confirm_settle_times(publishes: Iterable[Publish]) -> list[float]:
    return sorted(p.settled_ms for p in publishes if p.outcome == "confirmed" and p.settled_ms is not None)


def longest_gap(times_ms: list[float]) -> tuple[float, float | None]:
    """The longest gap between consecutive sorted times, and where it starts (0, None for fewer than two)."""
    best, start = 0.0, None
    for earlier, later in pairwise(times_ms):
        if later - earlier > best:
            best, start = later - earlier, earlier
    return best, start


def first_confirm_after(publishes: list[Publish], at_ms: float) -> float | None:
    settled = [p.settled_ms for p in publishes
               if p.outcome == "confirmed" and p.settled_ms is not None and p.sent_ms >= at_ms]
    return min(settled) - at_ms if settled else None


def availability(publishes: Iterable[Publish], faults: Iterable[Fault]) -> Availability:
    publish_list = list(publishes)
    gap, gap_start = longest_gap(confirm_settle_times(publish_list))
    recoveries = tuple(FaultRecovery(f.kind, f.target, f.at_ms, first_confirm_after(publish_list, f.at_ms),
                                     any(p.sent_ms >= f.at_ms for p in publish_list))
                       for f in faults if f.kind not in MARKERS)
    latencies = [p.settled_ms - p.sent_ms for p in publish_list if p.outcome == "confirmed" and p.settled_ms is not None]
    return Availability(gap, gap_start, recoveries, max(latencies, default=0.0))
