"""The shovel link state machine (cluster/shovel/link.py) driven by hand: ack modes, routing, headers, delete-after,
reconnects and URI rotation. Pure: no sockets."""

from __future__ import annotations

from typing import Any

from cluster.shovel.link import (
    RUNNING,
    STARTING,
    TERMINATED,
    AckSource,
    CancelConsume,
    Connect,
    DeleteSelf,
    Disconnect,
    NackSource,
    Publish,
    ShovelLink,
)
from cluster.shovel.params import parse_definition
from node.amqp.properties import BasicProperties

P = BasicProperties(delivery_mode=2, headers={"h": 1})


def _link(**extra: Any) -> ShovelLink:
    value = {"src-uri": ["amqp://a1", "amqp://a2"], "src-queue": "src", "dest-uri": ["amqp://b1", "amqp://b2"],
             **extra}
    link = ShovelLink(parse_definition("/", "s", value), node_name="n1")
    assert link.start(0) == [Connect(0, 0)]
    return link


def _running(**extra: Any) -> ShovelLink:
    link = _link(**extra)
    link.connected(0, queue_length=3)
    assert link.state == RUNNING
    return link


def test_on_confirm_acks_the_source_only_after_the_destination_confirms() -> None:
    link = _running()
    out = link.delivery(7, "ex", "rk", P, b"m1", 1)
    assert out == [Publish(1, "ex", "rk", P, b"m1")]
    assert link.delivery(8, "ex", "rk", P, b"m2", 1) == [Publish(2, "ex", "rk", P, b"m2")]
    assert link.delivery(9, "ex", "rk", P, b"m3", 1)[0].seq == 3  # type: ignore[union-attr]
    assert link.confirm(2, multiple=True, ack=True, now_ms=2) == [AckSource(8, multiple=True)]
    assert link.confirm(3, multiple=False, ack=False, now_ms=2) == [NackSource(9)]
    assert link.confirm(3, multiple=False, ack=True, now_ms=2) == []  # already settled
    assert link.status()["forwarded"] == 3 and link.status()["acked"] == 2


def test_out_of_order_confirms() -> None:
    link = _running()
    for tag in (1, 2, 3):
        link.delivery(tag, "", "q", P, b"x", 0)
    assert link.confirm(2, multiple=False, ack=True, now_ms=0) == [AckSource(2)]
    assert link.confirm(3, multiple=True, ack=True, now_ms=0) == [AckSource(3, multiple=True)]  # 1 and 3 left


def test_on_publish_acks_at_once_and_no_ack_never() -> None:
    link = _running(**{"ack-mode": "on-publish"})
    assert link.delivery(4, "", "k", P, b"x", 0) == [Publish(0, "", "k", P, b"x"), AckSource(4)]
    link = _running(**{"ack-mode": "no-ack"})
    assert link.delivery(4, "", "k", P, b"x", 0) == [Publish(0, "", "k", P, b"x")]


def test_destination_queue_exchange_and_key() -> None:
    assert _running(**{"dest-queue": "dq"}).delivery(1, "ex", "rk", P, b"", 0)[0] == Publish(1, "", "dq", P, b"")
    out = _running(**{"dest-exchange": "dx"}).delivery(1, "ex", "rk", P, b"", 0)[0]
    assert (out.exchange, out.routing_key) == ("dx", "rk")  # type: ignore[union-attr]
    out = _running(**{"dest-exchange": "dx", "dest-exchange-key": "k2"}).delivery(1, "ex", "rk", P, b"", 0)[0]
    assert (out.exchange, out.routing_key) == ("dx", "k2")  # type: ignore[union-attr]


def test_forward_and_timestamp_headers_and_publish_properties() -> None:
    link = _running(**{"dest-queue": "dq", "dest-add-forward-headers": True, "dest-add-timestamp-header": True,
                       "dest-publish-properties": {"delivery_mode": 1}})
    [publish] = link.delivery(1, "ex", "rk", P, b"", 1_700_000_000_123)
    assert isinstance(publish, Publish)
    headers = publish.properties.headers or {}
    assert headers["h"] == 1 and headers["x-shovelled-timestamp"] == 1_700_000_000
    [entry] = headers["x-shovelled"]
    assert entry["shovel-name"] == "s" and entry["src-queue"] == "src" and entry["dest-queue"] == "dq"
    assert entry["shovelled-by"] == "n1" and entry["src-uri"] == "amqp://guest@a1:5672/%2F"
    assert publish.properties.delivery_mode == 1 and P.headers == {"h": 1}


def test_failures_rotate_uris_and_reconnect_after_the_delay() -> None:
    link = _link(**{"reconnect-delay": 2})
    assert link.connect_failed("src", "refused", 100) == [Disconnect("src: refused")]
    assert link.state == STARTING and link.tick(2099) == [] and link.tick(2100) == [Connect(1, 0)]
    link.connect_failed("dest", "refused", 3000)
    assert link.tick(5000) == [Connect(1, 1)]
    link.connected(5000)
    link.delivery(1, "", "q", P, b"", 5000)
    assert link.down("dest", "connection lost", 6000) == [Disconnect("dest: connection lost")]
    assert link.confirm(1, False, True, 6001) == []  # a confirm of the old connection is ignored
    assert link.tick(8000) == [Connect(1, 1)] and link.status()["blocked_reason"] == "dest: connection lost"
    assert link.status()["failures"] == 3
    link.connected(8000)
    assert link.delivery(1, "", "q", P, b"", 8000)[0] == Publish(1, "", "q", P, b"")  # numbering restarts


def test_numeric_delete_after_forwards_n_then_deletes_itself() -> None:
    link = _running(**{"src-delete-after": 2})
    link.delivery(1, "", "q", P, b"", 0)
    assert link.delivery(2, "", "q", P, b"", 0)[-1] == CancelConsume()
    assert link.delivery(3, "", "q", P, b"", 0) == [NackSource(3)]  # in flight past the count: requeued
    assert link.confirm(1, False, True, 0) == [AckSource(1)]
    assert link.confirm(2, False, True, 5) == [AckSource(2), Disconnect("completed"), DeleteSelf()]
    assert link.state == TERMINATED and link.status()["termination_reason"] == "completed"


def test_queue_length_delete_after_uses_the_length_at_connect() -> None:
    link = _link(**{"src-delete-after": "queue-length", "ack-mode": "on-publish"})
    link.connected(0, queue_length=1)
    out = link.delivery(1, "", "q", P, b"", 0)
    assert out[:2] == [Publish(0, "", "q", P, b""), AckSource(1)] and out[-1] == DeleteSelf()
    empty = _link(**{"src-delete-after": "queue-length"})
    assert empty.connected(0, queue_length=0)[-1] == DeleteSelf()


def test_stop_terminates_and_ignores_later_input() -> None:
    link = _running()
    assert link.stop("deleted", 3) == [Disconnect("deleted")]
    assert link.state == TERMINATED and link.delivery(1, "", "q", P, b"", 4) == [] and link.tick(10**9) == []
