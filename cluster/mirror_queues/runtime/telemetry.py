"""Mirrored-queue replica telemetry: LEO, HW and ISR changes in the replication telemetry format (`"kind": "mirror"`).

What it is for: the same JSON-lines files, schema v1, that cluster/raft writes for quorum queues
(docs/telemetry.md), so `spark_analytics` (`raftmq lag`) reads mirrored queues with the same job: the leader
epoch is `term`, the LEO is `last_index`, the HW is `commit_index`, and a leader's `followers` map gives each
follower's LEO as `match_index` (so lag in messages is the leader's LEO minus it, and lag in time comes from the
`append` records, as for Raft). A mirror directory is `<data_dir>/mirror/telemetry/`, next to Raft's
`<data_dir>/raft/telemetry/`, and the job's input resolution finds both. One writer per process, every call naming
the queue's group: a replica process (runtime/node.py) for its one queue, a cluster node
(node/runtime/cluster/mirror_groups.py) for every mirrored queue it hosts.

How it works: `MirrorTelemetry` is the Raft `TelemetryWriter` (its files, rotation and bounds) with mirror records:
`append` after every batch the replica made durable (offsets as 1-based indexes: offset o is index o + 1;
`entries_term` = the last record's epoch), `commit` when the HW moved, `state` sampled every `sample_interval_ms`
per group when something changed (with the ISR as `isr`, a field the Raft records do not have; all groups on one
interval, `sample_replicas`), and two record types of its own: `isr` (the ISR or leader changed: `leader`, `isr`)
and `truncate` (`from_index`, `to_index`: the LEO before and after, i.e. the
last index kept before and after; `how`: the core's reason,
`leader-epoch`, `leader-epoch (another round)`, `hw (unsafe)`, `out-of-range`, `leader-epoch-v0`). The job
reads all of them (spark_analytics: `isr.py` for `isr`, `truncations.py` for `truncate`).
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Iterable
from typing import Any

from cluster.mirror_queues.core.replica import Replica
from cluster.mirror_queues.core.types import Record, Truncated
from cluster.raft.runtime.telemetry import TelemetryWriter


class MirrorTelemetry(TelemetryWriter):
    def __init__(self, data_dir: pathlib.Path, node: str, clock_ms: Callable[[], int],
                 sample_interval_ms: int = 1000) -> None:
        super().__init__(data_dir / "mirror", node, clock_ms, sample_interval_ms=sample_interval_ms)
        self._hws: dict[str, int] = {}
        self._isrs: dict[str, tuple[str, tuple[str, ...]]] = {}
        self._mirror_states: dict[str, tuple[Any, ...]] = {}
        self._last_mirror_sample_ms = 0

    def _record(self, kind: str, group: str, replica: Replica) -> dict[str, Any]:
        return {"v": 1, "kind": "mirror", "type": kind, "ts_ms": self._clock_ms(), "node": self.node,
                "group": group, "term": replica.epoch}

    def on_append(self, group: str, replica: Replica, records: list[Record]) -> None:
        if not records:
            return
        record = self._record("append", group, replica)
        record.update(role=replica.role, first_index=records[0].offset + 1, last_index=records[-1].offset + 1,
                      bytes=sum(len(r.msg.encode()) for r in records), entries_term=records[-1].epoch)
        self._write(record)

    def on_truncate(self, group: str, replica: Replica, effect: Truncated) -> None:
        record = self._record("truncate", group, replica)
        record.update(role=replica.role, from_index=effect.from_leo, to_index=effect.to_leo, how=effect.how)
        self._write(record)
        self.flush()  # rare and telling: on disk at once, so a kill -9 right after does not lose it

    def after(self, group: str, replica: Replica) -> None:
        """After every core call: a `commit` record if the HW moved, an `isr` record if the leader or ISR did."""
        if replica.hw != self._hws.get(group, -1):
            self._hws[group] = replica.hw
            record = self._record("commit", group, replica)
            record["commit_index"] = replica.hw
            self._write(record)
        if replica.role == "leader":
            isr = (replica.name, tuple(sorted(replica.isr)))
            if isr != self._isrs.get(group):
                self._isrs[group] = isr
                record = self._record("isr", group, replica)
                record.update(leader=replica.name, isr=list(isr[1]))
                self._write(record)
                self.flush()
        else:
            self._isrs.pop(group, None)

    def sample_replicas(self, replicas: Iterable[tuple[str, Replica]], force: bool = False) -> None:
        """A `state` record per (group, replica) that changed since its last one, once every sample interval (the
        pairs are read only then: a generator costs nothing between samples)."""
        now_ms = self._clock_ms()
        if not force and now_ms - self._last_mirror_sample_ms < self._sample_interval_ms:
            return
        self._last_mirror_sample_ms = now_ms
        for group, replica in replicas:
            followers = {}
            if replica.role == "leader":
                followers = {f: {"match_index": leo} for f, leo in sorted(replica.follower_leo.items())}
            key = (replica.epoch, replica.role, replica.leo, replica.hw, tuple(sorted(replica.isr)),
                   tuple(sorted((f, v["match_index"]) for f, v in followers.items())))
            if key == self._mirror_states.get(group):
                continue
            self._mirror_states[group] = key
            record = self._record("state", group, replica)
            record.update(role=replica.role, last_index=replica.leo, commit_index=replica.hw)
            if replica.role == "leader":
                record.update(followers=followers, isr=sorted(replica.isr))
            self._write(record)
        self.flush()

    def forget_mirror(self, group: str) -> None:
        """A queue no longer hosted here: drop what is tracked for it (a re-added group starts afresh)."""
        self._hws.pop(group, None)
        self._isrs.pop(group, None)
        self._mirror_states.pop(group, None)
