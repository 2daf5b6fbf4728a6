"""Replicated mode: what the runtime tells the broker about the queue groups (pure; see `replica` for the rest).

`set_leader` marks the queues whose local replica leads: only those propose Expire when the machine's
`next_expiry_ms()` is due (message TTLs and x-expires, whose `QueueExpired` this leader then carries out: `tick`,
re-proposed after EXPIRE_RETRY_MS if not applied yet; `next_deadline_ms` counts leader queues only), detach the consumers of nodes reported down (`node_down` remembers them, so a later
leader does it too), and purge a classic queue's transient messages after its node's restart. `snapshot`/`restore`
carry a queue's replica plus the broker's bookkeeping that is a function of the log; after a restore this node
resyncs its own parties with the replica (`_resync`), since the entries the snapshot covered never produced effects
here. `forget_queue` releases what waited on a deleted queue. At-least-once dead lettering (the leader republishes
held messages, settles them once every target accepted them) is in `replica_dead_letters`.
"""

from __future__ import annotations

from typing import Final

import cbor2

from cluster.queue import Cancel, Detach, Expire, GetOk, Purge, Return
from cluster.queue.replicated import ReplicatedQueue, decode_id, encode_id
from cluster.queue.seal import Seal
from node.broker.definitions import delete_queue
from node.broker.queues import QueueState, queue_args
from node.broker.replica import answer_get_ok, deliver_unseen, maybe_auto_delete, reattach
from node.broker.replica_dead_letters import (
    _held_deadline_ms,
    _leader_changed,
    _prune_held_sends,
    _scan_held,
)
from node.broker.replica_machine import (
    ProposingMachine,
    id_node,
    is_stale,
    propose,
    queue_of,
    replica_of,
    track,
)
from node.broker.replica_publish import answer_get_empty
from node.broker.replica_wire import decode_payload, encode_payload
from node.broker.state import BrokerState

SNAPSHOT_VERSION: Final = 1
EXPIRE_RETRY_MS: Final = 1000  # the leader re-proposes Expire if the last one has not applied after this long
# an auto-delete queue its machine reported unused this long ago (its proposing node went away before deleting it,
# replica.maybe_auto_delete) is deleted by its leader
AUTO_DELETE_FALLBACK_MS: Final = 5000


# --- leadership, nodes, time -----------------------------------------------------------------------------------


def set_leader(broker: BrokerState, vhost: str, name: str, is_leader: bool, alone: bool = False) -> None:
    """`alone`: this node is also the group's only voter (a classic queue's), so what it proposes commits here."""
    key = (vhost, name)
    if is_leader:
        broker.leading[key] = alone
    else:
        broker.leading.pop(key, None)
    queue = queue_of(broker, vhost, name)
    if queue is None or queue.is_leader == is_leader:
        return
    queue.is_leader = is_leader
    queue.expire_proposed_ms = None
    _leader_changed(queue)
    if is_leader:
        if not queue.transient_checked:
            _drop_transient_of_earlier_life(broker, queue)
        if queue.machine.held_count:
            _scan_held(broker, queue)  # re-send every held dead letter the old leader may not have finished
        for cid in list(queue.members):
            if cid in broker.down_consumers:
                propose(broker, queue, Detach(cid, broker.now_ms))
        maybe_auto_delete(broker, queue)


def _drop_transient_of_earlier_life(broker: BrokerState, queue: QueueState) -> None:
    """A classic durable queue's transient messages do not survive its node's restart (RabbitMQ drops them, and so
    does a single node): the first time this node leads a classic queue it did not declare in this boot (after a
    restart, its one voter is this node again), its Raft leader proposes `Purge(transient_only=True)`. It lands
    after every entry of the earlier life, and every replica applies it alike. Quorum queues keep them (as
    RabbitMQ's, which store every message)."""
    queue.transient_checked = True
    if queue.durable and queue.exclusive_owner is None and queue.arguments.get("x-queue-type") != "quorum":
        propose(broker, queue, Purge(transient_only=True))


def node_down(broker: BrokerState, node: str) -> None:
    """Consumers (and get holders) of `node` are detached by each queue's leader; remembered for later leaders."""
    for vhost in list(broker.vhosts.values()):
        for queue in list(vhost.queues.values()):
            if not isinstance(queue.machine, ProposingMachine):
                continue
            for cid in list(queue.members):
                if id_node(cid) == node:
                    track(broker.down_consumers, cid)
                    if queue.is_leader:
                        propose(broker, queue, Detach(cid, broker.now_ms))


def tick(broker: BrokerState) -> None:
    """The leader's timers: Expire for due message TTLs and x-expires, the auto-delete fallback."""
    now_ms = broker.now_ms
    for vhost in list(broker.vhosts.values()):
        for queue in list(vhost.queues.values()):
            if not queue.is_leader:
                continue
            due = queue.machine.next_expiry_ms()
            proposed = queue.expire_proposed_ms
            if due is not None and due <= now_ms and (proposed is None or now_ms - proposed >= EXPIRE_RETRY_MS):
                queue.expire_proposed_ms = now_ms
                propose(broker, queue, Expire(now_ms))
            held_due = _held_deadline_ms(queue)
            if held_due is not None and held_due <= now_ms:
                _scan_held(broker, queue)
            machine = replica_of(queue).queue
            if machine.unused and now_ms - (machine.last_used_ms or 0) >= AUTO_DELETE_FALLBACK_MS:
                delete_queue(broker, queue)


def next_deadline_ms(broker: BrokerState) -> int | None:
    best: int | None = None
    for vhost in broker.vhosts.values():
        for queue in vhost.queues.values():
            if not queue.is_leader:
                continue
            due = queue.machine.next_expiry_ms()
            if due is not None and queue.expire_proposed_ms is not None:
                due = max(due, queue.expire_proposed_ms + EXPIRE_RETRY_MS)
            held_due = _held_deadline_ms(queue)
            if held_due is not None:
                due = held_due if due is None else min(due, held_due)
            if due is not None and (best is None or due < best):
                best = due
    return best


# --- snapshots ----------------------------------------------------------------------------------------------------


def snapshot(broker: BrokerState, vhost: str, name: str, sealed: bool | None = None) -> bytes:
    """`sealed=False`: with the seal lifted, as the seed of the queue's next log (cluster/queue/seal.py)."""
    queue = queue_of(broker, vhost, name)
    if queue is None:
        return b""
    replica = replica_of(queue).snapshot(encode_payload, sealed)
    members = [encode_id(cid) for cid in queue.members]
    had_consumer = replica_of(queue).queue.had_consumer  # (also in the machine's snapshot now; kept for the old layout)
    dead_letter_seq = replica_of(queue).queue.dead_letter_seq  # (the same)
    return cbor2.dumps([SNAPSHOT_VERSION, replica, dead_letter_seq, had_consumer, members])


def msg_id_span(broker: BrokerState, vhost: str, name: str) -> tuple[int, int | None] | None:
    """(the next message id, the oldest id still ready or unacked or None) of the queue's replica; None: not a
    replicated queue here (a mirrored queue's sync point: node/clustering/mirror_sync.py)."""
    queue = queue_of(broker, vhost, name)
    if queue is None:
        return None
    machine = replica_of(queue).queue
    return machine.msg_ids_used + 1, machine.oldest_msg_id()


def sealed(broker: BrokerState, vhost: str, name: str) -> bool:
    """Whether the queue's replica applied a `Seal` (cluster/queue/seal.py): it takes nothing more from its log."""
    queue = queue_of(broker, vhost, name)
    return queue is not None and replica_of(queue).sealed


def seal(broker: BrokerState, vhost: str, name: str) -> None:
    """Propose the seal of the queue's log (the queue moves to another log: a classic queue becoming mirrored)."""
    queue = queue_of(broker, vhost, name)
    if queue is not None and not replica_of(queue).sealed:
        propose(broker, queue, Seal())


def restore(broker: BrokerState, vhost: str, name: str, data: bytes) -> None:
    """Replace the replica (ValueError for a malformed snapshot), then resync this node's parties with it."""
    queue = queue_of(broker, vhost, name)
    if queue is None:
        return
    machine: ProposingMachine = queue.machine
    if not data:
        machine.replica = ReplicatedQueue(name, queue_args(queue.arguments, queue.auto_delete))
        queue.members = {}
    else:
        try:
            version, replica, dead_letter_seq, had_attach, members = cbor2.loads(data)
        except Exception as exc:  # cbor2 raises several types on garbage
            raise ValueError(f"bad queue snapshot: {exc!r:.200}") from exc
        if version != SNAPSHOT_VERSION or type(dead_letter_seq) is not int:
            raise ValueError("bad queue snapshot")
        machine.replica = ReplicatedQueue.restore(replica, decode_payload)
        machine.replica.queue.adopt_declared(queue.auto_delete, bool(had_attach))  # (snapshots before usage.py)
        machine.replica.queue.adopt_dead_letter_seq(dead_letter_seq)  # (snapshots before DeadLetter.seq)
        queue.members = {decode_id(cid): None for cid in members}
    queue.expire_proposed_ms = None
    queue.flow_inflight = 0  # the snapshot may cover publishes proposed here: their entries are never applied
    _prune_held_sends(queue)
    _resync(broker, queue)


def _resync_gets(broker: BrokerState, queue: QueueState, now_ms: int) -> None:
    """This node's basic.gets still waiting on the queue, after a restore. A Get the snapshot covers was applied
    where this node never saw it: it took a message, which its getter holds unacked in the replica (get-ok with
    it), or found the queue empty (get-empty). A Get the snapshot does not cover waits on: it comes later in the
    log, or is given up and answered empty then (`proposal_abandoned`)."""
    replica = replica_of(queue)
    machine = replica.queue
    for getter_id, (_ch, get_queue, _no_ack, proposal_id) in list(broker.pending_gets.items()):
        if get_queue is not queue:
            continue
        taken = machine.unacked_msg_ids(getter_id)
        held = machine.unacked_message(getter_id, taken[0]) if taken else None
        if held is not None:
            message, redelivered, delivery_count = held
            answer_get_ok(broker, queue, GetOk(getter_id, taken[0], message, redelivered, delivery_count,
                                               machine.ready_count), None)
            if len(taken) > 1:  # (one Get takes one message)
                propose(broker, queue, Return(getter_id, taken[1:], now_ms))
        elif replica.seen(broker.config.node_name, proposal_id):
            answer_get_empty(broker, getter_id)


def _resync(broker: BrokerState, queue: QueueState) -> None:
    """After a restore the replica may hold deliveries, get answers and outcomes this node never saw."""
    now_ms = broker.now_ms
    for cid in list(queue.members):
        if is_stale(broker, cid):
            propose(broker, queue, Detach(cid, now_ms))
    for consumer in [c for c in broker.consumers.values() if c.queue is queue]:
        cid = consumer.consumer_id
        held = {u.msg_id for u in consumer.channel.unacked.values() if u.consumer_id == cid}
        held.update(p.msg_id for p in consumer.channel.pending if p.consumer is consumer)
        unseen = [i for i in replica_of(queue).queue.unacked_msg_ids(cid) if i not in held]
        if consumer.cancelled:  # (cancelled, still holding unacked messages: it stays out of the consumers)
            if unseen:
                propose(broker, queue, Return(cid, unseen, now_ms))
            propose(broker, queue, Cancel(cid, now_ms))
        else:
            deliver_unseen(broker, queue, cid, unseen)  # (as the Deliver effects would have been)
            reattach(broker, queue, consumer)
    _resync_gets(broker, queue, now_ms)
    key = (queue.vhost, queue.name)
    for ch in list(broker.publishers.values()):
        for pending in ch.repl_waiting.values():
            command = pending.targets.get(key)
            if command is not None:  # Accepted again, or Duplicate if it had been: either way an outcome
                pending.resent.add(key)
                propose(broker, queue, command)


