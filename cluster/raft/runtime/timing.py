"""Stage timings of the Raft runtime's confirm path, for finding serial waits (off by default).

Enabled by the environment variable `RAFTMQ_RAFT_TIMING=<directory>`: the node driver then records, in
milliseconds, how long inbound batches wait before they are stepped (`inbox_wait`), how long queued commands wait
before they are routed (`route_wait`), each fsync (`fsync`), each Ready's apply (`apply`), each busy turn of the
loop (`loop_turn`), how late a 5 ms sleep wakes (`loop_lag`: the trio thread blocked by long callbacks, garbage
collection or the GIL), each garbage collection's pause (`gc_gen<N>`), on a leader the time from handing its new
entries to storage to applying them committed (`append_to_apply_leader`), and on a follower the same for appended
entries (`append_to_apply_follower`), and the loop's group changes: waiting for the pipeline to drain
(`turn_drain`), carrying the changes out (`turn_group_changes`), each group's load (`group_load`), removal
(`group_drop`, its stream's deletion included) and the fsync of new groups' first records
(`group_commit`). The host may add its own stages (`record`; the cluster runtime adds
`proposal_to_apply`: a local proposal until this node's replica applied it), and the transport how long a frame
waits in its peer's queue until its write finished (`frame_queue_to_write`). Besides these per-node stages, the
driver records *events* of single entries, `[t_s, kind, group, index, key]` with `t_s` from the system-wide
monotonic clock (`time.perf_counter`, CLOCK_MONOTONIC on Linux, so the three nodes of one host compare):
`propose`/`fwd`/`fwd_recv` (key: the command's crc32, index 0), `append` on the leader (key: the entry's crc32)
and on a follower, `durable` (the last index a finished fsync covered), `commit` (a leader's commit index moved),
`apply`/`applied` (before and after the host's apply of committed entries up to the index);
bench/raft_trace.py joins them into one message's path across the nodes. Every `dump_interval_s` the samples
and events taken since the last dump are appended as one JSON line `{"wall_s": ..., "stages": {stage: [ms, ...]},
"events": [...]}` to `<directory>/<node>.jsonl` (so a run's layouts can be told apart by time; `summary` gives
count/p50/p90/p99/max). Samples are kept in bounded rings
(`samples_max` per stage), pending marks per group are bounded too, and this is a diagnostic for short runs only.
When disabled (`from_environment` returns None) the driver pays one `is None` test per place.
"""

from __future__ import annotations

import gc
import json
import os
import pathlib
import time
from collections import deque
from dataclasses import dataclass, field

ENV_VAR = "RAFTMQ_RAFT_TIMING"
MARKS_PER_GROUP_MAX = 4096


def percentile(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return 0.0
    position = min(len(sorted_values) - 1, int(fraction * len(sorted_values)))
    return sorted_values[position]


@dataclass
class StageTimings:
    path: pathlib.Path
    samples_max: int = 50_000
    dump_interval_s: float = 2.0
    _samples: dict[str, deque[float]] = field(default_factory=dict)
    _marks: dict[tuple[str, str], deque[tuple[int, float]]] = field(default_factory=dict)
    _events: deque[tuple[float, str, str, int, int]] = field(default_factory=lambda: deque(maxlen=200_000))
    _last_dump_s: float = 0.0

    @classmethod
    def from_environment(cls, node_id: str) -> StageTimings | None:
        directory = os.environ.get(ENV_VAR)
        if not directory:
            return None
        pathlib.Path(directory).mkdir(parents=True, exist_ok=True)
        return cls(pathlib.Path(directory) / f"{node_id}.jsonl")

    @staticmethod
    def now_s() -> float:
        return time.perf_counter()

    def record(self, stage: str, milliseconds: float) -> None:
        ring = self._samples.get(stage)
        if ring is None:
            ring = self._samples[stage] = deque(maxlen=self.samples_max)
        ring.append(milliseconds)

    def event(self, kind: str, group: str, index: int, key: int = 0) -> None:
        """One entry reached a point of its path (see the header): joined across nodes by bench/raft_trace.py."""
        self._events.append((time.perf_counter(), kind, group, index, key))

    def watch_gc(self) -> None:
        """Record every garbage collection's pause as `gc_gen<N>` (gc.callbacks, this process)."""
        started: list[float] = [0.0]

        def callback(phase: str, info: dict[str, int]) -> None:
            if phase == "start":
                started[0] = time.perf_counter()
            else:
                self.record(f"gc_gen{info.get('generation', -1)}", (time.perf_counter() - started[0]) * 1000)

        gc.callbacks.append(callback)

    def since(self, stage: str, started_s: float) -> None:
        self.record(stage, (time.perf_counter() - started_s) * 1000)

    def mark(self, stage: str, group: str, index: int) -> None:
        """Remember when `index` of `group` reached this stage's start (only a higher index than the last mark)."""
        marks = self._marks.get((stage, group))
        if marks is None:
            marks = self._marks[(stage, group)] = deque(maxlen=MARKS_PER_GROUP_MAX)
        if not marks or index > marks[-1][0]:
            marks.append((index, time.perf_counter()))

    def reached(self, stage: str, group: str, index: int) -> None:
        """`index` of `group` got through the stage: a sample for every mark at or below it."""
        marks = self._marks.get((stage, group))
        if not marks:
            return
        now = time.perf_counter()
        while marks and marks[0][0] <= index:
            self.record(stage, (now - marks.popleft()[1]) * 1000)

    def summary(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for stage, ring in sorted(self._samples.items()):
            values = sorted(ring)
            out[stage] = {"count": len(values), "p50": round(percentile(values, 0.5), 3),
                          "p90": round(percentile(values, 0.9), 3), "p99": round(percentile(values, 0.99), 3),
                          "max": round(values[-1], 3) if values else 0.0}
        return out

    def maybe_dump(self) -> None:
        now = time.perf_counter()
        if now - self._last_dump_s < self.dump_interval_s:
            return
        self._last_dump_s = now
        stages = {stage: [round(value, 2) for value in ring] for stage, ring in sorted(self._samples.items())}
        self._samples.clear()
        events = [[round(t, 6), kind, group, index, key] for t, kind, group, index, key in self._events]
        self._events.clear()
        with self.path.open("a") as file:
            file.write(json.dumps({"wall_s": round(time.time(), 3), "stages": stages, "events": events}) + "\n")
