"""The broker's replicated mode (docs/cluster.md): queue commands go out as proposals, committed entries come back.

Every queue's `QueueState.machine` is a `ProposingMachine` (`replica_machine`): its `apply(command)` emits
`ProposeQueue` and returns no effects, and every read (`ready_count`, `next_expiry_ms()`, `args`, ...) is answered
by the local replica (`.replica`, a `cluster.queue.replicated.ReplicatedQueue`). So the single-node handlers
(consume, ack, credit, cancel, channel close) run unchanged and propose instead of applying. Publishing, basic.get,
queue.purge and tx.commit have their own handlers: they need to wait for the outcome (basic.get and queue.purge
here, publishing and tx.commit in `replica_publish`).

`apply_committed` runs one committed entry on the local replica and acts on its effects for this node's own
parties only: deliveries to local consumers (`ConsumerId(node, boot_id, n)`), get answers to local getters
(`GetterId(node, boot_id, n)`, fresh per basic.get), Accepted/Duplicate/Rejected to local publishers
(`ChannelPublisherId(node, boot_id, conn_id, channel)`, sequence counted per channel number of the connection;
the ids are cluster/queue/ids.py's). A publish is confirmed
when every target queue's replica applied Accepted or Duplicate for it (nacked on Rejected or abandonment).

What the machine decides is the same on every replica; what is proposed in reaction is decided by one node:
the owner of an id (a stray delivery or get answer for a local id that is gone: Detach/Return; an Attach of this
node's earlier boot: Detach) or the queue's local leader (`set_leader`): Expire for TTL, dead-letter republishing
(publisher id `AtMostOnceDeadLetterPublisher(vhost, queue)`, sequence = the machine's `DeadLetter.seq`, the same on every
replica, so a retried or repeated republish is deduplicated by the target), and Detach of the
consumers of a node reported down (those duties, the timers and the queue snapshots are in `replica_control`).
Auto-delete and x-expires are the machine's decisions (cluster/queue/usage.py: `QueueUnused` when the last consumer
left, `QueueExpired` at an `Expire` the leader proposed when the machine's `next_expiry_ms()` was due); the node
that proposed the command carries the deletion out, so a client's cancel-ok waits for it (`read_your_writes`); a
new leader, or the leader after 5 s of an unused queue (`replica_control.tick`), deletes one whose deciding node
went away first (`maybe_auto_delete`).
This node's own entries end their read-your-writes tickets once applied (`read_your_writes.done`).
Dead-lettering is at most once across a leader change (as RabbitMQ's default for quorum queues); with
x-dead-letter-strategy at-least-once (and reject-publish) the machine holds the message until the leader saw every
target accept it (`replica_dead_letters`). Per-queue bookkeeping that is a function of the log (`members`)
travels in the queue snapshot with the replica.

A log entry is a `cluster.queue.envelope.Envelope` (incarnation, origin, proposal id, command); the cluster runtime
encodes and reads them with `Broker.envelope_codec` and hands this module envelopes only, once per applied batch
(`apply_committed`). The message payload codec and publish batching into `EnqueueMany` are in `replica_wire`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from cluster.queue import (
    Accepted,
    AddCredit,
    Attach,
    DeadLetter,
    Deliver,
    Detach,
    Discard,
    Duplicate,
    Enqueue,
    EnqueueMany,
    Expire,
    Get,
    GetEmpty,
    GetOk,
    Purge,
    Purged,
    QueueExpired,
    QueueUnused,
    Rejected,
    Return,
    Settle,
    SettleDeadLettered,
)
from cluster.queue.envelope import Envelope
from cluster.queue.ids import AtMostOnceDeadLetterPublisher, DeadLetterPublisher, GetterId
from node.amqp import methods as m
from node.broker import credit_flow, delivery, read_your_writes, replica_dead_letters, trace
from node.broker.channel import ChannelState, Message, Unacked
from node.broker.definitions import delete_queue
from node.broker.effects import CloseChannel, Send, SendContent
from node.broker.queues import QueueState
from node.broker.replica_dead_letters import dead_letter_copy
from node.broker.replica_machine import (
    ACCEPTED,
    DUPLICATE,
    REJECTED,
    TRACKED_IDS_MAX,
    is_local,
    is_stale,
    propose,
    queue_of,
    replica_of,
)
from node.broker.replica_publish import answer_get_empty, on_outcome, tx_commit
from node.broker.replica_wire import BATCH_BYTES_MAX as BATCH_BYTES_MAX
from node.broker.replica_wire import BATCH_MESSAGES_MAX as BATCH_MESSAGES_MAX
from node.broker.replica_wire import decode_payload as decode_payload
from node.broker.state import BrokerState

DETACH_RETRIES_MAX: Final = 10  # times an abandoned Detach of a gone local consumer is proposed again


# --- publishing ----------------------------------------------------------------------------------------------


# --- basic.get -------------------------------------------------------------------------------------------------


def basic_get(broker: BrokerState, ch: ChannelState, queue: QueueState, no_ack: bool) -> None:
    """basic.get of a Raft queue (`ReplicatedBackend.get`): answered when this node's replica applied the Get."""
    getter_id = broker.new_getter_id()
    # Always a Get with ack: a no-ack get is settled once its answer reached this node, so an answer this node
    # never saw (the client left) is returned instead of lost.
    proposal_id = propose(broker, queue, Get(getter_id, False, broker.now_ms))
    broker.pending_gets[getter_id] = (ch, queue, no_ack, proposal_id)


def answer_get_ok(broker: BrokerState, queue: QueueState, effect: GetOk, command: Any) -> None:
    """The Get of `effect.consumer_id` took a message (`command`: the Get applied, None when a snapshot restore
    found it taken): get-ok to the channel that waits, which holds it unacked (or settles it: no-ack); nobody
    waiting any more, it goes back to the queue."""
    getter_id = effect.consumer_id
    waiting = broker.pending_gets.pop(getter_id, None)
    if waiting is None or waiting[0].closed:
        if is_local(broker, getter_id) and not (isinstance(command, Get) and command.no_ack):
            propose(broker, queue, Return(getter_id, (effect.msg_id,), broker.now_ms))  # nobody waits for it
        return
    ch, _queue_waited, no_ack, _proposal_id = waiting
    msg: Message = effect.message.payload
    tag = ch.next_delivery_tag
    ch.next_delivery_tag = tag + 1
    if no_ack:
        propose(broker, queue, Settle(getter_id, (effect.msg_id,)))
    else:
        ch.unacked[tag] = Unacked(queue, getter_id, effect.msg_id, None)
    ok = m.BasicGetOk(delivery_tag=tag, redelivered=effect.redelivered, exchange=msg.exchange,
                      routing_key=msg.routing_key, message_count=effect.remaining)
    broker.out.append(SendContent(ch.conn_id, ch.number, ok, msg.properties, msg.body))
    if broker.trace_vhosts and queue.vhost in broker.trace_vhosts:  # Firehose (node/broker/trace.py)
        trace.tap_out(broker, ch, queue.vhost, queue.name, msg, effect.redelivered)


def queue_purge(broker: BrokerState, ch: ChannelState, queue: QueueState, nowait: bool) -> None:
    """queue.purge of a Raft queue (`ReplicatedBackend.purge`): purge-ok only once this node's replica applied the
    Purge: a message confirmed after purge-ok was enqueued after the Purge in the log, so the purge cannot take it
    (purge-ok at once lost such messages)."""
    queue.purge_waiters.append((ch, nowait))
    propose(broker, queue, Purge())


def _answer_purge(broker: BrokerState, queue: QueueState, count: int | None) -> None:
    """This node's oldest waiting purge: purge-ok with the count, or (None: given up) a channel error."""
    if not queue.purge_waiters:
        return
    ch, nowait = queue.purge_waiters.pop(0)
    if ch.closed:
        return
    if count is None:
        broker.out.append(CloseChannel(ch.conn_id, ch.number, 541, f"INTERNAL_ERROR - purge of {queue.resource} "
                                       "was not committed in time", m.QueuePurge.CLASS_ID, m.QueuePurge.METHOD_ID))
    elif not nowait:
        broker.out.append(Send(ch.conn_id, ch.number, m.QueuePurgeOk(message_count=count)))


HANDLERS: dict[type, Any] = {m.TxCommit: tx_commit}


_NO_ID: Final = object()  # matches no consumer or publisher id


# --- committed entries ------------------------------------------------------------------------------------------


def apply_committed(broker: BrokerState, vhost: str, name: str, envelopes: Iterable[Envelope]) -> None:
    """A group's committed entries, in log order, as envelopes of the queue's incarnation (cluster/queue/envelope.py:
    the runtime read them; an unknown queue ignores them)."""
    me = broker.config.node_name
    for envelope in envelopes:
        _apply_committed(broker, vhost, name, envelope)
        if broker.proposal_tickets and envelope.origin == me:
            read_your_writes.done(broker, envelope.proposal_id)  # (after the apply: what waited sees its effect)


def _apply_committed(broker: BrokerState, vhost: str, name: str, envelope: Envelope) -> None:
    queue = queue_of(broker, vhost, name)
    if queue is None:
        return
    replica = replica_of(queue)
    origin = envelope.origin
    proposal = envelope.proposal
    if replica.seen(origin, envelope.proposal_id):  # a retried proposal applied before: skipped
        replica.apply(proposal)  # counts the skip; the command is not looked at
        return
    command: Any = proposal.command
    queue.flow_applied += 1
    if origin == broker.config.node_name:
        kind = type(command)
        if kind is EnqueueMany:
            credit_flow.inflight_done(queue, len(command.sequences))
        elif kind is Enqueue:
            credit_flow.inflight_done(queue, 1)
    if type(command) is SettleDeadLettered:
        replica_dead_letters.before_settle_dead_lettered(queue, command.msg_ids)
    effects: list[Any] | None = replica.apply(proposal)
    if effects is None:
        return
    key = (vhost, name)
    consumers = broker.consumers
    elsewhere_consumer: Any = _NO_ID  # a consumer of another node: its deliveries are that node's business
    unwatched_publisher: Any = _NO_ID  # a publisher nobody here waits for (a batch's effects share the id object)
    unused = False  # the machine decided to delete the queue (auto-delete, x-expires)
    for effect in effects:
        kind = type(effect)
        if kind is Deliver:
            cid = effect.consumer_id
            if cid is elsewhere_consumer:
                continue
            if cid not in consumers and not is_local(broker, cid):
                elsewhere_consumer = cid
                continue
            _on_deliver(broker, queue, effect)
        elif kind is Accepted:
            publisher_id = effect.publisher_id
            if publisher_id is unwatched_publisher:
                continue
            if _unwatched(broker, publisher_id):
                unwatched_publisher = publisher_id
                continue
            on_outcome(broker, key, publisher_id, effect.sequence, ACCEPTED)
        elif kind is Duplicate:
            on_outcome(broker, key, effect.publisher_id, effect.sequence, DUPLICATE)
        elif kind is Rejected:
            on_outcome(broker, key, effect.publisher_id, effect.sequence, REJECTED)
        elif kind is GetOk:
            answer_get_ok(broker, queue, effect, command)
        elif kind is GetEmpty:
            answer_get_empty(broker, effect.consumer_id)
        elif kind is Purged:
            if proposal.origin == broker.config.node_name:
                _answer_purge(broker, queue, effect.count)
        elif kind is DeadLetter:
            if not queue.is_leader:
                continue
            if effect.held_seq is None:
                _republish_dead_letter(broker, queue, effect)
            else:
                replica_dead_letters.send_held(broker, queue, effect.msg_id, effect.held_seq, effect.reason,
                                          effect.message)
        elif kind is QueueUnused or kind is QueueExpired:
            unused = True
    _after_command(broker, queue, command, origin)
    if unused and origin == broker.config.node_name:
        delete_queue(broker, queue)  # (the proposing node carries the machine's decision out)


def _unwatched(broker: BrokerState, publisher_id: Any) -> bool:
    """No local channel or dead-letter sender waits for this publisher's outcomes (on_outcome would do nothing)."""
    if publisher_id is None:
        return True
    if publisher_id in broker.publishers:
        return False
    return type(publisher_id) is not DeadLetterPublisher


def deliver_unseen(broker: BrokerState, queue: QueueState, consumer_id: Any, msg_ids: list[Any]) -> None:
    """Deliveries the replica made to a local consumer that this node never sent (a restored snapshot covered
    them): sent now, as their Deliver effects would have been (returned if the consumer cannot take them now)."""
    machine = replica_of(queue).queue
    for msg_id in msg_ids:
        held = machine.unacked_message(consumer_id, msg_id)
        if held is not None:
            message, redelivered, delivery_count = held
            _on_deliver(broker, queue, Deliver(consumer_id, msg_id, message, redelivered, delivery_count))


def _on_deliver(broker: BrokerState, queue: QueueState, effect: Deliver) -> None:
    cid = effect.consumer_id
    consumer = broker.consumers.get(cid)
    if consumer is None:
        if is_local(broker, cid) and cid not in broker.detaching:  # its Detach was lost: propose it again
            propose(broker, queue, Detach(cid, broker.now_ms))
        return
    if consumer.cancelled or consumer.channel.closed or consumer.queue is not queue:
        propose(broker, queue, Return(cid, (effect.msg_id,), broker.now_ms))
        return
    delivery._on_deliver(broker, queue, effect)


def _after_command(broker: BrokerState, queue: QueueState, command: Any, origin: str) -> None:
    """Bookkeeping every replica does alike (members, counters), then what this node proposes in reaction."""
    kind = type(command)
    if kind is Attach:
        cid = command.consumer_id
        queue.members[cid] = None
        if is_stale(broker, cid):
            propose(broker, queue, Detach(cid, broker.now_ms))
    elif kind is Detach:
        _after_detach(broker, queue, command, origin)
    elif kind is Get:
        if not command.no_ack and replica_of(queue).queue.unacked_msg_ids(command.consumer_id):
            queue.members[command.consumer_id] = None
    elif kind is Settle or kind is Return or kind is Discard:
        cid = command.consumer_id
        if type(cid) is GetterId and cid in queue.members and not replica_of(queue).queue.unacked_msg_ids(cid):
            del queue.members[cid]
    elif kind is Expire:
        queue.expire_proposed_ms = None


def _after_detach(broker: BrokerState, queue: QueueState, command: Detach, origin: str) -> None:
    cid = command.consumer_id
    queue.members.pop(cid, None)
    broker.down_consumers.pop(cid, None)
    broker.detach_retries.pop(cid, None)
    expected = broker.detaching.pop(cid, "absent") != "absent"
    consumer = broker.consumers.get(cid)
    if consumer is not None and not expected and consumer.queue is queue and not consumer.cancelled:
        reattach(broker, queue, consumer)  # detached by a leader that thought this node down: come back


def reattach(broker: BrokerState, queue: QueueState, consumer: Any) -> None:
    consumer.credit = 0
    consumer.granted = False
    propose(broker, queue, Attach(consumer.consumer_id, broker.now_ms, prefetch=consumer.prefetch, credit=0,
                                  priority=consumer.priority, no_ack=consumer.no_ack))
    broker.mark_dirty(consumer.channel)


def maybe_auto_delete(broker: BrokerState, queue: QueueState) -> None:
    """The leader's fallback for an auto-delete queue the machine reported unused (`QueueUnused`) whose proposing
    node went away before deleting it: a new leader (set_leader) or the leader's timer (replica_control.tick)."""
    if queue.is_leader and replica_of(queue).queue.unused:
        delete_queue(broker, queue)


def _republish_dead_letter(broker: BrokerState, queue: QueueState, effect: DeadLetter) -> None:
    dead, targets = dead_letter_copy(broker, queue, effect.message, effect.reason)
    publisher_id = AtMostOnceDeadLetterPublisher(queue.vhost, queue.name)
    vhost = broker.vhosts[queue.vhost]
    for _vhost, target in targets:
        target_queue = vhost.queues.get(target)
        if target_queue is not None and dead is not None:
            replica_dead_letters.send_copy(broker, target_queue, dead, publisher_id, effect.seq)


# --- abandoned proposals ----------------------------------------------------------------------------------------


def proposal_abandoned(broker: BrokerState, vhost: str, name: str, envelope: Envelope) -> None:
    """The runtime gave up on this node's proposal (`envelope`): whoever waits for it hears so."""
    if broker.proposal_tickets and envelope.origin == broker.config.node_name:
        read_your_writes.done(broker, envelope.proposal_id)  # first: a consume-ok it held goes out before a cancel
    command: Any = envelope.command
    kind = type(command)
    queue = queue_of(broker, vhost, name)
    if kind is Enqueue:
        if queue is not None:
            credit_flow.inflight_done(queue, 1)
        on_outcome(broker, (vhost, name), command.publisher_id, command.sequence, REJECTED)
    elif kind is EnqueueMany:
        if queue is not None:
            credit_flow.inflight_done(queue, len(command.sequences))
        for sequence in command.sequences:
            on_outcome(broker, (vhost, name), command.publisher_id, sequence, REJECTED)
    elif kind is Get:
        answer_get_empty(broker, command.consumer_id)
    elif kind is AddCredit:
        consumer = broker.consumers.get(command.consumer_id)
        if consumer is not None:
            consumer.credit = max(0, consumer.credit - command.credit)
            broker.mark_dirty(consumer.channel)
    elif kind is Attach:
        consumer = broker.consumers.get(command.consumer_id)
        if consumer is not None and queue is not None and consumer.queue is queue and not consumer.cancelled:
            _server_cancel(broker, consumer)
    elif kind is Detach:
        _detach_abandoned(broker, queue, command)
    elif kind is Expire and queue is not None:
        queue.expire_proposed_ms = None
    elif kind is Purge and queue is not None:
        _answer_purge(broker, queue, None)
    elif kind is SettleDeadLettered and queue is not None:
        replica_dead_letters.settle_abandoned(queue, command.msg_ids)


def _detach_abandoned(broker: BrokerState, queue: QueueState | None, command: Detach) -> None:
    """A local consumer that is gone must leave the machine, or its unacked messages stay stuck: propose the Detach
    again, at most DETACH_RETRIES_MAX times (after that, the next boot of this node detaches it as stale)."""
    cid = command.consumer_id
    broker.detaching.pop(cid, None)
    tries = broker.detach_retries.pop(cid, 0) + 1
    if queue is None or not is_local(broker, cid) or cid in broker.consumers or tries > DETACH_RETRIES_MAX:
        return
    if len(broker.detach_retries) < TRACKED_IDS_MAX:
        broker.detach_retries[cid] = tries
    propose(broker, queue, Detach(cid, broker.now_ms))


def _server_cancel(broker: BrokerState, consumer: Any) -> None:
    """The consumer could not be attached: cancel it as a deleted queue would (basic.cancel if supported)."""
    ch = consumer.channel
    delivery.cancel_consumer(broker, consumer)
    conn = broker.conns.get(ch.conn_id)
    if conn is not None and conn.cancel_notify and not ch.closed:
        broker.out.append(Send(ch.conn_id, ch.number, m.BasicCancel(consumer_tag=consumer.tag, nowait=True)))
