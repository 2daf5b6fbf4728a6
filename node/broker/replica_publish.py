"""Replicated mode: publishing, and the publish outcomes that release confirms and tx.commit-ok (pure).

`route_publish` (installed as `BrokerState.publish_route`) routes a publish and proposes one Enqueue per target
queue, with the channel's publisher id `(node, boot_id, conn_id, channel)` and a sequence counted per channel
number of the connection; `tx_commit` does the same for a transaction's publishes. Each target queue's replica on
this node answers with Accepted, Duplicate or Rejected as the entry commits (`replica.apply_committed` calls
`on_outcome`); a publish is confirmed when every target accepted it (or saw a duplicate) and nacked on a rejection
or abandonment. Confirms released during one entry point go out per channel (`flush_confirms`). `forget_queue`
releases what waited on a deleted queue (called by `definitions.delete_queue`). A node-local exclusive queue
(node/broker/backend_owned.py) is not proposed to: on its owner's node the Enqueue applies at once, elsewhere the
publish leaves as `ForwardPublish` and its outcome comes back through `on_outcome` too (`forward_outcome`).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from cluster.queue import Enqueue, QueuedMessage
from cluster.queue.ids import DeadLetterPublisher
from node.amqp import methods as m
from node.broker import delivery, publish, replica_dead_letters
from node.broker.backend import PublishPath
from node.broker.channel import ChannelState, ConnState, Message, PendingPublish, TxState
from node.broker.effects import ForwardPublish, Send, SendContent
from node.broker.errors import precondition
from node.broker.queues import QueueState
from node.broker.replica_machine import ACCEPTED, DUPLICATE, REJECTED, propose, queue_of
from node.broker.replica_wire import propose_enqueue
from node.broker.state import BrokerState
from node.broker.vhost import VHost

_new_message = tuple.__new__  # Message(...) without the named tuple's Python-level __new__ (one per publish)


# --- publishing ----------------------------------------------------------------------------------------------


def route_publish(broker: BrokerState, ch: ChannelState, vhost: VHost[QueueState], method: Any, props: Any,
                  body: bytes, seq: int, ttl_ms: int | None) -> list[int]:
    """`publish.route_publish` of replicated mode: one Enqueue proposal per target queue."""
    return _route(broker, ch, vhost, method, props, body, seq, ttl_ms, 0)


def _route(broker: BrokerState, ch: ChannelState, vhost: VHost[QueueState], method: Any, props: Any, body: bytes,
           seq: int, ttl_ms: int | None, commit_id: int) -> list[int]:
    """Route and propose; returns [publish sequence] when a confirm or commit now waits for it, else []."""
    name, routing_key = method.exchange, method.routing_key
    msg = _new_message(Message, (name, routing_key, props, body))
    targets: tuple[str, ...] = ()
    if name == "" and routing_key.startswith(publish.REPLY_TO_PREFIX):
        routed = publish._deliver_reply(broker, msg)
    else:
        targets = vhost.route(name, routing_key, props.headers)
        routed = bool(targets)
    if routed:
        broker.messages_routed += 1
    elif method.mandatory:
        broker.messages_unroutable_returned += 1
        ret = m.BasicReturn(reply_code=312, reply_text="NO_ROUTE", exchange=name, routing_key=routing_key)
        broker.out.append(SendContent(ch.conn_id, ch.number, ret, props, body))
    else:
        broker.messages_unroutable_dropped += 1
    pending = PendingPublish(seq, commit_id) if seq or commit_id else None
    sequence = 0
    rejected = False
    if targets:
        sequence = _next_sequence(ch)
        message = QueuedMessage(msg, len(body), props.delivery_mode == 2, props.priority or 0, ttl_ms)
        queues, now_ms, publisher_id = vhost.queues, broker.now_ms, ch.publisher_id
        touched = broker.flow_touched
        for queue_name in targets:
            queue = queues.get(queue_name)
            if queue is None:
                continue
            path = queue.backend.publish_path  # (a QueueBackend: node/broker/backend.py)
            if path is not PublishPath.PROPOSE:  # a node-local exclusive queue (node/broker/backend_owned.py)
                if path is PublishPath.ENQUEUE:
                    local = QueuedMessage(msg, len(body), False, props.priority or 0, ttl_ms)  # (never stored)
                    rejected = delivery.enqueue(broker, queue, Enqueue(local, now_ms)) < 0 or rejected
                    continue
                owner = str(queue.exclusive_owner).rsplit("/", 2)[0]
                queue.flow_inflight += 1
                touched[id(queue)] = queue
                broker.out.append(ForwardPublish(owner, vhost.name, queue_name, props, body, publisher_id, sequence,
                                              name, routing_key))
                if pending is not None:
                    pending.targets[(vhost.name, queue_name)] = Enqueue(message, now_ms, publisher_id, sequence)
                continue
            touched[id(queue)] = queue  # credit flow: looked at after this read (credit_flow.after_read)
            command = Enqueue(message, now_ms, publisher_id, sequence)
            propose_enqueue(broker, queue, command)
            if pending is not None:
                pending.targets[(vhost.name, queue_name)] = command
    if pending is not None and pending.targets:
        pending.nacked = pending.nacked or rejected
        ch.repl_waiting[sequence] = pending
        pending.sequences.append(sequence)
        if seq:
            ch.confirm_waiting[seq] = 1
        return [sequence]
    if seq:
        publish.confirm_ready(broker, ch, () if rejected else (seq,), (seq,) if rejected else ())
    return []


def _next_sequence(ch: ChannelState) -> int:
    """The channel's next publish sequence; counted per channel number of the connection, so a reopened channel
    (same publisher id) continues above what the queues' publisher dedup has seen."""
    conn = ch.conn
    assert conn is not None
    sequence = conn.publish_seqs.get(ch.number, 0) + 1
    conn.publish_seqs[ch.number] = sequence
    return sequence


def tx_commit(broker: BrokerState, conn: ConnState, ch: ChannelState, method: m.TxCommit) -> None:
    """commit-ok goes out, in order, once every target queue applied every publish of the commit."""
    if ch.tx is None:
        raise precondition("channel is not transactional")
    tx, ch.tx = ch.tx, TxState()
    vhost = broker.vhost_of(conn)
    commit_id = ch.next_commit_id
    ch.next_commit_id = commit_id + 1
    waiting = 0
    for publish_method, props, body in tx.publishes:
        ttl_ms = publish.parse_expiration(props.expiration)
        waiting += len(_route(broker, ch, vhost, publish_method, props, body, 0, ttl_ms, commit_id))
    for _tag, entry, kind, requeue in tx.acks:
        delivery.settle_entries(broker, [entry], kind, requeue)
    broker.mark_dirty(ch)
    ch.commits_waiting[commit_id] = waiting
    publish._release_commits(broker, ch)


def on_outcome(broker: BrokerState, key: tuple[str, str], publisher_id: Any, sequence: Any, outcome: str) -> None:
    """One target queue's answer to a publish of a local channel."""
    ch = broker.publishers.get(publisher_id) if publisher_id is not None else None
    if ch is None:
        if type(publisher_id) is DeadLetterPublisher:
            replica_dead_letters.on_dead_letter_outcome(broker, key, publisher_id, sequence, outcome)
        return
    pending = ch.repl_waiting.get(sequence)
    command = pending.targets.get(key) if pending is not None else None
    if pending is None or command is None or command.sequence != sequence:
        return
    if outcome == DUPLICATE and key not in pending.resent:
        # This replica applied every entry and saw no Accepted for it: a later sequence of the channel committed
        # first (a retry reordered them) and the machine's high-water took this one for a retry. Send it again.
        _resend(broker, ch, pending, key, command)
        return
    del pending.targets[key]
    if outcome == REJECTED:
        pending.nacked = True
    if not pending.targets:
        _finish_pending(broker, ch, pending)


def _resend(broker: BrokerState, ch: ChannelState, pending: PendingPublish, key: tuple[str, str], command: Enqueue
            ) -> None:
    queue = queue_of(broker, *key)
    if queue is None:
        on_outcome(broker, key, ch.publisher_id, command.sequence, ACCEPTED)
        return
    sequence = _next_sequence(ch)
    resent = Enqueue(command.message, broker.now_ms, ch.publisher_id, sequence)
    pending.targets[key] = resent
    pending.sequences.append(sequence)
    ch.repl_waiting[sequence] = pending
    propose(broker, queue, resent)


def _finish_pending(broker: BrokerState, ch: ChannelState, pending: PendingPublish) -> None:
    for sequence in pending.sequences:
        ch.repl_waiting.pop(sequence, None)
    _complete(broker, ch, pending)


def _complete(broker: BrokerState, ch: ChannelState, pending: PendingPublish) -> None:
    if pending.confirm_seq:
        ch.confirm_waiting.pop(pending.confirm_seq, None)
        entry = broker.confirm_batch.get(id(ch))
        if entry is None:
            entry = broker.confirm_batch[id(ch)] = (ch, [], [])
        (entry[2] if pending.nacked else entry[1]).append(pending.confirm_seq)
    if pending.commit_id:
        publish._commit_persisted(broker, ch, pending.commit_id)


def flush_confirms(broker: BrokerState) -> None:
    """Send the confirms released during this entry point, per channel (a contiguous run: one multiple ack)."""
    if not broker.confirm_batch:
        return
    batch, broker.confirm_batch = broker.confirm_batch, {}
    for ch, acks, nacks in batch.values():
        if not ch.closed:
            publish.confirm_ready(broker, ch, acks, tuple(nacks))


# --- gets and deleted queues ---------------------------------------------------------------------------------


def answer_get_empty(broker: BrokerState, getter_id: Hashable) -> None:
    waiting = broker.pending_gets.pop(getter_id, None)
    if waiting is not None and not waiting[0].closed:
        ch = waiting[0]
        broker.out.append(Send(ch.conn_id, ch.number, m.BasicGetEmpty()))


def forget_queue(broker: BrokerState, queue: QueueState) -> None:
    """The queue was deleted: publishes waiting for it count it as done (as RabbitMQ confirms a message whose
    queue went away), gets waiting on it are answered empty."""
    key = (queue.vhost, queue.name)
    for ch in list(broker.publishers.values()):
        for pending in list(ch.repl_waiting.values()):
            command = pending.targets.get(key)
            if command is not None:
                on_outcome(broker, key, ch.publisher_id, command.sequence, ACCEPTED)
    for getter_id, (_ch, get_queue, _no_ack, _proposal_id) in list(broker.pending_gets.items()):
        if get_queue is queue:
            answer_get_empty(broker, getter_id)
    flush_confirms(broker)  # (this may run inside a client's entry point, which does not flush)
