"""Single-node paging: a long durable queue keeps its backlog on disk, not in memory (pure).

What it is for: a classic durable queue with 10 million 1 KiB messages must not hold 10 GB of bodies. Once a
queue's machine holds `BrokerConfig.queue_messages_in_memory_max` ready messages, each further message is *paged
out* at publish: its msg id is reserved from the machine (`Queue.reserve_msg_id`, so ids stay unique and in
publish order), its `MessageRecord` is written to the queue's log stream (as a `TailMessageRecord`: same bytes on
disk) and the broker keeps only the id and, once storage reports it (`Broker.on_tail_offsets`), the record's log
offset: two `array('q')` columns, 16 bytes a message (`PagedTail`). While a tail exists every message to the queue
joins it, so order is kept. A persistent message's confirm waits for the fsync as usual. A transient message (no
delivery_mode 2; or any message of a non-durable or exclusive queue) is *spilled* the same way, its delivery_mode
kept under the key `spilled_delivery_mode` of the record's properties: its confirm does not wait, and as its record
lacks delivery_mode 2, recovery never brings it back (dropped at restart, as RabbitMQ). While it waits, storage
counts it live (so the stream is not truncated under it); once paged in, the broker writes its MessageRemoved.
Messages with a per-message TTL join the tail in memory (`held`).

How messages come back: at the end of every entry point, a queue whose machine fell under half the limit gets a
`PageIn(vhost, queue, stream, request_id, offsets)` effect for the next batch (at most `PAGE_IN_BATCH_MAX`, one
outstanding request per queue). The runtime reads those records in a worker thread and calls
`Broker.on_paged_in(...)`, which feeds them to the machine with `Recover(msg_id, ..., redelivered=False)`: a paged
message takes its place by msg id and is delivered unflagged, as if it had never left. Recovery hands long queue
streams over as a `MessageIndexRecord` (ids and offsets of the live messages); those become the tail too, flagged
redelivered like every recovered message.

Opt-outs (such queues keep everything in memory, as before): queues with x-max-length, x-max-length-bytes,
x-max-priority or x-message-ttl, and replicated mode. A message with a per-message TTL never starts a tail. Purge
and delete write a MessageRemovedRecord for every tail message (harmless for spilled ones).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from cluster.queue import MsgId, QueuedMessage, Recover
from node.amqp.properties import BasicProperties
from node.broker.channel import Message
from node.broker.effects import PageIn
from node.broker.queues import QueueState
from node.broker.records import MessageRecord, MessageRemovedRecord, TailMessageRecord, queue_stream

if TYPE_CHECKING:
    from node.broker.broker import Broker

PAGE_IN_BATCH_MAX: Final = 1024  # records per PageIn (one worker-thread hop)
COMPACT_PREFIX_MIN: Final = 4096  # consumed tail entries dropped from the columns once this many and half
HELD: Final = -1  # the offset of a tail message kept in memory (`PagedTail.held`)
SPILLED_DELIVERY_MODE: Final = "spilled_delivery_mode"  # a spilled record's delivery_mode, under another key


@dataclass(slots=True)
class PagedTail:
    """A queue's messages kept on disk only, in delivery (= msg id = log) order."""

    stream: str
    msg_ids: array[int] = field(default_factory=lambda: array("q"))
    offsets: array[int] = field(default_factory=lambda: array("q"))  # a prefix of msg_ids' offsets (known ones)
    head: int = 0  # first entry not yet asked for
    recovered: int = 0  # entries [0, recovered) came from recovery: delivered redelivered=True
    pending_request: int = 0  # the outstanding PageIn's request id (0: none)
    pending_ids: tuple[int, ...] = ()
    pending_recovered: int = 0  # the first this many of pending_ids are recovered ones
    held: dict[int, tuple[QueuedMessage, int | None]] = field(default_factory=dict)  # msg id -> (message, expiry)

    @property
    def count(self) -> int:
        """Messages of the tail not yet in the machine (asked-for ones included)."""
        return len(self.msg_ids) - self.head + len(self.pending_ids)

    def take_batch(self, size_max: int) -> tuple[tuple[int, ...], tuple[int, ...], int]:
        """The next up to `size_max` entries with known offsets: (ids, offsets, how many are recovered ones)."""
        head = self.head
        end = min(len(self.offsets), head + size_max)
        ids = tuple(self.msg_ids[head:end])
        offsets = tuple(self.offsets[head:end])
        recovered = max(0, min(end, self.recovered) - head)
        self.head = end
        if end >= COMPACT_PREFIX_MIN and end * 2 >= len(self.msg_ids):
            del self.msg_ids[:end]
            del self.offsets[:end]
            self.recovered = max(0, self.recovered - end)
            self.head = 0
        return ids, offsets, recovered


def is_pageable(broker: Broker, queue: QueueState) -> bool:
    """Whether the queue may page (see the module docstring for the opt-outs)."""
    args = queue.arguments
    return (not broker.replicated and broker.config.queue_messages_in_memory_max > 0
            and not any(key in args for key in ("x-max-length", "x-max-length-bytes", "x-max-priority",
                                                 "x-message-ttl")))


def page_out(broker: Broker, queue: QueueState, msg: Message, persistent: bool, ttl_ms: int | None) -> int:
    """Put a message at the end of the queue's tail instead of into its machine; returns the Persist token its
    confirm waits for (0: none). A message without TTL waits on disk (a transient one too: spilled, its confirm
    does not wait, and recovery never brings it back); one with a TTL waits in memory, in `held`, in its place."""
    from node.broker.delivery import properties_to_dict

    tail = queue.tail
    if tail is None:
        tail = queue.tail = PagedTail(queue_stream(queue.vhost, queue.name))
        broker.paging[tail.stream] = queue
    msg_id = queue.machine.reserve_msg_id()
    tail.msg_ids.append(msg_id)
    props = msg.properties
    if ttl_ms is None:
        fields = properties_to_dict(props)
        if persistent and queue.stored:
            return broker.persist((TailMessageRecord(queue.vhost, queue.name, msg_id, msg.exchange,
                                                     msg.routing_key, fields, msg.body),))
        if "delivery_mode" in fields:  # spilled: without delivery_mode 2 the record is never recovered
            fields[SPILLED_DELIVERY_MODE] = fields.pop("delivery_mode")
        broker.persist((TailMessageRecord(queue.vhost, queue.name, msg_id, msg.exchange, msg.routing_key, fields,
                                          msg.body),))
        return 0
    if len(tail.offsets) == len(tail.msg_ids) - 1:
        tail.offsets.append(HELD)
    stored = persistent and queue.stored  # as enqueue_all decides it for the machine
    tail.held[msg_id] = (QueuedMessage(msg, len(msg.body), stored, props.priority or 0, ttl_ms),
                         broker.now_ms + ttl_ms)
    if not stored:
        return 0
    return broker.persist((MessageRecord(queue.vhost, queue.name, msg_id, msg.exchange, msg.routing_key,
                                         properties_to_dict(props), msg.body),))


def attach_recovered_tail(broker: Broker, queue: QueueState, msg_ids: Any, offsets: Any) -> None:
    """Recovery: the queue's live messages, on disk, become its tail (delivered redelivered=True)."""
    if not len(msg_ids):
        return
    tail = PagedTail(queue_stream(queue.vhost, queue.name), array("q", msg_ids), array("q", offsets))
    tail.recovered = len(tail.msg_ids)
    queue.tail = tail
    queue.machine.skip_msg_ids_through(MsgId(tail.msg_ids[-1]))
    broker.paging[tail.stream] = queue


def on_tail_offsets(broker: Broker, items: list[tuple[str, int, int]]) -> None:
    """Storage appended these tail records: (stream, msg_id, offset), in append order."""
    paging = broker.paging
    for stream, msg_id, offset in items:
        queue = paging.get(stream)
        tail = queue.tail if queue is not None else None
        if tail is None:
            continue
        known = len(tail.offsets)
        if known < len(tail.msg_ids) and tail.msg_ids[known] == msg_id:
            tail.offsets.append(offset)
            _mark_held_known(tail)


def _mark_held_known(tail: PagedTail) -> None:
    """Held messages right after the known prefix need no offset: they are known too."""
    msg_ids, offsets, held = tail.msg_ids, tail.offsets, tail.held
    while held and len(offsets) < len(msg_ids) and msg_ids[len(offsets)] in held:
        offsets.append(HELD)


def request_page_ins(broker: Broker) -> None:
    """For every paging queue whose machine ran low and has no request outstanding: ask for the next batch."""
    limit = broker.config.queue_messages_in_memory_max
    low = limit // 2
    for queue in list(broker.paging.values()):
        tail = queue.tail
        if tail is None or tail.pending_request or queue.machine.ready_count >= max(low, 1):
            continue
        room = min(PAGE_IN_BATCH_MAX, limit - queue.machine.ready_count)
        if room <= 0 or tail.head >= len(tail.offsets):
            continue
        ids, offsets, recovered = tail.take_batch(room)
        broker.next_page_request += 1
        tail.pending_request = broker.next_page_request
        tail.pending_ids = ids
        tail.pending_recovered = recovered
        on_disk = tuple(offset for offset in offsets if offset != HELD)
        if on_disk:
            broker.out.append(PageIn(queue.vhost, queue.name, tail.stream, tail.pending_request, on_disk))
        else:  # all held in memory: no read needed
            on_paged_in(broker, queue.vhost, queue.name, tail.pending_request, [])


def on_paged_in(broker: Broker, vhost_name: str, queue_name: str, request_id: int,
                records: list[MessageRecord]) -> None:
    """Storage read a PageIn's records: they join the machine in order (ids checked; stale answers ignored)."""
    from node.broker.delivery import apply_queue

    vhost = broker.vhosts.get(vhost_name)
    queue = vhost.queues.get(queue_name) if vhost is not None else None
    tail = queue.tail if queue is not None else None
    if queue is None or tail is None or tail.pending_request != request_id:
        return
    expected, recovered = tail.pending_ids, tail.pending_recovered
    tail.pending_request, tail.pending_ids, tail.pending_recovered = 0, (), 0
    by_id = {record.msg_id: record for record in records}
    spilled: list[MessageRemovedRecord] = []
    held = tail.held
    for index, msg_id in enumerate(expected):
        kept = held.pop(msg_id, None) if held else None
        expiry_ms: int | None = None
        delivery_count = 0
        if kept is not None:
            queued, expiry_ms = kept
        else:
            record = by_id.get(msg_id)
            if record is None:
                continue  # unreadable: storage logged it; the message cannot come back
            fields = record.properties
            persistent = fields.get("delivery_mode") == 2
            if not persistent:  # its disk copy is garbage now: storage must not keep the stream for it
                spilled.append(MessageRemovedRecord(queue.vhost, queue.name, msg_id))
            if SPILLED_DELIVERY_MODE in fields:
                fields = dict(fields)
                fields["delivery_mode"] = fields.pop(SPILLED_DELIVERY_MODE)
            props = BasicProperties(**fields)
            msg = Message(record.exchange, record.routing_key, props, record.body)
            queued = QueuedMessage(msg, len(record.body), persistent, props.priority or 0, None)
            delivery_count = record.delivery_count
        if queued.persistent:
            queue.persisted_ids.add(msg_id)
        apply_queue(broker, queue, Recover(MsgId(msg_id), queued, delivery_count, expiry_ms,
                                           redelivered=index < recovered))
    if spilled:
        broker.persist(tuple(spilled))
    if not tail.count:
        drop_tail(broker, queue)


def drop_tail(broker: Broker, queue: QueueState) -> None:
    tail = queue.tail
    if tail is not None:
        queue.tail = None
        if broker.paging.get(tail.stream) is queue:
            del broker.paging[tail.stream]


def forget_tail(broker: Broker, queue: QueueState) -> int:
    """Purge/delete: every tail message is gone (MessageRemoved records); returns how many there were."""
    tail = queue.tail
    if tail is None:
        return 0
    ids = [*tail.pending_ids, *tail.msg_ids[tail.head:]]
    on_disk = [i for i in ids if i not in tail.held or tail.held[i][0].persistent]
    drop_tail(broker, queue)
    if on_disk:
        broker.persist(tuple(MessageRemovedRecord(queue.vhost, queue.name, i) for i in on_disk))
    return len(ids)


def message_count(queue: QueueState) -> int:
    """Ready messages: the machine's and the tail's."""
    tail = queue.tail
    ready: int = queue.machine.ready_count
    return ready + (tail.count if tail is not None else 0)
