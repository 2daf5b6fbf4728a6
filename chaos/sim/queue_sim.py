"""The simulator running a replicated queue: the real queue machine, proposal tracking, dedup and incarnations.

`QueueSimulation` is the Raft simulator (simulator.py: one seed, fake clock, network and disk, the real MultiRaft
cores) whose one group is a queue, replicated on every node exactly as cluster mode replicates it:

- every committed entry is read as an envelope of the queue's incarnation (`cluster.queue.envelope.EnvelopeCodec`,
  the runtime's reader: an entry of another incarnation is skipped) and applied to the node's
  `ReplicatedQueue`, which skips a proposal id it applied already; snapshots carry the replica
  (`ReplicatedQueue.snapshot`), so a node restored from a compacted log continues from the same state;
- every node runs a client, as a node's AMQP connections do: a publisher (Enqueue with publisher id and sequence)
  with a confirm window, and a consumer (Attach with a prefetch, Settle of what it was delivered, a few ticks
  later; now and then it cancels, keeping what it holds, and consumes again), and now and then a queue.declare
  (`Declare`) and the leader's timer (`Expire`): the queue is auto-delete with an x-expires, so the machine's
  usage decisions (`QueueUnused`, `QueueExpired`; nothing deletes the queue here) are made. Now and then the
  consumer rejects a message (`Discard`): the queue has a DLX, so the machine dead-letters it, and every node that
  believes it leads when it applies the `DeadLetter` sends the copy, as the broker's leader does, to one target
  queue outside the cluster (a plain machine, as a target queue's replica) under the source's at-most-once
  publisher id with the machine's `DeadLetter.seq`; a copy may be lost on the way, and now and then a node that
  does not lead sends it too (as an old leader that has not heard of the new one does, or a new leader applying
  entries its predecessor acted on already): the target must take it as a `Duplicate`. Its proposals are
  tracked by the runtime's own `ProposalTracker`: sent to a node that believes it leads (as a follower forwards;
  lost when the link is cut or the message dropped), sent again every `RETRY_MS` until the client's own replica
  applied them, given up after `TIMEOUT_MS`. A publish is confirmed when the client's replica applied its Enqueue
  (`Accepted`). A crash loses the node's client; the restarted node detaches the consumers of its earlier lives
  (a barrier, as the runtime marks every Detach), so what they held returns to the queue.

Checkers, besides the Raft ones of checkers.py:
- every replica applies the same entries: the replicas' snapshots agree at every applied index, and so do the
  machine's usage decisions (`QueueUnused`, `QueueExpired`) and its dead letters (msg id and sequence) at each
  index;
- no dead-letter copy twice (at most once): the target accepts each dead-lettered message at most once, however
  many leaders (an old one that has not heard of the new, a new one catching up, a node restored from a
  snapshot) send it;
- no redelivery after a settled ack: once a replica applied a Settle that removed a message, no later Deliver of it;
- no confirmed message lost: after the faults heal, every replica applied a final marker and every client's
  proposals were applied, every confirmed message was settled or is still in the queue (ready, or unacked).
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass, field
from typing import Any

import cbor2

from chaos.sim.checkers import AppliedState, SafetyViolation
from chaos.sim.sim_types import SimConfig, SimNode, SimResult
from chaos.sim.simulator import PROPOSALS_QUEUED_MAX, Simulation
from cluster.queue.envelope import Envelope, EnvelopeCodec
from cluster.queue.ids import AtMostOnceDeadLetterPublisher, ChannelPublisherId, ConsumerId
from cluster.queue.machine import Queue
from cluster.queue.replicated import ReplicatedQueue
from cluster.queue.types import (
    Accepted,
    Attach,
    Cancel,
    DeadLetter,
    Declare,
    Deliver,
    Detach,
    Discard,
    Duplicate,
    Enqueue,
    Expire,
    MsgId,
    QueueArgs,
    QueuedMessage,
    QueueExpired,
    QueueUnused,
    Settle,
)
from cluster.raft.core.types import Entry, EntryKind, GroupId, NodeId, Role
from node.clustering.proposals import PROPOSAL_IDS_PER_BOOT, Pending, ProposalTracker

QUEUE = "q"
INCARNATION = 0x5EED  # every entry is framed with it; a replica skips any other
MS_PER_TICK = 10
RETRY_MS = 1_000  # 100 ticks: as in the runtime, far above a round trip (retries while the leader is only slow add
# duplicate entries faster than a one-entry window replicates them: the seed 4 profile livelocks at 200)
TIMEOUT_MS = 20_000
PREFETCH = 4
CONFIRM_WINDOW = 4  # a publisher's unconfirmed publishes at most (a real client's confirm window)
PUBLISH_RATE = 0.3  # per live node and tick, while the faults last
SETTLE_RATE = 0.3  # per live node and tick: settle what was delivered
CANCEL_RATE = 0.02  # per live node and tick: the consumer cancels (keeping its unacked), while consuming
RECONSUME_RATE = 0.03  # per live node and tick: a cancelled consumer consumes again
DECLARE_RATE = 0.005  # per live node and tick: a queue.declare (`Declare`)
EXPIRE_RATE = 0.01  # per live node and tick: the leader's timer (`Expire`)
QUEUE_ARGS = QueueArgs(auto_delete=True, expires_ms=100,  # the usage rules decide (cluster/queue/usage.py)
                       dead_letter_exchange="dlx")  # and a rejected message is dead-lettered
USAGE_SEED_SALT = 0x05A6E  # the usage commands draw from their own RNG (the seed's other draws stay as they were)
DISCARD_RATE = 0.1  # per live node and tick: the consumer rejects one message it holds instead of settling it
COPY_LOSS_RATE = 0.1  # a dead-letter copy lost on its way to the target
STRAY_COPY_RATE = 0.3  # a node that does not lead sends the copy too
DEAD_LETTER_SEED_SALT = 0xD1E7  # the rejects and copy losses draw from their own RNG too
DEAD_LETTER_PUBLISHER = AtMostOnceDeadLetterPublisher("/", QUEUE)


def _identity(value: Any) -> Any:
    return value


ENTRIES = EnvelopeCodec("", _identity, _identity)  # writes and reads every node's entries (keeps none: no origin "")


@dataclass(slots=True)
class SimClient:
    """One node's connections: a publisher and a consumer, with the runtime's proposal tracker."""

    node: NodeId
    boot: int
    tracker: ProposalTracker
    next_seq: int = 1
    cancelled: bool = False  # the consumer cancelled (it keeps and settles what it holds) and has not consumed again
    outstanding: list[MsgId] = field(default_factory=list)  # delivered to this consumer, Settle not proposed yet
    waiting: dict[int, int] = field(default_factory=dict)  # proposal id -> publish sequence, until applied

    @property
    def origin(self) -> str:
        return f"{self.node}#{self.boot}"

    @property
    def consumer_id(self) -> ConsumerId:
        return ConsumerId(self.node, self.boot, 1)

    @property
    def publisher_id(self) -> ChannelPublisherId:
        return ChannelPublisherId(self.node, self.boot, 1, 1)


@dataclass(slots=True)
class Replica:
    """A node's replica of the queue and what the checkers remember of it."""

    queue: ReplicatedQueue
    settled: set[int] = field(default_factory=set)  # msg ids a Settle removed (no Deliver of them afterwards)

    def encode(self, applied: AppliedState) -> bytes:
        return cbor2.dumps([applied.encode(), self.queue.snapshot(_identity), sorted(self.settled)])

    @staticmethod
    def decode(data: bytes) -> tuple[AppliedState, Replica]:
        if not data:
            return AppliedState(), Replica(ReplicatedQueue(QUEUE, QUEUE_ARGS))
        applied, queue, settled = cbor2.loads(data)
        return AppliedState.decode(applied), Replica(ReplicatedQueue.restore(queue, _identity), set(settled))


class QueueSimulation(Simulation):
    confirm_early = False  # a broken publisher confirming on send, not on apply: the checker must catch it

    def __init__(self, config: SimConfig) -> None:
        self.replicas: dict[NodeId, Replica] = {}
        self.clients: dict[NodeId, SimClient] = {}
        self.state_digests: dict[int, tuple[NodeId, int]] = {}  # applied index -> (first node, replica digest)
        self.decisions: dict[int, tuple[NodeId, tuple[str, ...]]] = {}  # applied index -> (first node, decisions)
        self.usage_rng = random.Random(config.seed ^ USAGE_SEED_SALT)
        self.dead_letter_rng = random.Random(config.seed ^ DEAD_LETTER_SEED_SALT)
        self.dead_letter_target = Queue("dlx-target")  # where every dead-letter copy goes (dedup by publisher)
        self.copied: set[bytes] = set()  # bodies the target accepted a copy of
        self.confirmed: list[bytes] = []  # the body of every confirmed publish (bodies are unique)
        self.msg_ids: dict[bytes, MsgId] = {}  # body -> the msg id the machine gave it (the same on every replica)
        self.consumers: set[tuple[str, int, int]] = set()
        self.queue_stats = {"published": 0, "confirmed": 0, "settled": 0, "deliveries": 0, "skipped_retries": 0,
                            "given_up": 0, "cancels": 0, "unused": 0, "expired": 0, "dead_lettered": 0,
                            "copies": 0, "copies_deduplicated": 0, "copies_lost": 0}
        super().__init__(config)

    # --- the run -------------------------------------------------------------------------------------------
    def run(self) -> SimResult:
        result = super().run()
        if result.ok:
            try:
                self._check_nothing_lost()
            except SafetyViolation as error:
                result.ok, result.violation = False, str(error)
                self._log(f"VIOLATION {error}")
        result.stats.update(self.queue_stats)
        return result

    def _tick(self, tick: int, chaos: bool) -> None:
        self.now = tick
        for client in list(self.clients.values()):
            self._client_step(client, chaos)
        super()._tick(tick, chaos)

    def _converged(self) -> bool:
        """The Raft groups converged and every client's proposals were applied (or given up)."""
        return super()._converged() and not any(len(client.tracker) for client in self.clients.values())

    def _maybe_propose(self) -> None:
        """No raw proposals: the clients propose (`_client_step`)."""

    @property
    def now_ms(self) -> int:
        return self.now * MS_PER_TICK

    # --- the clients ---------------------------------------------------------------------------------------
    def _start(self, node: SimNode, fresh: bool) -> None:
        super()._start(node, fresh)
        boot = node.incarnation + 1
        client = SimClient(node.id, boot, ProposalTracker(boot * PROPOSAL_IDS_PER_BOOT, RETRY_MS, TIMEOUT_MS))
        self.clients[node.id] = client
        for earlier in range(1, boot):  # consumers of this node's earlier lives hold messages nobody will ack
            self._propose(client, Detach((node.id, earlier, 1), self.now_ms), barrier=True)
        self.consumers.add(client.consumer_id)
        self._propose(client, Attach(client.consumer_id, self.now_ms, prefetch=PREFETCH))

    def _crash(self, node: SimNode) -> None:
        super()._crash(node)
        self.clients.pop(node.id, None)
        self.replicas.pop(node.id, None)

    def _client_step(self, client: SimClient, chaos: bool) -> None:
        rng = self.rng
        if chaos and rng.random() < PUBLISH_RATE and len(client.waiting) < CONFIRM_WINDOW:
            seq = client.next_seq
            client.next_seq += 1
            body = f"{client.origin}/{seq}".encode()
            message = QueuedMessage(body, len(body), True)
            proposal_id = self._propose(client, Enqueue(message, self.now_ms, client.publisher_id, seq))
            client.waiting[proposal_id] = seq
            if self.confirm_early:
                self.confirmed.append(body)
            self.queue_stats["published"] += 1
        if chaos:
            self._reject_step(client)
        if client.outstanding and rng.random() < SETTLE_RATE:
            count = rng.randint(1, len(client.outstanding))
            ids, client.outstanding = client.outstanding[:count], client.outstanding[count:]
            self._propose(client, Settle(client.consumer_id, ids))
        if chaos:
            self._usage_step(client)
        for pending in client.tracker.expired(self.now_ms):
            client.waiting.pop(pending.proposal_id, None)  # a publish given up: nacked, never confirmed
            self.queue_stats["given_up"] += 1
        for group in client.tracker.groups_due(self.now_ms):
            for pending in client.tracker.sendable(group):
                self._send(client, pending)

    def _usage_step(self, client: SimClient) -> None:
        """Cancel and consume again, declare, the leader's timer: the commands of the machine's usage rules."""
        rng, now_ms = self.usage_rng, self.now_ms
        if not client.cancelled and rng.random() < CANCEL_RATE:
            client.cancelled = True
            self._propose(client, Cancel(client.consumer_id, now_ms))
            self.queue_stats["cancels"] += 1
        elif client.cancelled and rng.random() < RECONSUME_RATE:
            client.cancelled = False
            self._propose(client, Attach(client.consumer_id, now_ms, prefetch=PREFETCH))
        if rng.random() < DECLARE_RATE:
            self._propose(client, Declare(now_ms))
        if rng.random() < EXPIRE_RATE:
            self._propose(client, Expire(now_ms))

    def _reject_step(self, client: SimClient) -> None:
        """basic.reject without requeue of one delivered message: the machine dead-letters it."""
        rng = self.dead_letter_rng
        if client.outstanding and rng.random() < DISCARD_RATE:
            msg_id = client.outstanding.pop(rng.randrange(len(client.outstanding)))
            self._propose(client, Discard(client.consumer_id, (msg_id,), self.now_ms))

    def _propose(self, client: SimClient, command: Any, barrier: bool = False) -> int:
        proposal_id = client.tracker.next_id()
        envelope = Envelope(INCARNATION, client.origin, proposal_id, command)
        group = self.group_ids[0]
        pending = Pending(proposal_id, group, "/", QUEUE, ENTRIES.encode(envelope), self.now_ms, barrier=barrier,
                          envelope=envelope)
        client.tracker.add(pending)
        if not client.tracker.held_back(pending):
            self._send(client, pending)
        return proposal_id

    def _send(self, client: SimClient, pending: Pending) -> None:
        """Forward to a node that believes it leads (lost on a cut link or by the network's loss rate)."""
        pending.sent_ms = self.now_ms
        leaders = self._leaders(GroupId(pending.group), include_busy=True)
        if not leaders:
            return
        leader, _ = self.rng.choice(leaders)
        lost = (client.node, leader.id) in self.net.blocked or self.rng.random() < self.net.faults.loss_rate
        if leader.id != client.node and lost:
            return
        if len(leader.proposals) < PROPOSALS_QUEUED_MAX:
            leader.proposals.append((GroupId(pending.group), pending.data))
        if leader.pending is None and leader.mr is not None:
            self._propose_queued(leader)
            self._drive(leader)

    # --- the replicas --------------------------------------------------------------------------------------
    def _restore_applied(self, node: SimNode, group: GroupId, data: bytes) -> AppliedState:
        applied, replica = Replica.decode(data)
        self.replicas[node.id] = replica
        return applied

    def _snapshot_data(self, node: SimNode, group: GroupId) -> bytes:
        return self.replicas[node.id].encode(node.applied[group])

    def _on_applied(self, node: SimNode, group: GroupId, entry: Entry) -> None:
        if entry.kind is not EntryKind.NORMAL:
            return
        read = ENTRIES.read_batch((entry.data,), INCARNATION)
        if not read.envelopes:
            return
        proposal = read.envelopes[0].proposal
        replica = self.replicas[node.id]
        command = proposal.command
        removed: list[MsgId] = []
        if isinstance(command, Settle):
            unacked = set(replica.queue.queue.unacked_msg_ids(command.consumer_id))
            removed = [msg_id for msg_id in command.msg_ids if msg_id in unacked]
        effects = replica.queue.apply(proposal)
        client = self.clients.get(node.id)
        own = client is not None and proposal.origin == client.origin
        if own:
            assert client is not None
            client.tracker.applied(proposal.proposal_id)
            for released in client.tracker.released(group):
                self._send(client, released)
        if effects is None:
            self.queue_stats["skipped_retries"] += 1
            return
        replica.settled.update(removed)
        if own and removed:
            self.queue_stats["settled"] += len(removed)
        self._check_decisions(node, entry.index, effects)
        for effect in effects:
            if isinstance(effect, Deliver):
                if effect.msg_id in replica.settled:
                    raise SafetyViolation("redelivery", f"{node.id} delivered msg {effect.msg_id} after its ack "
                                                        f"was applied")
                if client is not None and effect.consumer_id == client.consumer_id:
                    client.outstanding.append(effect.msg_id)
                    self.queue_stats["deliveries"] += 1
            elif isinstance(effect, DeadLetter):
                assert effect.msg_id is not None
                replica.settled.add(effect.msg_id)  # it left the queue: never delivered again, and not lost
                leads = node.mr is not None and node.mr.groups[group].role is Role.LEADER
                if leads or self.dead_letter_rng.random() < STRAY_COPY_RATE:
                    self._send_copy(effect)
            elif isinstance(effect, Accepted):
                assert isinstance(command, Enqueue)
                self.msg_ids.setdefault(command.message.payload, effect.msg_id)
                if own and client is not None and client.waiting.pop(proposal.proposal_id, None) is not None:
                    self.queue_stats["confirmed"] += 1
                    if not self.confirm_early:
                        self.confirmed.append(command.message.payload)

    def _send_copy(self, effect: DeadLetter) -> None:
        """The leader's dead-letter copy to the target, under the source's publisher id and the machine's sequence
        (`copy_sequence`); lost now and then. Accepting one message's copy twice is a violation."""
        if self.dead_letter_rng.random() < COPY_LOSS_RATE:
            self.queue_stats["copies_lost"] += 1
            return
        body = effect.message.payload
        copy = Enqueue(QueuedMessage(body, len(body), True), self.now_ms, DEAD_LETTER_PUBLISHER,
                       self.copy_sequence(effect))
        for outcome in self.dead_letter_target.apply(copy):
            if isinstance(outcome, Duplicate):
                self.queue_stats["copies_deduplicated"] += 1
            elif isinstance(outcome, Accepted):
                if body in self.copied:
                    raise SafetyViolation("dead letter copied twice", f"{body!r} (sequence {copy.sequence})")
                self.copied.add(body)
                self.queue_stats["copies"] += 1

    def copy_sequence(self, effect: DeadLetter) -> int | None:
        return effect.seq

    def _check_decisions(self, node: SimNode, index: int, effects: list[Any]) -> None:
        """Every replica makes the same usage decisions, and dead-letters the same messages under the same
        sequences, at the same index."""
        decided = tuple(f"DeadLetter {e.msg_id}#{e.seq}" if type(e) is DeadLetter else type(e).__name__
                        for e in effects if type(e) in _DECISIONS)
        first = self.decisions.setdefault(index, (node.id, decided))
        if first[1] != decided:
            raise SafetyViolation("decision divergence", f"{node.id} decided {decided} and {first[0]} "
                                                          f"{first[1]} at index {index}")
        if first[0] == node.id:
            self.queue_stats["unused"] += decided.count("QueueUnused")
            self.queue_stats["expired"] += decided.count("QueueExpired")
            self.queue_stats["dead_lettered"] += len(decided) - decided.count("QueueUnused") - decided.count(
                "QueueExpired")

    def _after_apply(self, node: SimNode, group: GroupId, state: AppliedState) -> None:
        digest = zlib.crc32(self.replicas[node.id].encode(AppliedState(state.index, 0)))
        first = self.state_digests.setdefault(state.index, (node.id, digest))
        if first[1] != digest:
            raise SafetyViolation("replica divergence", f"{node.id} and {first[0]} differ at index {state.index}")

    def _check_nothing_lost(self) -> None:
        """After convergence: every confirmed message was settled or is still in the queue."""
        node = max(self.replicas, key=lambda n: self.nodes[n].applied[self.group_ids[0]].index)
        replica = self.replicas[node]
        queue = replica.queue.queue
        present = set(queue.ready_msg_ids())
        for consumer in self.consumers:
            present.update(queue.unacked_msg_ids(consumer))
        lost = []
        for body in self.confirmed:
            msg_id = self.msg_ids.get(body)
            if msg_id is None or (msg_id not in present and msg_id not in replica.settled):
                lost.append(body)
        if lost:
            raise SafetyViolation("confirmed message lost", f"{len(lost)} on {node}, e.g. {lost[:5]}")


_DECISIONS = (QueueUnused, QueueExpired, DeadLetter)


def run_queue_seed(config: SimConfig) -> SimResult:
    return QueueSimulation(config).run()
