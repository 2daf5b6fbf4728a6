"""Exchanges, queues and bindings through pika: every exchange type, e2e bindings, alternate exchange, errors."""

from __future__ import annotations

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.integration.helpers import drain, expect_channel_error, publish, queue_depth


def test_direct_exchange_routes_by_exact_key(ch: BlockingChannel, uid: str) -> None:
    ch.exchange_declare(f"x-{uid}", "direct", auto_delete=True)
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, f"x-{uid}", "red")
    publish(ch, f"x-{uid}", "red", b"1")
    publish(ch, f"x-{uid}", "blue", b"2")
    assert drain(ch, q) == [b"1"]


def test_fanout_exchange_copies_to_every_queue(ch: BlockingChannel, uid: str) -> None:
    ch.exchange_declare(f"x-{uid}", "fanout", auto_delete=True)
    queues = [ch.queue_declare("", exclusive=True).method.queue for _ in range(3)]
    for q in queues:
        ch.queue_bind(q, f"x-{uid}", "ignored")
    publish(ch, f"x-{uid}", "anything", b"m")
    assert [drain(ch, q) for q in queues] == [[b"m"], [b"m"], [b"m"]]


@pytest.mark.parametrize(
    ("pattern", "matches", "misses"),
    [
        ("a.*.c", ["a.b.c", "a..c"], ["a.c", "a.b.b.c", "a.b.c.d"]),
        ("a.#", ["a", "a.b", "a.b.c"], ["b.a", "ab"]),
        ("#.c", ["c", "a.c", "a.b.c"], ["c.a"]),
        ("#", ["", "x", "x.y.z"], []),
        ("a.#.z", ["a.z", "a.b.z", "a.b.c.z"], ["a.b", "z"]),
        pytest.param("*", ["x"], ["", "x.y"]),
    ],
)
def test_topic_exchange_wildcards(
    ch: BlockingChannel, uid: str, pattern: str, matches: list[str], misses: list[str]
) -> None:
    ch.exchange_declare(f"x-{uid}", "topic", auto_delete=True)
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, f"x-{uid}", pattern)
    for key in matches + misses:
        publish(ch, f"x-{uid}", key, key.encode())
    assert sorted(drain(ch, q)) == sorted(k.encode() for k in matches)


def test_headers_exchange_all_and_any(ch: BlockingChannel, uid: str) -> None:
    ch.exchange_declare(f"x-{uid}", "headers", auto_delete=True)
    q_all = ch.queue_declare("", exclusive=True).method.queue
    q_any = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q_all, f"x-{uid}", "", arguments={"x-match": "all", "a": 1, "b": "two"})
    ch.queue_bind(q_any, f"x-{uid}", "", arguments={"x-match": "any", "a": 1, "b": "two"})
    publish(ch, f"x-{uid}", "", b"both", headers={"a": 1, "b": "two", "c": 3})
    publish(ch, f"x-{uid}", "", b"only-a", headers={"a": 1})
    publish(ch, f"x-{uid}", "", b"wrong", headers={"a": 2, "b": "three"})
    publish(ch, f"x-{uid}", "", b"none")
    assert drain(ch, q_all) == [b"both"]
    assert drain(ch, q_any) == [b"both", b"only-a"]


def test_predeclared_exchanges_exist(ch: BlockingChannel) -> None:
    for name, kind in [("amq.direct", "direct"), ("amq.fanout", "fanout"), ("amq.topic", "topic"),
                       ("amq.headers", "headers"), ("amq.match", "headers")]:
        ch.exchange_declare(name, kind, passive=True)
        ch.exchange_declare(name, kind, durable=True)


def test_default_exchange_routes_by_queue_name(ch: BlockingChannel) -> None:
    q = ch.queue_declare("", exclusive=True).method.queue
    publish(ch, "", q, b"hello")
    assert drain(ch, q) == [b"hello"]


def test_exchange_to_exchange_binding_and_unbind(ch: BlockingChannel, uid: str) -> None:
    ch.exchange_declare(f"src-{uid}", "topic")
    ch.exchange_declare(f"dst-{uid}", "fanout", auto_delete=True)
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, f"dst-{uid}", "")
    ch.exchange_bind(destination=f"dst-{uid}", source=f"src-{uid}", routing_key="k.#")
    publish(ch, f"src-{uid}", "k.1", b"routed")
    publish(ch, f"src-{uid}", "other", b"dropped")
    assert drain(ch, q) == [b"routed"]
    ch.exchange_unbind(destination=f"dst-{uid}", source=f"src-{uid}", routing_key="k.#")
    publish(ch, f"src-{uid}", "k.2", b"after-unbind")
    assert drain(ch, q) == []
    ch.exchange_delete(f"src-{uid}")


def test_queue_unbind_stops_routing(ch: BlockingChannel, uid: str) -> None:
    ch.exchange_declare(f"x-{uid}", "direct", auto_delete=True)
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, f"x-{uid}", "k")
    ch.queue_bind(q, f"x-{uid}", "keep")
    ch.queue_unbind(q, f"x-{uid}", "k")
    publish(ch, f"x-{uid}", "k", b"1")
    publish(ch, f"x-{uid}", "keep", b"2")
    assert drain(ch, q) == [b"2"]


def test_alternate_exchange_receives_unroutable(ch: BlockingChannel, uid: str) -> None:
    ch.exchange_declare(f"ae-{uid}", "fanout", auto_delete=True)
    q_ae = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q_ae, f"ae-{uid}", "")
    ch.exchange_declare(f"x-{uid}", "direct", auto_delete=True, arguments={"alternate-exchange": f"ae-{uid}"})
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, f"x-{uid}", "known")
    publish(ch, f"x-{uid}", "known", b"normal")
    publish(ch, f"x-{uid}", "unknown", b"alternate")
    assert drain(ch, q) == [b"normal"]
    assert drain(ch, q_ae) == [b"alternate"]


def test_auto_delete_exchange_goes_with_its_last_binding(ch: BlockingChannel, uid: str) -> None:
    ch.exchange_declare(f"x-{uid}", "direct", auto_delete=True)
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, f"x-{uid}", "k")
    ch.queue_unbind(q, f"x-{uid}", "k")
    expect_channel_error(404, lambda: ch.exchange_declare(f"x-{uid}", "direct", passive=True))


def test_exchange_delete_and_if_unused(conn: pika.BlockingConnection, uid: str) -> None:
    ch = conn.channel()
    ch.exchange_declare(f"x-{uid}", "direct")
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, f"x-{uid}", "k")
    expect_channel_error(406, lambda: ch.exchange_delete(f"x-{uid}", if_unused=True))
    ch = conn.channel()
    ch.exchange_delete(f"x-{uid}")
    expect_channel_error(404, lambda: ch.exchange_declare(f"x-{uid}", "direct", passive=True))


def test_exchange_redeclare_with_other_type_is_406(conn: pika.BlockingConnection, uid: str) -> None:
    ch = conn.channel()
    ch.exchange_declare(f"x-{uid}", "direct", auto_delete=True)
    error = expect_channel_error(406, lambda: ch.exchange_declare(f"x-{uid}", "fanout", auto_delete=True))
    assert "inequivalent" in error.reply_text


def test_passive_declare_of_missing_exchange_is_404(ch: BlockingChannel, uid: str) -> None:
    error = expect_channel_error(404, lambda: ch.exchange_declare(f"missing-{uid}", passive=True))
    assert f"missing-{uid}" in error.reply_text


def test_passive_declare_of_the_default_exchange_is_403(ch: BlockingChannel) -> None:
    """As RabbitMQ 3.10 (aiormq's test_channel_closed_reuse relies on it)."""
    error = expect_channel_error(403, lambda: ch.exchange_declare("", passive=True))
    assert error.reply_text == "ACCESS_REFUSED - operation not permitted on the default exchange"


def test_unknown_exchange_type_is_503_connection_error(conn: pika.BlockingConnection, uid: str) -> None:
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        ch.exchange_declare(f"x-{uid}", "no-such-type")
    assert info.value.reply_code == 503


def test_reserved_amq_prefix_is_403(ch: BlockingChannel, uid: str) -> None:
    expect_channel_error(403, lambda: ch.exchange_declare(f"amq.{uid}", "direct"))


def test_default_exchange_cannot_be_bound_or_deleted(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    expect_channel_error(403, lambda: ch.queue_bind(q, "", "k"))
    ch = conn.channel()
    expect_channel_error(403, lambda: ch.exchange_delete("amq.direct"))


def test_internal_exchange_refuses_publish(conn: pika.BlockingConnection, uid: str) -> None:
    ch = conn.channel()
    ch.exchange_declare(f"x-{uid}", "fanout", auto_delete=True, internal=True)
    ch.basic_publish(f"x-{uid}", "", b"no")
    expect_channel_error(403, lambda: ch.queue_declare("", exclusive=True))


def test_publish_to_missing_exchange_is_404(ch: BlockingChannel, uid: str) -> None:
    ch.basic_publish(f"missing-{uid}", "", b"no")
    expect_channel_error(404, lambda: ch.queue_declare("", exclusive=True))


def test_server_named_queue_and_declare_ok_counts(ch: BlockingChannel) -> None:
    ok = ch.queue_declare("", exclusive=True).method
    assert ok.queue.startswith("amq.gen-")
    assert (ok.message_count, ok.consumer_count) == (0, 0)
    publish(ch, "", ok.queue, b"1")
    publish(ch, "", ok.queue, b"2")
    ch.basic_consume(ok.queue, lambda *args: None)
    again = ch.queue_declare(ok.queue, passive=True).method
    assert again.consumer_count == 1
    assert again.message_count + 0 <= 2


def test_queue_purge_returns_count(ch: BlockingChannel) -> None:
    q = ch.queue_declare("", exclusive=True).method.queue
    for i in range(5):
        publish(ch, "", q, str(i))
    assert ch.queue_purge(q).method.message_count == 5
    assert queue_depth(ch, q) == 0


def test_queue_delete_returns_count_and_if_empty_if_unused(conn: pika.BlockingConnection, uid: str) -> None:
    ch = conn.channel()
    ch.queue_declare(f"q-{uid}")
    publish(ch, "", f"q-{uid}", b"x")
    expect_channel_error(406, lambda: ch.queue_delete(f"q-{uid}", if_empty=True))
    ch = conn.channel()
    ch.basic_consume(f"q-{uid}", lambda *args: None, auto_ack=False)
    ch2 = conn.channel()
    expect_channel_error(406, lambda: ch2.queue_delete(f"q-{uid}", if_unused=True))
    ch3 = conn.channel()
    assert ch3.queue_delete(f"q-{uid}").method.message_count in (0, 1)
    expect_channel_error(404, lambda: ch3.queue_declare(f"q-{uid}", passive=True))


def test_queue_redeclare_with_other_durability_is_406(conn: pika.BlockingConnection, uid: str) -> None:
    ch = conn.channel()
    ch.queue_declare(f"q-{uid}", auto_delete=True)
    expect_channel_error(406, lambda: ch.queue_declare(f"q-{uid}", durable=True))
    conn.channel().queue_delete(f"q-{uid}")


def test_passive_declare_of_missing_queue_is_404(ch: BlockingChannel, uid: str) -> None:
    expect_channel_error(404, lambda: ch.queue_declare(f"missing-{uid}", passive=True))


def test_bind_missing_queue_or_exchange_is_404(conn: pika.BlockingConnection, uid: str) -> None:
    ch = conn.channel()
    expect_channel_error(404, lambda: ch.queue_bind(f"missing-{uid}", "amq.direct", "k"))
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    expect_channel_error(404, lambda: ch.queue_bind(q, f"missing-{uid}", "k"))


def test_exclusive_queue_is_locked_to_its_connection(amqp_target: object, conn: pika.BlockingConnection) -> None:
    q = conn.channel().queue_declare("", exclusive=True).method.queue
    other = pika.BlockingConnection(amqp_target.params())  # type: ignore[attr-defined]
    try:
        expect_channel_error(405, lambda: other.channel().queue_declare(q, passive=True))
        expect_channel_error(405, lambda: other.channel().basic_consume(q, lambda *a: None))
    finally:
        other.close()


def test_exclusive_queue_deleted_when_connection_closes(amqp_target: object, ch: BlockingChannel) -> None:
    other = pika.BlockingConnection(amqp_target.params())  # type: ignore[attr-defined]
    q = other.channel().queue_declare("", exclusive=True).method.queue
    other.close()
    expect_channel_error(404, lambda: ch.queue_declare(q, passive=True))


def test_auto_delete_queue_goes_with_its_last_consumer(conn: pika.BlockingConnection, uid: str) -> None:
    ch = conn.channel()
    q = ch.queue_declare(f"q-{uid}", auto_delete=True).method.queue
    tag = ch.basic_consume(q, lambda *a: None)
    ch.basic_cancel(tag)
    expect_channel_error(404, lambda: ch.queue_declare(q, passive=True))


def test_headers_exchange_with_x_variants_match_x_headers(ch: BlockingChannel, uid: str) -> None:
    ch.exchange_declare(f"x-{uid}", "headers", auto_delete=True)
    plain = ch.queue_declare("", exclusive=True).method.queue
    with_x = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(plain, f"x-{uid}", "", arguments={"x-match": "any", "x-foo": "1"})
    ch.queue_bind(with_x, f"x-{uid}", "", arguments={"x-match": "any-with-x", "x-foo": "1"})
    publish(ch, f"x-{uid}", "", b"m", headers={"x-foo": "1"})
    assert drain(ch, plain) == []  # plain all/any ignore x- headers
    assert drain(ch, with_x) == [b"m"]


def test_queue_name_with_amq_prefix_is_403(ch: BlockingChannel, uid: str) -> None:
    expect_channel_error(403, lambda: ch.queue_declare(f"amq.{uid}"))


def test_queue_redeclare_with_other_arguments_is_406(conn: pika.BlockingConnection, uid: str) -> None:
    ch = conn.channel()
    ch.queue_declare(f"q-{uid}", auto_delete=True, arguments={"x-message-ttl": 1000})
    ch.basic_consume(f"q-{uid}", lambda *a: None)  # keeps the auto-delete queue while we probe
    error = expect_channel_error(
        406, lambda: conn.channel().queue_declare(f"q-{uid}", auto_delete=True, arguments={"x-message-ttl": 2000}))
    assert "x-message-ttl" in error.reply_text
