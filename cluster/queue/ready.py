"""The store of ready messages: priority levels of FIFO deques, a requeue heap per level, and an expiry heap.

Delivery order within a priority level is ascending msg_id. New messages are appended to the level's `fresh`
deque (ids only grow) and returned messages go to a small heap keyed by msg_id, so a requeued message goes back
ahead of newer ones. Taking the head compares the two tops: O(1) in the common case, O(log r) with r returned.

Compact backlog: a fresh message is stored as just its `QueuedMessage` reference in the deque and its id in an
unboxed `array('q')` column beside it (16 bytes per message); its `Entry` (the mutable record of state, delivery
count and expiry) is only created when it leaves the ready set. With a queue TTL, a message whose expiry comes
from that TTL is compact too, its expiry in a third column (24 bytes): as the clock never goes back, those
expiries grow along the deque, so they expire from the level's head without a heap. Messages with a shorter
per-message TTL, and returned or recovered ones, are `Entry` objects in the expiry heap. An Entry in the fresh
deque always expires no later than the compact messages behind it, so a head scan never misses a due message.

Removal from the middle (expiry of a message not at the head, purge) is lazy: the entry is marked GONE and
skipped when it reaches the head. Garbage is bounded: a level is rebuilt when its garbage outnumbers its live
entries (amortised O(1)). The expiry heap holds entries with an expiry, ordered by (expiry_ms, msg_id); it is
rebuilt when it grows past twice the ready count, so acknowledged messages do not linger in it.
"""

from __future__ import annotations

import heapq
from array import array
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
ID_COLUMN_COMPACT_MIN: Final = 4096
NO_EXPIRY: Final = -1


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


class _IntColumn:
    """A FIFO of ints stored unboxed (8 bytes each); the consumed prefix is cut off once it is half the array."""

    __slots__ = ("_head", "_ids")

    def __init__(self) -> None:
        self._ids = array("q")
        self._head = 0

    def __len__(self) -> int:
        return len(self._ids) - self._head

    def append(self, msg_id: int) -> None:
        self._ids.append(msg_id)

    def first(self) -> int:
        return self._ids[self._head]

    def popleft(self) -> int:
        ids = self._ids
        head = self._head
        msg_id = ids[head]
        head += 1
        if head >= ID_COLUMN_COMPACT_MIN and head * 2 >= len(ids):
            del ids[:head]
            head = 0
        self._head = head
        return msg_id

    def values(self) -> list[int]:
        return self._ids[self._head :].tolist()

    def last(self) -> int:
        return self._ids[-1]

    def pop(self) -> int:
        """Remove and return the newest id (the caller checked the column is not empty)."""
        return self._ids.pop()


FreshItem = QueuedMessage | Entry


class _Level:
    __slots__ = ("fresh", "fresh_expiry", "fresh_ids", "garbage", "live", "returned")

    def __init__(self, with_expiry: bool) -> None:
        self.fresh: deque[FreshItem] = deque()
        self.fresh_ids = _IntColumn()
        self.fresh_expiry = _IntColumn() if with_expiry else None  # NO_EXPIRY for Entry items
        self.returned: list[tuple[int, Entry]] = []
        self.live = 0
        self.garbage = 0


class ReadyStore:
    """Ready messages in delivery order (highest priority first, then ascending msg_id)."""

    __slots__ = ("_levels", "_top_level", "count", "expiry_heap", "queue_ttl_ms", "size_bytes")

    def __init__(self, max_priority: int | None, queue_ttl_ms: int | None = None) -> None:
        self._top_level = max_priority or 0
        self.queue_ttl_ms = queue_ttl_ms
        self._levels = [_Level(queue_ttl_ms is not None) for _ in range(self._top_level + 1)]
        self.count = 0
        self.size_bytes = 0
        self.expiry_heap: list[Entry] = []

    def level_of(self, message: QueuedMessage) -> int:
        priority = message.priority
        if priority <= 0:
            return 0
        return priority if priority < self._top_level else self._top_level

    # --- adding ---------------------------------------------------------------------------------------------

    def push_new(self, msg_id: MsgId, message: QueuedMessage, expiry_ms: int | None) -> None:
        """Append a message whose id is larger than every id already in the store.

        The expiry must be the queue TTL's (or None) unless the message's own ttl_ms is shorter.
        """
        level = self._levels[self.level_of(message)] if self._top_level else self._levels[0]
        fresh_expiry = level.fresh_expiry
        if expiry_ms is None:
            level.fresh.append(message)
            if fresh_expiry is not None:
                fresh_expiry.append(NO_EXPIRY)
        elif fresh_expiry is not None and (message.ttl_ms is None or message.ttl_ms >= self.queue_ttl_ms):  # type: ignore[operator]
            level.fresh.append(message)
            fresh_expiry.append(expiry_ms)
        else:
            entry = Entry(msg_id, message, 0, expiry_ms, READY)
            level.fresh.append(entry)
            if fresh_expiry is not None:
                fresh_expiry.append(NO_EXPIRY)
            self._track_expiry(entry)
        level.fresh_ids.append(msg_id)
        level.live += 1
        self.count += 1
        self.size_bytes += message.size_bytes

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
            self._rebuild_expiry_heap()

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
        fresh_ids = level.fresh_ids
        returned = level.returned
        while True:
            if returned and (not fresh or returned[0][0] < fresh_ids.first()):
                entry = heapq.heappop(returned)[1]
            else:
                item = fresh.popleft()
                msg_id = fresh_ids.popleft()
                expiry_ms = level.fresh_expiry.popleft() if level.fresh_expiry is not None else NO_EXPIRY
                if type(item) is Entry:
                    entry = item
                else:
                    expiry = None if expiry_ms == NO_EXPIRY else expiry_ms
                    entry = Entry(MsgId(msg_id), item, 0, expiry, READY)  # type: ignore[arg-type]
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
        """Remove every ready message whose expiry is <= now_ms, in (expiry, msg_id) order."""
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
        if self.queue_ttl_ms is not None:
            from_heap = len(expired)
            for level in self._levels:
                if level.fresh:
                    self._pop_due_compact_heads(level, now_ms, expired)
            if len(expired) > 1 and (from_heap or len(self._levels) > 1):
                expired.sort(key=_expiry_order)
        return expired

    def _pop_due_compact_heads(self, level: _Level, now_ms: int, expired: list[Entry]) -> None:
        fresh = level.fresh
        fresh_ids = level.fresh_ids
        fresh_expiry = level.fresh_expiry
        assert fresh_expiry is not None
        while fresh:
            item = fresh[0]
            if type(item) is Entry:
                if item.flags & STATE_MASK == READY:
                    return  # the expiry heap has it, and it is due no later than what follows
                fresh.popleft()
                fresh_ids.popleft()
                fresh_expiry.popleft()
                level.garbage -= 1
                continue
            expiry_ms = fresh_expiry.first()
            if expiry_ms == NO_EXPIRY or expiry_ms > now_ms:
                return
            fresh.popleft()
            fresh_expiry.popleft()
            entry = Entry(MsgId(fresh_ids.popleft()), item, 0, expiry_ms, READY)  # type: ignore[arg-type]
            level.live -= 1
            self.count -= 1
            self.size_bytes -= entry.message.size_bytes
            expired.append(entry)

    def next_expiry_ms(self) -> int | None:
        heap = self.expiry_heap
        while heap and heap[0].flags & STATE_MASK != READY:
            heapq.heappop(heap).flags &= ~IN_EXPIRY_HEAP
        earliest = heap[0].expiry_ms if heap else None
        if self.queue_ttl_ms is not None:
            for level in self._levels:
                head_expiry_ms = self._compact_head_expiry(level)
                if head_expiry_ms is not None and (earliest is None or head_expiry_ms < earliest):
                    earliest = head_expiry_ms
        return earliest

    @staticmethod
    def _compact_head_expiry(level: _Level) -> int | None:
        """Expiry of the level's head if it is a compact message (garbage at the head is dropped on the way)."""
        fresh = level.fresh
        fresh_expiry = level.fresh_expiry
        assert fresh_expiry is not None
        while fresh:
            item = fresh[0]
            if type(item) is not Entry:
                expiry_ms = fresh_expiry.first()
                return None if expiry_ms == NO_EXPIRY else expiry_ms
            if item.flags & STATE_MASK == READY:
                return None  # its expiry is in the heap and no later than the compact ones behind it
            fresh.popleft()
            level.fresh_ids.popleft()
            fresh_expiry.popleft()
            level.garbage -= 1
        return None

    def clear(self) -> int:
        """Remove every ready message; returns how many there were."""
        removed = self.count
        for level in self._levels:
            for entry in self._live_entries(level):
                entry.flags = (entry.flags & ~STATE_MASK) | GONE
            level.fresh.clear()
            level.fresh_ids = _IntColumn()
            level.fresh_expiry = _IntColumn() if level.fresh_expiry is not None else None
            level.returned.clear()
            level.live = 0
            level.garbage = 0
        self.count = 0
        self.size_bytes = 0
        self._rebuild_expiry_heap()
        return removed

    def withdraw_newest(self, count_max: int) -> list[Entry]:
        """Single-node paging under memory pressure: remove up to `count_max` of the NEWEST ready messages
        (highest msg ids first), stopping at one with an expiry; returns them in descending msg id order.

        Only for a store with one level and no queue TTL (pageable queues); others return nothing.
        """
        if self._top_level or self.queue_ttl_ms is not None:
            return []
        level = self._levels[0]
        fresh, fresh_ids = level.fresh, level.fresh_ids
        returned = sorted(entry for entry in level.returned if entry[1].flags & STATE_MASK == READY)
        taken: list[Entry] = []
        while len(taken) < count_max and self.count:
            while fresh and type(fresh[-1]) is Entry and fresh[-1].flags & STATE_MASK != READY:
                fresh.pop()
                fresh_ids.pop()
                level.garbage -= 1
            fresh_id = fresh_ids.last() if fresh else -1
            if returned and returned[-1][0] > fresh_id:
                entry = returned[-1][1]
                if entry.expiry_ms is not None:
                    break
                returned.pop()
            else:
                item = fresh[-1]
                if type(item) is Entry:
                    break  # a fresh Entry without queue TTL has a per-message TTL
                fresh.pop()
                entry = Entry(MsgId(fresh_ids.pop()), item, 0, None, READY)  # type: ignore[arg-type]
            entry.flags = (entry.flags & ~STATE_MASK) | GONE
            level.live -= 1
            self.count -= 1
            self.size_bytes -= entry.message.size_bytes
            taken.append(entry)
        level.garbage -= len(level.returned) - len(returned)  # (garbage left the heap with the sort)
        level.returned = returned  # ascending: a valid heap
        return taken

    # --- inspection -----------------------------------------------------------------------------------------

    def iter_in_order(self) -> Iterator[Entry]:
        """Live entries in delivery order (for snapshots and tests)."""
        for index in range(self._top_level, -1, -1):
            yield from sorted(self._live_entries(self._levels[index]), key=_msg_id_of)

    def oldest_msg_id(self) -> int | None:
        """The smallest id of a ready message (None: nothing ready). Per level: the first live item of the fresh
        deque (skipping the lazily removed ones before it) and the live returned ones."""
        oldest: int | None = None
        for level in self._levels:
            if not level.live:
                continue
            for index, item in enumerate(level.fresh):
                if type(item) is not Entry or item.flags & STATE_MASK == READY:
                    msg_id = level.fresh_ids._ids[level.fresh_ids._head + index]
                    oldest = msg_id if oldest is None else min(oldest, msg_id)
                    break
            for msg_id, entry in level.returned:
                if entry.flags & STATE_MASK == READY and (oldest is None or msg_id < oldest):
                    oldest = msg_id
        return oldest

    # --- maintenance ----------------------------------------------------------------------------------------

    @staticmethod
    def _live_fresh(level: _Level) -> list[tuple[int, int, FreshItem]]:
        """(msg_id, compact expiry or NO_EXPIRY, item) of the live items of the fresh deque."""
        ids = level.fresh_ids.values()
        expiries = level.fresh_expiry.values() if level.fresh_expiry is not None else [NO_EXPIRY] * len(ids)
        return [
            (msg_id, expiry_ms, item)
            for msg_id, expiry_ms, item in zip(ids, expiries, level.fresh, strict=True)
            if type(item) is not Entry or item.flags & STATE_MASK == READY
        ]

    @classmethod
    def _live_entries(cls, level: _Level) -> list[Entry]:
        """Live entries of a level; compact fresh messages get a (temporary) Entry."""
        live = [
            item
            if isinstance(item, Entry)
            else Entry(MsgId(msg_id), item, 0, None if expiry_ms == NO_EXPIRY else expiry_ms, READY)
            for msg_id, expiry_ms, item in cls._live_fresh(level)
        ]
        live.extend(entry for _, entry in level.returned if entry.flags & STATE_MASK == READY)
        return live

    def _rebuild_level(self, level: _Level) -> None:
        kept = self._live_fresh(level)
        level.fresh = deque(item for _, _, item in kept)
        level.fresh_ids = _IntColumn()
        for msg_id, _, _ in kept:
            level.fresh_ids.append(msg_id)
        if level.fresh_expiry is not None:
            level.fresh_expiry = _IntColumn()
            for _, expiry_ms, _ in kept:
                level.fresh_expiry.append(expiry_ms)
        level.returned = [item for item in level.returned if item[1].flags & STATE_MASK == READY]
        heapq.heapify(level.returned)
        level.garbage = 0

    def _rebuild_expiry_heap(self) -> None:
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


def _expiry_order(entry: Entry) -> tuple[int, int]:
    assert entry.expiry_ms is not None
    return entry.expiry_ms, entry.msg_id
