"""Replicated mode: at-least-once dead lettering, and the dead-letter copy both strategies republish (pure).

The source queue's machine holds each dead-lettered message (`DeadLetter.held_seq`). Its leader republishes it to
the DLX targets as Enqueue with publisher id `DeadLetterPublisher(vhost, queue, None)` (cluster/queue/ids.py) and
the hold sequence as sequence, so a
retry, or a new leader's re-send, is a Duplicate at the target. Every node watches the targets' outcomes for
these publisher ids on its own replicas (`HeldSends.accepted`); once every target the message routes to
accepted it, the leader proposes `SettleDeadLettered`. The targets' dedup keeps one high-water sequence per
publisher, so a Duplicate for a hold sequence this node never saw accepted may hide a reordering (a later one
overtook a lost proposal): the leader then sends that copy once more under its own publisher id
`DeadLetterPublisher(vhost, queue, held_seq)` with sequence 1 (at least once: a copy already accepted unseen, e.g. inside a
snapshot this node installed, is then duplicated). A message that routes nowhere, or that a target refused, stays
held and is sent again every DLX_RETRY_MS (RabbitMQ keeps and retries too); the holding area is bounded by the
machine (DEAD_LETTER_HELD_MAX, then publishes are refused) and by the queue's length limits.

`replica` calls in here as entries commit (send_held, before_settle_dead_lettered, on_dead_letter_outcome through
`replica_publish.on_outcome`), `replica_control` for the leader's timers (_scan_held, _held_deadline_ms) and
snapshots (_prune_held_sends). `dead_letter_copy` builds the copy (x-death added) and its targets for at-most-once
dead lettering too (`replica._republish_dead_letter`).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Final

from cluster.queue import Enqueue, MsgId, QueuedMessage, SettleDeadLettered
from cluster.queue.ids import DeadLetterPublisher
from node.broker import delivery, publish
from node.broker.backend import PublishPath, backend_of
from node.broker.channel import Message
from node.broker.effects import ForwardPublish
from node.broker.queues import QueueState
from node.broker.replica_machine import ACCEPTED, DUPLICATE, REJECTED, propose, queue_of, replica_of
from node.broker.state import BrokerState

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


def send_held(broker: BrokerState, queue: QueueState, msg_id: int, held_seq: int, reason: str, message: QueuedMessage
              ) -> None:
    """Leader: (re)publish one held message to the targets that have not accepted it yet."""
    state = held_sends(queue)
    dead, targets = dead_letter_copy(broker, queue, message, reason)
    accepted = state.accepted.get(held_seq, set())
    publisher_id = DeadLetterPublisher(queue.vhost, queue.name, None)
    vhost = broker.vhosts[queue.vhost]
    for target in targets:
        target_queue = vhost.queues.get(target[1])
        if target not in accepted and target_queue is not None and dead is not None:
            send_copy(broker, target_queue, dead, publisher_id, held_seq)
    state.sent[msg_id] = (broker.now_ms, frozenset(targets))
    _settle_if_done(broker, queue, state, msg_id, held_seq)


def on_dead_letter_outcome(broker: BrokerState, target: tuple[str, str], publisher_id: DeadLetterPublisher,
                           sequence: int, outcome: str) -> None:
    """A target queue's replica (on this node) answered a held message's republish."""
    source = queue_of(broker, publisher_id.vhost, publisher_id.queue)
    if source is None:
        return
    alone = publisher_id.held_seq is not None  # a copy sent alone (_resend_alone)
    held_seq = publisher_id.held_seq if publisher_id.held_seq is not None else sequence
    if type(held_seq) is not int:
        return
    msg_id = replica_of(source).queue.held_msg_id(held_seq)
    if msg_id is None or outcome == REJECTED:
        return  # settled already; or refused (reject-publish at the target): the retry scan sends it again
    state = held_sends(source)
    accepted = state.accepted.get(held_seq)
    if outcome == DUPLICATE and not alone and (accepted is None or target not in accepted):
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


def send_copy(broker: BrokerState, target: QueueState, dead: QueuedMessage, publisher_id: Hashable,
              sequence: int) -> None:
    """One dead-letter copy to one target: proposed to a Raft queue. A node-local exclusive queue (node/broker/
    backend_owned.py) takes it at once on its owner's node; another node forwards it there as a `ForwardPublish`
    whose confirm comes back as the outcome (`replica_publish.on_outcome`), so a held copy is settled only once the
    owner has it."""
    path = backend_of(target).publish_path if target.backend is not None else PublishPath.PROPOSE
    if path is PublishPath.PROPOSE:
        propose(broker, target, Enqueue(dead, broker.now_ms, publisher_id, sequence))
        return
    msg: Message = dead.payload
    if path is PublishPath.ENQUEUE:
        local = QueuedMessage(msg, dead.size_bytes, False, dead.priority, dead.ttl_ms)  # (never stored)
        outcome = REJECTED if delivery.enqueue(broker, target, Enqueue(local, broker.now_ms)) < 0 else ACCEPTED
        if type(publisher_id) is DeadLetterPublisher:
            on_dead_letter_outcome(broker, (target.vhost, target.name), publisher_id, sequence, outcome)
        return
    owner = str(target.exclusive_owner).rsplit("/", 2)[0]
    target.flow_inflight += 1  # (forward_outcome counts it done)
    broker.out.append(ForwardPublish(owner, target.vhost, target.name, msg.properties, msg.body, publisher_id,
                                     sequence, msg.exchange, msg.routing_key))


def _resend_alone(broker: BrokerState, source: QueueState, target: tuple[str, str], msg_id: int, held_seq: int) -> None:
    target_queue = queue_of(broker, *target)
    letter = replica_of(source).queue.held_letter(MsgId(msg_id))
    if target_queue is None or letter is None:
        return
    dead, _targets = dead_letter_copy(broker, source, letter[2], letter[1])
    if dead is not None:
        publisher_id = DeadLetterPublisher(source.vhost, source.name, held_seq)
        send_copy(broker, target_queue, dead, publisher_id, 1)


def _settle_if_done(broker: BrokerState, queue: QueueState, state: HeldSends, msg_id: int, held_seq: int) -> None:
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
        held_seq = replica_of(queue).queue.held_seq(msg_id)
        if held_seq is not None:
            state.accepted.pop(held_seq, None)
        state.sent.pop(msg_id, None)
        state.settling.discard(msg_id)


def _prune_held_sends(queue: QueueState) -> None:
    """After a snapshot install: forget what this node tracked of messages the snapshot no longer holds."""
    state = queue.held_sends
    if state is None:
        return
    machine = replica_of(queue).queue
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


def _scan_held(broker: BrokerState, queue: QueueState) -> None:
    """Leader, every DLX_SCAN_MS: send held messages never sent or unsettled DLX_RETRY_MS after their last send."""
    state = held_sends(queue)
    now_ms = broker.now_ms
    state.scanned_ms = now_ms
    budget = DLX_SEND_BATCH_MAX
    for msg_id, held_seq, reason, message, _delivery_count in replica_of(queue).queue.held_letters():
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


def dead_letter_copy(broker: BrokerState, queue: QueueState, message: QueuedMessage, reason: str
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
