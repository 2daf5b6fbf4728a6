"""The read-only side of `Queue` (a mixin of cluster/queue/machine.py): counts, the held dead letters, the
time, and the msg ids for tests and tools (the next expiry is `usage.QueueUsage.next_expiry_ms`, the paging counts
are `paging.QueuePaging`'s). None of it changes the state.
"""

from __future__ import annotations

from collections.abc import Hashable

from cluster.queue.consumers import Consumer
from cluster.queue.holding import DeadLetterHolding
from cluster.queue.ready import ReadyStore
from cluster.queue.types import DeadLetterReason, MsgId, QueuedMessage


class QueueViews:
    """Queries on one queue's state; `Queue` holds the attributes."""

    __slots__ = ()

    _ready: ReadyStore
    _consumers: dict[Hashable, Consumer]
    _active: Consumer | None
    _attached_count: int
    _unacked_count: int
    _held: DeadLetterHolding
    _now_ms: int

    @property
    def ready_count(self) -> int:
        return self._ready.count

    @property
    def ready_bytes(self) -> int:
        return self._ready.size_bytes

    @property
    def unacked_count(self) -> int:
        return self._unacked_count

    @property
    def consumer_count(self) -> int:
        return self._attached_count

    @property
    def active_consumer(self) -> Hashable | None:
        """The single active consumer's id (None without one or when SAC is off)."""
        return self._active.consumer_id if self._active is not None else None

    @property
    def held_count(self) -> int:
        """Dead-lettered messages held until their targets accepted them (at-least-once)."""
        return self._held.count

    @property
    def held_bytes(self) -> int:
        return self._held.size_bytes

    def held_letters(self) -> list[tuple[MsgId, int, DeadLetterReason, QueuedMessage, int]]:
        """(msg_id, hold sequence, reason, message, delivery_count) of every held message, in hold order (O(n))."""
        return [(h.entry.msg_id, h.seq, h.reason, h.entry.message, h.entry.delivery_count) for h in self._held]

    def held_msg_id(self, held_seq: int) -> MsgId | None:
        """The msg id held under this hold sequence (None: not held, e.g. settled already)."""
        return self._held.msg_id_of(held_seq)

    def held_seq(self, msg_id: MsgId) -> int | None:
        """The hold sequence of a held message (None: not held)."""
        letter = self._held.held.get(msg_id)
        return letter.seq if letter is not None else None

    def held_letter(self, msg_id: MsgId) -> tuple[int, DeadLetterReason, QueuedMessage] | None:
        """(hold sequence, reason, message) of a held message (None: not held)."""
        letter = self._held.held.get(msg_id)
        return (letter.seq, letter.reason, letter.entry.message) if letter is not None else None

    @property
    def now_ms(self) -> int:
        """The latest time seen in a command."""
        return self._now_ms

    def ready_msg_ids(self) -> list[MsgId]:
        """Ready message ids in delivery order (O(n); for tests and tools)."""
        return [entry.msg_id for entry in self._ready.iter_in_order()]

    def oldest_msg_id(self) -> int | None:
        """The smallest id of a message still in the queue, ready or unacked (None: none). Ids only grow, so every
        message enqueued before a moment whose next id was N is gone once this is None or >= N (a mirrored queue's
        ha-sync-mode manual: node/clustering/mirror_sync.py). O(unacked + returned) and the lazily removed head."""
        oldest = self._ready.oldest_msg_id()
        if self._unacked_count:
            for consumer in self._consumers.values():
                if consumer.unacked:
                    first = min(consumer.unacked)
                    oldest = first if oldest is None else min(oldest, first)
        return oldest

    def unacked_msg_ids(self, consumer_id: Hashable) -> list[MsgId]:
        consumer = self._consumers.get(consumer_id)
        return sorted(consumer.unacked) if consumer is not None else []

    def unacked_message(self, consumer_id: Hashable, msg_id: MsgId) -> tuple[QueuedMessage, bool, int] | None:
        """(message, redelivered flag, delivery count) of a message `consumer_id` holds unacked; None if not."""
        consumer = self._consumers.get(consumer_id)
        entry = consumer.unacked.get(msg_id) if consumer is not None else None
        return None if entry is None else (entry.message, entry.redelivered, entry.delivery_count)
