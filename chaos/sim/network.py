"""A simulated network of node-to-node batches: delay, loss, duplication, reordering, partitions and clogging.

Every batch gets a random delay (so batches reorder), may be lost or duplicated, and is held in a heap keyed by
(delivery tick, sequence number) so that a seed replays exactly. A partition is a set of blocked directed links
(any shape: halves, an isolated node, a bridge, one-way links); a clogged link adds delay without losing anything.
The in-flight total is bounded: beyond `in_flight_max` the network drops (as a full socket buffer would).
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

from cluster.raft.core.multiraft import NodeBatch
from cluster.raft.core.types import NodeId


@dataclass(slots=True)
class NetworkFaults:
    loss_rate: float = 0.0
    duplicate_rate: float = 0.0
    delay_ticks_min: int = 1
    delay_ticks_max: int = 3


@dataclass(slots=True)
class SimNetwork:
    rng: random.Random
    faults: NetworkFaults
    in_flight_max: int = 20_000
    blocked: set[tuple[NodeId, NodeId]] = field(default_factory=set)
    clogged: dict[tuple[NodeId, NodeId], int] = field(default_factory=dict)  # link -> extra delay ticks
    _heap: list[tuple[int, int, NodeBatch]] = field(default_factory=list)
    _seq: int = 0
    sent: int = 0
    dropped: int = 0

    def send(self, now: int, batch: NodeBatch) -> None:
        self.sent += 1
        link = (batch.src, batch.dst)
        if link in self.blocked or len(self._heap) >= self.in_flight_max:
            self.dropped += 1
            return
        if self.faults.loss_rate and self.rng.random() < self.faults.loss_rate:
            self.dropped += 1
            return
        copies = 2 if self.faults.duplicate_rate and self.rng.random() < self.faults.duplicate_rate else 1
        for _ in range(copies):
            delay = self.rng.randint(self.faults.delay_ticks_min, self.faults.delay_ticks_max)
            delay += self.clogged.get(link, 0)
            self._seq += 1
            heapq.heappush(self._heap, (now + delay, self._seq, batch))

    def due(self, now: int) -> list[NodeBatch]:
        out: list[NodeBatch] = []
        while self._heap and self._heap[0][0] <= now:
            _, _, batch = heapq.heappop(self._heap)
            if (batch.src, batch.dst) in self.blocked:
                self.dropped += 1  # a partition also cuts what was already on the wire
                continue
            out.append(batch)
        return out

    def partition(self, sides: list[set[NodeId]]) -> None:
        for side in sides:
            for other in sides:
                if other is side:
                    continue
                self.blocked.update((a, b) for a in side for b in other)

    def block_one_way(self, src: NodeId, dst: NodeId) -> None:
        self.blocked.add((src, dst))

    def heal(self) -> None:
        self.blocked.clear()
        self.clogged.clear()

    def in_flight_on(self, src: NodeId, dst: NodeId) -> bool:
        """Whether a batch from `src` to `dst` is still on the wire."""
        return any(batch.src == src and batch.dst == dst for _, _, batch in self._heap)
