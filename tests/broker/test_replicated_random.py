"""Replicated mode under random interleavings (seeded, pure): no confirmed message is lost, replicas end equal.

Each run drives three brokers with publishers (confirms on), consumers (manual acks, random prefetch), no-ack
gets, node crashes and restarts (from snapshots), lagging nodes catching up from a snapshot, leader moves, retried entries and abandoned proposals, then
drains the queue and checks: every message the broker confirmed was consumed by a client or is still in the queue,
and every replica's snapshot is the same bytes.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from node.amqp import methods as m
from node.broker.effects import Send, SendContent
from tests.broker.cluster_harness import Cluster, ClusterClient, take

KEY = ("/", "q")


@dataclass
class Party:
    client: ClusterClient
    role: str  # "pub" | "sub"
    seqs: dict[int, bytes] = field(default_factory=dict)  # publish seq -> body, until confirmed
    next_seq: int = 1
    unacked: dict[int, bytes] = field(default_factory=dict)  # delivery tag -> body
    consuming: bool = False


class World:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.cluster = Cluster()
        self.parties: list[Party] = []
        self.next_conn = 1
        self.confirmed: set[bytes] = set()
        self.consumed: set[bytes] = set()
        self.next_body = 0
        self.fanned: set[bytes] = set()  # published to the fanout exchange: to q and to q2 (length-limited)
        self.consumed2: set[bytes] = set()
        first = self.connect("a", "pub")
        first.client.declare("q", durable=True, arguments={"x-queue-type": "quorum"})
        first.client.declare("q2", durable=True, arguments={"x-max-length": 15, "x-overflow": "reject-publish"})
        first.client.call(m.ExchangeDeclare(exchange="fan", type="fanout", durable=True))
        first.client.bind("q", "fan")
        first.client.bind("q2", "fan")
        self.cluster.commit()

    def connect(self, node: str, role: str) -> Party:
        client = ClusterClient(self.cluster, node, self.next_conn)
        self.next_conn += 1
        client.open(1)
        party = Party(client, role)
        if role == "pub":
            client.call(m.ConfirmSelect())
        self.parties.append(party)
        return party

    def live(self, role: str) -> list[Party]:
        return [p for p in self.parties if p.role == role and p.client.node not in self.cluster.down]

    # --- reading what the brokers sent -----------------------------------------------------------------------

    def collect(self) -> None:
        for node in self.cluster.brokers:
            for effect in take(self.cluster, node):
                party = self._party(node, effect)
                if party is not None:
                    self._observe(party, effect)

    def _party(self, node: str, effect: object) -> Party | None:
        conn_id = getattr(effect, "conn_id", None)
        return next((p for p in self.parties if p.client.node == node and p.client.conn_id == conn_id), None)

    def _observe(self, party: Party, effect: object) -> None:
        method = getattr(effect, "method", None)
        if isinstance(effect, Send) and isinstance(method, m.BasicAck | m.BasicNack):
            tags = [s for s in party.seqs if s <= method.delivery_tag] if method.multiple else [method.delivery_tag]
            for seq in tags:
                body = party.seqs.pop(seq)
                if isinstance(method, m.BasicAck):
                    self.confirmed.add(body)
        elif isinstance(effect, SendContent) and isinstance(method, m.BasicDeliver):
            party.unacked[method.delivery_tag] = effect.body
        elif isinstance(effect, SendContent) and isinstance(method, m.BasicGetOk):
            self.consumed.add(effect.body)
        elif isinstance(effect, Send) and isinstance(method, m.BasicCancel):
            party.consuming = False

    # --- actions ---------------------------------------------------------------------------------------------

    def step(self) -> None:
        rng, cluster = self.rng, self.cluster
        action = rng.choice(["publish"] * 6 + ["commit"] * 4 + ["ack", "ack", "nack", "consume", "cancel", "get",
                                                                 "crash", "leader", "duplicate", "abandon", "lag"])
        getattr(self, "do_" + action)()
        if rng.random() < 0.3:
            cluster.commit()
        self.collect()

    def do_publish(self) -> None:
        pubs = self.live("pub")
        if not pubs:
            self.connect(self.rng.choice(self._up()), "pub")
            return
        party = self.rng.choice(pubs)
        body = b"%d" % self.next_body
        self.next_body += 1
        party.seqs[party.next_seq] = body
        party.next_seq += 1
        if self.rng.random() < 0.3:  # confirmed only if both queues took it; nacked when q2 is full
            self.fanned.add(body)
            party.client.publish("fan", "", body)
        else:
            party.client.publish("", "q", body)

    def do_commit(self) -> None:
        self.cluster.commit()

    def do_ack(self) -> None:
        subs = [p for p in self.live("sub") if p.unacked]
        if subs:
            party = self.rng.choice(subs)
            tag = self.rng.choice(list(party.unacked))
            multiple = self.rng.random() < 0.3
            for t in [t for t in party.unacked if t <= tag] if multiple else [tag]:
                self.consumed.add(party.unacked.pop(t))
            party.client.ack(tag, multiple=multiple)

    def do_nack(self) -> None:
        subs = [p for p in self.live("sub") if p.unacked]
        if subs:
            party = self.rng.choice(subs)
            tag = self.rng.choice(list(party.unacked))
            party.unacked.pop(tag)
            party.client.call(m.BasicNack(delivery_tag=tag, requeue=True))

    def do_consume(self) -> None:
        idle = [p for p in self.live("sub") if not p.consuming]
        party = self.rng.choice(idle) if idle else self.connect(self.rng.choice(self._up()), "sub")
        party.client.call(m.BasicQos(prefetch_count=self.rng.choice([0, 1, 3])))
        party.client.consume("q", f"t{party.client.conn_id}")
        party.consuming = True

    def do_cancel(self) -> None:
        subs = [p for p in self.live("sub") if p.consuming]
        if subs:
            party = self.rng.choice(subs)
            party.client.call(m.BasicCancel(consumer_tag=f"t{party.client.conn_id}"))
            party.consuming = False

    def do_get(self) -> None:
        node = self.rng.choice(self._up())
        party = next((p for p in self.live("pub") if p.client.node == node), None) or self.connect(node, "pub")
        party.client.call(m.BasicGet(queue="q", no_ack=True))

    def do_crash(self) -> None:
        node = self.rng.choice(["b", "c"])
        if node in self.cluster.paused:
            return
        if node in self.cluster.down:
            self.cluster.restart(node)
            return
        self.cluster.commit()
        self.collect()  # what the node sent before it died reached its clients (no-ack gets are consumed)
        self.cluster.crash(node)
        self.parties = [p for p in self.parties if p.client.node != node]
        if self.cluster.leaders[KEY] == node:
            self.cluster.set_leader(KEY, "a")

    def do_lag(self) -> None:
        node = self.rng.choice(["b", "c"])
        if node in self.cluster.paused:
            self.cluster.resume(node)
        elif node not in self.cluster.down and self.cluster.leaders[KEY] != node:
            self.cluster.pause(node)

    def do_leader(self) -> None:
        self.cluster.set_leader(KEY, self.rng.choice([n for n in self._up() if n not in self.cluster.paused]))

    def do_duplicate(self) -> None:
        if self.cluster.logs[KEY]:
            self.cluster.duplicate_last(KEY)

    def do_abandon(self) -> None:
        self.cluster.hold = True
        self.do_publish()
        self.do_ack()
        self.cluster.hold = False
        self.cluster.abandon()

    def _up(self) -> list[str]:
        return [n for n in ("a", "b", "c") if n not in self.cluster.down]

    # --- the end ---------------------------------------------------------------------------------------------

    def drain(self) -> None:
        for node in ("b", "c"):
            if node in self.cluster.paused:
                self.cluster.resume(node)
            if node in self.cluster.down:
                self.cluster.restart(node)
        self.cluster.commit()
        self.collect()
        for party in list(self.parties):
            party.client.close()
        self.parties.clear()
        self.cluster.commit()
        self.collect()
        last = self.connect("c", "sub")
        last.client.consume("q", "final", no_ack=True)
        for _ in range(200):
            self.cluster.commit()
            self.collect()
            self.consumed.update(last.unacked.values())
            last.unacked.clear()
            last.client.writable(True)
            if self.cluster.brokers["a"].vhosts["/"].queues["q"].machine.ready_count == 0:
                break
        self.cluster.commit()
        self.collect()
        self.consumed.update(last.unacked.values())
        self.consumed2 = self._drain_q2()

    def _drain_q2(self) -> set[bytes]:
        party = self.connect("b", "sub")
        party.client.consume("q2", "final2", no_ack=True)
        for _ in range(50):
            self.cluster.commit()
            self.collect()
            party.client.writable(True)
        return set(party.unacked.values())


@pytest.mark.parametrize("seed", range(12))
def test_random_interleavings_lose_no_confirmed_message_and_replicas_agree(seed: int) -> None:
    world = World(seed)
    for _ in range(250):
        world.step()
    world.drain()
    assert world.confirmed, "the run confirmed nothing: it tests nothing"
    assert world.confirmed <= world.consumed, sorted(world.confirmed - world.consumed)
    assert world.confirmed & world.fanned <= world.consumed2, sorted((world.confirmed & world.fanned) - world.consumed2)
    machine = world.cluster.brokers["a"].vhosts["/"].queues["q"].machine
    assert (machine.ready_count, machine.unacked_count) == (0, 0)  # nothing stuck with a consumer that is gone
    for key in (KEY, ("/", "q2")):
        assert len(set(world.cluster.snapshots(key).values())) == 1, f"replicas of {key} differ"
