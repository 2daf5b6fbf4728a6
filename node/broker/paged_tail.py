"""Where a queue's paged messages are on disk (pure): the broker's side of the machine's paging effects.

What it is for: the queue machine decides which messages of a long queue wait outside it and when they come back
(cluster/queue/paging.py); it keeps their ids only. This module carries out those decisions on storage and keeps
what only the broker knows, each waiting message's log offset, in a `PagedTail` per queue (two `array('q')`
columns, 16 bytes a message), below the handler modules so that `delivery` hands it the effects:

- `PagedOut` (not held): the message is written to the queue's stream as a `TailMessageRecord` (same bytes as a
  MessageRecord) and the broker keeps its id, and its offset once storage reports it (`on_tail_offsets`). A
  persistent message of a stored queue waits for the fsync as usual (its confirm too). Any other (a transient one,
  or any message of a non-durable or exclusive queue) is *spilled*: its delivery_mode is kept under the key
  `spilled_delivery_mode`, its confirm does not wait, and as its record lacks delivery_mode 2 recovery never brings
  it back (dropped at restart, as RabbitMQ); storage counts it live while it waits, so the stream is not truncated
  under it, and the broker writes its MessageRemoved once it is paged in.
- `SpilledOut` (memory pressure): each message is written as a tail record, a transient one spilled as above, a
  persistent one as the same record again (same msg id), ONE record and no removal of the old one: both recovery
  folds take a later record of a live id as the message's new place (the old copy dies), so no crash point can
  lose it (a removal followed by the copy could be cut between the two: the "alarm-spill crash window"). Its
  offset is UNKNOWN until storage reports it.
- `PageInWanted(msg_ids)`: remembered; `PageIn` effects are sent at the end of the entry point
  (node/broker/paging.py `issue_reads`) once storage has reported every offset they need.
- `PagedDropped` (purge): a MessageRemoved for each, and the bookkeeping goes.
"""

from __future__ import annotations

import bisect
from array import array
from dataclasses import dataclass, field
from typing import Final

from cluster.queue import PagedDropped, PagedOut, PageInWanted, QueuedMessage, SpilledOut
from node.broker.channel import Message
from node.broker.effects import PageIn
from node.broker.queues import QueueState
from node.broker.records import (
    MessageRecord,
    MessageRemovedRecord,
    TailMessageRecord,
    properties_to_dict,
    queue_stream,
)
from node.broker.state import BrokerState

COMPACT_PREFIX_MIN: Final = 4096  # read entries dropped from the columns once this many and half
UNKNOWN: Final = -2  # the offset of a spilled message storage has not reported yet (`PagedTail.front`)
SPILLED_DELIVERY_MODE: Final = "spilled_delivery_mode"  # a spilled record's delivery_mode, under another key


@dataclass(slots=True)
class PagedTail:
    """The records of one queue's tail messages not yet read back."""

    stream: str
    msg_ids: array[int] = field(default_factory=lambda: array("q"))  # written at PagedOut or recovered, ascending
    offsets: array[int] = field(default_factory=lambda: array("q"))  # a prefix of msg_ids' offsets (known ones)
    head: int = 0  # first entry not yet read
    front: dict[int, int] = field(default_factory=dict)  # spilled: msg id -> offset (UNKNOWN: not yet reported)
    wanted: tuple[int, ...] = ()  # the machine's PageInWanted not yet sent to storage
    request_id: int = 0  # the PageIn storage is reading (0: none)
    request_ids: tuple[int, ...] = ()

    @property
    def waiting(self) -> int:
        """Records not read back yet (the wanted ones are among the front's and `msg_ids[head:]`)."""
        return len(self.msg_ids) - self.head + len(self.front) + len(self.request_ids)

    def offsets_of(self, msg_ids: tuple[int, ...]) -> tuple[list[int], int] | None:
        """The offsets of `msg_ids` (in the machine's order: the front's, or the next of `msg_ids`) and the head
        after them; None while storage has not reported one of them. An id the broker never wrote is left out
        (the machine takes it as unreadable)."""
        offsets: list[int] = []
        front, ids, known = self.front, self.msg_ids, self.offsets
        head = self.head
        for msg_id in msg_ids:
            offset = front.get(msg_id)
            if offset is None:
                if head >= len(ids) or ids[head] != msg_id:
                    at = bisect.bisect_left(ids, msg_id, head)
                    if at >= len(ids) or ids[at] != msg_id:
                        continue
                    head = at
                if head >= len(known):
                    return None
                offset = known[head]
                head += 1
            elif offset == UNKNOWN:
                return None
            offsets.append(offset)
        return offsets, head

    def start_read(self, request_id: int, head: int) -> None:
        """The wanted ids go to storage as request `request_id`; entries before `head` are read."""
        for msg_id in self.wanted:
            self.front.pop(msg_id, None)
        self.request_id, self.request_ids, self.wanted = request_id, self.wanted, ()
        if head >= COMPACT_PREFIX_MIN and head * 2 >= len(self.msg_ids):
            del self.msg_ids[:head], self.offsets[:head]
            head = 0
        self.head = head


def tail_of(broker: BrokerState, queue: QueueState) -> PagedTail:
    tail: PagedTail | None = queue.tail
    if tail is None:
        tail = queue.tail = PagedTail(queue_stream(queue.vhost, queue.name))
        broker.paging[tail.stream] = queue
    return tail


def drop_tail(broker: BrokerState, queue: QueueState) -> None:
    tail = queue.tail
    if tail is not None:
        queue.tail = None
        if broker.paging.get(tail.stream) is queue:
            del broker.paging[tail.stream]


def _record(queue: QueueState, msg_id: int, message: QueuedMessage, delivery_count: int) -> TailMessageRecord:
    """The tail record of a message (spilled: delivery_mode under another key, unless persistent)."""
    msg: Message = message.payload
    fields = properties_to_dict(msg.properties)
    if not message.persistent and "delivery_mode" in fields:
        fields[SPILLED_DELIVERY_MODE] = fields.pop("delivery_mode")
    return TailMessageRecord(queue.vhost, queue.name, msg_id, msg.exchange, msg.routing_key, fields, msg.body,
                             delivery_count)


def page_out(broker: BrokerState, queue: QueueState, effect: PagedOut) -> int:
    """A message joined the machine's tail (not held): write it; returns the Persist token its confirm waits for
    (0: none, a spilled message)."""
    tail = tail_of(broker, queue)
    tail.msg_ids.append(effect.msg_id)
    token = broker.persist((_record(queue, effect.msg_id, effect.message, 0),))
    return token if effect.message.persistent else 0


def spilled_out(broker: BrokerState, queue: QueueState, effect: SpilledOut) -> None:
    """Messages withdrawn under memory pressure: each written again as ONE tail record (see the header)."""
    tail = tail_of(broker, queue)
    records: list[MessageRecord] = []
    for msg_id, message, delivery_count in effect.messages:
        queue.persisted_ids.discard(msg_id)  # (its old record needs no removal: the copy replaces it)
        records.append(_record(queue, msg_id, message, delivery_count))
        tail.front[msg_id] = UNKNOWN
    broker.persist(tuple(records))


def page_in_wanted(broker: BrokerState, queue: QueueState, effect: PageInWanted) -> None:
    tail_of(broker, queue).wanted = effect.msg_ids


def paged_dropped(broker: BrokerState, queue: QueueState, effect: PagedDropped) -> None:
    """Purge dropped the tail: its messages on disk are removed."""
    drop_tail(broker, queue)
    queue.persisted_ids.difference_update(effect.msg_ids)
    broker.persist(tuple(MessageRemovedRecord(queue.vhost, queue.name, msg_id) for msg_id in effect.msg_ids))


def on_tail_offsets(broker: BrokerState, items: list[tuple[str, int, int]]) -> None:
    """Storage appended these tail records: (stream, msg_id, offset), in append order."""
    paging = broker.paging
    for stream, msg_id, offset in items:
        queue = paging.get(stream)
        tail: PagedTail | None = queue.tail if queue is not None else None
        if tail is None:
            continue
        if tail.front.get(msg_id) == UNKNOWN:
            tail.front[msg_id] = offset
            continue
        known = len(tail.offsets)
        if known < len(tail.msg_ids) and tail.msg_ids[known] == msg_id:
            tail.offsets.append(offset)


def issue_reads(broker: BrokerState) -> None:
    """End of an entry point: send storage a `PageIn` for every wanted batch whose offsets are all known."""
    for queue in list(broker.paging.values()):
        tail: PagedTail | None = queue.tail
        if tail is None or not tail.wanted or tail.request_id:
            continue
        found = tail.offsets_of(tail.wanted)
        if found is None:
            continue  # (on_tail_offsets will tell)
        offsets, head = found
        broker.next_page_request += 1
        tail.start_read(broker.next_page_request, head)
        broker.out.append(PageIn(queue.vhost, queue.name, tail.stream, tail.request_id, tuple(offsets)))


def forget_tail(broker: BrokerState, queue: QueueState) -> None:
    """The queue is deleted: a MessageRemoved for every tail record not read back."""
    tail: PagedTail | None = queue.tail
    if tail is None:
        return
    ids = [*tail.request_ids, *tail.front, *tail.msg_ids[tail.head:]]
    drop_tail(broker, queue)
    if ids:
        broker.persist(tuple(MessageRemovedRecord(queue.vhost, queue.name, i) for i in ids))
