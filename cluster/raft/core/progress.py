"""What a leader knows about each follower's log, and the flow control of appends to it (as etcd's Progress).

States: PROBE sends one append at a time until the follower's match point is found; REPLICATE pipelines appends
optimistically, bounded by `Inflights` (messages and bytes in flight); SNAPSHOT waits for an InstallSnapshot to
land. `next` is the next index to send, `match` the highest index known durable on the follower.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field

from cluster.raft.core.types import INDEX_ZERO, Index


class ProgressState(enum.Enum):
    PROBE = "probe"
    REPLICATE = "replicate"
    SNAPSHOT = "snapshot"


@dataclass(slots=True)
class Inflights:
    """Appends sent and not yet acknowledged: (last index, bytes), bounded in count and in bytes."""

    count_max: int
    size_bytes_max: int
    _items: deque[tuple[Index, int]] = field(default_factory=deque)
    size_bytes: int = 0

    def add(self, last_index: Index, size_bytes: int) -> None:
        assert not self.full(), "inflights overflow"
        self._items.append((last_index, size_bytes))
        self.size_bytes += size_bytes

    def free_through(self, index: Index) -> None:
        while self._items and self._items[0][0] <= index:
            _, size = self._items.popleft()
            self.size_bytes -= size

    def free_first(self) -> None:
        if self._items:
            _, size = self._items.popleft()
            self.size_bytes -= size

    def full(self) -> bool:
        return len(self._items) >= self.count_max or self.size_bytes >= self.size_bytes_max

    def reset(self) -> None:
        self._items.clear()
        self.size_bytes = 0

    def __len__(self) -> int:
        return len(self._items)


@dataclass(slots=True)
class Progress:
    match: Index
    next: Index
    inflights: Inflights
    state: ProgressState = ProgressState.PROBE
    probe_sent: bool = False  # in PROBE, an append is outstanding; wait for its answer or a heartbeat
    pending_snapshot: Index = INDEX_ZERO
    recent_active: bool = False
    is_learner: bool = False

    def become_probe(self) -> None:
        if self.state is ProgressState.SNAPSHOT:
            self.next = Index(max(self.match + 1, self.pending_snapshot + 1))
        else:
            self.next = Index(self.match + 1)
        self.state = ProgressState.PROBE
        self.probe_sent = False
        self.pending_snapshot = Index(0)
        self.inflights.reset()

    def become_replicate(self) -> None:
        self.state = ProgressState.REPLICATE
        self.next = Index(self.match + 1)
        self.probe_sent = False
        self.inflights.reset()

    def become_snapshot(self, snapshot_index: Index) -> None:
        self.state = ProgressState.SNAPSHOT
        self.pending_snapshot = snapshot_index
        self.probe_sent = False
        self.inflights.reset()

    def maybe_update(self, index: Index) -> bool:
        """An acknowledgement up to `index`; False if it is stale."""
        updated = index > self.match
        if updated:
            self.match = index
            self.probe_sent = False
        self.next = Index(max(self.next, index + 1))
        return updated

    def maybe_decrease_to(self, rejected: Index, probe_hint: Index) -> bool:
        """A rejection of prev_index `rejected`; False if it is stale. Never goes below match + 1."""
        if self.state is ProgressState.REPLICATE:
            if rejected <= self.match:
                return False
            self.next = Index(self.match + 1)
            return True
        if self.next - 1 != rejected:
            return False
        self.next = Index(max(min(rejected, probe_hint + 1), self.match + 1))
        self.probe_sent = False
        return True

    def is_paused(self) -> bool:
        if self.state is ProgressState.PROBE:
            return self.probe_sent
        if self.state is ProgressState.REPLICATE:
            return self.inflights.full()
        return True

    def sent_entries(self, last_index: Index, size_bytes: int) -> None:
        if self.state is ProgressState.REPLICATE:
            self.next = Index(last_index + 1)
            self.inflights.add(last_index, size_bytes)
        elif self.state is ProgressState.PROBE:
            self.probe_sent = True
