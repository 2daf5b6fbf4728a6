"""Micro-benchmark of what every replica of a quorum queue does per message in workload (b): apply committed entries.

One round = one `EnqueueMany` entry of 256 persistent 100-byte messages (one publisher, consecutive sequences)
followed by the consumer's multiple-ack `Settle` of the 256 deliveries it got (one consumer, prefetch 1000,
attached before the first round). Two levels, each printing CPU microseconds per message:
- machine: `decode_proposal` (with node/broker/replica_wire's payload codec) + `ReplicatedQueue.apply` of both
  entries, as cluster/queue sees them;
- classic: workload (a)'s machine work for the same messages: 256 single `Enqueue`s, then the multiple-ack Settle;
- broker: both entries' bytes read by the broker's `envelope_codec` (`read_batch`, as the cluster runtime does)
  and applied with one `Broker.apply_committed` on a replica whose publisher and consumer are on other nodes (ids
  of node "x"), i.e. also node/broker/replica.py's per-entry and per-effect work;
- publisher: the publisher's node for the same 256 messages: one read of confirmed publishes through
  `Broker.handle_many` (route, batch into one EnqueueMany, propose), the entry's encoding (`envelope_codec`), and
  its own entry read and applied when committed (the kept object: no decoding), confirms released.
The collector runs as in a serving node (young threshold 50,000). Timing is CPU time of this process (time.process_time), so a busy machine distorts it less than wall time.

Run from the repository root: .venv/bin/python -m bench.micro.queue_apply [--rounds 400] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import time
from typing import Any

from cluster.queue import (
    Attach,
    Deliver,
    EnqueueMany,
    QueuedMessage,
    ReplicatedQueue,
    Settle,
    decode_proposal,
)
from cluster.queue.envelope import Envelope
from cluster.queue.types import MsgId
from node.amqp.properties import BasicProperties
from node.broker import replica_wire
from node.broker.channel import Message

BATCH = 256
PREFETCH = 1000
BODY = b"x" * 100
PUBLISHER = ("x", 1, 7, 1)
CONSUMER = ("x", 1, 3)
ORIGIN = "x"
SOURCE = replica_wire.envelope_codec("")  # node "x"'s entries, written by a codec that keeps none (replicas decode)


def _message() -> QueuedMessage:
    props = BasicProperties(delivery_mode=2)
    return QueuedMessage(Message("", "q", props, BODY), len(BODY), True, 0, None)


class Rounds:
    """Encoded entries for round after round (proposal ids and sequences keep growing)."""

    def __init__(self) -> None:
        self.proposal_id = 0
        self.sequence = 0
        self.message = _message()
        self.next_msg_id = 1

    def _encode(self, command: Any) -> bytes:
        self.proposal_id += 1
        return SOURCE.encode(Envelope(0, ORIGIN, self.proposal_id, command))

    def attach(self) -> bytes:
        return self._encode(Attach(CONSUMER, 0, prefetch=PREFETCH))

    def enqueue_many(self, now_ms: int) -> bytes:
        sequences = tuple(range(self.sequence + 1, self.sequence + 1 + BATCH))
        self.sequence += BATCH
        return self._encode(EnqueueMany(PUBLISHER, now_ms, (self.message,) * BATCH, sequences))

    def settle(self) -> bytes:
        ids = list(range(self.next_msg_id, self.next_msg_id + BATCH))
        self.next_msg_id += BATCH
        return self._encode(Settle(CONSUMER, [MsgId(i) for i in ids]))

    def entries(self, rounds: int) -> list[tuple[bytes, bytes]]:
        return [(self.enqueue_many(round_index), self.settle()) for round_index in range(rounds)]


def bench_machine(rounds: int) -> float:
    source = Rounds()
    replica = ReplicatedQueue("q")
    replica.apply(decode_proposal(source.attach(), replica_wire.decode_payload))
    entries = source.entries(rounds)
    decode_payload = replica_wire.decode_payload
    started = time.process_time()
    delivered = 0
    for enqueue_data, settle_data in entries:
        effects = replica.apply(decode_proposal(enqueue_data, decode_payload))
        assert effects is not None
        delivered += sum(1 for effect in effects if type(effect) is Deliver)
        replica.apply(decode_proposal(settle_data, decode_payload))
    elapsed = time.process_time() - started
    assert delivered == rounds * BATCH and replica.queue.unacked_count == 0, (delivered, replica.queue.unacked_count)
    return elapsed * 1e6 / (rounds * BATCH)


def bench_classic(rounds: int) -> float:
    """Workload (a)'s machine work: 256 single Enqueues (a classic queue applies each publish on its own), each
    delivered at once, then one multiple-ack Settle; no codec."""
    from cluster.queue import Enqueue, Queue

    queue = Queue("q")
    queue.apply(Attach(CONSUMER, 0, prefetch=PREFETCH))
    message = _message()
    apply = queue.apply
    started = time.process_time()
    for round_index in range(rounds):
        first = round_index * BATCH + 1
        for _ in range(BATCH):
            apply(Enqueue(message, round_index))
        apply(Settle(CONSUMER, [MsgId(i) for i in range(first, first + BATCH)]))
    elapsed = time.process_time() - started
    assert queue.unacked_count == 0 and queue.ready_count == 0
    return elapsed * 1e6 / (rounds * BATCH)


def _confirming_cluster() -> tuple[Any, Any]:
    """The broker harness's 3-node cluster with quorum queue "q" and a confirming client on node "a"."""
    from node.amqp import methods as m
    from tests.broker.cluster_harness import Cluster, cluster_client, take

    cluster = Cluster()
    client = cluster_client(cluster, "a")
    client.declare("q", durable=True, arguments={"x-queue-type": "quorum"})
    cluster.commit()
    take(cluster, "a")
    client.call(m.ConfirmSelect())
    return cluster, client


def bench_broker(rounds: int) -> float:

    cluster, _ = _confirming_cluster()
    broker = cluster.brokers["b"]
    source = Rounds()
    codec = broker.envelope_codec
    broker.apply_committed("/", "q", codec.read_batch((source.attach(),), 0).envelopes)
    entries = source.entries(rounds)
    started = time.process_time()
    for enqueue_data, settle_data in entries:
        broker.apply_committed("/", "q", codec.read_batch((enqueue_data, settle_data), 0).envelopes)
    elapsed = time.process_time() - started
    machine = broker.vhosts["/"].queues["q"].machine
    assert machine.unacked_count == 0 and machine.ready_count == 0
    return elapsed * 1e6 / (rounds * BATCH)


def bench_publisher(rounds: int) -> float:
    """The publisher's node: one read of 256 confirmed publishes (`handle_many`: route, batch, propose), the entry's
    encoding, then its own committed entry applied (decode-once: no decoding) and the confirms released."""
    from node.amqp import events as ev
    from node.amqp import methods as m
    from node.broker.effects import ProposeQueue

    cluster, client = _confirming_cluster()
    broker = cluster.brokers["a"]
    publish = ev.ContentReceived(1, m.BasicPublish(exchange="", routing_key="q"), BasicProperties(delivery_mode=2),
                                 BODY)
    events = [publish] * BATCH
    codec = broker.envelope_codec
    acked = 0
    started = time.process_time()
    for _ in range(rounds):
        effects = broker.handle_many(client.conn_id, events, 0)
        entries = [codec.encode(Envelope(0, "a", effect.proposal_id, effect.command))
                   for effect in effects if type(effect) is ProposeQueue]
        acked += len(broker.apply_committed("/", "q", codec.read_batch(entries, 0).envelopes))
    elapsed = time.process_time() - started
    assert acked >= rounds, acked
    return elapsed * 1e6 / (rounds * BATCH)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=15, help="best of this many runs")
    parser.add_argument("--only", choices=["machine", "classic", "broker", "publisher"], help="run one level only")
    parser.add_argument("--profile", action="store_true", help="cProfile one machine and one broker run")
    options = parser.parse_args()
    gc.freeze()
    gc.set_threshold(50_000)  # as node/runtime/server.py's hot_path_gc while serving
    if options.profile:
        for bench in (bench_machine, bench_classic, bench_broker, bench_publisher):
            profiler = cProfile.Profile()
            profiler.runcall(bench, options.rounds)
            print(f"== {bench.__name__}")
            pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
        return
    benches = [bench_machine, bench_classic, bench_broker, bench_publisher]
    if options.only:
        benches = [{"machine": bench_machine, "classic": bench_classic, "broker": bench_broker,
                    "publisher": bench_publisher}[options.only]]
    for bench in benches:
        best = min(bench(options.rounds) for _ in range(options.repeat))
        print(f"{bench.__name__:<14} {best:7.2f} us/msg (best of {options.repeat}, {options.rounds} rounds of {BATCH})")


if __name__ == "__main__":
    main()
