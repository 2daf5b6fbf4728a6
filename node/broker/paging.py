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

Under the memory alarm (`Broker.set_alarm("memory", True)`, then every `tick` while it stays on): messages already
in memory go to disk too, as RabbitMQ's classic queues page out under memory pressure. Each pageable queue whose
machine holds more than `alarm_floor(limit)` (limit/10, at least 1) ready messages withdraws its NEWEST ready ones
(`Queue.withdraw_newest_ready`: never unacked ones; it stops at one with a per-message TTL), in batches of at most
`SPILL_QUEUE_BATCH_MAX` (one Persist each) and at most `SPILL_CALL_MAX` a call, and writes each as a tail record: a transient one
spilled as above; a persistent one as the same record again (same msg id), ONE record and no removal of the old
one: both recovery folds take a later record of a live id as the message's new place (the old copy dies), so no
crash point can lose it (a removal followed by the copy could be cut between the two: the "alarm-spill crash
window"); recovery sorts an index that lists the copy after newer ids.
They wait at the FRONT of the tail (`PagedTail.front_ids`, newest first; older than every other tail message, so
FIFO order holds) with their delivery count and redelivered flag, and page in first. While the alarm is on,
page-in fills a machine only up to the floor (`effective_limit`); when it clears, normal page-in resumes.

Opt-outs (such queues keep everything in memory): queues with x-max-length, x-max-length-bytes,
x-max-priority or x-message-ttl, and replicated mode. A message with a per-message TTL never starts a tail. Purge
and delete write a MessageRemovedRecord for every tail message (harmless for spilled ones).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any, Final

from cluster.queue import MsgId, QueuedMessage, Recover
from node.amqp.properties import BasicProperties
from node.broker.backend import backend_of
from node.broker.channel import Message
from node.broker.delivery import apply_queue, properties_to_dict
from node.broker.effects import PageIn
from node.broker.queues import QueueState
from node.broker.records import MessageRecord, MessageRemovedRecord, TailMessageRecord, queue_stream
from node.broker.state import BrokerState

PAGE_IN_BATCH_MAX: Final = 1024  # records per PageIn (one worker-thread hop)
COMPACT_PREFIX_MIN: Final = 4096  # consumed tail entries dropped from the columns once this many and half
HELD: Final = -1  # the offset of a tail message kept in memory (`PagedTail.held`)
UNKNOWN: Final = -2  # the offset of a front message storage has not reported yet (`PagedTail.front_offsets`)
MEMORY_ALARM: Final = "memory"  # the `Broker.set_alarm` kind that spills messages already in memory
SPILL_QUEUE_BATCH_MAX: Final = 1024  # messages one queue withdraws from its machine per batch (one Persist)
SPILL_CALL_MAX: Final = 8192  # messages all queues withdraw per call (one set_alarm or tick)
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
    pending_redelivered: frozenset[int] = frozenset()  # those of pending_ids to deliver flagged redelivered
    held: dict[int, tuple[QueuedMessage, int | None]] = field(default_factory=dict)  # msg id -> (message, expiry)
    front_ids: array[int] = field(default_factory=lambda: array("q"))  # spilled under the alarm; newest first
    front_offsets: dict[int, int] = field(default_factory=dict)  # front msg id -> offset (UNKNOWN: not yet)
    redelivered: set[int] = field(default_factory=set)  # front msg ids flagged redelivered in the machine

    @property
    def count(self) -> int:
        """Messages of the tail not yet in the machine (asked-for ones included)."""
        return len(self.msg_ids) - self.head + len(self.pending_ids) + len(self.front_ids)

    def take_batch(self, size_max: int) -> tuple[tuple[int, ...], tuple[int, ...], frozenset[int]]:
        """The next up to `size_max` entries with known offsets: (ids, offsets, those flagged redelivered).
        The front (older than every other entry) goes first."""
        if self.front_ids:
            return self._take_front(size_max)
        head = self.head
        end = min(len(self.offsets), head + size_max)
        ids = tuple(self.msg_ids[head:end])
        offsets = tuple(self.offsets[head:end])
        recovered = frozenset(ids[:max(0, min(end, self.recovered) - head)])
        self.head = end
        if end >= COMPACT_PREFIX_MIN and end * 2 >= len(self.msg_ids):
            del self.msg_ids[:end]
            del self.offsets[:end]
            self.recovered = max(0, self.recovered - end)
            self.head = 0
        return ids, offsets, recovered

    def _take_front(self, size_max: int) -> tuple[tuple[int, ...], tuple[int, ...], frozenset[int]]:
        front, known = self.front_ids, self.front_offsets
        ids: list[int] = []
        offsets: list[int] = []
        while front and len(ids) < size_max:
            offset = known.get(front[-1], UNKNOWN)
            if offset == UNKNOWN:
                break  # storage has not reported it yet: nothing behind it may go first
            msg_id = front.pop()
            del known[msg_id]
            ids.append(msg_id)
            offsets.append(offset)
        flagged = frozenset(msg_id for msg_id in ids if msg_id in self.redelivered)
        self.redelivered -= flagged
        return tuple(ids), tuple(offsets), flagged


def is_pageable(broker: BrokerState, queue: QueueState) -> bool:
    """Whether the queue may page (see the module docstring for the opt-outs)."""
    args = queue.arguments
    return (backend_of(queue).can_page and broker.config.queue_messages_in_memory_max > 0
            and not any(key in args for key in ("x-max-length", "x-max-length-bytes", "x-max-priority",
                                                 "x-message-ttl")))


def page_out(broker: BrokerState, queue: QueueState, msg: Message, persistent: bool, ttl_ms: int | None) -> int:
    """Put a message at the end of the queue's tail instead of into its machine; returns the Persist token its
    confirm waits for (0: none). A message without TTL waits on disk (a transient one too: spilled, its confirm
    does not wait, and recovery never brings it back); one with a TTL waits in memory, in `held`, in its place."""
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


def attach_recovered_tail(broker: BrokerState, queue: QueueState, msg_ids: Any, offsets: Any) -> None:
    """Recovery: the queue's live messages, on disk, become its tail (delivered redelivered=True)."""
    if not len(msg_ids):
        return
    if any(msg_ids[i] > msg_ids[i + 1] for i in range(len(msg_ids) - 1)):  # messages spilled under the alarm
        order = sorted(range(len(msg_ids)), key=msg_ids.__getitem__)  # were written again after newer ones
        msg_ids, offsets = [msg_ids[i] for i in order], [offsets[i] for i in order]
    tail = PagedTail(queue_stream(queue.vhost, queue.name), array("q", msg_ids), array("q", offsets))
    tail.recovered = len(tail.msg_ids)
    queue.tail = tail
    queue.machine.skip_msg_ids_through(MsgId(tail.msg_ids[-1]))
    broker.paging[tail.stream] = queue


def on_tail_offsets(broker: BrokerState, items: list[tuple[str, int, int]]) -> None:
    """Storage appended these tail records: (stream, msg_id, offset), in append order."""
    paging = broker.paging
    for stream, msg_id, offset in items:
        queue = paging.get(stream)
        tail = queue.tail if queue is not None else None
        if tail is None:
            continue
        if tail.front_offsets.get(msg_id) == UNKNOWN:
            tail.front_offsets[msg_id] = offset
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


def request_page_ins(broker: BrokerState) -> None:
    """For every paging queue whose machine ran low and has no request outstanding: ask for the next batch."""
    limit = effective_limit(broker)
    low = limit // 2
    for queue in list(broker.paging.values()):
        tail = queue.tail
        if tail is None or tail.pending_request or queue.machine.ready_count >= max(low, 1):
            continue
        room = min(PAGE_IN_BATCH_MAX, limit - queue.machine.ready_count)
        if room <= 0:
            continue
        ids, offsets, redelivered = tail.take_batch(room)
        if not ids:
            continue
        broker.next_page_request += 1
        tail.pending_request = broker.next_page_request
        tail.pending_ids = ids
        tail.pending_redelivered = redelivered
        on_disk = tuple(offset for offset in offsets if offset != HELD)
        if on_disk:
            broker.out.append(PageIn(queue.vhost, queue.name, tail.stream, tail.pending_request, on_disk))
        else:  # all held in memory: no read needed
            on_paged_in(broker, queue.vhost, queue.name, tail.pending_request, [])


def on_paged_in(broker: BrokerState, vhost_name: str, queue_name: str, request_id: int,
                records: list[MessageRecord]) -> None:
    """Storage read a PageIn's records: they join the machine in order (ids checked; stale answers ignored)."""
    vhost = broker.vhosts.get(vhost_name)
    queue = vhost.queues.get(queue_name) if vhost is not None else None
    tail = queue.tail if queue is not None else None
    if queue is None or tail is None or tail.pending_request != request_id:
        return
    expected, redelivered = tail.pending_ids, tail.pending_redelivered
    tail.pending_request, tail.pending_ids, tail.pending_redelivered = 0, (), frozenset()
    by_id = {record.msg_id: record for record in records}
    spilled: list[MessageRemovedRecord] = []
    held = tail.held
    for msg_id in expected:
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
                                           redelivered=msg_id in redelivered))
    if spilled:
        broker.persist(tuple(spilled))
    if not tail.count:
        drop_tail(broker, queue)


def drop_tail(broker: BrokerState, queue: QueueState) -> None:
    tail = queue.tail
    if tail is not None:
        queue.tail = None
        if broker.paging.get(tail.stream) is queue:
            del broker.paging[tail.stream]


def forget_tail(broker: BrokerState, queue: QueueState) -> int:
    """Purge/delete: every tail message is gone (MessageRemoved records); returns how many there were."""
    tail = queue.tail
    if tail is None:
        return 0
    ids = [*tail.pending_ids, *tail.front_ids, *tail.msg_ids[tail.head:]]
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


def effective_limit(broker: BrokerState) -> int:
    """Ready messages a pageable queue's machine may hold: the limit, or only the floor under the memory alarm."""
    limit: int = broker.config.queue_messages_in_memory_max
    return alarm_floor(limit) if MEMORY_ALARM in broker.alarms else limit


def alarm_floor(limit: int) -> int:
    """Ready messages a pageable queue keeps in memory under the memory alarm (at least 1: consumers go on)."""
    return max(1, limit // 10)


def spill_under_alarm(broker: BrokerState) -> None:
    """Under the memory alarm (from `set_alarm` and every `tick`): each pageable queue holding more than the
    floor moves its newest ready messages, in bounded batches, to the front of its tail on disk."""
    if MEMORY_ALARM not in broker.alarms:
        return
    floor = alarm_floor(broker.config.queue_messages_in_memory_max)
    budget = SPILL_CALL_MAX
    for vhost in broker.vhosts.values():
        for queue in vhost.queues.values():
            if not queue.pageable or (queue.tail is not None and queue.tail.pending_request):
                continue  # (with a PageIn outstanding its ids sit between the machine's and the front's)
            while budget > 0 and queue.machine.ready_count > floor:
                moved = spill_newest(broker, queue, min(queue.machine.ready_count - floor, budget,
                                                        SPILL_QUEUE_BATCH_MAX))
                if not moved:
                    break  # (a message with a per-message TTL stops it)
                budget -= moved
            if budget <= 0:
                return


def spill_newest(broker: BrokerState, queue: QueueState, count_max: int) -> int:
    """Withdraw up to `count_max` of the machine's newest ready messages (stopping at one with a per-message
    TTL) and write them as tail records at the front of the tail; returns how many moved.

    A persistent one is written again as one record (same msg id), with no MessageRemoved of its earlier
    record: storage's fold and recovery take a record of an id already live as the message's new place, so every
    crash point finds one live copy (a removal then a copy could be cut between the two). A transient one is
    spilled as by `page_out`. Its delivery count and redelivered flag come back with it at page-in."""
    taken = queue.machine.withdraw_newest_ready(count_max)
    if not taken:
        return 0
    tail = queue.tail
    if tail is None:
        tail = queue.tail = PagedTail(queue_stream(queue.vhost, queue.name))
        broker.paging[tail.stream] = queue
    records: list[MessageRecord] = []
    for msg_id, queued, delivery_count, redelivered in reversed(taken):  # ascending msg id: log order
        msg: Message = queued.payload
        queue.persisted_ids.discard(msg_id)  # (its old record needs no removal: the copy below replaces it)
        fields = properties_to_dict(msg.properties)
        if not queued.persistent and "delivery_mode" in fields:
            fields[SPILLED_DELIVERY_MODE] = fields.pop("delivery_mode")
        records.append(TailMessageRecord(queue.vhost, queue.name, msg_id, msg.exchange, msg.routing_key, fields,
                                         msg.body, delivery_count))
        tail.front_offsets[msg_id] = UNKNOWN
        if redelivered:
            tail.redelivered.add(msg_id)
    tail.front_ids.extend(msg_id for msg_id, *_ in taken)  # newest first: each batch is older than the last
    broker.persist(tuple(records))
    return len(taken)
