"""The queue link machine (cluster/federation/queue_link.py): consume only while the local queue has consumers and
no ready messages, republish to the default exchange with x-received-from and the original exchange/key, acks per
ack mode, no loop check, status row."""

from __future__ import annotations

from cluster.federation.link import RUNNING, Ack, Publish, link_id
from cluster.federation.params import parse_upstream
from cluster.federation.queue_link import Cancel, Consume, QueueLink
from node.amqp.properties import BasicProperties

URI = "amqp://u:secret@up-host:5672"


def _link(**extra: object) -> QueueLink:
    link = QueueLink(parse_upstream("/", "up", {"uri": URI, **extra}), "/", "q", "down-cluster")
    link.start(0)
    return link


def test_names_default_to_rabbitmqs() -> None:
    link = _link()
    assert (link.queue_name, link.consumer_tag, link.publish_exchange) == ("q", "federation-link-up", "")
    other = _link(queue="upq", **{"consumer-tag": "tag-1"})
    assert (other.queue_name, other.consumer_tag) == ("upq", "tag-1")


def test_consumes_only_while_local_consumers_and_no_ready_messages() -> None:
    link = _link()
    assert link.demand(1, 0) == []  # not connected yet: remembered
    assert link.connected(1, "up-cluster") == [Consume()]
    assert link.state == RUNNING and link.consuming
    assert link.demand(1, 0) == []
    assert link.demand(1, 5) == [Cancel()]  # local messages ready: local consumers first
    assert link.demand(2, 3) == []
    assert link.demand(2, 0) == [Consume()]
    assert link.demand(0, 0) == [Cancel()]  # no local consumer
    assert link.demand(0, 0) == []
    assert link.pauses == 2
    link.down("lost", 2)
    assert not link.consuming
    link.tick(10_000)
    assert link.connected(10_001, "up-cluster") == []  # no consumer locally: nothing to pull


def test_forward_to_default_exchange_with_headers_and_on_confirm_acks() -> None:
    link = _link()
    link.demand(1, 0)
    link.connected(1, "up-cluster")
    effects = link.delivery(7, "rk", BasicProperties(user_id="guest", headers={"a": 1}), b"m", False, "ex")
    assert len(effects) == 1 and isinstance(effects[0], Publish)
    pub = effects[0]
    assert (pub.seq, pub.routing_key, pub.body) == (1, "q", b"m")
    assert pub.properties.user_id is None
    assert pub.properties.headers == {
        "a": 1, "x-original-exchange": "ex", "x-original-routing-key": "rk",
        "x-received-from": [{"uri": "amqp://u@up-host:5672/%2F", "queue": "q", "redelivered": False,
                             "cluster-name": "up-cluster"}]}
    assert link.confirm(1, False, True) == [Ack(7)]
    # a message that has crossed a link before keeps its original exchange/key and gets one more entry; no hop
    # limit for queues (RabbitMQ has none either)
    hop = {"uri": "x", "queue": "q", "redelivered": False, "cluster-name": "down-cluster"}
    props = BasicProperties(headers={"x-received-from": [hop], "x-original-exchange": "e0",
                                     "x-original-routing-key": "k0"})
    pub2 = link.delivery(8, "q", props, b"m2", True, "")[0]
    assert isinstance(pub2, Publish) and pub2.properties.headers is not None
    assert pub2.properties.headers["x-original-exchange"] == "e0"
    assert [h["cluster-name"] for h in pub2.properties.headers["x-received-from"]] == ["up-cluster", "down-cluster"]


def test_on_publish_and_no_ack() -> None:
    link = _link(**{"ack-mode": "on-publish"})
    link.connected(1, "c")
    effects = link.delivery(3, "q", BasicProperties(), b"m", False)
    assert isinstance(effects[0], Publish) and effects[0].seq == 0 and effects[1] == Ack(3)
    link = _link(**{"ack-mode": "no-ack"})
    link.connected(1, "c")
    assert len(link.delivery(3, "q", BasicProperties(), b"m", False)) == 1


def test_status_row() -> None:
    link = _link()
    link.demand(2, 0)
    link.connected(5, "up-cluster")
    row = link.status()
    assert row["type"] == "queue" and row["queue"] == "q" and row["upstream_queue"] == "q"
    assert row["status"] == "running" and row["consuming"] and row["local_consumers"] == 2
    assert row["consumer_tag"] == "federation-link-up" and "exchange" not in row
    assert row["id"] == link_id("/", "q", "up", "queue") != link_id("/", "q", "up")
