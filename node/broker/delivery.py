"""Consumers and deliveries: consume, cancel, get, ack/nack/reject, recover, qos, and the credit that paces them.

Every consumer is attached to its queue machine in credit mode. The broker grants credit in windows of
`consumer_credit_window` (replicated mode: up to twice a consumer's prefetch, `credit_window`; and, with a
channel-global prefetch, no more than the channel's free room), topping up at
the end of each entry point for channels marked dirty. A new consumer gets its first window even while the
connection is not writable (its deliveries then wait in `pending`): the queue round-robins only among consumers
with credit, so a consumer attached next to peers that already hold a window would otherwise get nothing until the
socket drained (RabbitMQ alternates consumers of one queue message by message). A delivery the channel may not send now (flow off, socket
not draining, channel-global prefetch full) waits in the channel's `pending` buffer, which credit bounds. Per-consumer
prefetch (basic.qos global=false) is the machine's own `prefetch`. A cancelled consumer keeps its unacked messages
(they can still be acked): `Cancel` takes it out of the machine's consumers, and it is detached when the last one
is settled or the channel closes. Auto-delete and x-expires are the machine's (`QueueUnused`, `QueueExpired` among
a command's effects: `_handle_effects` deletes the queue).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any

from cluster.queue import (
    Accepted,
    AddCredit,
    Attach,
    Cancel,
    DeadLetter,
    Deliver,
    Detach,
    Discard,
    Dropped,
    Enqueue,
    Get,
    GetEmpty,
    GetOk,
    MsgId,
    PagedDropped,
    PagedOut,
    PageInWanted,
    QueuedMessage,
    QueueExpired,
    QueueUnused,
    Rejected,
    Return,
    Settle,
    SpilledOut,
)
from node.amqp import methods as m
from node.broker import paged_tail, trace
from node.broker.backend import backend_of
from node.broker.channel import ChannelState, ConnState, Consumer, Message, PendingDelivery, Unacked
from node.broker.effects import Effect, Send, SendContent
from node.broker.errors import AmqpError, access_refused, precondition
from node.broker.queue_lookup import REPLY_TO_QUEUE, check_exclusive, lookup_queue
from node.broker.queues import QueueState
from node.broker.records import MessageRecord, MessageRemovedRecord, Record
from node.broker.records import properties_to_dict as properties_to_dict  # (replica_wire uses it from here)
from node.broker.state import BrokerState

_new_tuple = tuple.__new__  # _new_tuple(Unacked, (...)): a NamedTuple without its Python-level __new__


SHARED_PROPERTY_DICTS_MAX = 4096  # cleared when full
_shared_property_dicts: dict[int, tuple[Any, dict[str, Any]]] = {}  # id(props) -> (props, kept alive; its dict)


def shared_properties_dict(props: Any) -> dict[str, Any]:
    """properties_to_dict, but one dict per `BasicProperties` object without headers (node/amqp shares one such
    object per distinct property list): the records of many messages share it, and so does their encoding
    (records.encode_record). The caller must not mutate it."""
    if props.headers is not None:
        return properties_to_dict(props)
    cached = _shared_property_dicts.get(id(props))
    if cached is not None and cached[0] is props:
        return cached[1]
    fields = properties_to_dict(props)
    if len(_shared_property_dicts) >= SHARED_PROPERTY_DICTS_MAX:
        _shared_property_dicts.clear()
    _shared_property_dicts[id(props)] = (props, fields)
    return fields


def _persist_accepted(broker: BrokerState, queue: QueueState, msg_id: int, message: QueuedMessage) -> int:
    msg: Message = message.payload
    queue.persisted_ids.add(msg_id)
    record = MessageRecord(queue.vhost, queue.name, msg_id, msg.exchange, msg.routing_key,
                           shared_properties_dict(msg.properties), msg.body)
    return broker.persist((record,))


def enqueue(broker: BrokerState, queue: QueueState, command: Enqueue) -> int:
    """Apply one Enqueue (the publish hot path): > 0 is the Persist token of an accepted persistent message,
    -1 means the queue refused it, 0 neither.

    The accepted message's record is written before any other effect of the command is handled, so a removal
    record (no-ack delivery, drop-head) can never precede the message's own record in the queue's stream. A
    message the machine pages out (`PagedOut`) is written to its tail instead (node/broker/paged_tail.py), unless
    the machine holds it in memory: then it is stored as an accepted one.
    """
    effects = queue.machine.apply(command)
    first = effects[0] if effects else None
    if type(first) is Accepted:
        token = _persist_accepted(broker, queue, first.msg_id, command.message) if command.message.persistent else 0
        if len(effects) == 2 and type(effects[1]) is Deliver:
            _on_deliver(broker, queue, effects[1])
        elif len(effects) > 1:
            _handle_effects(broker, queue, effects)
        return token
    if type(first) is PagedOut and len(effects) == 1 and not first.held:  # a long queue's publish
        return paged_tail.page_out(broker, queue, first)
    token = 0
    for effect in effects:
        kind = type(effect)
        if kind is Accepted:
            if command.message.persistent:
                token = _persist_accepted(broker, queue, effect.msg_id, command.message)
        elif kind is PagedOut:
            if not effect.held:
                token = paged_tail.page_out(broker, queue, effect)
            elif command.message.persistent:
                token = _persist_accepted(broker, queue, effect.msg_id, command.message)
        elif kind is Rejected:
            token = -1
    _handle_effects(broker, queue, effects)
    return token


def apply_queue(broker: BrokerState, queue: QueueState, command: Any) -> list[Any]:
    """Run one command on the queue's machine; handle deliveries, gets and losses; return the rest."""
    return _handle_effects(broker, queue, queue.machine.apply(command))


def _handle_effects(broker: BrokerState, queue: QueueState, effects: list[Any]) -> list[Any]:
    rest: list[Any] = []
    for effect in effects:
        kind = type(effect)
        if kind is Deliver:
            _on_deliver(broker, queue, effect)
        elif kind is Accepted or kind is Rejected or kind is PagedOut:
            continue
        elif kind is GetOk:
            _on_get_ok(broker, queue, effect)
        elif kind is GetEmpty:
            ch = broker.getters.get(effect.consumer_id)
            if ch is not None:
                broker.out.append(Send(ch.conn_id, ch.number, m.BasicGetEmpty()))
        elif kind is DeadLetter:
            if effect.msg_id is not None:
                forget_persisted(broker, queue, (effect.msg_id,))
            broker.dead_letters.append((queue, effect))
        elif kind is Dropped:
            forget_persisted(broker, queue, (effect.msg_id,))
        elif kind is QueueUnused or kind is QueueExpired:
            broker.delete_queue(queue)  # (auto-delete, x-expires: the machine decided)
        elif kind is PageInWanted:  # paging (the machine decided): node/broker/paged_tail.py
            paged_tail.page_in_wanted(broker, queue, effect)
        elif kind is SpilledOut:
            paged_tail.spilled_out(broker, queue, effect)
        elif kind is PagedDropped:
            paged_tail.paged_dropped(broker, queue, effect)
        else:
            rest.append(effect)
    return rest


def forget_persisted(broker: BrokerState, queue: QueueState, msg_ids: Iterable[int]) -> None:
    persisted = queue.persisted_ids
    if not persisted:
        return
    gone = msg_ids if type(msg_ids) is list and persisted.issuperset(msg_ids) else [
        i for i in msg_ids if i in persisted]
    if gone:
        persisted.difference_update(gone)
        vhost, name = queue.vhost, queue.name
        removed: list[Record] = [MessageRemovedRecord(vhost, name, i) for i in gone]
        broker.persist(removed)


def _on_deliver(broker: BrokerState, queue: QueueState, effect: Deliver) -> None:
    consumer = broker.consumers.get(effect.consumer_id)
    if consumer is None:
        return
    credit = consumer.credit = consumer.credit - 1
    ch = consumer.channel
    if credit * 2 <= (consumer.window or broker.config.consumer_credit_window):
        broker.mark_dirty(ch)
    if consumer.no_ack and queue.persisted_ids:
        forget_persisted(broker, queue, (effect.msg_id,))
    conn = ch.conn
    if (ch.pending or conn is None or not conn.writable or ch.closed
            or not (consumer.no_ack or not ch.prefetch_channel or len(ch.unacked) < ch.prefetch_channel)):
        # (_can_send, inlined on this hot path)
        ch.pending.append(PendingDelivery(consumer, effect.msg_id, effect.message.payload, effect.redelivered))
        drain_pending(broker, ch)
    else:
        _send_delivery(broker, ch, consumer, effect.msg_id, effect.message.payload, effect.redelivered)


def _can_send(ch: ChannelState, consumer: Consumer) -> bool:
    conn = ch.conn
    if conn is None or not conn.writable or ch.closed:
        return False
    return consumer.no_ack or ch.prefetch_channel == 0 or len(ch.unacked) < ch.prefetch_channel


def _send_delivery(broker: BrokerState, ch: ChannelState, consumer: Consumer, msg_id: MsgId, msg: Message,
                   redelivered: bool) -> None:
    tag = ch.next_delivery_tag
    ch.next_delivery_tag = tag + 1
    if not consumer.no_ack:
        ch.unacked[tag] = _new_tuple(Unacked, (consumer.queue, consumer.consumer_id, msg_id, consumer))
        consumer.unacked_count += 1
    deliver = m.BasicDeliver(consumer.tag, tag, redelivered, msg.exchange, msg.routing_key)
    broker.out.append(SendContent(ch.conn_id, ch.number, deliver, msg.properties, msg.body))
    if broker.trace_vhosts:  # Firehose (node/broker/trace.py)
        queue = consumer.queue
        if queue.vhost in broker.trace_vhosts:
            trace.tap_out(broker, ch, queue.vhost, queue.name, msg, redelivered)


def drain_pending(broker: BrokerState, ch: ChannelState) -> None:
    pending = ch.pending
    while pending and _can_send(ch, pending[0].consumer):
        p = pending.popleft()
        _send_delivery(broker, ch, p.consumer, p.msg_id, p.message, p.redelivered)


def _on_get_ok(broker: BrokerState, queue: QueueState, effect: GetOk) -> None:
    ch = broker.getters.get(effect.consumer_id)
    if ch is None:
        return
    msg: Message = effect.message.payload
    tag = ch.next_delivery_tag
    ch.next_delivery_tag = tag + 1
    if ch.get_no_ack:
        forget_persisted(broker, queue, (effect.msg_id,))
    else:
        ch.unacked[tag] = Unacked(queue, ch.get_consumer_id, effect.msg_id, None)
    ok = m.BasicGetOk(delivery_tag=tag, redelivered=effect.redelivered, exchange=msg.exchange,
                      routing_key=msg.routing_key, message_count=effect.remaining)
    broker.out.append(SendContent(ch.conn_id, ch.number, ok, msg.properties, msg.body))
    if broker.trace_vhosts and queue.vhost in broker.trace_vhosts:  # Firehose (node/broker/trace.py)
        trace.tap_out(broker, ch, queue.vhost, queue.name, msg, effect.redelivered)


# --- credit -----------------------------------------------------------------------------------------------------


def refill_dirty(broker: BrokerState) -> None:
    dirty, broker.dirty = broker.dirty, {}
    for ch in dirty.values():
        if not ch.closed:
            refill(broker, ch)


def refill(broker: BrokerState, ch: ChannelState) -> None:
    drain_pending(broker, ch)
    conn = broker.conns.get(ch.conn_id)
    flowing = conn is not None and conn.writable
    if broker.held:
        hold = broker.held.get((ch.conn_id, ch.number))
        if hold is not None:
            if any(token not in broker.ticket_owner for token in hold.tokens):
                return  # replies wait for the disk (reply_gate): no top-ups meanwhile, so what is held stays bounded
            # replies wait for this node's replica (read_your_writes, about a commit round): a new consumer still
            # gets its first window with its Attach, but no top-ups, so what is held stays bounded here too
            flowing = False
    for consumer in list(ch.consumers.values()):
        if consumer.granted and not flowing:
            continue  # top-ups wait for the socket; a new consumer's first window does not (see below)
        consumer.window = window = credit_window(broker, ch, consumer)
        target = credit_target(broker, ch, consumer.no_ack, window)
        if consumer.credit < target and consumer.credit * 2 <= target:
            grant = target - consumer.credit
            consumer.credit = target
            consumer.granted = True
            apply_queue(broker, consumer.queue, AddCredit(consumer.consumer_id, grant))


def credit_window(broker: BrokerState, ch: ChannelState, consumer: Consumer) -> int:
    """A consumer's credit window: `consumer_credit_window`, widened by its queue's backend (a Raft queue's
    consumer with a prefetch limit: twice its prefetch, node/broker/backend_replicated.py)."""
    return backend_of(consumer.queue).credit_window(broker.config.consumer_credit_window, consumer,
                                                  consumer.prefetch or ch.prefetch_channel)


def credit_target(broker: BrokerState, ch: ChannelState, no_ack: bool, window: int = 0) -> int:
    """The credit a consumer of `ch` is topped up to: one window (`consumer_credit_window` unless given), or the
    channel-global prefetch's free room."""
    window = window or broker.config.consumer_credit_window
    if no_ack or not ch.prefetch_channel:
        return window
    return max(0, min(window, ch.prefetch_channel - len(ch.unacked) - len(ch.pending)))


# --- consume / cancel -------------------------------------------------------------------------------------------


def basic_consume(broker: BrokerState, conn: ConnState, ch: ChannelState, method: m.BasicConsume) -> None:
    if method.queue == REPLY_TO_QUEUE:
        _consume_reply_to(broker, ch, method)
        return
    queue = lookup_queue(broker, conn, ch, method.queue)
    broker.check_access(conn, "read", "queue", queue.name)
    check_exclusive(conn, queue)
    tag = method.consumer_tag or broker.random_name("amq.ctag-")
    if tag in ch.consumers or tag == ch.reply_to_tag:
        raise AmqpError(530, f"attempt to reuse consumer tag '{tag}'", connection=True)
    if queue.exclusive_consumer is not None or (method.exclusive and (
            queue.consumers or backend_of(queue).consumer_count(queue))):  # (any node's)
        raise access_refused(f"{queue.resource} in exclusive use")
    priority = method.arguments.get("x-priority", 0)
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise precondition(f"invalid arg 'x-priority' for {queue.resource}: {{unacceptable_type,{priority!r}}}")
    prefetch = 0 if method.no_ack else ch.prefetch_consumer
    consumer = Consumer(broker.new_consumer_id(), tag, conn.conn_id, ch, queue, method.no_ack, prefetch, priority,
                        method.exclusive)
    ch.consumers[tag] = consumer
    broker.consumers[consumer.consumer_id] = consumer
    queue.consumers[consumer.consumer_id] = consumer
    if method.exclusive:
        queue.exclusive_consumer = consumer.consumer_id
    if not method.nowait:
        broker.out.append(Send(ch.conn_id, ch.number, m.BasicConsumeOk(consumer_tag=tag)))
    apply_queue(broker, queue, Attach(consumer.consumer_id, broker.now_ms, prefetch=prefetch, credit=0,
                                      priority=priority, no_ack=method.no_ack))
    broker.mark_dirty(ch)


def _consume_reply_to(broker: BrokerState, ch: ChannelState, method: m.BasicConsume) -> None:
    if not method.no_ack:
        raise precondition("reply consumer cannot acknowledge")
    if ch.reply_to_tag is not None:
        raise precondition("reply consumer already set")
    tag = method.consumer_tag or broker.random_name("amq.ctag-")
    if tag in ch.consumers:
        raise AmqpError(530, f"attempt to reuse consumer tag '{tag}'", connection=True)
    ch.reply_to_tag = tag
    ch.reply_to_token = broker.random_name("")
    broker.reply_tokens[ch.reply_to_token] = ch
    if not method.nowait:
        broker.out.append(Send(ch.conn_id, ch.number, m.BasicConsumeOk(consumer_tag=tag)))


def basic_cancel(broker: BrokerState, conn: ConnState, ch: ChannelState, method: m.BasicCancel) -> None:
    tag = method.consumer_tag
    if tag == ch.reply_to_tag and ch.reply_to_token is not None:
        broker.reply_tokens.pop(ch.reply_to_token, None)
        ch.reply_to_tag = ch.reply_to_token = None
    consumer = ch.consumers.get(tag)
    if not method.nowait:
        broker.out.append(Send(ch.conn_id, ch.number, m.BasicCancelOk(consumer_tag=tag)))
    if consumer is not None:
        cancel_consumer(broker, consumer)


def cancel_consumer(broker: BrokerState, consumer: Consumer) -> None:
    """Client-side cancel: no more deliveries; unacked messages stay on the channel until settled."""
    ch, queue = consumer.channel, consumer.queue
    ch.consumers.pop(consumer.tag, None)
    _drop_pending(broker, ch, consumer)
    _leave_queue(queue, consumer)
    if consumer.unacked_count == 0:
        broker.consumers.pop(consumer.consumer_id, None)
        apply_queue(broker, queue, Detach(consumer.consumer_id, broker.now_ms))
    else:
        consumer.cancelled = True
        ch.lingering.append(consumer)
        apply_queue(broker, queue, Cancel(consumer.consumer_id, broker.now_ms))


def _leave_queue(queue: QueueState, consumer: Consumer) -> None:
    queue.consumers.pop(consumer.consumer_id, None)
    if queue.exclusive_consumer == consumer.consumer_id:
        queue.exclusive_consumer = None


def _drop_pending(broker: BrokerState, ch: ChannelState, consumer: Consumer) -> None:
    if not ch.pending:
        return
    keep = [p for p in ch.pending if p.consumer is not consumer]
    gone = [p.msg_id for p in ch.pending if p.consumer is consumer]
    ch.pending.clear()
    ch.pending.extend(keep)
    if gone and not consumer.no_ack:
        apply_queue(broker, consumer.queue, Return(consumer.consumer_id, gone, broker.now_ms))


def cancel_queue_consumers(broker: BrokerState, queue: QueueState, cancels: list[Effect] | None = None) -> None:
    """The queue is gone: tell every consumer with a server-sent basic.cancel (consumer_cancel_notify).

    The cancels are appended to `cancels` when given (the caller places them after its reply), else to out.
    """
    sink = broker.out if cancels is None else cancels
    for consumer in list(queue.consumers.values()):
        ch = consumer.channel
        ch.consumers.pop(consumer.tag, None)
        broker.consumers.pop(consumer.consumer_id, None)
        ch.pending = type(ch.pending)(p for p in ch.pending if p.consumer is not consumer)
        conn = broker.conns.get(ch.conn_id)
        if conn is not None and conn.cancel_notify and not ch.closed:
            sink.append(Send(ch.conn_id, ch.number, m.BasicCancel(consumer_tag=consumer.tag, nowait=True)))
    queue.consumers.clear()
    queue.exclusive_consumer = None


def channel_gone(broker: BrokerState, ch: ChannelState) -> None:
    """Channel closed: consumers detached (their unacked come back redelivered), gets returned, tx dropped."""
    now_ms = broker.now_ms
    ch.pending.clear()
    get_holders: dict[tuple[int, Any], tuple[QueueState, Any]] = {}  # (queue, getter id): one per channel or get
    for entry in list(ch.unacked.values()) + [a[1] for a in (ch.tx.acks if ch.tx else [])]:
        if entry.consumer is None:
            get_holders[(id(entry.queue), entry.consumer_id)] = (entry.queue, entry.consumer_id)
    ch.unacked.clear()
    ch.tx = None
    for consumer in list(ch.consumers.values()) + ch.lingering:
        broker.consumers.pop(consumer.consumer_id, None)
        _leave_queue(consumer.queue, consumer)
        apply_queue(broker, consumer.queue, Detach(consumer.consumer_id, now_ms))
    ch.consumers.clear()
    ch.lingering.clear()
    for queue, getter_id in get_holders.values():
        apply_queue(broker, queue, Detach(getter_id, now_ms))


# --- get / ack / nack / reject / recover --------------------------------------------------------------------------


def basic_get(broker: BrokerState, conn: ConnState, ch: ChannelState, method: m.BasicGet) -> None:
    queue = lookup_queue(broker, conn, ch, method.queue)
    broker.check_access(conn, "read", "queue", queue.name)
    check_exclusive(conn, queue)
    backend_of(queue).get(broker, ch, queue, method.no_ack)


def get_now(broker: BrokerState, ch: ChannelState, queue: QueueState, no_ack: bool) -> None:
    """basic.get of a queue whose machine applies commands at once (`LocalBackend.get`)."""
    ch.get_no_ack = no_ack
    apply_queue(broker, queue, Get(ch.get_consumer_id, no_ack, broker.now_ms))


def collect_tags(ch: ChannelState, delivery_tag: int, multiple: bool) -> list[int]:
    if multiple:
        if delivery_tag == 0:
            return list(ch.unacked)
        unacked = ch.unacked
        if delivery_tag not in unacked:
            raise precondition(f"unknown delivery tag {delivery_tag}")
        first = next(iter(unacked))
        if next(reversed(unacked)) - first + 1 == len(unacked):  # ascending and contiguous: no gaps to skip
            return list(range(first, delivery_tag + 1))
        tags: list[int] = []
        for tag in ch.unacked:  # ascending (see ChannelState.unacked): stop at the first one past delivery_tag
            if tag > delivery_tag:
                break
            tags.append(tag)
        return tags
    if delivery_tag not in ch.unacked:
        raise precondition(f"unknown delivery tag {delivery_tag}")
    return [delivery_tag]


def basic_ack(broker: BrokerState, conn: ConnState, ch: ChannelState, method: m.BasicAck) -> None:
    if not method.multiple and ch.tx is None:  # the hot path: one tag, settled now
        entry = ch.unacked.pop(method.delivery_tag, None)
        if entry is None:
            raise precondition(f"unknown delivery tag {method.delivery_tag}")
        _settle_one(broker, entry)
        if ch.pending or ch.prefetch_channel:
            broker.mark_dirty(ch)
        return
    _settle_tags(broker, ch, collect_tags(ch, method.delivery_tag, method.multiple), "ack", False)


def _settle_one(broker: BrokerState, entry: Unacked) -> None:
    """settle_entries(broker, [entry], "ack", False), unrolled."""
    queue, msg_id = entry.queue, entry.msg_id
    effects = queue.machine.apply(Settle(entry.consumer_id, (msg_id,)))
    if effects:
        _handle_effects(broker, queue, effects)
    if queue.persisted_ids:
        forget_persisted(broker, queue, (msg_id,))
    consumer = entry.consumer
    if consumer is not None:
        consumer.unacked_count -= 1
        if consumer.cancelled and consumer.unacked_count <= 0:
            _finish_lingering(broker, consumer)


def basic_nack(broker: BrokerState, conn: ConnState, ch: ChannelState, method: m.BasicNack) -> None:
    _settle_tags(broker, ch, collect_tags(ch, method.delivery_tag, method.multiple), "reject", method.requeue)


def basic_reject(broker: BrokerState, conn: ConnState, ch: ChannelState, method: m.BasicReject) -> None:
    _settle_tags(broker, ch, collect_tags(ch, method.delivery_tag, False), "reject", method.requeue)


def _settle_tags(broker: BrokerState, ch: ChannelState, tags: list[int], kind: str, requeue: bool) -> None:
    entries = list(map(ch.unacked.pop, tags))
    if ch.tx is not None:
        ch.tx.acks.extend((tag, entry, kind, requeue) for tag, entry in zip(tags, entries, strict=True))
        return
    settle_entries(broker, entries, kind, requeue)
    if ch.pending or ch.prefetch_channel:
        broker.mark_dirty(ch)


def _settle_groups(entries: list[Unacked]) -> Iterable[list[Unacked]]:
    """The entries grouped by (queue, consumer id), in order of first appearance. A multiple ack of one
    consumer's deliveries (the common case) is one group, found with C-level scans only."""
    if len(entries) > 1:
        queues, consumer_ids, _ids, _consumers = zip(*entries, strict=True)
        if len(set(map(id, queues))) == 1 and len(set(consumer_ids)) == 1:
            return (entries,)
    groups: dict[tuple[int, Hashable], list[Unacked]] = {}
    for entry in entries:
        key = (id(entry.queue), entry.consumer_id)
        group = groups.get(key)
        if group is None:
            groups[key] = [entry]
        else:
            group.append(entry)
    return groups.values()


def settle_entries(broker: BrokerState, entries: list[Unacked], kind: str, requeue: bool) -> None:
    now_ms = broker.now_ms
    for group in _settle_groups(entries):
        queue, consumer_id = group[0].queue, group[0].consumer_id
        ids = [e.msg_id for e in group]
        if kind == "ack":
            apply_queue(broker, queue, Settle(consumer_id, ids))
            forget_persisted(broker, queue, ids)
        elif requeue:
            apply_queue(broker, queue, Return(consumer_id, ids, now_ms))
        else:
            apply_queue(broker, queue, Discard(consumer_id, ids, now_ms))
        consumer = group[0].consumer
        if consumer is not None:
            consumer.unacked_count -= len(group)
            if consumer.cancelled and consumer.unacked_count <= 0:
                _finish_lingering(broker, consumer)


def _finish_lingering(broker: BrokerState, consumer: Consumer) -> None:
    ch = consumer.channel
    if consumer in ch.lingering:
        ch.lingering.remove(consumer)
    broker.consumers.pop(consumer.consumer_id, None)
    apply_queue(broker, consumer.queue, Detach(consumer.consumer_id, broker.now_ms))


def basic_recover(broker: BrokerState, conn: ConnState, ch: ChannelState, method: Any) -> None:
    if not method.requeue:
        raise AmqpError(540, "requeue=false", connection=True)
    entries = list(ch.unacked.values())
    ch.unacked.clear()
    settle_entries(broker, entries, "reject", True)
    if isinstance(method, m.BasicRecover):
        broker.out.append(Send(ch.conn_id, ch.number, m.BasicRecoverOk()))
    broker.mark_dirty(ch)


def basic_qos(broker: BrokerState, conn: ConnState, ch: ChannelState, method: m.BasicQos) -> None:
    if method.prefetch_size != 0:
        raise AmqpError(540, f"prefetch_size!=0 ({method.prefetch_size})", connection=True)
    if method.global_:
        ch.prefetch_channel = method.prefetch_count
    else:
        ch.prefetch_consumer = method.prefetch_count
    broker.out.append(Send(ch.conn_id, ch.number, m.BasicQosOk()))
    broker.mark_dirty(ch)
