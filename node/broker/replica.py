"""The broker's replicated mode (docs/cluster.md): queue commands go out as proposals, committed entries come back.

Every queue's `QueueState.machine` is a `ProposingMachine`: its `apply(command)` emits `ProposeQueue` and returns
no effects, and every read (`ready_count`, `next_expiry_ms()`, `args`, ...) is answered by the local replica
(`.replica`, a `cluster.queue.replicated.ReplicatedQueue`). So the single-node handlers (consume, ack, credit,
cancel, channel close) run unchanged and propose instead of applying. Publishing, basic.get and tx.commit have
their own handlers here: they need to wait for the outcome.

`apply_committed` runs one committed entry on the local replica and acts on its effects for this node's own
parties only: deliveries to local consumers (ids `(node, boot_id, n)`), get answers to local getters (ids
`("get", node, boot_id, n)`, fresh per basic.get), Accepted/Duplicate/Rejected to local publishers (ids
`(node, boot_id, conn_id, channel)`, sequence counted per channel number of the connection). A publish is confirmed
when every target queue's replica applied Accepted or Duplicate for it (nacked on Rejected or abandonment).

What the machine decides is the same on every replica; what is proposed in reaction is decided by one node:
the owner of an id (a stray delivery or get answer for a local id that is gone: Detach/Return; an Attach of this
node's earlier boot: Detach) or the queue's local leader (`set_leader`): Expire for TTL, dead-letter republishing
(publisher id `("dlx", vhost, queue)`, sequence = the queue's count of DeadLetter effects, the same on every
replica, so a retried or repeated republish is deduplicated by the target), auto-delete, x-expires, and Detach of
the consumers of a node reported down (those duties, the timers and the queue snapshots are in `replica_control`).
Dead-lettering is at most once across a leader change (as RabbitMQ's default for quorum queues); with
x-dead-letter-strategy at-least-once (and reject-publish) the machine holds the message until the leader saw every
target accept it (`replica_control`, "at-least-once dead lettering"). Per-queue bookkeeping that is a function of the log (`members`, `dead_letter_seq`,
`had_consumer`) travels in the queue snapshot with the replica.

What goes into the log and how it is read back cheaply (the payload codec, decode-once, publish batching into
`EnqueueMany`) is in `replica_wire`; `apply_committed` skips an entry whose proposal id the replica has seen
(a retry) before decoding anything.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Any, Final

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
    QueueArgs,
    QueuedMessage,
    Rejected,
    Return,
    Settle,
    SettleDeadLettered,
)
from cluster.queue.replicated import (
    Proposal,
    ProposalDecodeError,
    ReplicatedQueue,
    peek_proposal,
)
from node.amqp import methods as m
from node.broker import credit_flow, delivery, publish
from node.broker.channel import ChannelState, ConnState, Message, PendingPublish, TxState, Unacked
from node.broker.definitions import check_exclusive, delete_queue, lookup_queue
from node.broker.effects import CloseChannel, ProposeQueue, Send, SendContent
from node.broker.errors import precondition
from node.broker.queues import QueueState
from node.broker.replica_wire import BATCH_BYTES_MAX as BATCH_BYTES_MAX
from node.broker.replica_wire import BATCH_MESSAGES_MAX as BATCH_MESSAGES_MAX
from node.broker.replica_wire import Batch, decoded, kept_proposal, propose_enqueue
from node.broker.replica_wire import decode_payload as decode_payload
from node.broker.replica_wire import encode as encode
from node.broker.vhost import VHost

if TYPE_CHECKING:
    from node.broker.broker import Broker

DETACH_RETRIES_MAX: Final = 10  # times an abandoned Detach of a gone local consumer is proposed again
TRACKED_IDS_MAX: Final = 65536  # bound of the detaching / down-consumer sets (cleared when full)


# --- ids --------------------------------------------------------------------------------------


def _id_parts(cid: Any) -> tuple[Any, Any]:
    """(node, boot_id) of a consumer id (node, boot, n) or getter id ("get", node, boot, n); else (None, None)."""
    if type(cid) is tuple:
        if len(cid) == 3:
            return cid[0], cid[1]
        if len(cid) == 4 and cid[0] == "get":
            return cid[1], cid[2]
    return None, None


def id_node(cid: Any) -> Any:
    return _id_parts(cid)[0]


def is_local(broker: Broker, cid: Any) -> bool:
    """An id of this node's current life."""
    return _id_parts(cid) == (broker.config.node_name, broker.config.boot_id)


def is_stale(broker: Broker, cid: Any) -> bool:
    """An id of an earlier life of this node."""
    node, boot = _id_parts(cid)
    return bool(node == broker.config.node_name and boot != broker.config.boot_id)


def _is_getter(cid: Any) -> bool:
    return type(cid) is tuple and len(cid) == 4 and cid[0] == "get"


def global_owner(broker: Broker, owner: int | str | None) -> str | None:
    """An exclusive owner as the cluster knows it: "node/boot_id/conn_id" for a local connection."""
    if isinstance(owner, int):
        return f"{broker.config.node_name}/{broker.config.boot_id}/{owner}"
    return owner


def local_owner(broker: Broker, owner: str | None) -> tuple[int | str | None, bool]:
    """(the owner as QueueState keeps it, whether it is a connection of an earlier life of this node)."""
    if owner is None:
        return None, False
    parts = owner.rsplit("/", 2)
    if len(parts) == 3 and parts[0] == broker.config.node_name:
        if parts[1] == str(broker.config.boot_id) and parts[2].isdigit():
            return int(parts[2]), False
        return owner, True
    return owner, False


def track(ids: dict[Hashable, None], cid: Hashable) -> None:
    if len(ids) >= TRACKED_IDS_MAX:
        ids.clear()
    ids[cid] = None


# --- the proposing machine ----------------------------------------------------------------------------------------


class ProposingMachine:
    """Stands where the queue machine stands in single-node mode: commands are proposed, reads hit the replica."""

    __slots__ = ("_broker", "_queue", "batch", "replica")

    def __init__(self, broker: Broker, queue: QueueState, args: QueueArgs) -> None:
        self._broker = broker
        self._queue = queue
        self.replica = ReplicatedQueue(queue.name, args)
        self.batch: Batch | None = None  # the open publish batch (propose_enqueue)
        queue.is_leader = (queue.vhost, queue.name) in broker.leading

    def apply(self, command: Any) -> list[Any]:
        propose(self._broker, self._queue, command)
        return []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.replica.queue, name)


def propose(broker: Broker, queue: QueueState, command: Any) -> None:
    if type(command) is Detach and is_local(broker, command.consumer_id):
        track(broker.detaching, command.consumer_id)
    machine = queue.machine
    if type(machine) is ProposingMachine:
        machine.batch = None  # a later publish must not overtake this command: it starts a new batch
    if type(command) is Enqueue:
        queue.flow_inflight += 1  # credit_flow.py: applied (or given up) later
    broker.out.append(ProposeQueue(queue.vhost, queue.name, command))


def queue_of(broker: Broker, vhost: str, name: str) -> QueueState | None:
    vh = broker.vhosts.get(vhost)
    queue = vh.queues.get(name) if vh is not None else None
    return queue if queue is not None and isinstance(queue.machine, ProposingMachine) else None


def replica_of(queue: QueueState) -> ReplicatedQueue:
    machine: ProposingMachine = queue.machine
    return machine.replica


# --- publishing ----------------------------------------------------------------------------------------------


def route_publish(broker: Broker, ch: ChannelState, vhost: VHost[QueueState], method: Any, props: Any,
                  body: bytes, seq: int, ttl_ms: int | None) -> list[int]:
    """`publish.route_publish` of replicated mode: one Enqueue proposal per target queue."""
    return _route(broker, ch, vhost, method, props, body, seq, ttl_ms, 0)


def _route(broker: Broker, ch: ChannelState, vhost: VHost[QueueState], method: Any, props: Any, body: bytes,
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
    if not routed and method.mandatory:
        ret = m.BasicReturn(reply_code=312, reply_text="NO_ROUTE", exchange=name, routing_key=routing_key)
        broker.out.append(SendContent(ch.conn_id, ch.number, ret, props, body))
    pending = PendingPublish(seq, commit_id) if seq or commit_id else None
    sequence = 0
    if targets:
        sequence = _next_sequence(ch)
        message = QueuedMessage(msg, len(body), props.delivery_mode == 2, props.priority or 0, ttl_ms)
        queues, now_ms, publisher_id = vhost.queues, broker.now_ms, ch.publisher_id
        touched = broker.flow_touched
        for queue_name in targets:
            queue = queues.get(queue_name)
            if queue is None:
                continue
            touched[id(queue)] = queue  # credit flow: looked at after this read (credit_flow.after_read)
            command = Enqueue(message, now_ms, publisher_id, sequence)
            propose_enqueue(broker, queue, command)
            if pending is not None:
                pending.targets[(vhost.name, queue_name)] = command
    if pending is not None and pending.targets:
        ch.repl_waiting[sequence] = pending
        pending.sequences.append(sequence)
        if seq:
            ch.confirm_waiting[seq] = 1
        return [sequence]
    if seq:
        publish.confirm_ready(broker, ch, (seq,), ())
    return []


def _next_sequence(ch: ChannelState) -> int:
    """The channel's next publish sequence; counted per channel number of the connection, so a reopened channel
    (same publisher id) continues above what the queues' publisher dedup has seen."""
    conn = ch.conn
    assert conn is not None
    sequence = conn.publish_seqs.get(ch.number, 0) + 1
    conn.publish_seqs[ch.number] = sequence
    return sequence


def tx_commit(broker: Broker, conn: ConnState, ch: ChannelState, method: m.TxCommit) -> None:
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


ACCEPTED, DUPLICATE, REJECTED = "accepted", "duplicate", "rejected"


def on_outcome(broker: Broker, key: tuple[str, str], publisher_id: Any, sequence: Any, outcome: str) -> None:
    """One target queue's answer to a publish of a local channel."""
    ch = broker.publishers.get(publisher_id) if publisher_id is not None else None
    if ch is None:
        if type(publisher_id) is tuple and len(publisher_id) >= 3 and publisher_id[0] == "dlx-alo":
            from node.broker import replica_control

            if replica_control.is_dead_letter_publisher(publisher_id):
                replica_control.on_dead_letter_outcome(broker, key, publisher_id, sequence, outcome)
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


def _resend(broker: Broker, ch: ChannelState, pending: PendingPublish, key: tuple[str, str], command: Enqueue
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


def _finish_pending(broker: Broker, ch: ChannelState, pending: PendingPublish) -> None:
    for sequence in pending.sequences:
        ch.repl_waiting.pop(sequence, None)
    _complete(broker, ch, pending)


def _complete(broker: Broker, ch: ChannelState, pending: PendingPublish) -> None:
    if pending.confirm_seq:
        ch.confirm_waiting.pop(pending.confirm_seq, None)
        entry = broker.confirm_batch.get(id(ch))
        if entry is None:
            entry = broker.confirm_batch[id(ch)] = (ch, [], [])
        (entry[2] if pending.nacked else entry[1]).append(pending.confirm_seq)
    if pending.commit_id:
        publish._commit_persisted(broker, ch, pending.commit_id)


def flush_confirms(broker: Broker) -> None:
    """Send the confirms released during this entry point, per channel (a contiguous run: one multiple ack)."""
    if not broker.confirm_batch:
        return
    batch, broker.confirm_batch = broker.confirm_batch, {}
    for ch, acks, nacks in batch.values():
        if not ch.closed:
            publish.confirm_ready(broker, ch, acks, tuple(nacks))


# --- basic.get -------------------------------------------------------------------------------------------------


def basic_get(broker: Broker, conn: ConnState, ch: ChannelState, method: m.BasicGet) -> None:
    queue = lookup_queue(broker, conn, ch, method.queue)
    broker.check_access(conn, "read", "queue", queue.name)
    check_exclusive(conn, queue)
    queue.last_used_ms = broker.now_ms
    getter_id = broker.new_getter_id()
    broker.pending_gets[getter_id] = (ch, queue, method.no_ack)
    # Always a Get with ack: a no-ack get is settled once its answer reached this node, so an answer this node
    # never saw (it installed a snapshot past it, or the client left) is returned instead of lost.
    propose(broker, queue, Get(getter_id, False, broker.now_ms))


def _on_get_ok(broker: Broker, queue: QueueState, effect: GetOk, command: Any) -> None:
    getter_id = effect.consumer_id
    waiting = broker.pending_gets.pop(getter_id, None)
    if waiting is None or waiting[0].closed:
        if is_local(broker, getter_id) and not (isinstance(command, Get) and command.no_ack):
            propose(broker, queue, Return(getter_id, (effect.msg_id,), broker.now_ms))  # nobody waits for it
        return
    ch, _queue_waited, no_ack = waiting
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


def answer_get_empty(broker: Broker, getter_id: Hashable) -> None:
    waiting = broker.pending_gets.pop(getter_id, None)
    if waiting is not None and not waiting[0].closed:
        ch = waiting[0]
        broker.out.append(Send(ch.conn_id, ch.number, m.BasicGetEmpty()))


def queue_purge(broker: Broker, conn: ConnState, ch: ChannelState, method: m.QueuePurge) -> None:
    """queue.purge-ok only once this node's replica applied the Purge: a message confirmed after purge-ok was
    enqueued after the Purge in the log, so the purge cannot take it (purge-ok at once lost such messages)."""
    queue = lookup_queue(broker, conn, ch, method.queue)
    broker.check_access(conn, "read", "queue", queue.name)
    check_exclusive(conn, queue)
    queue.purge_waiters.append((ch, method.nowait))
    propose(broker, queue, Purge())


def _answer_purge(broker: Broker, queue: QueueState, count: int | None) -> None:
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


HANDLERS: dict[type, Any] = {m.BasicGet: basic_get, m.TxCommit: tx_commit, m.QueuePurge: queue_purge}


_new_message = tuple.__new__  # Message(...) without the named tuple's Python-level __new__ (one per publish)
_SKIPPED: Final = Purge()  # stands for the command of a skipped entry (never applied)
_NO_ID: Final = object()  # matches no consumer or publisher id


# --- committed entries ------------------------------------------------------------------------------------------


def apply_committed(broker: Broker, vhost: str, name: str, data: bytes) -> None:
    queue = queue_of(broker, vhost, name)
    if queue is None:
        return
    replica = replica_of(queue)
    try:
        origin, proposal_id = peek_proposal(data)
    except ProposalDecodeError:
        return  # every replica decodes the same bytes alike, so all skip it
    if replica.seen(origin, proposal_id):  # a retried proposal applied before: skipped without decoding it
        if origin == broker.config.node_name:
            kept_proposal(data)
        replica.apply(Proposal(origin, proposal_id, _SKIPPED))  # counts the skip; the command is not looked at
        return
    proposal = decoded(broker, data, origin)
    if proposal is None:
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
        from node.broker import replica_control

        replica_control.before_settle_dead_lettered(queue, command.msg_ids)
    effects: list[Any] | None = replica.apply(proposal)
    if effects is None:
        return
    key = (vhost, name)
    consumers = broker.consumers
    elsewhere_consumer: Any = _NO_ID  # a consumer of another node: its deliveries are that node's business
    unwatched_publisher: Any = _NO_ID  # a publisher nobody here waits for (a batch's effects share the id object)
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
            _on_get_ok(broker, queue, effect, command)
        elif kind is GetEmpty:
            answer_get_empty(broker, effect.consumer_id)
        elif kind is Purged:
            if proposal.origin == broker.config.node_name:
                _answer_purge(broker, queue, effect.count)
        elif kind is DeadLetter:
            queue.dead_letter_seq += 1
            if not queue.is_leader:
                continue
            if effect.held_seq is None:
                _republish_dead_letter(broker, queue, effect)
            else:
                from node.broker import replica_control

                replica_control.send_held(broker, queue, effect.msg_id, effect.held_seq, effect.reason,
                                          effect.message)
    _after_command(broker, queue, command)


def _unwatched(broker: Broker, publisher_id: Any) -> bool:
    """No local channel or dead-letter sender waits for this publisher's outcomes (on_outcome would do nothing)."""
    if publisher_id is None:
        return True
    if publisher_id in broker.publishers:
        return False
    return not (type(publisher_id) is tuple and len(publisher_id) >= 3 and publisher_id[0] == "dlx-alo")


def _on_deliver(broker: Broker, queue: QueueState, effect: Deliver) -> None:
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


def _after_command(broker: Broker, queue: QueueState, command: Any) -> None:
    """Bookkeeping every replica does alike (members, counters), then what this node proposes in reaction."""
    kind = type(command)
    if kind is Attach:
        cid = command.consumer_id
        queue.members[cid] = None
        queue.had_consumer = True
        queue.last_used_ms = max(queue.last_used_ms, command.now_ms)
        if is_stale(broker, cid):
            propose(broker, queue, Detach(cid, broker.now_ms))
    elif kind is Detach:
        _after_detach(broker, queue, command)
    elif kind is Get:
        queue.last_used_ms = max(queue.last_used_ms, command.now_ms)
        if not command.no_ack and queue.machine.unacked_msg_ids(command.consumer_id):
            queue.members[command.consumer_id] = None
    elif kind is Settle or kind is Return or kind is Discard:
        cid = command.consumer_id
        if _is_getter(cid) and cid in queue.members and not queue.machine.unacked_msg_ids(cid):
            del queue.members[cid]
    elif kind is Expire:
        queue.expire_proposed_ms = None


def _after_detach(broker: Broker, queue: QueueState, command: Detach) -> None:
    cid = command.consumer_id
    queue.members.pop(cid, None)
    queue.last_used_ms = max(queue.last_used_ms, command.now_ms)
    broker.down_consumers.pop(cid, None)
    broker.detach_retries.pop(cid, None)
    expected = broker.detaching.pop(cid, "absent") != "absent"
    consumer = broker.consumers.get(cid)
    if consumer is not None and not expected and consumer.queue is queue and not consumer.cancelled:
        reattach(broker, queue, consumer)  # detached by a leader that thought this node down: come back
    maybe_auto_delete(broker, queue)


def reattach(broker: Broker, queue: QueueState, consumer: Any) -> None:
    consumer.credit = 0
    consumer.granted = False
    propose(broker, queue, Attach(consumer.consumer_id, broker.now_ms, prefetch=consumer.prefetch, credit=0,
                                  priority=consumer.priority, no_ack=consumer.no_ack))
    broker.mark_dirty(consumer.channel)


def maybe_auto_delete(broker: Broker, queue: QueueState) -> None:
    if queue.is_leader and queue.auto_delete and queue.had_consumer and queue.machine.consumer_count == 0:
        delete_queue(broker, queue)


def dead_letter_copy(broker: Broker, queue: QueueState, message: QueuedMessage, reason: str
                     ) -> tuple[QueuedMessage | None, list[tuple[str, str]]]:
    """The copy to republish (x-death added) and the queues it routes to now; (None, []) without a DLX."""
    vhost = broker.vhosts.get(queue.vhost)
    args = queue.machine.args
    dlx = args.dead_letter_exchange
    if vhost is None or dlx is None or (dlx != "" and dlx not in vhost.exchanges):
        return None, []
    msg: Message = message.payload
    props = publish.with_x_death(msg, queue.name, reason, broker.now_ms)
    routing_key = args.dead_letter_routing_key or msg.routing_key
    targets = list(vhost.route(dlx, routing_key, props.headers))
    if reason != "rejected":
        deaths = props.headers.get("x-death", [])
        targets = [t for t in targets if not publish.is_cycle(t, deaths)]
    dead = QueuedMessage(Message(dlx, routing_key, props, msg.body), len(msg.body), message.persistent,
                         message.priority, None)
    return dead, [(vhost.name, target) for target in targets if target in vhost.queues]


def _republish_dead_letter(broker: Broker, queue: QueueState, effect: DeadLetter) -> None:
    dead, targets = dead_letter_copy(broker, queue, effect.message, effect.reason)
    publisher_id = ("dlx", queue.vhost, queue.name)
    vhost = broker.vhosts[queue.vhost]
    for _vhost, target in targets:
        target_queue = vhost.queues.get(target)
        if target_queue is not None and dead is not None:
            propose(broker, target_queue, Enqueue(dead, broker.now_ms, publisher_id, queue.dead_letter_seq))


# --- abandoned proposals ----------------------------------------------------------------------------------------


def proposal_abandoned(broker: Broker, vhost: str, name: str, data: bytes) -> None:
    try:
        origin, _proposal_id = peek_proposal(data)
    except ProposalDecodeError:
        return
    proposal = decoded(broker, data, origin, keep=True)  # kept: the entry may still commit
    if proposal is None:
        return
    command: Any = proposal.command
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
        from node.broker import replica_control

        replica_control.settle_abandoned(queue, command.msg_ids)


def _detach_abandoned(broker: Broker, queue: QueueState | None, command: Detach) -> None:
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


def _server_cancel(broker: Broker, consumer: Any) -> None:
    """The consumer could not be attached: cancel it as a deleted queue would (basic.cancel if supported)."""
    ch = consumer.channel
    delivery.cancel_consumer(broker, consumer)
    conn = broker.conns.get(ch.conn_id)
    if conn is not None and conn.cancel_notify and not ch.closed:
        broker.out.append(Send(ch.conn_id, ch.number, m.BasicCancel(consumer_tag=consumer.tag, nowait=True)))
