"""Replicated mode: node-local exclusive queues (node/broker/backend_owned.py), on the pure multi-broker harness.

The owner's node holds the queue (no proposal, confirmed at once, nothing stored); another node forwards a publish
as `ForwardPublish`, and the owner's answer comes back through `Broker.forward_outcome` (played here as the runtime
does: the owner's broker gets the publish on a link connection of its own).
"""

from __future__ import annotations

from collections.abc import Sequence

from node.amqp import events as ev
from node.amqp import methods as m
from node.broker.effects import ForwardPublish, Persist, ProposeQueue, Send, SendContent
from node.broker.records import QueueRecord
from tests.broker.cluster_harness import Cluster, ClusterClient, cluster_client, take
from tests.broker.harness import bodies, channel_close


def _acks(effects: Sequence[object]) -> list[int]:
    return [e.method.delivery_tag for e in effects if isinstance(e, Send) and isinstance(e.method, m.BasicAck)]


def _nacks(effects: Sequence[object]) -> list[int]:
    return [e.method.delivery_tag for e in effects if isinstance(e, Send) and isinstance(e.method, m.BasicNack)]


def test_the_owner_s_node_holds_it_without_proposals_or_storage_and_confirms_at_once() -> None:
    cluster = Cluster()
    a = cluster_client(cluster, "a")
    a.declare("reply", exclusive=True, auto_delete=True)
    a.consume("reply", "t", no_ack=True)
    a.call(m.ConfirmSelect(), channel=1)
    effects = cluster.brokers["a"].handle(a.conn_id, _publish_event("reply", b"one", persistent=True), 0)
    assert not any(isinstance(e, ProposeQueue | Persist) for e in effects)
    assert bodies(effects) == [b"one"] and _acks(effects) == [1]
    assert not any(cluster.logs.values())  # nothing was proposed to a queue log
    assert [r.exclusive_owner for r in cluster.records if isinstance(r, QueueRecord)] == ["a/1/1"]


def test_a_publish_on_another_node_is_forwarded_and_the_owner_s_answer_confirms_it() -> None:
    cluster = Cluster()
    a, b = cluster_client(cluster, "a"), cluster_client(cluster, "b")
    a.declare("reply", exclusive=True)
    b.call(m.ConfirmSelect())
    effects = b.publish("", "reply", b"r1") + b.publish("", "reply", b"r2")
    forwards = [e for e in effects if isinstance(e, ForwardPublish)]
    assert [(f.node, f.queue, f.body) for f in forwards] == [("a", "reply", b"r1"), ("a", "reply", b"r2")]
    assert _acks(effects) == [] and not any(isinstance(e, ProposeQueue) for e in effects)
    link = cluster_client(cluster, "a", conn_id=7)  # the forwarding link's connection on the owner's node
    link.call(m.ConfirmSelect())
    for f in forwards:
        assert _acks(link.publish("", f.queue, f.body)) != []
    broker = cluster.brokers["b"]
    first = broker.forward_outcome("/", "reply", forwards[0].publisher_id, forwards[0].sequence, True)
    second = broker.forward_outcome("/", "reply", forwards[1].publisher_id, forwards[1].sequence, False)
    assert _acks(first) == [1] and _nacks(second) == [2]
    got = a.call(m.BasicGet(queue="reply", no_ack=True)) + a.call(m.BasicGet(queue="reply", no_ack=True))
    assert [e.body for e in got if isinstance(e, SendContent)] == [b"r1", b"r2"]


def test_other_connections_get_405_and_the_owner_s_close_deletes_it_everywhere() -> None:
    cluster = Cluster()
    a, b = cluster_client(cluster, "a"), cluster_client(cluster, "b")
    a.declare("mine", exclusive=True)
    other = cluster_client(cluster, "a", conn_id=2)
    assert channel_close(other.consume("mine"))[0] == 405
    assert channel_close(b.consume("mine"))[0] == 405
    assert "mine" in cluster.brokers["c"].vhosts["/"].queues
    a.handle(_close_connection())
    for node in ("a", "b", "c"):
        assert "mine" not in cluster.brokers[node].vhosts["/"].queues, node


def test_a_queue_deleted_while_forwards_are_out_acks_them() -> None:
    cluster = Cluster()
    a, b = cluster_client(cluster, "a"), cluster_client(cluster, "b")
    a.declare("gone", exclusive=True)
    b.call(m.ConfirmSelect())
    forward = next(e for e in b.publish("", "gone", b"x") if isinstance(e, ForwardPublish))
    a.handle(_close_connection())  # the owner leaves: every node drops the queue
    assert "gone" not in cluster.brokers["b"].vhosts["/"].queues
    assert 1 in _acks(cluster.outbox["b"])  # released as for a vanished queue (RabbitMQ acks those)
    assert cluster.brokers["b"].forward_outcome("/", "gone", forward.publisher_id, forward.sequence, False) == []


def _publish_event(queue: str, body: bytes, persistent: bool = False) -> object:
    from node.amqp import events as ev
    from node.amqp.properties import BasicProperties

    return ev.ContentReceived(1, m.BasicPublish(exchange="", routing_key=queue),
                              BasicProperties(delivery_mode=2 if persistent else 1), body)


def _close_connection() -> object:
    from node.amqp import events as ev

    return ev.ConnectionClosed(200, "bye", by_client=True)


INTERNAL = ("raftmq-internal-forward", "derived-password")


def _internal_link(cluster: Cluster, node: str, conn_id: int = 7) -> ClusterClient:
    """The forwarding link's connection on `node`, logged in with the internal login as the connection does."""
    link = cluster_client(cluster, node, conn_id, user=INTERNAL[0])
    authenticator = cluster.brokers[node].authenticator_for(conn_id)
    assert authenticator.authenticate("PLAIN", f"\0{INTERNAL[0]}\0{INTERNAL[1]}".encode()) == INTERNAL[0]
    assert authenticator.vhost_access(INTERNAL[0], "/") and authenticator.connection_limit_reached("/") is None
    return link


def test_the_internal_login_needs_no_user_and_may_only_publish() -> None:
    cluster = Cluster(internal_login=INTERNAL)
    broker = cluster.brokers["a"]
    broker.open_connection(5, "10.0.0.9", False)
    authenticator = broker.authenticator_for(5)
    assert authenticator.authenticate("PLAIN", f"\0{INTERNAL[0]}\0wrong".encode()) is None
    assert authenticator.authenticate("PLAIN", b"\0guest\0guest") is None  # (guest: loopback only)
    assert not broker.conns[5].internal
    link = _internal_link(cluster, "a")
    assert channel_close(link.declare("q"))[0] == 403  # configure: refused
    a = cluster_client(cluster, "a")
    a.declare("mine", exclusive=True)
    link.open(2)
    assert channel_close(link.call(m.BasicGet(queue="mine"), channel=2))[0] == 403  # read: refused
    assert Cluster().brokers["a"].config.internal_login is None  # (a single node, or none configured: no such login)


def test_a_forwarded_publish_keeps_its_exchange_routing_key_headers_and_user_id() -> None:
    from node.runtime.cluster.forward import with_origin

    cluster = Cluster(internal_login=INTERNAL)
    a, b = cluster_client(cluster, "a"), cluster_client(cluster, "b")
    a.declare("reply", exclusive=True)
    a.bind("reply", "amq.direct", "rk")
    b.call(m.ConfirmSelect())
    effects = b.publish("amq.direct", "rk", b"one", user_id="guest") + b.publish("", "reply", b"two",
                                                                                headers={"h": 1})
    forwards = [e for e in effects if isinstance(e, ForwardPublish)]
    assert [(f.exchange, f.routing_key) for f in forwards] == [("amq.direct", "rk"), ("", "reply")]
    link = _internal_link(cluster, "a")
    link.call(m.ConfirmSelect())
    for f in forwards:
        out = link.handle(ev.ContentReceived(1, m.BasicPublish(exchange="", routing_key=f.queue), with_origin(f),
                                             f.body))
        assert _acks(out) != [], out
    got = a.call(m.BasicGet(queue="reply", no_ack=True)) + a.call(m.BasicGet(queue="reply", no_ack=True))
    contents = [e for e in got if isinstance(e, SendContent)]
    assert [(c.method.exchange, c.method.routing_key, c.body) for c in contents] == [
        ("amq.direct", "rk", b"one"), ("", "reply", b"two")]
    assert [(c.properties.headers, c.properties.user_id) for c in contents] == [(None, "guest"), ({"h": 1}, None)]


def test_a_dead_letter_to_an_exclusive_queue_of_another_node_is_forwarded_and_settled_on_its_confirm() -> None:
    cluster = Cluster(internal_login=INTERNAL)
    a, b = cluster_client(cluster, "a"), cluster_client(cluster, "b")
    a.declare("reply", exclusive=True)
    a.bind("reply", "amq.direct", "dead")
    args = {"x-queue-type": "quorum", "x-dead-letter-exchange": "amq.direct", "x-dead-letter-routing-key": "dead",
            "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"}
    b.declare("src", durable=True, arguments=args)
    cluster.commit()
    b.publish("", "src", b"dl")
    cluster.commit()
    got = b.call(m.BasicGet(queue="src"))
    cluster.commit()
    tag = next(e.method.delivery_tag for e in got + take(cluster, "b") if isinstance(e, SendContent))
    b.call(m.BasicReject(delivery_tag=tag, requeue=False))
    cluster.commit()
    forwards = [e for e in take(cluster, "b") if isinstance(e, ForwardPublish)]
    assert [(f.node, f.queue, f.exchange, f.routing_key, f.body) for f in forwards] == [
        ("a", "reply", "amq.direct", "dead", b"dl")]
    source = cluster.brokers["b"].vhosts["/"].queues["src"]
    assert source.machine.held_count == 1  # held until the owner's node confirms it
    cluster.feed("b", cluster.brokers["b"].forward_outcome("/", "reply", forwards[0].publisher_id,
                                                           forwards[0].sequence, True))
    cluster.commit()
    assert source.machine.held_count == 0
