"""Consuming through pika: push consumers, cancel both ways, get, ack/nack/reject, recover, qos, flow, reply-to."""

from __future__ import annotations

from typing import Any

import amqp
import pika
import pika.exceptions
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.integration.helpers import drain, expect_channel_error, publish, queue_depth, wait_until


class Collector:
    """A pika consumer callback that records deliveries (and acks them unless told not to)."""

    def __init__(self, ack: bool = True) -> None:
        self.ack = ack
        self.bodies: list[bytes] = []
        self.methods: list[Any] = []

    def __call__(self, channel: BlockingChannel, method: Any, _props: Any, body: bytes) -> None:
        self.bodies.append(body)
        self.methods.append(method)
        if self.ack:
            channel.basic_ack(method.delivery_tag)


def _queue_with(ch: BlockingChannel, bodies: list[str]) -> str:
    q = ch.queue_declare("", exclusive=True).method.queue
    for body in bodies:
        publish(ch, "", q, body)
    return q


def test_consume_receives_in_order_then_cancel_stops(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = _queue_with(ch, ["1", "2", "3"])
    got = Collector()
    tag = ch.basic_consume(q, got)
    assert wait_until(lambda: got.bodies == [b"1", b"2", b"3"], conn)
    assert got.methods[0].consumer_tag == tag
    assert [m.delivery_tag for m in got.methods] == [1, 2, 3]
    ch.basic_cancel(tag)
    publish(ch, "", q, b"4")
    conn.process_data_events(time_limit=0.2)
    assert got.bodies == [b"1", b"2", b"3"]
    assert drain(ch, q) == [b"4"]


def test_round_robin_between_consumers(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    a, b = Collector(), Collector()
    ch.basic_consume(q, a)
    ch.basic_consume(q, b)
    for i in range(10):
        publish(ch, "", q, str(i))
    assert wait_until(lambda: len(a.bodies) + len(b.bodies) == 10, conn)
    assert len(a.bodies) == 5
    assert len(b.bodies) == 5


def test_consumer_priority_gets_messages_first(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    low, high = Collector(), Collector()
    ch.basic_consume(q, low, arguments={"x-priority": 1})
    ch.basic_consume(q, high, arguments={"x-priority": 10})
    for i in range(5):
        publish(ch, "", q, str(i))
    assert wait_until(lambda: len(high.bodies) == 5, conn)
    assert low.bodies == []


def test_server_cancels_consumer_when_queue_deleted(conn: pika.BlockingConnection, uid: str) -> None:
    ch = conn.channel()
    ch.queue_declare(f"q-{uid}")
    cancelled: list[Any] = []
    ch.add_on_cancel_callback(cancelled.append)
    ch.basic_consume(f"q-{uid}", Collector())
    conn.channel().queue_delete(f"q-{uid}")
    assert wait_until(lambda: len(cancelled) == 1, conn)
    assert ch.is_open


def test_exclusive_consumer_refuses_others(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_consume(q, Collector(), exclusive=True)
    expect_channel_error(403, lambda: conn.channel().basic_consume(q, Collector()))
    ch2 = conn.channel()
    q2 = ch2.queue_declare("", exclusive=True).method.queue
    ch2.basic_consume(q2, Collector())
    expect_channel_error(403, lambda: conn.channel().basic_consume(q2, Collector(), exclusive=True))


def test_duplicate_consumer_tag_is_530(amqp_target: Any) -> None:
    """pika refuses a duplicate tag itself, so py-amqp sends it to the broker."""
    connection = amqp.Connection(f"{amqp_target.host}:{amqp_target.port}", userid="guest", password="guest")
    connection.connect()
    try:
        channel = connection.channel()
        q, _, _ = channel.queue_declare("", exclusive=True)
        channel.basic_consume(q, consumer_tag="same", callback=lambda message: None)
        with pytest.raises(amqp.exceptions.NotAllowed) as info:
            channel.basic_consume(q, consumer_tag="same", callback=lambda message: None)
        assert info.value.reply_code == 530
    finally:
        connection.collect()


def test_basic_get_and_get_empty(ch: BlockingChannel) -> None:
    q = _queue_with(ch, ["a", "b"])
    method, _props, body = ch.basic_get(q)
    assert body == b"a"
    assert method.message_count == 1
    assert not method.redelivered
    ch.basic_ack(method.delivery_tag)
    assert ch.basic_get(q, auto_ack=True)[2] == b"b"
    assert ch.basic_get(q) == (None, None, None)


def test_ack_multiple(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = _queue_with(ch, ["1", "2", "3"])
    tags = [ch.basic_get(q)[0].delivery_tag for _ in range(3)]
    ch.basic_ack(tags[1], multiple=True)
    ch.close()
    assert drain(conn.channel(), q) == [b"3"]


def test_nack_multiple_requeue_sets_redelivered(ch: BlockingChannel) -> None:
    q = _queue_with(ch, ["1", "2", "3"])
    tags = [ch.basic_get(q)[0].delivery_tag for _ in range(3)]
    ch.basic_nack(tags[2], multiple=True, requeue=True)
    seen = []
    for _ in range(3):
        method, _props, body = ch.basic_get(q, auto_ack=True)
        seen.append((body, method.redelivered))
    assert seen == [(b"1", True), (b"2", True), (b"3", True)]


def test_nack_without_requeue_drops(ch: BlockingChannel) -> None:
    q = _queue_with(ch, ["1", "2"])
    first = ch.basic_get(q)[0].delivery_tag
    ch.basic_nack(first, requeue=False)
    assert drain(ch, q) == [b"2"]


def test_reject_requeue_and_drop(ch: BlockingChannel) -> None:
    q = _queue_with(ch, ["1"])
    ch.basic_reject(ch.basic_get(q)[0].delivery_tag, requeue=True)
    method, _props, body = ch.basic_get(q)
    assert (body, method.redelivered) == (b"1", True)
    ch.basic_reject(method.delivery_tag, requeue=False)
    assert queue_depth(ch, q) == 0


def test_ack_of_unknown_delivery_tag_is_406(ch: BlockingChannel) -> None:
    ch.basic_ack(999)
    expect_channel_error(406, lambda: ch.queue_declare("", exclusive=True))


def test_unacked_messages_return_redelivered_when_channel_closes(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = _queue_with(ch, ["1", "2"])
    got = Collector(ack=False)
    ch.basic_consume(q, got)
    assert wait_until(lambda: len(got.bodies) == 2, conn)
    ch.close()
    other = conn.channel()
    method, _props, body = other.basic_get(q, auto_ack=True)
    assert (body, method.redelivered) == (b"1", True)


def test_basic_recover_requeue_redelivers(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = _queue_with(ch, ["1", "2"])
    got = Collector(ack=False)
    ch.basic_consume(q, got)
    assert wait_until(lambda: len(got.bodies) == 2, conn)
    ch.basic_recover(requeue=True)
    assert wait_until(lambda: len(got.bodies) == 4, conn)
    assert [m.redelivered for m in got.methods] == [False, False, True, True]
    assert sorted(got.bodies[2:]) == [b"1", b"2"]


def test_no_ack_consumer_needs_no_acks(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = _queue_with(ch, ["1", "2", "3"])
    got = Collector(ack=False)
    ch.basic_consume(q, got, auto_ack=True)
    assert wait_until(lambda: len(got.bodies) == 3, conn)
    ch.close()
    assert drain(conn.channel(), q) == []


def test_qos_prefetch_per_consumer(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = _queue_with(ch, [str(i) for i in range(10)])
    ch.basic_qos(prefetch_count=3)
    got = Collector(ack=False)
    ch.basic_consume(q, got)
    assert wait_until(lambda: len(got.bodies) == 3, conn)
    conn.process_data_events(time_limit=0.3)
    assert len(got.bodies) == 3
    ch.basic_ack(got.methods[-1].delivery_tag, multiple=True)
    assert wait_until(lambda: len(got.bodies) == 6, conn)


def test_qos_global_is_shared_by_the_channel(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q1 = _queue_with(ch, [str(i) for i in range(5)])
    q2 = _queue_with(ch, [str(i) for i in range(5)])
    ch.basic_qos(prefetch_count=3, global_qos=True)
    a, b = Collector(ack=False), Collector(ack=False)
    ch.basic_consume(q1, a)
    ch.basic_consume(q2, b)
    assert wait_until(lambda: len(a.bodies) + len(b.bodies) == 3, conn)
    conn.process_data_events(time_limit=0.3)
    assert len(a.bodies) + len(b.bodies) == 3


def test_qos_per_consumer_and_global_together(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q1 = _queue_with(ch, [str(i) for i in range(5)])
    q2 = _queue_with(ch, [str(i) for i in range(5)])
    ch.basic_qos(prefetch_count=4, global_qos=True)
    ch.basic_qos(prefetch_count=1)
    a, b = Collector(ack=False), Collector(ack=False)
    ch.basic_consume(q1, a)
    ch.basic_consume(q2, b)
    assert wait_until(lambda: len(a.bodies) == 1 and len(b.bodies) == 1, conn)
    conn.process_data_events(time_limit=0.3)
    assert (len(a.bodies), len(b.bodies)) == (1, 1)


def test_channel_flow_is_answered(ch: BlockingChannel) -> None:
    assert ch.flow(True) is True


def test_direct_reply_to(conn: pika.BlockingConnection) -> None:
    client = conn.channel()
    server = conn.channel()
    requests = server.queue_declare("", exclusive=True).method.queue
    replies = Collector(ack=False)
    client.basic_consume("amq.rabbitmq.reply-to", replies, auto_ack=True)
    client.basic_publish("", requests, b"ping", pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))
    assert wait_until(lambda: queue_depth(server, requests) == 1, conn)
    _method, props, body = server.basic_get(requests, auto_ack=True)
    assert body == b"ping"
    assert props.reply_to.startswith("amq.rabbitmq.reply-to.")
    server.basic_publish("", props.reply_to, b"pong")
    assert wait_until(lambda: replies.bodies == [b"pong"], conn)


def test_direct_reply_to_without_consumer_is_406(ch: BlockingChannel) -> None:
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"x", pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))
    expect_channel_error(406, lambda: ch.queue_declare(q, passive=True))


def test_consume_from_missing_queue_is_404(ch: BlockingChannel, uid: str) -> None:
    expect_channel_error(404, lambda: ch.basic_consume(f"missing-{uid}", Collector()))


def test_channel_flow_false_is_540(conn: pika.BlockingConnection) -> None:
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        conn.channel().flow(False)
    assert info.value.reply_code == 540


def test_ack_multiple_with_tag_zero_acks_everything(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = _queue_with(ch, ["1", "2", "3"])
    for _ in range(3):
        ch.basic_get(q)
    ch.basic_ack(0, multiple=True)
    ch.close()
    assert drain(conn.channel(), q) == []


def test_qos_prefetch_size_is_540(conn: pika.BlockingConnection) -> None:
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        conn.channel().basic_qos(prefetch_size=1024)
    assert info.value.reply_code == 540
