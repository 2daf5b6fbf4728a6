"""Publishing through pika (and py-amqp for `immediate`): mandatory returns, confirms, transactions, size limit."""

from __future__ import annotations

from typing import Any

import amqp
import pika
import pika.exceptions
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.integration.helpers import drain, expect_channel_error, publish, queue_depth, wait_until
from tests.integration.nodeproc import MAX_MESSAGE_SIZE_BYTES


def test_mandatory_unroutable_is_returned_with_312(conn: pika.BlockingConnection, uid: str) -> None:
    ch = conn.channel()
    returned: list[tuple[Any, bytes]] = []
    ch.add_on_return_callback(lambda _ch, method, _props, body: returned.append((method, body)))
    ch.basic_publish("amq.direct", f"nobody-{uid}", b"back", mandatory=True)
    assert wait_until(lambda: len(returned) == 1, conn)
    method, body = returned[0]
    assert (method.reply_code, method.reply_text) == (312, "NO_ROUTE")
    assert (method.exchange, method.routing_key, body) == ("amq.direct", f"nobody-{uid}", b"back")


def test_mandatory_with_confirms_raises_unroutable(ch: BlockingChannel, uid: str) -> None:
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish("amq.direct", f"nobody-{uid}", b"back", mandatory=True)


def test_mandatory_routable_is_not_returned(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    returned: list[bytes] = []
    ch.add_on_return_callback(lambda *args: returned.append(args[3]))
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"ok", mandatory=True)
    assert drain(ch, q) == [b"ok"]
    assert returned == []


def test_immediate_publish_is_540_not_implemented(amqp_target: Any) -> None:
    connection = amqp.Connection(f"{amqp_target.host}:{amqp_target.port}", userid="guest", password="guest")
    connection.connect()
    try:
        channel = connection.channel()
        channel.basic_publish(amqp.Message(b"now"), exchange="amq.direct", routing_key="k", immediate=True)
        with pytest.raises(amqp.exceptions.AMQPNotImplementedError) as info:
            channel.queue_declare("", exclusive=True)
            connection.drain_events(timeout=5)
        assert info.value.reply_code == 540
    finally:
        connection.collect()


def test_confirms_ack_every_publish(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.confirm_delivery()
    for i in range(50):
        publish(ch, "", q, str(i))  # raises unless acked
    assert queue_depth(ch, q) == 50


def test_confirms_with_persistent_messages_in_durable_queue(conn: pika.BlockingConnection, uid: str) -> None:
    ch = conn.channel()
    ch.queue_declare(f"q-{uid}", durable=True)
    ch.confirm_delivery()
    for i in range(20):
        publish(ch, "", f"q-{uid}", str(i), delivery_mode=2)
    assert queue_depth(ch, f"q-{uid}") == 20
    ch.queue_delete(f"q-{uid}")


def test_confirms_unroutable_is_acked(ch: BlockingChannel, uid: str) -> None:
    ch.confirm_delivery()
    ch.basic_publish("amq.direct", f"nobody-{uid}", b"lost")  # no exception: acked though unroutable


def test_confirm_select_on_transactional_channel_is_406(ch: BlockingChannel) -> None:
    ch.tx_select()
    expect_channel_error(406, ch.confirm_delivery)


def test_tx_commit_makes_publishes_visible(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    observer = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.tx_select()
    publish(ch, "", q, b"1")
    publish(ch, "", q, b"2")
    assert queue_depth(observer, q) == 0
    ch.tx_commit()
    assert drain(observer, q) == [b"1", b"2"]


def test_tx_rollback_discards_publishes(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.tx_select()
    publish(ch, "", q, b"gone")
    ch.tx_rollback()
    publish(ch, "", q, b"kept")
    ch.tx_commit()
    assert drain(conn.channel(), q) == [b"kept"]


def test_tx_acks_apply_on_commit_only(conn: pika.BlockingConnection) -> None:
    setup = conn.channel()
    q = setup.queue_declare("", exclusive=True).method.queue
    publish(setup, "", q, b"a")
    publish(setup, "", q, b"b")
    ch = conn.channel()
    ch.tx_select()
    first, _, _ = ch.basic_get(q)
    second, _, _ = ch.basic_get(q)
    ch.basic_ack(first.delivery_tag)
    ch.tx_rollback()  # the ack of "a" is forgotten: "a" stays unacked on this channel
    ch.basic_ack(second.delivery_tag)
    ch.tx_commit()
    ch.close()  # unacked "a" goes back to the queue
    method, _props, body = setup.basic_get(q, auto_ack=True)
    assert body == b"a"
    assert method.redelivered
    assert drain(setup, q) == []


def test_tx_commit_without_select_is_406(ch: BlockingChannel) -> None:
    expect_channel_error(406, ch.tx_commit)


def test_message_over_max_size_closes_channel_406(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    publish(ch, "", q, b"x" * MAX_MESSAGE_SIZE_BYTES)  # exactly at the limit: accepted
    ch.basic_publish("", q, b"x" * (MAX_MESSAGE_SIZE_BYTES + 1))
    expect_channel_error(406, lambda: ch.queue_declare(q, passive=True))
    assert queue_depth(conn.channel(), q) == 1


def test_large_message_spans_frames_intact(ch: BlockingChannel) -> None:
    q = ch.queue_declare("", exclusive=True).method.queue
    body = bytes(range(256)) * 2000  # 512 000 bytes: several frames at frame_max 131072
    publish(ch, "", q, body)
    assert drain(ch, q) == [body]


def test_properties_round_trip(ch: BlockingChannel) -> None:
    q = ch.queue_declare("", exclusive=True).method.queue
    props = pika.BasicProperties(
        content_type="application/json", content_encoding="utf-8", headers={"int": 1, "str": "s", "list": [1, "a"],
        "nested": {"k": True}, "decimal_free": 2**40}, delivery_mode=2, priority=3, correlation_id="c1", reply_to="r",
        expiration="60000", message_id="m1", timestamp=1700000000, type="t", user_id="guest", app_id="app",
    )
    ch.basic_publish("", q, b"{}", props)
    _method, got, _body = ch.basic_get(q, auto_ack=True)
    for name in ("content_type", "content_encoding", "delivery_mode", "priority", "correlation_id", "reply_to",
                 "expiration", "message_id", "timestamp", "type", "user_id", "app_id"):
        assert getattr(got, name) == getattr(props, name), name
    assert got.headers == props.headers


def test_user_id_must_match_the_connection_user(ch: BlockingChannel) -> None:
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"forged", pika.BasicProperties(user_id="someone-else"))
    expect_channel_error(406, lambda: ch.queue_declare(q, passive=True))
