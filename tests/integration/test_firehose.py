"""Firehose tracing (RabbitMQ's rabbit_trace), single node and cluster: `raftmq ctl trace_on -p vhost` on every node,
then each publish and each delivery (basic.get-ok and basic.deliver) in the vhost is copied to the vhost's internal
`amq.rabbitmq.trace` topic exchange as `publish.<exchange>` / `deliver.<queue>` with RabbitMQ's headers and the
original body; `trace_off` stops it. Tracing is per node, so the test turns it on at every node of the cluster
(clients reach any of them through HAProxy). Uses the session's broker and a vhost of its own; pika clients.
"""

from __future__ import annotations

from typing import Any

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.integration.conftest import Target
from tests.integration.helpers import expect_channel_error
from tests.integration.test_vhost_limits import api, ctl, make_vhost, management_ports, quote, wait_all

TRACE = "amq.rabbitmq.trace"


def _set_tracing(target: Target, vhost: str, on: bool) -> None:
    ports = management_ports(target)
    for port in ports:
        done = ctl(port, "trace_on" if on else "trace_off", "-p", vhost)
        assert done.returncode == 0, done.stderr
    wait_all(ports, f"tracing {on}", lambda p: api(p, "GET", f"/api/vhosts/{quote(vhost)}").json()["tracing"] is on)


def _drain(ch: BlockingChannel, queue: str) -> list[tuple[str, Any, bytes]]:
    got = []
    while True:
        method, props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return got
        got.append((method.routing_key, props, body))


def _collect(ch: BlockingChannel, queue: str, want: int) -> list[tuple[str, Any, bytes]]:
    got: list[tuple[str, Any, bytes]] = []
    deadline = 200  # x 0.1 s
    while len(got) < want and deadline:
        got += _drain(ch, queue)
        if len(got) < want:
            ch.connection.sleep(0.1)
            deadline -= 1
    assert len(got) == want, got
    return got


def _publish_and_sync(ch: BlockingChannel, exchange: str) -> None:
    ch.basic_publish(exchange, "x", b"no")
    ch.basic_qos(prefetch_count=1)  # a round trip: the channel's closing shows here


@pytest.fixture
def traced(amqp_target: Target, uid: str) -> tuple[Target, str]:
    if amqp_target.node is None:
        pytest.skip("needs the broker's management API on its own nodes")
    return amqp_target, make_vhost(amqp_target, f"trace-{uid}")


def test_trace_on_copies_publishes_and_deliveries_off_stops(traced: tuple[Target, str]) -> None:
    target, vhost = traced
    assert all(api(p, "GET", f"/api/vhosts/{quote(vhost)}").json()["tracing"] is False
               for p in management_ports(target))  # off by default
    connection = pika.BlockingConnection(target.params(vhost=vhost))
    try:
        ch = connection.channel()
        ch.exchange_declare(TRACE, "topic", durable=True, internal=True, passive=True)
        ch.queue_declare("tr", durable=True)
        ch.queue_bind("tr", TRACE, "#")
        ch.queue_declare("work", durable=True)
        _set_tracing(target, vhost, True)
        props = pika.BasicProperties(content_type="text/plain", delivery_mode=2, message_id="m1",
                                     headers={"h": "v"})
        ch.basic_publish("", "work", b"one", props)
        ch.basic_publish("amq.direct", "nowhere", b"lost")
        method, _props, body = ch.basic_get("work", auto_ack=False)
        assert method is not None and body == b"one"
        ch.basic_nack(method.delivery_tag, requeue=True)  # the next delivery of it is a redelivery
        for consumed_method, _p, consumed_body in ch.consume("work", inactivity_timeout=30):
            assert consumed_method is not None and consumed_body == b"one"
            ch.basic_ack(consumed_method.delivery_tag)
            break
        ch.cancel()

        got = _collect(ch, "tr", 4)
        by_key: dict[str, list[tuple[Any, bytes]]] = {}
        for key, trace_props, trace_body in got:
            by_key.setdefault(key, []).append((trace_props, trace_body))
        assert sorted(by_key) == ["deliver.work", "publish.", "publish.amq.direct"]
        [(published, body)] = by_key["publish."]
        assert body == b"one"
        h = published.headers
        assert (h["exchange_name"], h["routing_keys"], h["routed_queues"]) == ("", ["work"], ["work"])
        assert h["properties"] == {"content_type": "text/plain", "delivery_mode": 2, "message_id": "m1",
                                   "headers": {"h": "v"}}
        assert (h["vhost"], h["user"]) == (vhost, "guest")
        assert h["node"] and h["connection"] and isinstance(h["channel"], int)
        assert published.delivery_mode is None  # the copy is transient: headers only
        [(unrouted, body)] = by_key["publish.amq.direct"]
        assert body == b"lost" and unrouted.headers["routed_queues"] == []
        assert unrouted.headers["routing_keys"] == ["nowhere"]
        deliveries = sorted((p.headers["redelivered"], b) for p, b in by_key["deliver.work"])
        assert deliveries == [(0, b"one"), (1, b"one")]  # the get-ok, then the consumer's redelivery
        delivered = by_key["deliver.work"][0][0].headers
        assert (delivered["exchange_name"], delivered["routing_keys"], delivered["vhost"]) == ("", ["work"], vhost)
        assert "routed_queues" not in delivered

        # Clients may not publish to the trace exchange (internal, as in RabbitMQ).
        expect_channel_error(403, lambda: _publish_and_sync(connection.channel(), TRACE))

        _set_tracing(target, vhost, False)
        ch.basic_publish("", "work", b"two")
        method, _props, body = ch.basic_get("work", auto_ack=True)
        assert body == b"two"
        ch.basic_publish("", "tr", b"sentinel")  # after anything traced from this channel, in the queue's order
        assert [(key, body) for key, _p, body in _collect(ch, "tr", 1)] == [("tr", b"sentinel")]
        ch.queue_delete("tr")
        ch.queue_delete("work")
    finally:
        connection.close()


def test_trace_on_an_unknown_vhost_is_refused(amqp_target: Target) -> None:
    if amqp_target.node is None:
        pytest.skip("needs the broker's management API on its own nodes")
    done = ctl(management_ports(amqp_target)[0], "trace_on", "-p", "no-such-vhost")
    assert done.returncode == 65, (done.returncode, done.stderr)
