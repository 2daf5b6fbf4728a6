"""The trio driver of one node's MultiRaft: timers, inbound batches, proposals, and the Ready cycle.

One task owns the MultiRaft. It wakes when a batch arrives, a proposal is queued or a tick is due; it then steps
every inbound batch, hands queued proposals to the cores, and runs the Ready cycle: write every group's records,
`commit()` them in a worker thread (one fsync for all groups), send the batches, apply committed entries (the
`on_apply` callback), `advance`. Replication telemetry (telemetry.py) is written after each fsync and sampled
on the timer. Inbound batches and proposals wait in bounded queues (beyond the bound, batches
are dropped and proposals refused).
"""

from __future__ import annotations

import pathlib
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import trio

from cluster.raft.core.multiraft import MultiRaft, MultiRaftConfig, NodeBatch, split_early
from cluster.raft.core.types import Entry, GroupId, Index, Membership, NodeId
from cluster.raft.runtime.storage import RaftStorage
from cluster.raft.runtime.telemetry import TelemetryWriter
from cluster.raft.runtime.transport import Transport

INBOX_BATCHES_MAX = 4096
PROPOSALS_QUEUED_MAX = 65536


@dataclass
class NodeStats:
    ready_cycles: int = 0
    fsyncs: int = 0
    applied_entries: int = 0
    proposals_refused: int = 0
    fsync_seconds: float = 0.0


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
            for entry in ready.committed_entries:
                self._on_apply(group, entry)
                self.stats.applied_entries += 1
        multi.advance(node_ready)
        self.stats.ready_cycles += 1

    def last_index(self, group: GroupId) -> Index:
        assert self.multi is not None
        return self.multi.groups[group].log.last_index()
