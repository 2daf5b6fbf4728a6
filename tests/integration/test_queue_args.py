"""Queue arguments through pika: TTLs, x-expires, length limits and overflow, dead lettering, priority, SAC."""

from __future__ import annotations

import time
from typing import Any

import pika
import pika.exceptions
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.integration.helpers import drain, expect_channel_error, publish, queue_depth, wait_until


def _dlx_pair(ch: BlockingChannel, uid: str) -> tuple[str, str]:
    """A fanout dead-letter exchange and the queue behind it."""
    ch.exchange_declare(f"dlx-{uid}", "fanout", auto_delete=True)
    dead = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(dead, f"dlx-{uid}", "")
    return f"dlx-{uid}", dead


def _get_with_props(ch: BlockingChannel, queue: str) -> tuple[Any, bytes] | None:
    method, props, body = ch.basic_get(queue, auto_ack=True)
    return None if method is None else (props, body)


def test_queue_message_ttl_expires_messages(ch: BlockingChannel) -> None:
    q = ch.queue_declare("", exclusive=True, arguments={"x-message-ttl": 50}).method.queue
    publish(ch, "", q, b"short-lived")
    time.sleep(0.5)
    assert drain(ch, q) == []


def test_per_message_expiration(ch: BlockingChannel) -> None:
    q = ch.queue_declare("", exclusive=True).method.queue
    publish(ch, "", q, b"expires", expiration="50")
    publish(ch, "", q, b"stays")
    time.sleep(0.5)
    assert drain(ch, q) == [b"stays"]


def test_expired_messages_are_dead_lettered_with_x_death(ch: BlockingChannel) -> None:
    dlx, dead = _dlx_pair(ch, "ttl-" + str(id(ch)))
    q = ch.queue_declare("", exclusive=True, arguments={"x-message-ttl": 50, "x-dead-letter-exchange": dlx}).method.queue
    publish(ch, "", q, b"m")
    assert wait_until(lambda: queue_depth(ch, dead) == 1)
    props, body = _get_with_props(ch, dead) or (None, b"")
    assert body == b"m"
    death = props.headers["x-death"][0]
    assert death["reason"] == "expired"
    assert death["queue"] == q
    assert death["count"] == 1
    assert props.headers["x-first-death-reason"] == "expired"


def test_queue_expires_when_unused(conn: pika.BlockingConnection, uid: str) -> None:
    ch = conn.channel()
    ch.queue_declare(f"q-{uid}", arguments={"x-expires": 100})

    def gone() -> bool:
        probe = conn.channel()
        try:
            probe.queue_declare(f"q-{uid}", passive=True)
        except pika.exceptions.ChannelClosedByBroker as exc:
            return exc.reply_code == 404
        probe.close()
        time.sleep(0.3)
        return False

    assert wait_until(gone)


def test_auto_delete_queue_goes_when_its_last_consumer_cancels_holding_a_message(conn: pika.BlockingConnection,
                                                                               uid: str) -> None:
    # RabbitMQ's rule, the queue machine's in both modes: a cancelled consumer with unacked messages is no consumer
    ch = conn.channel()
    queue = f"ad-{uid}"
    ch.queue_declare(queue, auto_delete=True)
    ch.basic_qos(prefetch_count=10)
    publish(ch, "", queue, b"held")
    tags: list[int] = []
    consumer_tag = ch.basic_consume(queue, lambda _c, method, _p, _b: tags.append(method.delivery_tag))
    assert wait_until(lambda: bool(tags), conn)
    ch.basic_cancel(consumer_tag)  # the message is still unacked
    expect_channel_error(404, lambda: conn.channel().queue_declare(queue, passive=True))


def test_max_length_drop_head(ch: BlockingChannel) -> None:
    q = ch.queue_declare("", exclusive=True, arguments={"x-max-length": 2}).method.queue
    for body in (b"1", b"2", b"3"):
        publish(ch, "", q, body)
    assert drain(ch, q) == [b"2", b"3"]


def test_max_length_bytes_drop_head(ch: BlockingChannel) -> None:
    q = ch.queue_declare("", exclusive=True, arguments={"x-max-length-bytes": 10}).method.queue
    for body in (b"aaaa", b"bbbb", b"cccc"):
        publish(ch, "", q, body)
    assert drain(ch, q) == [b"bbbb", b"cccc"]


def test_max_length_drop_head_dead_letters_with_reason_maxlen(ch: BlockingChannel, uid: str) -> None:
    dlx, dead = _dlx_pair(ch, uid)
    q = ch.queue_declare("", exclusive=True, arguments={"x-max-length": 1, "x-dead-letter-exchange": dlx}).method.queue
    publish(ch, "", q, b"old")
    publish(ch, "", q, b"new")
    assert wait_until(lambda: queue_depth(ch, dead) == 1)
    props, body = _get_with_props(ch, dead) or (None, b"")
    assert body == b"old"
    assert props.headers["x-death"][0]["reason"] == "maxlen"
    assert drain(ch, q) == [b"new"]


def test_max_length_reject_publish_nacks_with_confirms(ch: BlockingChannel) -> None:
    q = ch.queue_declare("", exclusive=True,
                         arguments={"x-max-length": 2, "x-overflow": "reject-publish"}).method.queue
    ch.confirm_delivery()
    publish(ch, "", q, b"1")
    publish(ch, "", q, b"2")
    with pytest.raises(pika.exceptions.NackError):
        publish(ch, "", q, b"3")
    assert drain(ch, q) == [b"1", b"2"]


def test_max_length_reject_publish_dlx_dead_letters_rejected(ch: BlockingChannel, uid: str) -> None:
    dlx, dead = _dlx_pair(ch, uid)
    args = {"x-max-length": 1, "x-overflow": "reject-publish-dlx", "x-dead-letter-exchange": dlx}
    q = ch.queue_declare("", exclusive=True, arguments=args).method.queue
    publish(ch, "", q, b"kept")
    publish(ch, "", q, b"rejected")
    assert wait_until(lambda: queue_depth(ch, dead) == 1)
    props, body = _get_with_props(ch, dead) or (None, b"")
    assert body == b"rejected"
    assert props.headers["x-death"][0]["reason"] == "maxlen"
    assert drain(ch, q) == [b"kept"]


def test_reject_dead_letters_with_routing_key_override(ch: BlockingChannel, uid: str) -> None:
    ch.exchange_declare(f"dlx-{uid}", "direct", auto_delete=True)
    dead = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(dead, f"dlx-{uid}", "dead-key")
    args = {"x-dead-letter-exchange": f"dlx-{uid}", "x-dead-letter-routing-key": "dead-key"}
    q = ch.queue_declare("", exclusive=True, arguments=args).method.queue
    publish(ch, "", q, b"bad")
    method, _props, _body = ch.basic_get(q)
    ch.basic_reject(method.delivery_tag, requeue=False)
    assert wait_until(lambda: queue_depth(ch, dead) == 1)
    method, props, body = ch.basic_get(dead, auto_ack=True)
    assert body == b"bad"
    assert method.routing_key == "dead-key"
    death = props.headers["x-death"][0]
    assert death["reason"] == "rejected"
    assert death["queue"] == q
    assert death["exchange"] == ""
    assert list(death["routing-keys"]) == [q]
    assert props.headers["x-first-death-queue"] == q


def test_x_death_count_grows_on_a_dead_letter_cycle(ch: BlockingChannel, uid: str) -> None:
    """A message rejected twice from the same queue has one x-death entry with count 2."""
    ch.exchange_declare(f"dlx-{uid}", "fanout", auto_delete=True)
    q = ch.queue_declare("", exclusive=True, arguments={"x-dead-letter-exchange": f"dlx-{uid}"}).method.queue
    ch.queue_bind(q, f"dlx-{uid}", "")
    publish(ch, "", q, b"loop")
    for _ in range(2):
        assert wait_until(lambda: queue_depth(ch, q) == 1)
        method, _props, _body = ch.basic_get(q)
        ch.basic_reject(method.delivery_tag, requeue=False)
    assert wait_until(lambda: queue_depth(ch, q) == 1)
    _method, props, _body = ch.basic_get(q, auto_ack=True)
    deaths = props.headers["x-death"]
    assert len(deaths) == 1
    assert deaths[0]["count"] == 2


def test_max_priority_delivers_highest_first(ch: BlockingChannel) -> None:
    q = ch.queue_declare("", exclusive=True, arguments={"x-max-priority": 10}).method.queue
    for priority in (1, 9, 5, 0):
        publish(ch, "", q, str(priority), priority=priority)
    assert drain(ch, q) == [b"9", b"5", b"1", b"0"]


def test_single_active_consumer(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True, arguments={"x-single-active-consumer": True}).method.queue
    got: dict[str, list[bytes]] = {"a": [], "b": []}

    def collector(name: str) -> Any:
        def on_message(channel: BlockingChannel, method: Any, _props: Any, body: bytes) -> None:
            got[name].append(body)
            channel.basic_ack(method.delivery_tag)
        return on_message

    tag_a = ch.basic_consume(q, collector("a"))
    ch.basic_consume(q, collector("b"))
    for i in range(4):
        publish(ch, "", q, str(i))
    assert wait_until(lambda: len(got["a"]) == 4, conn)
    assert got["b"] == []
    ch.basic_cancel(tag_a)
    publish(ch, "", q, b"after")
    assert wait_until(lambda: got["b"] == [b"after"], conn)


@pytest.mark.parametrize(
    "arguments",
    [
        {"x-message-ttl": -1},
        {"x-max-length": "many"},
        {"x-overflow": "explode"},
        {"x-expires": 0},
        {"x-max-priority": 1000},
    ],
)
def test_bad_queue_arguments_are_406(conn: pika.BlockingConnection, arguments: dict[str, Any]) -> None:
    ch = conn.channel()
    expect_channel_error(406, lambda: ch.queue_declare("", exclusive=True, arguments=arguments))
