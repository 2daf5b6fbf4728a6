"""The trio driver of one node's MultiRaft: timers, inbound batches, proposals, and the Ready cycle.

One task owns the MultiRaft. It wakes when a batch arrives, a proposal is queued or a tick is due; it then steps
every inbound batch, hands queued proposals to the cores, and runs the Ready cycle: write every group's records,
`commit()` them in a worker thread (one fsync for all groups), send the batches, apply committed entries (the
`on_apply` callback), `advance`. Replication telemetry (telemetry.py) is written after each fsync and sampled
on the timer. Inbound batches and proposals wait in bounded queues (beyond the bound, batches
are dropped and proposals refused).

Automatic compaction (when the host gives a `SnapshotHost`): after `advance`, a group whose applied log holds more
than `CompactionConfig.entries_max` entries or `bytes_max` bytes of entry data beyond its snapshot gets a new
snapshot: `host.snapshot(group)` (the state machine at the applied index), `core.compact`, then
`RaftStorage.compact` in a worker thread (the stream's NodeLog snapshot; segments behind it are deleted, so an idle
group's disk is bounded by its snapshot plus at most the thresholds). At most `groups_per_cycle_max` groups per
cycle, so a burst of compactions cannot stall the Ready loop. `host.restore(group, data)` rebuilds the state
machine from a snapshot: at start for every group whose storage holds one, and whenever a Ready carries a snapshot
received from the leader (before that Ready's committed entries are applied).
"""

from __future__ import annotations

import pathlib
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import trio

from cluster.raft.core.multiraft import MultiRaft, MultiRaftConfig, NodeBatch, split_early
from cluster.raft.core.types import Entry, GroupId, Index, Membership, NodeId
from cluster.raft.runtime.storage import RaftStorage
from cluster.raft.runtime.telemetry import TelemetryWriter
from cluster.raft.runtime.transport import Transport

INBOX_BATCHES_MAX = 4096
PROPOSALS_QUEUED_MAX = 65536


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


@dataclass
class NodeStats:
    ready_cycles: int = 0
    fsyncs: int = 0
    applied_entries: int = 0
    proposals_refused: int = 0
    fsync_seconds: float = 0.0
    compactions: int = 0
    restores: int = 0


class RaftNodeRuntime:
    def __init__(
        self,
        node_id: NodeId,
        data_dir: pathlib.Path,
        listen: tuple[str, int],
        peers: dict[NodeId, tuple[str, int]],
        secret: bytes,
        on_apply: Callable[[GroupId, Entry], None],
        config: MultiRaftConfig | None = None,
        tick_ms: int = 50,
        telemetry: bool = True,
        snapshots: SnapshotHost | None = None,
        compaction: CompactionConfig | None = None,
    ) -> None:
        self.node_id = node_id
        self.data_dir = data_dir
        self.listen = listen
        self.tick_ms = tick_ms
        self.stats = NodeStats()
        self._on_apply = on_apply
        self._config = config or MultiRaftConfig()
        self._inbox: deque[NodeBatch] = deque()
        self._proposals: deque[tuple[GroupId, bytes]] = deque()
        self._wake = trio.Event()
        self.transport = Transport(node_id, peers, secret, self._receive)
        self.storage: RaftStorage | None = None
        self.multi: MultiRaft | None = None
        self._groups: dict[GroupId, Membership] = {}
        self._telemetry_enabled = telemetry
        self.telemetry: TelemetryWriter | None = None
        self._snapshots = snapshots
        self._compaction = compaction or CompactionConfig()
        self._applied_bytes: dict[GroupId, int] = {}  # entry data applied since the group's last snapshot
        self._compaction_pending: set[GroupId] = set()  # past a threshold, beyond this cycle's allowance

    def add_group(self, group: GroupId, membership: Membership) -> None:
        """Declare a group before `run` (it is loaded from storage, or created empty)."""
        self._groups[group] = membership

    def _receive(self, batch: NodeBatch) -> None:
        if len(self._inbox) < INBOX_BATCHES_MAX:
            self._inbox.append(batch)
            self._wake.set()

    def propose(self, group: GroupId, data: bytes) -> bool:
        """Queue a command; it reaches the core at the next cycle. False: refused (queue full)."""
        if len(self._proposals) >= PROPOSALS_QUEUED_MAX:
            return False
        self._proposals.append((group, data))
        self._wake.set()
        return True

    def is_leader(self, group: GroupId) -> bool:
        return self.multi is not None and self.multi.groups[group].lead == self.node_id

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.storage = await trio.to_thread.run_sync(RaftStorage.open, self.data_dir)
        if self._telemetry_enabled:
            self.telemetry = TelemetryWriter(self.data_dir, self.node_id, lambda: int(time.time() * 1000))
        incarnation = random.getrandbits(31)
        multi = self.multi = MultiRaft(self.node_id, self._config, random.Random().randrange, incarnation)
        for group, membership in self._groups.items():
            persisted = self.storage.load(group, membership)
            multi.add_group(group, membership if persisted is None else None, persisted)
            if persisted is not None and persisted.snapshot.index > 0 and self._snapshots is not None:
                self._snapshots.restore(group, persisted.snapshot.data)
                self.stats.restores += 1
        async with trio.open_nursery() as nursery:
            await nursery.start(self.transport.serve, *self.listen)
            nursery.start_soon(self._ticker)
            task_status.started()
            try:
                await self._loop(multi, self.storage)
            finally:
                nursery.cancel_scope.cancel()
                if self.telemetry is not None:
                    self.telemetry.close()

    async def _ticker(self) -> None:
        while True:
            await trio.sleep(self.tick_ms / 1000)
            self._tick_due = True
            self._wake.set()

    _tick_due = False

    async def _loop(self, multi: MultiRaft, storage: RaftStorage) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            if self._tick_due:
                self._tick_due = False
                multi.tick()
                if self.telemetry is not None:
                    self.telemetry.sample(multi.groups)
            while self._inbox:
                multi.step(self._inbox.popleft())
            while self._proposals:
                group, data = self._proposals.popleft()
                if multi.propose(group, data) is None:
                    self.stats.proposals_refused += 1
            for _ in range(4):  # a few cycles: advancing can produce more (commit notices)
                if not multi.has_ready():
                    break
                await self._cycle(multi, storage)
            if self._compaction_pending:
                await self._compact_due(multi, storage, [])
                if self._compaction_pending:
                    self._wake.set()  # the rest next time round (never more than the allowance per wake)

    async def _cycle(self, multi: MultiRaft, storage: RaftStorage) -> None:
        node_ready = multi.ready()
        waiting: list[NodeBatch] = []
        for batch in node_ready.batches:
            early, late = split_early(batch)
            if early is not None:
                self.transport.send(early)  # a leader's appends go out while it fsyncs its own copy
            if late is not None:
                waiting.append(late)
        wrote = False
        for group, ready in node_ready.groups:
            if ready.entries or ready.hard_state is not None or ready.snapshot is not None:
                storage.write_ready(group, ready)
                wrote = True
        if wrote:
            started = trio.current_time()
            await trio.to_thread.run_sync(storage.commit)
            self.stats.fsync_seconds += trio.current_time() - started
            self.stats.fsyncs += 1
        for batch in waiting:
            self.transport.send(batch)  # votes and acknowledgements: only after the fsync
        if self.telemetry is not None:
            for group, ready in node_ready.groups:
                self.telemetry.on_durable(group, multi.groups[group], ready)
        for group, ready in node_ready.groups:
            if ready.snapshot is not None:
                self._applied_bytes[group] = 0
                if self._snapshots is not None:
                    self._snapshots.restore(group, ready.snapshot.data)
                    self.stats.restores += 1
            for entry in ready.committed_entries:
                self._on_apply(group, entry)
                self._applied_bytes[group] = self._applied_bytes.get(group, 0) + len(entry.data)
                self.stats.applied_entries += 1
        multi.advance(node_ready)
        self.stats.ready_cycles += 1
        if self._snapshots is not None:
            await self._compact_due(multi, storage, [group for group, ready in node_ready.groups])

    def _compaction_due(self, multi: MultiRaft, group: GroupId) -> bool:
        log = multi.groups[group].log
        if log.applied > log.persisted or log.applied <= log.snapshot.index:
            return False  # only what is applied and durable can be compacted
        return (log.applied - log.snapshot.index > self._compaction.entries_max
                or self._applied_bytes.get(group, 0) > self._compaction.bytes_max)

    async def _compact_due(self, multi: MultiRaft, storage: RaftStorage, touched: list[GroupId]) -> None:
        """Snapshot the groups past a threshold (those this cycle touched, then any left over from before)."""
        assert self._snapshots is not None
        pending = self._compaction_pending
        pending.update(group for group in touched if self._compaction_due(multi, group))
        chosen = sorted(pending)[: self._compaction.groups_per_cycle_max]
        if not chosen:
            return
        snapshots = []
        for group in chosen:
            pending.discard(group)
            if self._compaction_due(multi, group):
                snapshots.append((group, multi.groups[group].compact(self._snapshots.snapshot(group))))
                self._applied_bytes[group] = 0

        def persist() -> None:
            for group, snapshot in snapshots:
                storage.compact(group, snapshot)

        await trio.to_thread.run_sync(persist)
        self.stats.compactions += len(snapshots)

    def last_index(self, group: GroupId) -> Index:
        assert self.multi is not None
        return self.multi.groups[group].log.last_index()
