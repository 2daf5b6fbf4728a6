"""Pipelined Ready cycles: the node keeps taking Readies while an earlier one's fsync runs.

Acknowledgements and proposals that arrive during an fsync must not wait for it to end, nor a commit learnt then
wait for the next cycle (docs/raft.md, "Pipelined Ready cycles", explains the serial loop this replaced and what it
changed). As with etcd's asynchronous storage writes, a Ready is *taken* at once:
`MultiRaft.ready()` (the core hands its entries, hard state and committed entries out once, docs/raft.md), the
messages that may leave before the fsync are sent (`split_early`: a leader's appends carrying new entries and
commit indexes), and its committed entries are applied — they are durable on a majority already. Its records and
the messages that must follow durability (append acknowledgements, votes) wait in `queued` while an fsync is in
flight. When no fsync is in flight, `flush` writes every queued Ready's records and starts one fsync for all of
them in the sync thread (group commit). The committed entries of taken Readies are applied by `apply_taken`,
which the loop calls after the fsync started and after it let the transport's writers run (node.py), so neither
the fsync nor the frames just queued (appends, acknowledgements, forwards) wait for the apply (the host's work,
often the longest part of a turn). When the fsync is done the loop calls `finish_if_done`, which sends those
Readies' late messages and `advance`s them, in the order taken (a Ready may be advanced before its committed
entries are applied: it counts as unsettled until they are). So at most one fsync runs at a time, storage is touched by
one thread at a time (records are written only between fsyncs), and a Ready is advanced only after its fsync.

Bounds: at most `queued_max` Readies wait behind a running fsync (then the loop stops taking Readies, while it
still steps and routes: the inbox, the router and the cores' uncommitted-entries limit bound the rest).
`unsettled_groups` names the groups whose state machine is ahead of the core's applied index (a queued Ready
carried committed entries or a snapshot for them): the host's snapshot of such a group would not match
`log.applied`, so compaction skips them until they settle. `drain` empties the pipeline (group changes need it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from cluster.raft.core.multiraft import MultiRaft, NodeBatch, NodeReady, split_early
from cluster.raft.core.types import GroupId, NodeId
from cluster.raft.runtime.storage import RaftStorage
from cluster.raft.runtime.sync_thread import SyncJob, SyncThread
from cluster.raft.runtime.timing import StageTimings

QUEUED_READIES_MAX = 64
LATE_BATCH_MESSAGES_MAX = 4096  # late messages of several Readies to one peer go as one frame, up to this many


@dataclass(slots=True)
class TakenReady:
    node_ready: NodeReady
    late: list[NodeBatch]  # what may leave only once this Ready is durable


@dataclass
class PipelineStats:
    fsyncs: int = 0
    fsync_seconds: float = 0.0
    readies_taken: int = 0
    readies_behind_fsync: int = 0  # taken while an earlier fsync was running
    full: int = 0  # times `queued_max` Readies waited and taking paused


@dataclass
class ReadyPipeline:
    sync_thread: SyncThread
    send: Callable[[NodeBatch], None]
    apply_ready: Callable[[NodeReady], None]  # restore snapshots and apply committed entries, in order
    on_durable: Callable[[NodeReady], None]  # telemetry, after the fsync and before `advance`
    wake: Callable[[], None]  # called on the trio thread when an fsync is done
    timing: StageTimings | None = None
    queued_max: int = QUEUED_READIES_MAX
    volatile: set[GroupId] = field(default_factory=set)  # groups whose entries need no fsync (image.must_sync)
    stats: PipelineStats = field(default_factory=PipelineStats)
    _queued: list[TakenReady] = field(default_factory=list)  # taken, records not written yet
    _unapplied: list[NodeReady] = field(default_factory=list)  # taken, committed entries not applied yet
    _flight: list[TakenReady] = field(default_factory=list)  # records in the running fsync (or about to be)
    _fsync: SyncJob | None = None
    _fsync_started_s: float = 0.0

    @property
    def busy(self) -> bool:
        return self._fsync is not None or bool(self._queued) or bool(self._flight)

    @property
    def fsync_running(self) -> bool:
        return self._fsync is not None

    def can_take(self) -> bool:
        """False while an fsync runs and `queued_max` Readies wait behind it (0: take none during an fsync; the
        loop still steps and routes, and the next Ready gathers what came in)."""
        if self._fsync is None or len(self._queued) < self.queued_max:
            return True
        self.stats.full += 1
        return False

    def take(self, multi: MultiRaft) -> list[GroupId]:
        """Take one Ready: send what may leave early, queue the rest. Its committed entries are applied by the
        caller's `apply_taken` (before its records are written, if an fsync runs, or after their fsync started)."""
        node_ready = multi.ready()
        late: list[NodeBatch] = []
        for batch in node_ready.batches:
            early, waiting = split_early(batch)
            if early is not None:
                self.send(early)  # a leader's appends (new entries, commit index) go out at once
            if waiting is not None:
                late.append(waiting)
        self.stats.readies_taken += 1
        if self._fsync is not None:
            self.stats.readies_behind_fsync += 1
        self._queued.append(TakenReady(node_ready, late))
        self._unapplied.append(node_ready)
        return [group for group, _ in node_ready.groups]

    def apply_taken(self) -> None:
        """Apply the taken Readies' committed entries, in order (they are durable on a majority already: no
        need to wait for our own fsync)."""
        while self._unapplied:
            self.apply_ready(self._unapplied.pop(0))

    def flush(self, multi: MultiRaft, storage: RaftStorage) -> bool:
        """No fsync running: write the queued Readies' records and start their fsync (True); when none of them
        must be durable first (nothing written, or hard states that only move the commit index: `image.must_sync`),
        send their late messages and advance them now (False): every earlier Ready is durable already. Applies
        nothing: the caller's `apply_taken` does."""
        assert self._fsync is None and not self._flight
        if not self._queued:
            return False
        taken, self._queued = self._queued, []
        sync = False
        for item in taken:
            for group, ready in item.node_ready.groups:
                if ready.entries or ready.hard_state is not None or ready.snapshot is not None:
                    sync |= storage.write_ready(group, ready, group in self.volatile)
        self._flight = taken
        if not sync:  # nothing, commit indexes or volatile groups' entries (written; the next fsync covers them)
            self._settle(multi)
            return False
        self._fsync_started_s = trio.current_time()
        self._fsync = self.sync_thread.start(storage.commit, on_done=self.wake)
        return True

    def finish_if_done(self, multi: MultiRaft) -> bool:
        """The running fsync is done: send the late messages of its Readies and advance them (True)."""
        fsync = self._fsync
        if fsync is None or not fsync.done:
            return False
        self._fsync = None
        fsync.result()  # a failed fsync raises here: the node must stop
        elapsed_s = trio.current_time() - self._fsync_started_s
        self.stats.fsyncs += 1
        self.stats.fsync_seconds += elapsed_s
        if self.timing is not None:
            self.timing.record("fsync", elapsed_s * 1000)
        self._settle(multi)
        return True

    def _settle(self, multi: MultiRaft) -> None:
        taken, self._flight = self._flight, []
        for batch in merge_batches([batch for item in taken for batch in item.late]):
            self.send(batch)  # votes and acknowledgements: only now that they are durable
        for item in taken:
            self.on_durable(item.node_ready)
            multi.advance(item.node_ready)

    async def drain(self, multi: MultiRaft, storage: RaftStorage) -> None:
        """Wait until every taken Ready is durable and advanced (takes none meanwhile)."""
        self.apply_taken()
        while self.busy:
            if self._fsync is not None:
                await self._fsync.wait()
                self.finish_if_done(multi)
            else:
                self.flush(multi, storage)
            self.apply_taken()

    def unsettled_groups(self) -> set[GroupId]:
        """Groups a not yet advanced Ready applied committed entries or a snapshot for, or a taken Ready has them
        still to apply."""
        readies = [item.node_ready for item in (*self._flight, *self._queued)] + self._unapplied
        return {group for node_ready in readies for group, ready in node_ready.groups
                if ready.committed_entries or ready.snapshot is not None}


def merge_batches(batches: list[NodeBatch], messages_max: int = LATE_BATCH_MESSAGES_MAX) -> list[NodeBatch]:
    """One frame per peer for the late messages of several Readies (each peer's messages keep their order)."""
    if len(batches) <= 1:
        return batches
    by_peer: dict[NodeId, list[NodeBatch]] = {}
    for batch in batches:
        by_peer.setdefault(batch.dst, []).append(batch)
    merged: list[NodeBatch] = []
    for peer_batches in by_peer.values():
        first = peer_batches[0]
        messages = [message for batch in peer_batches for message in batch.messages]
        for start in range(0, max(len(messages), 1), messages_max):
            merged.append(NodeBatch(first.src, first.dst, first.incarnation,
                                    tuple(messages[start : start + messages_max])))
    return merged
