"""Single-node paging, the broker's part: a long durable queue keeps its backlog on disk, not in memory (pure).

What it is for: a classic durable queue with 10 million 1 KiB messages must not hold 10 GB of bodies. Who decides
what: the queue machine (cluster/queue/paging.py) decides which messages wait outside it, in its *tail*, and when
they come back; the broker carries that out on storage and keeps the log offsets (node/broker/paged_tail.py,
16 bytes a message); this module is what the broker adds around them:

- Every queue of a backend that can page (`QueueBackend.can_page`: a single node's local and mirrored queues)
  gets a machine with `page_limit` = `BrokerConfig.queue_messages_in_memory_max`. Past that many ready messages,
  a publish joins the tail (`PagedOut`, written as a tail record; its confirm waits for the fsync as usual when it
  is persistent and the queue stored; a transient one is spilled and recovery never brings it back). The opt-outs
  (queues keeping everything in memory) are the machine's: x-max-length, x-max-length-bytes, x-max-priority,
  x-message-ttl, a per-message TTL never starting a tail, and replicated queues (no page limit).
- Page-in: the machine asks (`PageInWanted`, at most `PAGE_IN_BATCH_MAX` ids, one request outstanding); at the
  end of the entry point the broker sends storage a `PageIn(vhost, queue, stream, request_id, offsets)` once it
  knows every offset (`paged_tail.issue_reads`); the runtime reads those records in a worker thread and calls
  `Broker.on_paged_in(...)`, which hands them to the machine as one `PagedIn` (`on_paged_in`): a paged message
  takes its place by msg id and is delivered unflagged, as if it had never left. A spilled (transient) record is
  garbage once read: the broker writes its MessageRemoved.
- Recovery hands long queue streams over as a `MessageIndexRecord` (ids and offsets of the live messages): the ids
  become the machine's tail (`RecoverPaged`, delivered redelivered like every recovered message), the offsets the
  broker's (`attach_recovered_tail`).
- The memory alarm (`Broker.set_alarm("memory", True)`): every paging machine learns the floor
  (`MemoryPressure(alarm_floor(limit))`: limit/10, at least 1; `MemoryPressure(None)` when it clears, and page-in
  fills the machines again) and, then at every `tick` while it stays on, is asked to `Spill` (at most
  `SPILL_CALL_MAX` messages a call for all queues): its newest ready messages above the floor go to the FRONT of
  its tail (`SpilledOut`), written as ONE record each (paged_tail.py: the alarm-spill crash window); recovery sorts
  an index that lists such a copy after newer ids.
- Purge drops the tail in the machine (`PagedDropped`: a MessageRemoved each); delete writes a MessageRemoved for
  every tail record not read back (`paged_tail.forget_tail`; harmless for spilled ones).
"""

from __future__ import annotations

from array import array
from typing import Any, Final

from cluster.queue import MemoryPressure, MsgId, PagedIn, QueuedMessage, RecoverPaged, Spill
from node.amqp.properties import BasicProperties
from node.broker import paged_tail
from node.broker.backend import backend_of
from node.broker.channel import Message
from node.broker.delivery import apply_queue
from node.broker.paged_tail import SPILLED_DELIVERY_MODE
from node.broker.queues import QueueState
from node.broker.records import MessageRecord, MessageRemovedRecord
from node.broker.state import BrokerState

MEMORY_ALARM: Final = "memory"  # the `Broker.set_alarm` kind that spills messages already in memory
SPILL_CALL_MAX: Final = 8192  # messages all queues spill per call (one set_alarm or tick)


def page_limit(broker: BrokerState) -> int:
    """The page limit of a new machine of a backend that can page."""
    return broker.config.queue_messages_in_memory_max


def alarm_floor(limit: int) -> int:
    """Ready messages a paging queue keeps in memory under the memory alarm (at least 1: consumers go on)."""
    return max(1, limit // 10)


def memory_floor(broker: BrokerState) -> int | None:
    """The machines' floor while the memory alarm is on (None: off)."""
    return alarm_floor(page_limit(broker)) if MEMORY_ALARM in broker.alarms else None


def _paging_queues(broker: BrokerState) -> list[QueueState]:
    return [queue for vhost in broker.vhosts.values() for queue in vhost.queues.values()
            if backend_of(queue).can_page]


def memory_alarm(broker: BrokerState) -> None:
    """The memory alarm went on or off: every paging machine learns the floor, and spills at once if on."""
    floor = memory_floor(broker)
    for queue in _paging_queues(broker):
        apply_queue(broker, queue, MemoryPressure(floor))
    spill_under_alarm(broker)


def spill_under_alarm(broker: BrokerState) -> None:
    """Under the memory alarm (from `memory_alarm` and every `tick`): each paging machine spills what it holds
    above the floor, `SPILL_CALL_MAX` messages a call at most for all of them."""
    if MEMORY_ALARM not in broker.alarms:
        return
    budget = SPILL_CALL_MAX
    for queue in _paging_queues(broker):
        before = queue.machine.ready_count
        apply_queue(broker, queue, Spill(budget))
        budget -= before - queue.machine.ready_count
        if budget <= 0:
            return


def attach_recovered_tail(broker: BrokerState, queue: QueueState, msg_ids: Any, offsets: Any) -> None:
    """Recovery: the queue's live messages, on disk, become its tail (delivered redelivered=True)."""
    if not len(msg_ids):
        return
    if any(msg_ids[i] > msg_ids[i + 1] for i in range(len(msg_ids) - 1)):  # messages spilled under the alarm
        order = sorted(range(len(msg_ids)), key=msg_ids.__getitem__)  # were written again after newer ones
        msg_ids, offsets = [msg_ids[i] for i in order], [offsets[i] for i in order]
    tail = paged_tail.tail_of(broker, queue)
    tail.msg_ids, tail.offsets, tail.head = array("q", msg_ids), array("q", offsets), 0
    apply_queue(broker, queue, RecoverPaged(tail.msg_ids))


def on_paged_in(broker: BrokerState, vhost_name: str, queue_name: str, request_id: int,
                records: list[MessageRecord]) -> None:
    """Storage read a PageIn's records: they go to the machine as one `PagedIn` (stale answers ignored)."""
    vhost = broker.vhosts.get(vhost_name)
    queue = vhost.queues.get(queue_name) if vhost is not None else None
    tail: paged_tail.PagedTail | None = queue.tail if queue is not None else None
    if queue is None or tail is None or tail.request_id != request_id:
        return
    tail.request_id, tail.request_ids = 0, ()
    messages: list[tuple[MsgId, QueuedMessage, int]] = []
    spilled: list[MessageRemovedRecord] = []
    for record in records:
        fields = record.properties
        persistent = fields.get("delivery_mode") == 2
        if persistent:
            queue.persisted_ids.add(record.msg_id)
        else:  # its disk copy is garbage now: storage must not keep the stream for it
            spilled.append(MessageRemovedRecord(queue.vhost, queue.name, record.msg_id))
        if SPILLED_DELIVERY_MODE in fields:
            fields = dict(fields)
            fields["delivery_mode"] = fields.pop(SPILLED_DELIVERY_MODE)
        props = BasicProperties(**fields)
        msg = Message(record.exchange, record.routing_key, props, record.body)
        messages.append((MsgId(record.msg_id), QueuedMessage(msg, len(record.body), persistent, props.priority or 0,
                                                             None), record.delivery_count))
    if not tail.waiting:
        paged_tail.drop_tail(broker, queue)
    apply_queue(broker, queue, PagedIn(tuple(messages)))
    if spilled:
        broker.persist(tuple(spilled))


def message_count(queue: QueueState) -> int:
    """Ready messages: the machine's and its tail's."""
    machine = queue.machine
    count: int = machine.ready_count + machine.paged_count
    return count
