"""Replicated mode: consumers, credit, QoS, node failures, TTL, dead letters, snapshots and mirrored definitions."""

from __future__ import annotations

import dataclasses
from typing import Any

import cbor2

from node.amqp import methods as m
from node.broker.effects import ProposeQueue, SendContent
from node.broker.replica import DETACH_RETRIES_MAX
from node.broker.replica_machine import replica_of
from tests.broker.cluster_harness import Cluster, ClusterClient, cluster_client, take
from tests.broker.harness import bodies, channel_close, deliveries, of_type

KEY = ("/", "q")


def _setup(**arguments: Any) -> tuple[Cluster, ClusterClient, ClusterClient, ClusterClient]:
    cluster = Cluster()
    a, b, c = (cluster_client(cluster, node) for node in ("a", "b", "c"))
    a.declare("q", durable=True, arguments={"x-queue-type": "quorum", **arguments})
    cluster.commit()
    for node in ("a", "b", "c"):
        take(cluster, node)
    return cluster, a, b, c


def _publish(cluster: Cluster, client: ClusterClient, *payloads: bytes, queue: str = "q") -> None:
    for body in payloads:
        client.publish("", queue, body)
    cluster.commit()


def _queue(cluster: Cluster, node: str, name: str = "q") -> Any:
    return cluster.brokers[node].vhosts["/"].queues[name]


def _all_equal(cluster: Cluster, key: tuple[str, str] = KEY) -> bool:
    return len(set(cluster.snapshots(key).values())) == 1


def test_consumers_of_a_node_that_goes_down_are_detached_and_their_messages_redelivered_elsewhere() -> None:
    cluster, a, b, c = _setup()
    _publish(cluster, a, b"m1", b"m2")
    b.consume("q", "tb")
    cluster.commit()
    assert bodies(take(cluster, "b")) == [b"m1", b"m2"]
    cluster.crash("b")  # the leader (a, the declaring node) proposes Detach for b's consumer
    cluster.commit()
    c.consume("q", "tc")
    cluster.commit()
    redelivered = deliveries(take(cluster, "c"))
    assert [d.body for d in redelivered] == [b"m1", b"m2"]
    assert all(d.method.redelivered for d in redelivered)


def test_a_later_leader_detaches_consumers_of_a_node_reported_down_earlier() -> None:
    cluster, a, b, _c = _setup()
    _publish(cluster, a, b"m1")
    b.consume("q", "tb")
    cluster.commit()
    cluster.hold = True
    cluster.crash("b")  # a's Detach is lost with a's leadership
    cluster.held.clear()
    cluster.hold = False
    cluster.set_leader(KEY, "c")
    cluster.commit()
    assert _queue(cluster, "a").machine.consumer_count == 0
    assert _queue(cluster, "c").machine.ready_count == 1


def test_channel_global_prefetch_bounds_unacked_on_a_quorum_queue() -> None:
    cluster, a, b, _c = _setup()
    _publish(cluster, a, *[b"%d" % i for i in range(6)])
    b.call(m.BasicQos(prefetch_count=2, global_=True))
    b.consume("q", "t1")
    b.consume("q", "t2")
    for _ in range(3):
        cluster.commit()
    got = deliveries(take(cluster, "b"))
    assert len(got) == 2
    b.ack(got[0].method.delivery_tag)
    for _ in range(3):
        cluster.commit()
    assert len(deliveries(take(cluster, "b"))) == 1
    channel = cluster.brokers["b"].conns[1].channels[1]
    assert len(channel.unacked) == 2


def test_deliveries_keep_flowing_past_one_credit_window() -> None:
    cluster = Cluster(consumer_credit_window=4)
    a, b = cluster_client(cluster, "a"), cluster_client(cluster, "b")
    a.declare("q", durable=True)
    _publish(cluster, a, *[b"%d" % i for i in range(20)])
    b.consume("q", "t", no_ack=True)
    received: list[bytes] = []
    for _ in range(20):
        cluster.commit()
        received += bodies(take(cluster, "b"))
        b.writable(True)
    assert received == [b"%d" % i for i in range(20)]


def test_message_ttl_is_expired_by_the_leader_only() -> None:
    cluster, a, _b, _c = _setup(**{"x-message-ttl": 100})
    a.now_ms = 0
    _publish(cluster, a, b"old")
    assert not [e for e in cluster.brokers["b"].tick(1000) if isinstance(e, ProposeQueue)]
    assert cluster.brokers["b"].next_deadline_ms() is None
    assert cluster.brokers["a"].next_deadline_ms() == 100
    cluster.tick("a", 1000)
    assert cluster.brokers["a"].next_deadline_ms() == 2000  # proposed, not applied: retry later, not busy-loop
    cluster.commit()
    for node in ("a", "b", "c"):
        assert _queue(cluster, node).machine.ready_count == 0
    assert cluster.brokers["a"].next_deadline_ms() is None


def _two_dead_letters() -> tuple[Cluster, ClusterClient, ClusterClient]:
    """A quorum queue "q" dead-lettering to the fanout "dlx" (bound to "dead"); b rejects and nacks its two
    messages without requeue, committed. Returns the cluster and the clients on a and b."""
    cluster = Cluster()
    a, b = cluster_client(cluster, "a"), cluster_client(cluster, "b")
    a.call(m.ExchangeDeclare(exchange="dlx", type="fanout", durable=True))
    a.declare("dead", durable=True)
    a.bind("dead", "dlx")
    a.declare("q", durable=True, arguments={"x-queue-type": "quorum", "x-dead-letter-exchange": "dlx"})
    _publish(cluster, a, b"bad", b"worse")
    b.consume("q", "t")
    cluster.commit()
    tags = [d.method.delivery_tag for d in deliveries(take(cluster, "b"))]
    b.call(m.BasicReject(delivery_tag=tags[0], requeue=False))
    b.call(m.BasicNack(delivery_tag=tags[1], requeue=False))
    cluster.commit()
    return cluster, a, b


def test_dead_letters_are_republished_once_by_the_leader() -> None:
    cluster, _a, _b = _two_dead_letters()
    for node in ("a", "b", "c"):
        assert _queue(cluster, node, "dead").machine.ready_count == 2
        assert replica_of(_queue(cluster, node, "q")).queue.dead_letter_seq == 2  # numbered by the machine, alike everywhere
    c = cluster_client(cluster, "c")
    c.consume("dead", "td")
    cluster.commit()
    got = deliveries(take(cluster, "c"))
    assert [d.body for d in got] == [b"bad", b"worse"]
    death = got[0].properties.headers["x-death"][0]
    assert death["queue"] == "q" and death["reason"] == "rejected"
    assert _all_equal(cluster, ("/", "dead"))


# Written by 9951385 (the broker counted the dead letters then, in the slot beside the replica): node a's
# snapshot of "q" right after the two rejects of the test above.
OLD_DEAD_LETTER_SNAPSHOT = (
    "85015901fba76776657273696f6e016677696e646f771910006b6f726967696e735f6d6178190100676170706c6965640667736b6970"
    "70656400676f726967696e73828361612081821a000f4240028361622081821a000f424004657175657565b16776657273696f6e0164"
    "6e616d6561716461726773aa6e6d6573736167655f74746c5f6d73f66a6d61785f6c656e677468f6706d61785f6c656e6774685f6279"
    "746573f6686f766572666c6f776964726f702d6865616474646561645f6c65747465725f65786368616e676563646c7877646561645f"
    "6c65747465725f726f7574696e675f6b6579f66c6d61785f7072696f72697479f67673696e676c655f6163746976655f636f6e73756d"
    "6572f46e64656c69766572795f6c696d6974f674646561645f6c65747465725f73747261746567796c61742d6d6f73742d6f6e63656e"
    "7075626c6973686572735f6d61781927106b6e6578745f6d73675f6964036a6174746163685f73657101666e6f775f6d730065726561"
    "64798069636f6e73756d657273818883616201020018fe00f401f5806572696e67738182008183616201026a6861735f616374697665"
    "f466616374697665f66a7075626c6973686572738182846161010101026974746c5f65706f63680071686f6c645f646561645f6c6574"
    "74657273f56d68656c645f6c6173745f736571006468656c648002f5818361620102"
)


def test_a_queue_snapshot_written_before_the_machine_numbered_dead_letters_continues_the_count() -> None:
    cluster, a, b = _two_dead_letters()
    cluster.feed("c", cluster.brokers["c"].queue_restore("/", "q", bytes.fromhex(OLD_DEAD_LETTER_SNAPSHOT)))
    assert replica_of(_queue(cluster, "c")).queue.dead_letter_seq == 2  # taken from the old slot
    replicas = {cbor2.loads(data)[1] for data in cluster.snapshots(KEY).values()}
    assert len(replicas) == 1  # the same replica (and count) on every node
    cluster.set_leader(KEY, "c")  # the restored node republishes the next copy: sequence 3, not a Duplicate
    _publish(cluster, a, b"third")
    tag = deliveries(take(cluster, "b"))[0].method.delivery_tag
    b.call(m.BasicReject(delivery_tag=tag, requeue=False))
    cluster.commit()
    for node in ("a", "b", "c"):
        assert _queue(cluster, node, "dead").machine.ready_count == 3


def test_replicas_end_equal_after_a_mixed_workload() -> None:
    cluster, a, b, c = _setup(**{"x-max-length": 50})
    a.call(m.ConfirmSelect())
    b.call(m.BasicQos(prefetch_count=3))
    b.consume("q", "tb")
    c.consume("q", "tc", no_ack=True)
    for i in range(30):
        a.publish("", "q", b"%d" % i)
        if i % 5 == 0:
            cluster.commit()
            for d in deliveries(take(cluster, "b")):
                b.call(m.BasicNack(delivery_tag=d.method.delivery_tag, requeue=i % 10 == 0))
    c.call(m.BasicGet(queue="q"), 1)
    cluster.commit()
    b.close()
    cluster.commit()
    assert _all_equal(cluster)
    assert _queue(cluster, "a").machine.consumer_count == 1


def test_snapshot_restore_mid_stream_keeps_a_node_consuming() -> None:
    cluster, a, _b, _c = _setup()
    _publish(cluster, a, b"1", b"2", b"3")
    cluster.crash("c")
    cluster.commit()
    c = cluster.restart("c")
    client = ClusterClient(cluster, "c")
    client.open(1)
    client.consume("q", "tc")
    _publish(cluster, a, b"4")
    assert bodies(take(cluster, "c")) == [b"1", b"2", b"3", b"4"]
    assert c.vhosts["/"].queues["q"].machine.ready_count == 0
    assert _all_equal(cluster)


def test_restore_sends_deliveries_the_node_never_saw() -> None:
    """A snapshot covering a delivery to a local consumer that this node never sent (a follower installing its
    leader's snapshot): it is sent at the restore, once, not redelivered; its ack settles it everywhere."""
    cluster, a, b, _c = _setup()
    _publish(cluster, a, b"1", b"2")
    b.consume("q", "tb")
    cluster.commit()
    assert bodies(take(cluster, "b")) == [b"1", b"2"]
    b.ack(1)
    cluster.commit()
    # b installs a snapshot from a taken as if b's deliveries had happened without b seeing them
    data = cluster.brokers["a"].queue_snapshot(*KEY)
    channel = cluster.brokers["b"].conns[1].channels[1]
    channel.unacked.clear()  # b "never delivered" message 2
    restored = cluster.brokers["b"].queue_restore("/", "q", data)
    assert not [e for e in restored if isinstance(e, ProposeQueue) and type(e.command).__name__ == "Return"]
    cluster.feed("b", restored)
    cluster.commit()
    sent = deliveries(take(cluster, "b"))
    assert [(d.body, d.method.redelivered) for d in sent] == [(b"2", False)]  # once, at the restore
    b.ack(3)  # (its delivery tag on b's channel: 1, 2, then 3)
    cluster.commit()
    assert _all_equal(cluster) and _queue(cluster, "a").machine.unacked_count == 0


def test_a_consumer_of_an_earlier_boot_is_detached_when_its_attach_is_replayed() -> None:
    cluster, a, b, c = _setup()
    _publish(cluster, a, b"x")
    b.consume("q", "tb")
    cluster.commit()
    cluster.down.add("b")  # b dies without anyone noticing
    cluster.restart("b", from_snapshots=False)  # b replays the whole log: its old Attach proposes Detach
    cluster.commit()
    assert _queue(cluster, "a").machine.consumer_count == 0
    c.consume("q", "tc")
    cluster.commit()
    assert bodies(take(cluster, "c")) == [b"x"]


def test_a_consumer_of_an_earlier_boot_is_detached_after_restore() -> None:
    cluster, a, b, _c = _setup()
    _publish(cluster, a, b"x")
    b.consume("q", "tb")
    cluster.commit()
    cluster.down.add("b")
    cluster.restart("b", from_snapshots=True)
    cluster.commit()
    assert _queue(cluster, "a").machine.consumer_count == 0
    assert _queue(cluster, "c").machine.ready_count == 1


def test_auto_delete_is_decided_by_the_leader_when_the_last_consumer_anywhere_leaves() -> None:
    cluster = Cluster()
    a, b = cluster_client(cluster, "a"), cluster_client(cluster, "b")
    a.declare("ad", auto_delete=True)
    cluster.commit()
    b.consume("ad", "t1")
    a.consume("ad", "t2")
    cluster.commit()
    b.call(m.BasicCancel(consumer_tag="t1"))
    cluster.commit()
    assert "ad" in cluster.brokers["c"].vhosts["/"].queues
    a.call(m.BasicCancel(consumer_tag="t2"))
    cluster.commit()
    for broker in cluster.brokers.values():
        assert "ad" not in broker.vhosts["/"].queues


def test_a_leader_elected_while_a_consume_is_in_flight_does_not_auto_delete_the_queue() -> None:
    # issue 16: the local basic.consume is not an applied Attach; a new leader must not take the queue as used
    cluster = Cluster()
    a, b = cluster_client(cluster, "a"), cluster_client(cluster, "b")
    a.declare("ad", auto_delete=True)
    cluster.commit()
    b.consume("ad", "t1")  # its Attach is proposed, not applied yet
    cluster.set_leader(("/", "ad"), "b")
    cluster.commit()
    assert all("ad" in broker.vhosts["/"].queues for broker in cluster.brokers.values())
    a.publish("", "ad", b"m1")
    cluster.commit()
    assert bodies(take(cluster, "b")) == [b"m1"]


def test_a_queue_deleted_on_another_node_cancels_local_consumers() -> None:
    cluster, a, b, _c = _setup()
    b.consume("q", "tb")
    cluster.commit()
    take(cluster, "b")
    a.call(m.QueueDelete(queue="q"))
    cancels = of_type(take(cluster, "b"), m.BasicCancel)
    assert [x.consumer_tag for x in cancels] == ["tb"]
    assert "q" not in cluster.brokers["c"].vhosts["/"].queues


def test_x_expires_deletes_an_unused_queue_on_the_leader() -> None:
    cluster = Cluster()
    a = cluster_client(cluster, "a")
    a.declare("exp", arguments={"x-expires": 500})
    cluster.commit()
    cluster.tick("b", 10_000)
    assert "exp" in cluster.brokers["a"].vhosts["/"].queues
    cluster.tick("a", 10_000)  # the leader proposes Expire; the machine decides (QueueExpired) once it applied
    cluster.commit()
    for broker in cluster.brokers.values():
        assert "exp" not in broker.vhosts["/"].queues


def test_an_abandoned_attach_cancels_the_consumer() -> None:
    cluster, _a, b, _c = _setup()
    cluster.hold = True
    b.consume("q", "tb")
    cluster.abandon()
    cluster.hold = False
    assert [x.consumer_tag for x in of_type(take(cluster, "b"), m.BasicCancel)] == ["tb"]


def test_stray_deliveries_to_a_closed_channel_are_returned() -> None:
    cluster, a, b, c = _setup()
    b.consume("q", "tb")
    cluster.commit()
    cluster.hold = True
    b.close_channel()  # Detach held back: deliveries still arrive for b's consumer
    cluster.hold = False
    _publish(cluster, a, b"p")
    assert not [e for e in take(cluster, "b") if isinstance(e, SendContent)]
    cluster.release()
    cluster.commit()
    c.consume("q", "tc")
    cluster.commit()
    assert bodies(take(cluster, "c")) == [b"p"]


def test_a_live_consumer_detached_by_a_false_node_down_attaches_again() -> None:
    cluster, a, b, _c = _setup()
    b.consume("q", "tb", no_ack=True)
    cluster.commit()
    cluster.feed("a", cluster.brokers["a"].node_down("b"))  # a partition: b is alive after all
    cluster.commit()
    _publish(cluster, a, b"after")
    cluster.commit()
    assert bodies(take(cluster, "b")) == [b"after"]
    assert _queue(cluster, "a").machine.consumer_count == 1


def test_an_abandoned_detach_is_proposed_again() -> None:
    cluster, a, b, c = _setup()
    _publish(cluster, a, b"p")
    b.consume("q", "tb")
    cluster.commit()
    cluster.hold = True
    b.close_channel()
    cluster.hold = False
    cluster.abandon()  # the Detach is given up: b proposes it again
    c.consume("q", "tc")
    cluster.commit()
    assert bodies(take(cluster, "c")) == [b"p"]


def test_a_detach_given_up_for_good_is_proposed_again_when_a_stray_delivery_shows_up() -> None:
    cluster, a, b, c = _setup()
    b.consume("q", "tb")
    cluster.commit()
    cluster.hold = True
    b.close_channel()
    for _ in range(DETACH_RETRIES_MAX + 1):
        cluster.abandon()  # every retry is given up too (they stay held)
    cluster.held.clear()
    cluster.hold = False
    _publish(cluster, a, b"p")  # delivered to the ghost consumer: b proposes Detach again
    c.consume("q", "tc")
    cluster.commit()
    assert bodies(take(cluster, "c")) == [b"p"]
    assert _queue(cluster, "c").machine.consumer_count == 1


def test_mirrored_definitions_echoes_and_redeclarations() -> None:
    cluster, _a, _b, _c = _setup()
    b_broker = cluster.brokers["b"]
    echo = [r for r in cluster.records if getattr(r, "name", None) == "q"]
    assert b_broker.apply_records(echo) == []  # an echo of a known definition changes nothing
    queue = b_broker.vhosts["/"].queues["q"]
    changed = [dataclasses.replace(echo[-1], arguments={"x-queue-type": "quorum", "x-max-length": 3})]
    b_broker.apply_records(changed)
    assert b_broker.vhosts["/"].queues["q"] is not queue
    assert b_broker.vhosts["/"].queues["q"].machine.args.max_length == 3


def test_an_exclusive_queue_of_an_earlier_boot_is_deleted_on_restart() -> None:
    cluster = Cluster()
    b = cluster_client(cluster, "b")
    b.declare("mine", exclusive=True)
    cluster.down.add("b")
    cluster.restart("b")
    for broker in cluster.brokers.values():
        assert "mine" not in broker.vhosts["/"].queues


def test_an_exclusive_consume_is_refused_while_another_node_has_consumers() -> None:
    cluster, _a, b, c = _setup()
    b.consume("q", "tb")
    cluster.commit()
    code, _text = channel_close(c.consume("q", "tc", exclusive=True))
    assert code == 403


def test_expired_messages_are_dead_lettered_once_by_whoever_leads_when_the_expiry_applies() -> None:
    cluster = Cluster()
    a = cluster_client(cluster, "a")
    a.call(m.ExchangeDeclare(exchange="dlx", type="fanout", durable=True))
    a.declare("dead", durable=True)
    a.bind("dead", "dlx")
    a.declare("q", durable=True, arguments={"x-message-ttl": 10, "x-dead-letter-exchange": "dlx"})
    _publish(cluster, a, b"t1", b"t2")
    cluster.tick("a", 1000)  # a proposes Expire, then loses the lead before it commits
    cluster.set_leader(KEY, "b")
    cluster.commit()
    for node in ("a", "b", "c"):
        assert _queue(cluster, node).machine.ready_count == 0
        assert _queue(cluster, node, "dead").machine.ready_count == 2
    assert _all_equal(cluster, ("/", "dead"))
