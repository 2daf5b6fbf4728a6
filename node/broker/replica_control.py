"""Replicated mode: what the runtime tells the broker about the queue groups (pure; see `replica` for the rest).

`set_leader` marks the queues whose local replica leads: only those propose Expire for due message TTLs (`tick`,
re-proposed after EXPIRE_RETRY_MS if not applied yet; `next_deadline_ms` counts leader queues only), delete an
unused queue after x-expires, and detach the consumers of nodes reported down (`node_down` remembers them, so a
later leader does it too). `snapshot`/`restore` carry a queue's replica plus the broker's bookkeeping that is a
function of the log; after a restore this node resyncs its own parties with the replica (`_resync`), since the
entries the snapshot covered never produced effects here. `forget_queue` releases what waited on a deleted queue. At-least-once dead lettering (the leader republishes held
messages, settles them once every target accepted them) is at the end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import cbor2

from cluster.queue import Detach, Enqueue, Expire, MsgId, QueuedMessage, Return, SettleDeadLettered
from cluster.queue.replicated import ReplicatedQueue, decode_id, encode_id
from node.broker.definitions import delete_queue
from node.broker.queues import QueueState, queue_args
from node.broker.replica import (
    ACCEPTED,
    DUPLICATE,
    REJECTED,
    ProposingMachine,
    answer_get_empty,
    dead_letter_copy,
    flush_confirms,
    id_node,
    is_stale,
    maybe_auto_delete,
    on_outcome,
    propose,
    queue_of,
    reattach,
    replica_of,
    track,
)
from node.broker.replica_wire import decode_payload, encode_payload

if TYPE_CHECKING:
    from node.broker.broker import Broker

SNAPSHOT_VERSION: Final = 1
EXPIRE_RETRY_MS: Final = 1000  # the leader re-proposes Expire if the last one has not applied after this long


# --- leadership, nodes, time -----------------------------------------------------------------------------------


def set_leader(broker: Broker, vhost: str, name: str, is_leader: bool) -> None:
    key = (vhost, name)
    if is_leader:
        broker.leading.add(key)
    else:
        broker.leading.discard(key)
    queue = queue_of(broker, vhost, name)
    if queue is None or queue.is_leader == is_leader:
        return
    queue.is_leader = is_leader
    queue.expire_proposed_ms = None
    _leader_changed(queue)
    if is_leader:
        if queue.machine.held_count:
            _scan_held(broker, queue)  # re-send every held dead letter the old leader may not have finished
        for cid in list(queue.members):
            if cid in broker.down_consumers:
                propose(broker, queue, Detach(cid, broker.now_ms))
        maybe_auto_delete(broker, queue)


def node_down(broker: Broker, node: str) -> None:
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


def tick(broker: Broker) -> None:
    """The leader's timers: Expire for due message TTLs, x-expires deletion."""
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
            if (queue.expires_ms is not None and queue.machine.consumer_count == 0
                    and now_ms - queue.last_used_ms >= queue.expires_ms):
                delete_queue(broker, queue)


def next_deadline_ms(broker: Broker) -> int | None:
    best: int | None = None
    for vhost in broker.vhosts.values():
        for queue in vhost.queues.values():
            if not queue.is_leader:
                continue
            due = queue.machine.next_expiry_ms()
            if due is not None and queue.expire_proposed_ms is not None:
                due = max(due, queue.expire_proposed_ms + EXPIRE_RETRY_MS)
            if queue.expires_ms is not None and queue.machine.consumer_count == 0:
                expiry = queue.last_used_ms + queue.expires_ms
                due = expiry if due is None else min(due, expiry)
            held_due = _held_deadline_ms(queue)
            if held_due is not None:
                due = held_due if due is None else min(due, held_due)
            if due is not None and (best is None or due < best):
                best = due
    return best


# --- snapshots ----------------------------------------------------------------------------------------------------


def snapshot(broker: Broker, vhost: str, name: str) -> bytes:
    queue = queue_of(broker, vhost, name)
    if queue is None:
        return b""
    replica = replica_of(queue).snapshot(encode_payload)
    members = [encode_id(cid) for cid in queue.members]
    return cbor2.dumps([SNAPSHOT_VERSION, replica, queue.dead_letter_seq, queue.had_consumer, members])


def restore(broker: Broker, vhost: str, name: str, data: bytes) -> None:
    """Replace the replica (ValueError for a malformed snapshot), then resync this node's parties with it."""
    queue = queue_of(broker, vhost, name)
    if queue is None:
        return
    machine: ProposingMachine = queue.machine
    if not data:
        machine.replica = ReplicatedQueue(name, queue_args(queue.arguments))
        queue.dead_letter_seq, queue.had_consumer, queue.members = 0, False, {}
    else:
        try:
            version, replica, dead_letter_seq, had_consumer, members = cbor2.loads(data)
        except Exception as exc:  # cbor2 raises several types on garbage
            raise ValueError(f"bad queue snapshot: {exc!r:.200}") from exc
        if version != SNAPSHOT_VERSION or type(dead_letter_seq) is not int:
            raise ValueError("bad queue snapshot")
        machine.replica = ReplicatedQueue.restore(replica, decode_payload)
        queue.dead_letter_seq, queue.had_consumer = dead_letter_seq, bool(had_consumer)
        queue.members = {decode_id(cid): None for cid in members}
    queue.expire_proposed_ms = None
    queue.flow_inflight = 0  # the snapshot may cover publishes proposed here: their entries are never applied
    _prune_held_sends(queue)
    _resync(broker, queue)


def _resync(broker: Broker, queue: QueueState) -> None:
    """After a restore the replica may hold deliveries, get answers and outcomes this node never saw."""
    now_ms = broker.now_ms
    for cid in list(queue.members):
        if is_stale(broker, cid):
            propose(broker, queue, Detach(cid, now_ms))
    for consumer in [c for c in broker.consumers.values() if c.queue is queue]:
        cid = consumer.consumer_id
        held = {u.msg_id for u in consumer.channel.unacked.values() if u.consumer_id == cid}
        held.update(p.msg_id for p in consumer.channel.pending if p.consumer is consumer)
        lost = [i for i in queue.machine.unacked_msg_ids(cid) if i not in held]
        if lost:
            propose(broker, queue, Return(cid, lost, now_ms))
        reattach(broker, queue, consumer)
    for getter_id, (_ch, get_queue, _no_ack) in list(broker.pending_gets.items()):
        if get_queue is queue:
            answer_get_empty(broker, getter_id)
            lost = queue.machine.unacked_msg_ids(getter_id)
            if lost:
                propose(broker, queue, Return(getter_id, lost, now_ms))
    key = (queue.vhost, queue.name)
    for ch in list(broker.publishers.values()):
        for pending in ch.repl_waiting.values():
            command = pending.targets.get(key)
            if command is not None:  # Accepted again, or Duplicate if it had been: either way an outcome
                pending.resent.add(key)
                propose(broker, queue, command)


def forget_queue(broker: Broker, queue: QueueState) -> None:
    """The queue was deleted: publishes waiting for it count it as done (as RabbitMQ confirms a message whose
    queue went away), gets waiting on it are answered empty."""
    key = (queue.vhost, queue.name)
    for ch in list(broker.publishers.values()):
        for pending in list(ch.repl_waiting.values()):
            command = pending.targets.get(key)
            if command is not None:
                on_outcome(broker, key, ch.publisher_id, command.sequence, ACCEPTED)
    for getter_id, (_ch, get_queue, _no_ack) in list(broker.pending_gets.items()):
        if get_queue is queue:
            answer_get_empty(broker, getter_id)
    flush_confirms(broker)  # (this may run inside a client's entry point, which does not flush)


# --- at-least-once dead lettering ---------------------------------------------------------------------------------
#
# The source queue's machine holds each dead-lettered message (`DeadLetter.held_seq`). Its leader republishes it to
# the DLX targets as Enqueue with publisher id ("dlx-alo", vhost, queue) and the hold sequence as sequence, so a
# retry, or a new leader's re-send, is a Duplicate at the target. Every node watches the targets' outcomes for
# these publisher ids on its own replicas (`HeldSends.accepted`); once every target the message routes to
# accepted it, the leader proposes `SettleDeadLettered`. The targets' dedup keeps one high-water sequence per
# publisher, so a Duplicate for a hold sequence this node never saw accepted may hide a reordering (a later one
# overtook a lost proposal): the leader then sends that copy once more under its own publisher id
# ("dlx-alo", vhost, queue, held_seq) with sequence 1 (at least once: a copy already accepted unseen, e.g. inside a
# snapshot this node installed, is then duplicated). A message that routes nowhere, or that a target refused, stays
# held and is sent again every DLX_RETRY_MS (RabbitMQ keeps and retries too); the holding area is bounded by the
# machine (DEAD_LETTER_HELD_MAX, then publishes are refused) and by the queue's length limits.

DLX_PUBLISHER = "dlx-alo"
DLX_RETRY_MS: Final = 3000  # a held message not settled this long after its last send is sent again
DLX_SCAN_MS: Final = 1000  # how often the leader walks its held messages (re-sends, settles)
DLX_SEND_BATCH_MAX: Final = 1024  # held messages sent per queue per scan (the rest at the next scan)
DLX_ACCEPTED_MAX: Final = 200_000  # observed target acceptances kept per queue (cleared when full: re-sends)


class HeldSends:
    """A node's volatile bookkeeping of one source queue's held dead letters."""

    __slots__ = ("accepted", "scanned_ms", "sent", "settling")

    def __init__(self) -> None:
        self.accepted: dict[int, set[tuple[str, str]]] = {}  # hold seq -> targets seen accepting (every node)
        self.sent: dict[int, tuple[int, frozenset[tuple[str, str]]]] = {}  # leader: msg id -> (sent ms, targets)
        self.settling: set[int] = set()  # leader: msg ids whose SettleDeadLettered is proposed
        self.scanned_ms: int | None = None  # leader: last scan (None: scan at the next tick)


def held_sends(queue: QueueState) -> HeldSends:
    if queue.held_sends is None:
        queue.held_sends = HeldSends()
    state: HeldSends = queue.held_sends
    return state


def is_dead_letter_publisher(publisher_id: object) -> bool:
    return type(publisher_id) is tuple and len(publisher_id) in (3, 4) and publisher_id[0] == DLX_PUBLISHER


def send_held(broker: Broker, queue: QueueState, msg_id: int, held_seq: int, reason: str, message: QueuedMessage
              ) -> None:
    """Leader: (re)publish one held message to the targets that have not accepted it yet."""
    state = held_sends(queue)
    dead, targets = dead_letter_copy(broker, queue, message, reason)
    accepted = state.accepted.get(held_seq, set())
    publisher_id = (DLX_PUBLISHER, queue.vhost, queue.name)
    vhost = broker.vhosts[queue.vhost]
    for target in targets:
        target_queue = vhost.queues.get(target[1])
        if target not in accepted and target_queue is not None and dead is not None:
            propose(broker, target_queue, Enqueue(dead, broker.now_ms, publisher_id, held_seq))
    state.sent[msg_id] = (broker.now_ms, frozenset(targets))
    _settle_if_done(broker, queue, state, msg_id, held_seq)


def on_dead_letter_outcome(broker: Broker, target: tuple[str, str], publisher_id: tuple[str, ...], sequence: int,
                           outcome: str) -> None:
    """A target queue's replica (on this node) answered a held message's republish."""
    source = queue_of(broker, publisher_id[1], publisher_id[2])
    if source is None:
        return
    seq_part: Any = sequence if len(publisher_id) == 3 else publisher_id[3]
    if type(seq_part) is not int:
        return
    held_seq: int = seq_part
    msg_id = source.machine.held_msg_id(held_seq)
    if msg_id is None or outcome == REJECTED:
        return  # settled already; or refused (reject-publish at the target): the retry scan sends it again
    state = held_sends(source)
    accepted = state.accepted.get(held_seq)
    if outcome == DUPLICATE and len(publisher_id) == 3 and (accepted is None or target not in accepted):
        if source.is_leader:  # maybe overtaken by a later sequence: send this copy under its own id
            _resend_alone(broker, source, target, msg_id, held_seq)
        return
    if accepted is None:
        if len(state.accepted) >= DLX_ACCEPTED_MAX:
            state.accepted.clear()
        accepted = state.accepted[held_seq] = set()
    accepted.add(target)
    if source.is_leader:
        _settle_if_done(broker, source, state, msg_id, held_seq)


def _resend_alone(broker: Broker, source: QueueState, target: tuple[str, str], msg_id: int, held_seq: int) -> None:
    target_queue = queue_of(broker, *target)
    letter = source.machine.held_letter(msg_id)
    if target_queue is None or letter is None:
        return
    dead, _targets = dead_letter_copy(broker, source, letter[2], letter[1])
    if dead is not None:
        publisher_id = (DLX_PUBLISHER, source.vhost, source.name, held_seq)
        propose(broker, target_queue, Enqueue(dead, broker.now_ms, publisher_id, 1))


def _settle_if_done(broker: Broker, queue: QueueState, state: HeldSends, msg_id: int, held_seq: int) -> None:
    sent = state.sent.get(msg_id)
    if sent is None or not sent[1] or msg_id in state.settling:
        return
    if sent[1] <= state.accepted.get(held_seq, set()):
        state.settling.add(msg_id)
        propose(broker, queue, SettleDeadLettered((MsgId(msg_id),)))


def before_settle_dead_lettered(queue: QueueState, msg_ids: tuple[MsgId, ...] | list[MsgId]) -> None:
    """Every node, before a committed SettleDeadLettered applies: forget what it tracked of those messages."""
    state = queue.held_sends
    if state is None:
        return
    for msg_id in msg_ids:
        held_seq = queue.machine.held_seq(msg_id)
        if held_seq is not None:
            state.accepted.pop(held_seq, None)
        state.sent.pop(msg_id, None)
        state.settling.discard(msg_id)


def _prune_held_sends(queue: QueueState) -> None:
    """After a snapshot install: forget what this node tracked of messages the snapshot no longer holds."""
    state = queue.held_sends
    if state is None:
        return
    machine = queue.machine
    state.accepted = {seq: seen for seq, seen in state.accepted.items() if machine.held_msg_id(seq) is not None}
    state.sent = {msg_id: sent for msg_id, sent in state.sent.items() if machine.held_seq(msg_id) is not None}
    state.settling = {msg_id for msg_id in state.settling if machine.held_seq(msg_id) is not None}


def settle_abandoned(queue: QueueState, msg_ids: tuple[MsgId, ...] | list[MsgId]) -> None:
    if queue.held_sends is not None:
        queue.held_sends.settling.difference_update(msg_ids)


def _leader_changed(queue: QueueState) -> None:
    state = queue.held_sends
    if state is not None:
        state.sent.clear()
        state.settling.clear()
        state.scanned_ms = None  # a new leader sends every held message at its first tick


def _scan_held(broker: Broker, queue: QueueState) -> None:
    """Leader, every DLX_SCAN_MS: send held messages never sent or unsettled DLX_RETRY_MS after their last send."""
    state = held_sends(queue)
    now_ms = broker.now_ms
    state.scanned_ms = now_ms
    budget = DLX_SEND_BATCH_MAX
    for msg_id, held_seq, reason, message, _delivery_count in queue.machine.held_letters():
        if budget <= 0:
            state.scanned_ms = now_ms - DLX_SCAN_MS  # more to send: come back at the next tick
            return
        sent = state.sent.get(msg_id)
        if msg_id in state.settling or (sent is not None and now_ms - sent[0] < DLX_RETRY_MS):
            continue
        budget -= 1
        send_held(broker, queue, msg_id, held_seq, reason, message)


def _held_deadline_ms(queue: QueueState) -> int | None:
    if not queue.machine.held_count:
        return None
    state = queue.held_sends
    if state is None or state.scanned_ms is None:
        return 0
    scanned_ms: int = state.scanned_ms
    return scanned_ms + DLX_SCAN_MS
