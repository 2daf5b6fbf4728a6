"""The store of ready messages: priority levels of FIFO deques, a requeue heap per level, and an expiry heap.

Each message lives in one `Entry` (slotted: id, message, delivery count, expiry, flags) from enqueue to settle.
Within a priority level, delivery order is ascending msg_id: new messages are appended to a deque (ids only grow),
and returned messages go to a small heap keyed by msg_id, so a requeued message goes back ahead of newer ones.
Taking the head compares the two tops: O(1) for the common case, O(log r) with r returned messages.

Removal from the middle (expiry of a message that is not at the head, purge) is lazy: the entry is marked GONE and
skipped when it reaches the head. Garbage is bounded: a level is rebuilt when its garbage outnumbers its live
entries (amortised O(1)). The expiry heap holds entries with an expiry, ordered by (expiry_ms, msg_id); it is
rebuilt when it grows past twice the ready count, so acknowledged messages do not linger in it.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator
from typing import Final

from cluster.queue.types import MsgId, QueuedMessage

READY: Final = 0
UNACKED: Final = 1
GONE: Final = 2
STATE_MASK: Final = 3
REDELIVERED: Final = 4
IN_EXPIRY_HEAP: Final = 8

GARBAGE_REBUILD_MIN: Final = 1024


class Entry:
    """One message inside the machine. `flags` packs the state (READY/UNACKED/GONE) and two bits."""

    __slots__ = ("delivery_count", "expiry_ms", "flags", "message", "msg_id")

    def __init__(
        self, msg_id: MsgId, message: QueuedMessage, delivery_count: int, expiry_ms: int | None, flags: int
    ) -> None:
        self.msg_id = msg_id
        self.message = message
        self.delivery_count = delivery_count
        self.expiry_ms = expiry_ms
        self.flags = flags

    def __lt__(self, other: Entry) -> bool:
        # Expiry-heap order (expiry_ms, msg_id); entries without expiry sort last. Also breaks ties between
        # equal msg_ids in a requeue heap, which only a duplicate Recover (a caller error) can create.
        mine = self.expiry_ms
        theirs = other.expiry_ms
        if mine != theirs:
            if mine is None:
                return False
            return theirs is None or mine < theirs
        return self.msg_id < other.msg_id

    @property
    def state(self) -> int:
        return self.flags & STATE_MASK

    @property
    def redelivered(self) -> bool:
        return bool(self.flags & REDELIVERED)


class _Level:
    __slots__ = ("fresh", "garbage", "live", "returned")

    def __init__(self) -> None:
        self.fresh: deque[Entry] = deque()
        self.returned: list[tuple[int, Entry]] = []
        self.live = 0
        self.garbage = 0


class ReadyStore:
    """Ready messages in delivery order (highest priority first, then ascending msg_id)."""

    __slots__ = ("_levels", "_top_level", "count", "expiry_heap", "size_bytes")

    def __init__(self, max_priority: int | None) -> None:
        self._top_level = max_priority or 0
        self._levels = [_Level() for _ in range(self._top_level + 1)]
        self.count = 0
        self.size_bytes = 0
        self.expiry_heap: list[Entry] = []

    def level_of(self, message: QueuedMessage) -> int:
        priority = message.priority
        if priority <= 0:
            return 0
        return priority if priority < self._top_level else self._top_level

    # --- adding ---------------------------------------------------------------------------------------------

    def push_new(self, entry: Entry) -> None:
        """Append a message with an id larger than every id already in the store."""
        level = self._levels[self.level_of(entry.message)] if self._top_level else self._levels[0]
        level.fresh.append(entry)
        level.live += 1
        self.count += 1
        self.size_bytes += entry.message.size_bytes
        if entry.expiry_ms is not None:
            self._track_expiry(entry)

    def push_returned(self, entry: Entry) -> None:
        """Put a message back at its original position (by msg_id)."""
        entry.flags = (entry.flags & ~STATE_MASK) | READY
        level = self._levels[self.level_of(entry.message)]
        heapq.heappush(level.returned, (entry.msg_id, entry))
        level.live += 1
        self.count += 1
        self.size_bytes += entry.message.size_bytes
        if entry.expiry_ms is not None:
            self._track_expiry(entry)

    def _track_expiry(self, entry: Entry) -> None:
        if entry.flags & IN_EXPIRY_HEAP:
            return
        entry.flags |= IN_EXPIRY_HEAP
        heap = self.expiry_heap
        heapq.heappush(heap, entry)
        if len(heap) > 2 * self.count + GARBAGE_REBUILD_MIN:
            self._rebuildexpiry_heap()

    # --- taking ---------------------------------------------------------------------------------------------

    def pop_head(self) -> Entry | None:
        """Remove and return the next message to deliver (state left to the caller), or None when empty."""
        if not self.count:
            return None
        levels = self._levels
        index = self._top_level
        while not levels[index].live:
            index -= 1
        level = levels[index]
        fresh = level.fresh
        returned = level.returned
        while True:
            if returned and (not fresh or returned[0][0] < fresh[0].msg_id):
                entry = heapq.heappop(returned)[1]
            else:
                entry = fresh.popleft()
            if not entry.flags & STATE_MASK:  # READY
                level.live -= 1
                self.count -= 1
                self.size_bytes -= entry.message.size_bytes
                return entry
            level.garbage -= 1

    def remove_lazily(self, entry: Entry) -> None:
        """Mark a ready entry GONE where it stands; it is skipped when it reaches the head."""
        entry.flags = (entry.flags & ~STATE_MASK) | GONE
        level = self._levels[self.level_of(entry.message)]
        level.live -= 1
        level.garbage += 1
        self.count -= 1
        self.size_bytes -= entry.message.size_bytes
        if level.garbage > GARBAGE_REBUILD_MIN and level.garbage > level.live:
            self._rebuild_level(level)

    def pop_expired(self, now_ms: int) -> list[Entry]:
        """Remove every ready entry whose expiry is <= now_ms, in (expiry, msg_id) order."""
        heap = self.expiry_heap
        expired: list[Entry] = []
        while heap:
            top = heap[0]
            assert top.expiry_ms is not None
            if top.expiry_ms > now_ms:
                break
            heapq.heappop(heap)
            top.flags &= ~IN_EXPIRY_HEAP
            if top.flags & STATE_MASK == READY:
                self.remove_lazily(top)
                expired.append(top)
        return expired

    def next_expiry_ms(self) -> int | None:
        heap = self.expiry_heap
        while heap and heap[0].flags & STATE_MASK != READY:
            heapq.heappop(heap).flags &= ~IN_EXPIRY_HEAP
        return heap[0].expiry_ms if heap else None

    def clear(self) -> int:
        """Remove every ready message; returns how many there were."""
        removed = self.count
        for level in self._levels:
            for entry in self._live_entries(level):
                entry.flags = (entry.flags & ~STATE_MASK) | GONE
            level.fresh.clear()
            level.returned.clear()
            level.live = 0
            level.garbage = 0
        self.count = 0
        self.size_bytes = 0
        self._rebuildexpiry_heap()
        return removed

    # --- inspection -----------------------------------------------------------------------------------------

    def iter_in_order(self) -> Iterator[Entry]:
        """Live entries in delivery order (for snapshots and tests)."""
        for index in range(self._top_level, -1, -1):
            yield from sorted(self._live_entries(self._levels[index]), key=_msg_id_of)

    # --- maintenance ----------------------------------------------------------------------------------------

    @staticmethod
    def _live_entries(level: _Level) -> list[Entry]:
        live = [entry for entry in level.fresh if entry.flags & STATE_MASK == READY]
        live.extend(entry for _, entry in level.returned if entry.flags & STATE_MASK == READY)
        return live

    def _rebuild_level(self, level: _Level) -> None:
        level.fresh = deque(entry for entry in level.fresh if entry.flags & STATE_MASK == READY)
        level.returned = [item for item in level.returned if item[1].flags & STATE_MASK == READY]
        heapq.heapify(level.returned)
        level.garbage = 0

    def _rebuildexpiry_heap(self) -> None:
        kept: list[Entry] = []
        for entry in self.expiry_heap:
            if entry.flags & STATE_MASK == READY:
                kept.append(entry)
            else:
                entry.flags &= ~IN_EXPIRY_HEAP
        heapq.heapify(kept)
        self.expiry_heap = kept


def _msg_id_of(entry: Entry) -> int:
    return entry.msg_id
