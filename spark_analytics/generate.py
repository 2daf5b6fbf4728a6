"""Deterministic, realistic replication telemetry of any size, for tests and benchmarks.

A small discrete-time model of Raft groups (one per queue) on several nodes, written as the JSON lines of
docs/telemetry.md. Per group the leader appends a batch every `interval` ms (1-8 entries of 80-400 bytes); every
follower persists it 1-15 ms later; the leader commits once a majority holds it and the followers learn the commit
a few ms after that. Every node writes a `state` sample each second (the leader's lists its followers' progress).

- The fault: in group 0 the last node is paused from `fault_start_fraction` to `fault_end_fraction` of the run (it
  writes nothing). It then catches up, persisting up to `catch_up_batches_per_tick` leader batches at a time.
- Leader changes: every other group moves its leadership to the next node (new term) half-way through.
- Size: the batch rate is derived from `records`, `groups` and `duration_s`, so the total is about `records`; the
  floor is one batch a second, i.e. at least about groups x duration_s x 3 x nodes records.

Groups are independent, so they are spread over worker processes (`workers`), each writing its own file per node:
`<output>/<node>/telemetry/replication-<node>-<worker>.jsonl` (so `<output>/<node>` looks like a node's data dir).
Each group has its own random stream seeded from (seed, group), so the output does not depend on `workers`.
"""

from __future__ import annotations

import bisect
import dataclasses
import multiprocessing
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

Batch = tuple[int, int, int, int, int]
"""An appended batch: first index, last index, size in bytes, cumulative log bytes, term of its entries."""

START_MS = 1_732_300_000_000
STATE_INTERVAL_MS = 1000
FLUSH_LINES = 20_000


@dataclass(frozen=True, slots=True)
class GenerateSpec:
    """What to generate; `records` is a target, the result says how many were written."""

    records: int
    output: str
    seed: int = 1
    nodes: int = 3
    groups: int = 4
    duration_s: int = 120
    workers: int = 1
    fault_start_fraction: float = 0.4
    fault_end_fraction: float = 0.6
    catch_up_batches_per_tick: int = 25
    kind: str = "raft"


@dataclass(frozen=True, slots=True)
class GenerateResult:
    records: int
    files: tuple[str, ...]
    seconds: float
    lagging_group: str
    lagging_follower: str
    fault_start_ms: int
    fault_end_ms: int


@dataclass(slots=True)
class _Progress:
    """A node's durable log (or commit index) over time: parallel, ts-ordered lists for as-of lookups."""

    ts_ms: list[int] = field(default_factory=list)
    index: list[int] = field(default_factory=list)
    log_bytes: list[int] = field(default_factory=list)

    def add(self, ts_ms: int, index: int, log_bytes: int) -> int:
        ts_ms = max(ts_ms, self.ts_ms[-1]) if self.ts_ms else ts_ms
        self.ts_ms.append(ts_ms)
        self.index.append(index)
        self.log_bytes.append(log_bytes)
        return ts_ms

    def as_of(self, ts_ms: int) -> tuple[int, int]:
        position = bisect.bisect_right(self.ts_ms, ts_ms) - 1
        return (self.index[position], self.log_bytes[position]) if position >= 0 else (0, 0)


def node_names(spec: GenerateSpec) -> list[str]:
    return [f"n{number}" for number in range(1, spec.nodes + 1)]


def group_name(group: int) -> str:
    return f"%2F/q{group:04d}"


def fault_window_ms(spec: GenerateSpec) -> tuple[int, int]:
    duration_ms = spec.duration_s * 1000
    return (
        START_MS + int(duration_ms * spec.fault_start_fraction),
        START_MS + int(duration_ms * spec.fault_end_fraction),
    )


class _GroupModel:
    """Simulates one group and hands its lines, per node, to `emit`."""

    def __init__(self, spec: GenerateSpec, group: int, records: int, emit: _Writer) -> None:
        self.spec, self.group, self.emit = spec, group_name(group), emit
        self.uniform = random.Random(spec.seed * 1_000_003 + group).random
        self.nodes = node_names(spec)
        self.end_ms = START_MS + spec.duration_s * 1000
        self.victim = self.nodes[-1] if group == 0 else None
        self.fault_start_ms, self.fault_end_ms = fault_window_ms(spec)
        first_leader = self.nodes[group % spec.nodes]
        change_ms = START_MS + spec.duration_s * 500
        self.terms = [(START_MS, 1, first_leader)]
        if group % 2 == 1 and spec.nodes > 1:
            self.terms.append((change_ms, 2, self.nodes[(group + 1) % spec.nodes]))
        per_batch = 2 * spec.nodes
        batches_per_s = max(1.0, (records / spec.duration_s - spec.nodes) / per_batch)
        self.interval_ms = 1000.0 / batches_per_s
        self.persisted = {node: _Progress() for node in self.nodes}
        self.committed = {node: _Progress() for node in self.nodes}
        # the victim's backlog of leader batches: (first, last, bytes, log_bytes)
        self.pending: list[Batch] = []

    def between(self, low: int, high: int) -> int:
        """A uniform integer in [low, high] (random.randint is the generator's hot spot; this is 5x cheaper)."""
        return low + int(self.uniform() * (high - low + 1))

    def term_at(self, ts_ms: int) -> tuple[int, str]:
        position = bisect.bisect_right([start for start, _, _ in self.terms], ts_ms) - 1
        _, term, leader = self.terms[max(position, 0)]
        return term, leader

    def paused(self, node: str, ts_ms: int) -> bool:
        return node == self.victim and self.fault_start_ms <= ts_ms < self.fault_end_ms

    def run(self) -> None:
        last_index = log_bytes = 0
        batch = 0
        while True:
            tick_ms = START_MS + int(batch * self.interval_ms)
            if tick_ms >= self.end_ms:
                break
            batch += 1
            entries = self.between(1, 8)
            size = entries * self.between(80, 400)
            first, last_index, log_bytes = last_index + 1, last_index + entries, log_bytes + size
            self.append_batch(tick_ms, first, last_index, size, log_bytes)
        self.write_states()

    def append_batch(self, tick_ms: int, first: int, last: int, size: int, log_bytes: int) -> None:
        term, leader = self.term_at(tick_ms)
        leader_ts = self.persisted[leader].add(tick_ms + self.between(0, 2), last, log_bytes)
        self.emit.append_line(
            leader, leader_ts, self.group, term, "leader", (first, last, size, log_bytes, term)
        )
        holders = []
        for node in self.nodes:
            if node == leader:
                continue
            batch = self.follower_batch(node, tick_ms, (first, last, size, log_bytes, term))
            if batch is None:
                continue
            b_last, b_log_bytes = batch[1], batch[3]
            ts = self.persisted[node].add(tick_ms + self.between(1, 15), b_last, b_log_bytes)
            self.emit.append_line(node, ts, self.group, term, "follower", batch)
            if b_last == last:
                holders.append((ts, node))
        self.commit(term, leader, last, leader_ts, sorted(holders))

    def follower_batch(self, node: str, tick_ms: int, batch: Batch) -> Batch | None:
        """The batch `node` persists at this tick: none while paused; merged backlog while catching up."""
        if node != self.victim:
            return batch
        self.pending.append(batch)
        if self.paused(node, tick_ms):
            return None
        taken = self.pending[: self.spec.catch_up_batches_per_tick]
        del self.pending[: self.spec.catch_up_batches_per_tick]
        return (taken[0][0], taken[-1][1], sum(item[2] for item in taken), taken[-1][3], taken[-1][4])

    def commit(
        self, term: int, leader: str, last: int, leader_ts: int, holders: list[tuple[int, str]]
    ) -> None:
        needed = len(self.nodes) // 2  # followers needed besides the leader for a majority
        if len(holders) < needed:
            return
        quorum_ts = max([leader_ts] + [ts for ts, _ in holders[:needed]]) + 1
        commit_ts = self.committed[leader].add(quorum_ts, last, 0)
        self.emit.commit_line(leader, commit_ts, self.group, term, last)
        for _, node in holders:
            ts = self.committed[node].add(commit_ts + self.between(1, 5), last, 0)
            self.emit.commit_line(node, ts, self.group, term, last)

    def write_states(self) -> None:
        for sample_ms in range(START_MS, self.end_ms, STATE_INTERVAL_MS):
            term, leader = self.term_at(sample_ms)
            for node in self.nodes:
                if self.paused(node, sample_ms):
                    continue
                last, log_bytes = self.persisted[node].as_of(sample_ms)
                commit_index, _ = self.committed[node].as_of(sample_ms)
                followers = ""
                if node == leader:
                    progress = [
                        (peer, *self.persisted[peer].as_of(sample_ms)) for peer in self.nodes if peer != node
                    ]
                    followers = ",".join(
                        f'"{peer}":{{"match_index":{match},"match_bytes":{match_bytes}}}'
                        for peer, match, match_bytes in progress
                    )
                role = "leader" if node == leader else "follower"
                self.emit.state_line(
                    node, sample_ms, self.group, term, role, last, commit_index, log_bytes, followers
                )


class _Writer:
    """Buffers lines per node and appends them to that node's file in chunks."""

    def __init__(self, spec: GenerateSpec, worker: int) -> None:
        self.prefix = f'{{"v":1,"kind":"{spec.kind}","type":'
        self.buffers: dict[str, list[str]] = {}
        self.files: dict[str, TextIO] = {}
        self.spec, self.worker, self.records = spec, worker, 0

    def append_line(self, node: str, ts: int, group: str, term: int, role: str, batch: Batch) -> None:
        first, last, size, log_bytes, entries_term = batch
        self._add(
            node,
            f'{self.prefix}"append","ts_ms":{ts},"node":"{node}","group":"{group}","term":{term},'
            f'"role":"{role}","first_index":{first},"last_index":{last},"bytes":{size},'
            f'"log_bytes":{log_bytes},"entries_term":{entries_term}}}\n',
        )

    def commit_line(self, node: str, ts: int, group: str, term: int, commit_index: int) -> None:
        self._add(
            node,
            f'{self.prefix}"commit","ts_ms":{ts},"node":"{node}","group":"{group}","term":{term},'
            f'"commit_index":{commit_index}}}\n',
        )

    def state_line(
        self,
        node: str,
        ts: int,
        group: str,
        term: int,
        role: str,
        last: int,
        commit_index: int,
        log_bytes: int,
        followers: str,
    ) -> None:
        extra = f',"followers":{{{followers}}}' if role == "leader" else ""
        self._add(
            node,
            f'{self.prefix}"state","ts_ms":{ts},"node":"{node}","group":"{group}","term":{term},'
            f'"role":"{role}","last_index":{last},"commit_index":{commit_index},'
            f'"log_bytes":{log_bytes}{extra}}}\n',
        )

    def _add(self, node: str, line: str) -> None:
        buffer = self.buffers.setdefault(node, [])
        buffer.append(line)
        self.records += 1
        if len(buffer) >= FLUSH_LINES:
            self._flush(node)

    def _flush(self, node: str) -> None:
        if node not in self.files:
            directory = Path(self.spec.output) / node / "telemetry"
            directory.mkdir(parents=True, exist_ok=True)
            self.files[node] = open(directory / f"replication-{node}-{self.worker:04d}.jsonl", "w")  # noqa: SIM115
        self.files[node].writelines(self.buffers[node])
        self.buffers[node] = []

    def close(self) -> list[str]:
        for node in list(self.buffers):
            self._flush(node)
        for handle in self.files.values():
            handle.close()
        return [handle.name for handle in self.files.values()]


def _records_for_group(spec: GenerateSpec, group: int) -> int:
    share, remainder = divmod(spec.records, spec.groups)
    return share + (1 if group < remainder else 0)


def _run_worker(spec: GenerateSpec, worker: int) -> tuple[int, list[str]]:
    writer = _Writer(spec, worker)
    for group in range(worker, spec.groups, spec.workers):
        _GroupModel(spec, group, _records_for_group(spec, group), writer).run()
    return writer.records, writer.close()


def generate(spec: GenerateSpec) -> GenerateResult:
    """Writes the telemetry described by `spec`; with workers > 1, groups run in spawned processes."""
    if spec.records < 1 or spec.nodes < 2 or spec.groups < 1 or spec.workers < 1:
        raise ValueError("need records >= 1, nodes >= 2, groups >= 1 and workers >= 1")
    started = time.perf_counter()
    workers = min(spec.workers, spec.groups)
    spec = dataclasses.replace(spec, workers=workers)
    if workers == 1:
        results = [_run_worker(spec, 0)]
    else:
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            results = pool.starmap(_run_worker, [(spec, worker) for worker in range(workers)])
    fault_start_ms, fault_end_ms = fault_window_ms(spec)
    return GenerateResult(
        records=sum(count for count, _ in results),
        files=tuple(sorted(path for _, paths in results for path in paths)),
        seconds=time.perf_counter() - started,
        lagging_group=group_name(0),
        lagging_follower=node_names(spec)[-1],
        fault_start_ms=fault_start_ms,
        fault_end_ms=fault_end_ms,
    )


def default_workers() -> int:
    return max(1, os.cpu_count() or 1)
