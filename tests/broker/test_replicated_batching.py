"""Replicated mode hot path: a read's publishes of one channel to one queue are one EnqueueMany proposal, the
proposing node applies its own objects instead of decoding its entries, and messages carry their property bytes."""

from __future__ import annotations

from typing import Any

from cluster.queue import Enqueue, EnqueueMany, Proposal, QueuedMessage, encode_proposal
from cluster.queue.envelope import Envelope
from node.amqp import events as ev
from node.amqp import methods as m
from node.amqp.properties import BasicProperties, decode_content_header, encode_content_header
from node.broker import replica, replica_wire
from node.broker.channel import Message
from node.broker.effects import ProposeQueue
from tests.broker.cluster_harness import Cluster, ClusterClient, cluster_client, take
from tests.broker.harness import bodies, deliveries, of_type

KEY = ("/", "q")


def _setup(queues: tuple[str, ...] = ("q",)) -> tuple[Cluster, ClusterClient, ClusterClient]:
    cluster = Cluster()
    a, b = cluster_client(cluster, "a"), cluster_client(cluster, "b")
    for name in queues:
        a.declare(name, durable=True, arguments={"x-queue-type": "quorum"})
    cluster.commit()
    for node in ("a", "b", "c"):
        take(cluster, node)
    a.call(m.ConfirmSelect())
    return cluster, a, b


def _publish(exchange: str, routing_key: str, body: bytes, props: BasicProperties | None = None) -> Any:
    method = m.BasicPublish(exchange=exchange, routing_key=routing_key)
    return ev.ContentReceived(1, method, props or BasicProperties(delivery_mode=2), body)


def _read(cluster: Cluster, client: ClusterClient, events: list[Any]) -> list[Any]:
    """One socket read's worth of events through handle_many; returns the proposals it made."""
    effects = client.broker.handle_many(client.conn_id, events, client.now_ms)
    proposals = [e for e in effects if isinstance(e, ProposeQueue)]
    cluster.feed(client.node, effects)
    return proposals


def _acks(effects: list[Any]) -> list[tuple[int, bool]]:
    return [(x.delivery_tag, x.multiple) for x in of_type(effects, m.BasicAck)]


def _confirmed(effects: list[Any]) -> set[int]:
    tags: set[int] = set()
    for ack in of_type(effects, m.BasicAck):
        tags |= set(range(1, ack.delivery_tag + 1)) if ack.multiple else {ack.delivery_tag}
    return tags


def _nacks(effects: list[Any]) -> list[tuple[int, bool]]:
    return [(x.delivery_tag, x.multiple) for x in of_type(effects, m.BasicNack)]


def test_a_reads_publishes_are_one_entry_confirmed_one_by_one_in_effect() -> None:
    cluster, a, b = _setup()
    proposals = _read(cluster, a, [_publish("", "q", b"%d" % n) for n in range(5)])
    assert len(proposals) == 1
    command = proposals[0].command
    assert isinstance(command, EnqueueMany) and list(command.sequences) == [1, 2, 3, 4, 5]
    assert len(cluster.logs[KEY]) == 1
    cluster.commit()
    assert _acks(take(cluster, "a")) == [(5, True)]
    b.consume("q", "t")
    cluster.commit()
    assert bodies(take(cluster, "b")) == [b"%d" % n for n in range(5)]
    assert len(set(cluster.snapshots(KEY).values())) == 1
    for broker in cluster.brokers.values():
        assert broker.vhosts["/"].queues["q"].machine.ready_count == 0


def test_another_command_to_the_queue_closes_the_batch_so_order_is_kept() -> None:
    cluster, a, _b = _setup(("q", "r"))
    events = [_publish("", "q", b"1"), _publish("", "r", b"r1"), _publish("", "q", b"2"),
              ev.MethodReceived(1, m.QueuePurge(queue="q")), _publish("", "q", b"3"), _publish("", "q", b"4")]
    proposals = _read(cluster, a, events)
    kinds = [(p.queue, type(p.command).__name__) for p in proposals]
    assert kinds == [("q", "EnqueueMany"), ("r", "Enqueue"), ("q", "Purge"), ("q", "EnqueueMany")]
    cluster.commit()
    effects = take(cluster, "a")
    assert of_type(effects, m.QueuePurgeOk)[0].message_count == 2
    assert _confirmed(effects) == {1, 2, 3, 4, 5}
    for broker in cluster.brokers.values():
        assert broker.vhosts["/"].queues["q"].machine.ready_count == 2
    assert len(set(cluster.snapshots(KEY).values())) == 1


def test_proposals_are_values_the_broker_never_changes_once_emitted() -> None:
    """Effects are immutable once emitted (issue 15 item 4): each read's EnqueueMany holds tuples, and a proposal
    the runtime took is left as it was when a later read of the same channel publishes again."""
    cluster, a, _b = _setup(("q", "r"))
    events = [_publish("", "q", b"1"), _publish("", "q", b"2"), _publish("", "r", b"r1"), _publish("", "q", b"3")]
    first = _read(cluster, a, events)
    commands = [p.command for p in first]
    assert [type(c).__name__ for c in commands] == ["EnqueueMany", "Enqueue"]
    batch = commands[0]
    assert isinstance(batch, EnqueueMany)
    assert type(batch.messages) is tuple and type(batch.sequences) is tuple and batch.sequences == (1, 2, 4)
    seen = [(p, p.command, tuple(getattr(p.command, "sequences", ()))) for p in first]
    again = _read(cluster, a, [_publish("", "q", b"%d" % n) for n in range(5, 9)])
    assert [type(p.command).__name__ for p in again] == ["EnqueueMany"]
    assert again[0].command.sequences == (5, 6, 7, 8)
    for proposal, command, sequences in seen:
        assert proposal.command is command and tuple(getattr(command, "sequences", ())) == sequences
    cluster.commit()
    assert _confirmed(take(cluster, "a")) == set(range(1, 9))


def test_batches_are_bounded() -> None:
    cluster, a, _b = _setup()
    count = replica.BATCH_MESSAGES_MAX + 3
    proposals = _read(cluster, a, [_publish("", "q", b"x") for _ in range(count)])
    sizes = [len(p.command.sequences) if isinstance(p.command, EnqueueMany) else 1 for p in proposals]
    assert sizes == [replica.BATCH_MESSAGES_MAX, 3]
    cluster.commit()
    assert _confirmed(take(cluster, "a")) == set(range(1, count + 1))


def test_an_abandoned_batch_nacks_every_publish_in_it() -> None:
    cluster, a, _b = _setup()
    cluster.hold = True
    _read(cluster, a, [_publish("", "q", b"%d" % n) for n in range(4)])
    cluster.hold = False
    cluster.abandon()
    effects = take(cluster, "a")
    assert _nacks(effects) == [(n, False) for n in range(1, 5)] and _acks(effects) == []


def test_the_proposer_applies_its_own_objects_and_other_replicas_the_publishers_property_bytes() -> None:
    cluster, a, _b = _setup()
    props = BasicProperties(content_type="text/plain", headers={"k": 1}, delivery_mode=2)
    _read(cluster, a, [_publish("", "q", b"hi", props)])
    cluster.commit()
    a.consume("q", "t")
    cluster.commit()
    delivered = [d for d in deliveries(take(cluster, "a")) if d.body == b"hi"]
    assert len(delivered) == 1 and delivered[0].properties is props  # its own object, not decoded back
    on_b = [d for d in cluster.brokers["b"].vhosts["/"].queues["q"].machine.replica.queue.unacked_msg_ids(
        next(iter(cluster.brokers["a"].consumers)))]
    assert len(on_b) == 1
    assert len(set(cluster.snapshots(KEY).values())) == 1


def test_payload_property_bytes_decode_to_equal_properties_and_old_entries_still_apply() -> None:
    props = BasicProperties(content_type="a", headers={"x": [1, "two"], "b": bytearray(b"\x00")}, priority=4)
    msg = Message("ex", "rk", props, b"body")
    wire = replica_wire.encode_payload_wire(msg)
    assert isinstance(wire[2], bytes)
    decoded = replica.decode_payload(wire)
    assert decoded == msg
    header = encode_content_header(4, decoded.properties)
    assert decode_content_header(header)[2] == props
    assert replica.decode_payload(replica_wire.encode_payload(msg)) == msg  # the snapshot (and old entries') form
    cluster, _a, b = _setup()
    old = encode_proposal(Proposal("z", 1, Enqueue(QueuedMessage(Message("", "q", props, b"old"), 3, True), 0,
                                                   ("z", 1, 1, 1), 1)), replica_wire.encode_payload)
    cluster.logs[KEY].append(old)
    cluster.commit()
    b.consume("q", "t")
    cluster.commit()
    delivered = [d for d in deliveries(take(cluster, "b")) if d.body == b"old"]
    assert [d.properties for d in delivered] == [props]


def test_property_bytes_without_headers_decode_to_one_shared_object() -> None:
    plain = replica_wire.encode_payload_wire(Message("", "q", BasicProperties(delivery_mode=2), b"1"))
    first, second = replica_wire.decode_payload(plain), replica_wire.decode_payload(list(plain))
    assert first.properties is second.properties
    with_headers = replica_wire.encode_payload_wire(Message("", "q", BasicProperties(headers={"a": 1}), b"1"))
    one, two = replica_wire.decode_payload(with_headers), replica_wire.decode_payload(with_headers)
    assert one.properties == two.properties and one.properties is not two.properties  # headers: never shared


def test_the_kept_proposals_are_bounded() -> None:
    message = QueuedMessage(Message("", "q", BasicProperties(), b"x"), 1, False)
    codec = replica_wire.envelope_codec("bound-test")
    for n in range(codec.kept_max + 10):
        codec.encode(Envelope(0, "bound-test", n, Enqueue(message, 0, ("p",), n)))
    assert len(codec._kept) <= codec.kept_max
    assert codec._kept_bytes == sum(len(data) for data in codec._kept)
