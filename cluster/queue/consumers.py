"""Consumers of one queue and the round-robin rings that choose who gets the next message.

A `Consumer` holds its limits (prefetch = unacked cap, credit = deliveries left, granted by the broker) and its
unacked entries. Only consumers that can take a message right now sit in a ring; there is one ring per consumer
priority, and the highest non-empty ring is served first, round-robin inside it. So choosing a consumer is O(1) in
the common case, not O(consumers): a consumer leaves its ring when it runs out of capacity and re-enters when a
settle or a credit grant gives it room.

Removal is lazy: a detached (or re-attached, hence replaced) consumer object is marked `attached = False` and
dropped when it reaches the head of its ring.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Hashable, Iterator
from typing import Final

from cluster.queue.ready import Entry
from cluster.queue.types import MsgId

ROOM_UNBOUNDED: Final = 1 << 62  # room of a consumer without prefetch or credit limit


class Consumer:
    """One attached consumer, or a basic.get holder (attached False) that still has unacked messages."""

    __slots__ = (
        "attach_seq",
        "attached",
        "consumer_id",
        "credit",
        "in_ring",
        "no_ack",
        "prefetch",
        "priority",
        "unacked",
    )

    def __init__(
        self,
        consumer_id: Hashable,
        prefetch: int,
        credit: int | None,
        priority: int,
        no_ack: bool,
        attach_seq: int,
        attached: bool,
    ) -> None:
        self.consumer_id = consumer_id
        self.prefetch = prefetch
        self.credit = credit
        self.priority = priority
        self.no_ack = no_ack
        self.attach_seq = attach_seq
        self.attached = attached
        self.in_ring = False
        self.unacked: dict[MsgId, Entry] = {}

    def has_capacity(self) -> bool:
        if not self.attached:
            return False
        credit = self.credit
        if credit is not None and credit <= 0:
            return False
        prefetch = self.prefetch
        return prefetch <= 0 or self.no_ack or len(self.unacked) < prefetch


class ConsumerRings:
    """Round-robin rings of consumers with capacity, one ring per consumer priority."""

    __slots__ = ("_priorities_desc", "_rings")

    def __init__(self) -> None:
        self._rings: dict[int, deque[Consumer]] = {}
        self._priorities_desc: list[int] = []  # negated priorities, ascending, for bisect

    def offer(self, consumer: Consumer) -> None:
        """Put the consumer at the back of its ring if it has room and is not there already."""
        if consumer.in_ring or not consumer.has_capacity():
            return
        ring = self._rings.get(consumer.priority)
        if ring is None:
            ring = self._rings[consumer.priority] = deque()
            bisect.insort(self._priorities_desc, -consumer.priority)
        ring.append(consumer)
        consumer.in_ring = True

    def head(self) -> Consumer | None:
        """The consumer that should get the next message, or None if nobody can take one."""
        for negated in self._priorities_desc:
            ring = self._rings[negated * -1]
            while ring:
                consumer = ring[0]
                if consumer.has_capacity():
                    return consumer
                ring.popleft()
                consumer.in_ring = False
        if self._rings:  # nothing to drop on a queue without consumers (the common publish-before-consume case)
            self._drop_empty_rings()
        return None

    def room_alone(self, consumer: Consumer) -> int:
        """How many messages in a row `consumer` (the current head) takes before the ring turns: its room when it is
        alone in its ring (round-robin then picks it every time until it is full), else 1."""
        if len(self._rings[consumer.priority]) != 1:
            return 1
        room = ROOM_UNBOUNDED if consumer.credit is None else consumer.credit
        prefetch = consumer.prefetch
        if prefetch > 0 and not consumer.no_ack:
            room = min(room, prefetch - len(consumer.unacked))
        return room

    def rotate(self, consumer: Consumer) -> None:
        """After `consumer` (the current head) got a message: move it to the back, or out if it is full."""
        ring = self._rings[consumer.priority]
        ring.popleft()
        if consumer.has_capacity():
            ring.append(consumer)
        else:
            consumer.in_ring = False

    def iter_rings(self) -> Iterator[tuple[int, list[Consumer]]]:
        """(priority, attached ring members in ring order), highest priority first (for snapshots)."""
        for negated in self._priorities_desc:
            members = [c for c in self._rings[-negated] if c.attached]
            if members:
                yield -negated, members

    def restore_ring(self, priority: int, members: list[Consumer]) -> None:
        """Rebuild one ring exactly as snapshotted (members keep their order even if momentarily full)."""
        for consumer in members:
            if priority not in self._rings:
                self._rings[priority] = deque()
                bisect.insort(self._priorities_desc, -priority)
            self._rings[priority].append(consumer)
            consumer.in_ring = True

    def _drop_empty_rings(self) -> None:
        empty = [p for p, ring in self._rings.items() if not ring]
        for priority in empty:
            del self._rings[priority]
            self._priorities_desc.remove(-priority)
