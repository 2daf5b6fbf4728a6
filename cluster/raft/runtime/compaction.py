"""Automatic compaction of a node's Raft groups: when a group's applied log has grown enough, snapshot it.

Used by the trio driver (node.py) when the host gives a `SnapshotHost`. `Compactor` counts, per group, the bytes of
entry data applied since the group's last snapshot (`applied`, reset by `restored` and by a compaction). After
`advance`, a group whose applied log holds more than `CompactionConfig.entries_max` entries or `bytes_max` bytes of
entry data beyond its snapshot gets a new snapshot: `host.snapshot(group)` (the state machine at the applied
index), `core.compact`, then `RaftStorage.compact` in a worker thread (the stream's NodeLog snapshot; segments
behind it are deleted, so an idle group's disk is bounded by its snapshot plus at most the thresholds). At most
`groups_per_cycle_max` groups per cycle, so a burst of compactions cannot stall the Ready loop; the groups past a
threshold beyond that allowance stay `pending` for a later turn. `host.restore(group, data)` rebuilds the state
machine from a snapshot: the driver calls it at start for every group whose storage holds one, and whenever a Ready
carries a snapshot received from the leader (before that Ready's committed entries are applied).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import trio

from cluster.raft.core.multiraft import MultiRaft
from cluster.raft.core.types import Entry, GroupId
from cluster.raft.runtime.storage import RaftStorage
from cluster.raft.runtime.timing import StageTimings


class SnapshotHost(Protocol):
    """The host's state machine images (optional: without it the runtime never compacts)."""

    def snapshot(self, group: GroupId) -> bytes:
        """The group's state machine as bytes, reflecting exactly the entries applied so far."""
        ...

    def restore(self, group: GroupId, data: bytes) -> None:
        """Replace the group's state machine with the one `snapshot` produced (b"" for the empty start)."""
        ...


@dataclass(frozen=True, slots=True)
class CompactionConfig:
    entries_max: int = 10_000  # applied entries beyond the snapshot before a new one is taken
    bytes_max: int = 64 * 1024 * 1024  # applied entry data bytes beyond the snapshot (counted since start)
    groups_per_cycle_max: int = 16  # compactions per Ready cycle (each is a few fsyncs)


class Compactor:
    """Which groups are due a snapshot, and taking them (see the module header)."""

    def __init__(self, host: SnapshotHost | None, config: CompactionConfig) -> None:
        self.host = host
        self.config = config
        self.applied_bytes: dict[GroupId, int] = {}  # entry data applied since the group's last snapshot
        self.pending: set[GroupId] = set()  # past a threshold, beyond this cycle's allowance

    def applied(self, group: GroupId, committed: Sequence[Entry]) -> None:
        self.applied_bytes[group] = self.applied_bytes.get(group, 0) + sum(len(e.data) for e in committed)

    def restored(self, group: GroupId) -> None:
        """The group's state machine was replaced by a snapshot received from the leader."""
        self.applied_bytes[group] = 0

    def forget(self, group: GroupId) -> None:
        self.applied_bytes.pop(group, None)
        self.pending.discard(group)

    def due(self, multi: MultiRaft, group: GroupId) -> bool:
        core = multi.groups.get(group)
        if core is None:
            return False  # a stepped batch may name a group this node does not host (any more)
        log = core.log
        if log.applied > log.persisted or log.applied <= log.snapshot.index:
            return False  # only what is applied and durable can be compacted
        return (log.applied - log.snapshot.index > self.config.entries_max
                or self.applied_bytes.get(group, 0) > self.config.bytes_max)

    async def compact_due(self, multi: MultiRaft, storage: RaftStorage, touched: list[GroupId],
                          unsettled: set[GroupId], timing: StageTimings | None) -> int:
        """Snapshot the groups past a threshold (those this cycle touched, then any left over from before); how
        many were compacted. Only while no fsync runs, and not the `unsettled` groups: their state machine is
        ahead of `log.applied` (a taken Ready's committed entries are applied before it is advanced), so they wait,
        pending, for a later turn."""
        assert self.host is not None
        pending = self.pending
        pending.update(group for group in touched if self.due(multi, group))
        chosen = sorted(pending - unsettled)[: self.config.groups_per_cycle_max]
        if not chosen:
            return 0
        snapshots = []
        started = 0.0 if timing is None else timing.now_s()
        for group in chosen:
            pending.discard(group)
            if self.due(multi, group):
                snapshots.append((group, multi.groups[group].compact(self.host.snapshot(group))))
                self.applied_bytes[group] = 0

        def persist() -> None:
            for group, snapshot in snapshots:
                storage.compact(group, snapshot)

        if timing is not None:
            timing.since("compaction_snapshot", started)
        await trio.to_thread.run_sync(persist)
        if timing is not None:
            timing.since("compaction", started)
        return len(snapshots)
