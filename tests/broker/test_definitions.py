"""Exchange and queue declare/delete/bind/unbind/purge, with RabbitMQ's reply codes and texts."""

from __future__ import annotations

import pytest

from node.amqp import methods as m
from node.broker.records import BindingRecord, ExchangeRecord, QueueRecord
from tests.broker.harness import (
    bodies,
    channel_close,
    connected,
    connection_close,
    deliveries,
    of_type,
    persists,
)


def test_exchange_declare_and_passive() -> None:
    c = connected()
    assert of_type(c.call(m.ExchangeDeclare(exchange="x", type="topic")), m.ExchangeDeclareOk)
    assert of_type(c.call(m.ExchangeDeclare(exchange="x", passive=True)), m.ExchangeDeclareOk)
    assert channel_close(c.call(m.ExchangeDeclare(exchange="nope", passive=True))) == (
        404, "NOT_FOUND - no exchange 'nope' in vhost '/'")


def test_default_exchange_declare_refused_passive_too() -> None:
    """RabbitMQ 3.10 refuses exchange.declare of "" even when passive (aiormq's test_channel_closed_reuse)."""
    c = connected()
    for passive in (True, False):
        c.open(1)
        assert channel_close(c.call(m.ExchangeDeclare(exchange="", passive=passive))) == (
            403, "ACCESS_REFUSED - operation not permitted on the default exchange")


def test_exchange_nowait_sends_nothing() -> None:
    c = connected()
    assert c.call(m.ExchangeDeclare(exchange="x", nowait=True)) == []


def test_exchange_inequivalent() -> None:
    c = connected()
    c.call(m.ExchangeDeclare(exchange="x", type="direct"))
    assert channel_close(c.call(m.ExchangeDeclare(exchange="x", type="fanout"))) == (
        406, "PRECONDITION_FAILED - inequivalent arg 'type' for exchange 'x' in vhost '/': "
             "received 'fanout' but current is 'direct'")
    c.open(1)
    assert channel_close(c.call(m.ExchangeDeclare(exchange="x", type="direct", durable=True))) == (
        406, "PRECONDITION_FAILED - inequivalent arg 'durable' for exchange 'x' in vhost '/': "
             "received 'true' but current is 'false'")


def test_exchange_reserved_names_and_default() -> None:
    c = connected()
    assert channel_close(c.call(m.ExchangeDeclare(exchange="amq.foo"))) == (
        403, "ACCESS_REFUSED - exchange name 'amq.foo' contains reserved prefix 'amq.*'")
    c.open(1)
    assert of_type(c.call(m.ExchangeDeclare(exchange="amq.direct", type="direct", durable=True)), m.ExchangeDeclareOk)
    assert channel_close(c.call(m.ExchangeDeclare(exchange=""))) == (
        403, "ACCESS_REFUSED - operation not permitted on the default exchange")
    c.open(1)
    assert channel_close(c.call(m.ExchangeDelete(exchange="")))[0] == 403
    c.open(1)
    assert channel_close(c.call(m.ExchangeDelete(exchange="amq.topic"))) == (
        403, "ACCESS_REFUSED - deletion of system exchange 'amq.topic' in vhost '/' not allowed")
    c.open(1)
    c.declare("q")
    assert channel_close(c.bind("q", "", "q")) == (
        403, "ACCESS_REFUSED - operation not permitted on the default exchange")


def test_unknown_exchange_type_closes_connection() -> None:
    c = connected()
    assert connection_close(c.call(m.ExchangeDeclare(exchange="x", type="bogus"))) == (
        503, "COMMAND_INVALID - invalid exchange type 'bogus'")


def test_exchange_delete_if_unused_and_idempotent() -> None:
    c = connected()
    c.call(m.ExchangeDeclare(exchange="x"))
    c.declare("q")
    c.bind("q", "x", "k")
    assert channel_close(c.call(m.ExchangeDelete(exchange="x", if_unused=True))) == (
        406, "PRECONDITION_FAILED - exchange 'x' in vhost '/' in use")
    c.open(1)
    assert of_type(c.call(m.ExchangeDelete(exchange="x")), m.ExchangeDeleteOk)
    assert of_type(c.call(m.ExchangeDelete(exchange="x")), m.ExchangeDeleteOk)


def test_internal_exchange_refuses_publish_but_routes_via_e2e() -> None:
    c = connected()
    c.call(m.ExchangeDeclare(exchange="inner", type="fanout", internal=True))
    c.call(m.ExchangeDeclare(exchange="outer", type="fanout"))
    c.call(m.ExchangeBind(destination="inner", source="outer"))
    c.declare("q")
    c.bind("q", "inner")
    c.consume("q", "t", no_ack=True)
    assert bodies(c.publish("outer", "", b"hi")) == [b"hi"]
    assert channel_close(c.publish("inner", "")) == (
        403, "ACCESS_REFUSED - cannot publish to internal exchange 'inner' in vhost '/'")


def test_auto_delete_exchange_goes_with_last_binding() -> None:
    c = connected()
    c.call(m.ExchangeDeclare(exchange="ad", type="fanout", auto_delete=True))
    c.declare("q")
    c.bind("q", "ad")
    c.call(m.QueueUnbind(queue="q", exchange="ad"))
    assert channel_close(c.call(m.ExchangeDeclare(exchange="ad", passive=True)))[0] == 404


def test_alternate_exchange_argument() -> None:
    c = connected()
    c.call(m.ExchangeDeclare(exchange="ae", type="fanout"))
    c.call(m.ExchangeDeclare(exchange="x", type="direct", arguments={"alternate-exchange": "ae"}))
    c.declare("lost")
    c.bind("lost", "ae")
    c.consume("lost", "t", no_ack=True)
    effects = c.publish("x", "nowhere", b"m", mandatory=True)
    assert bodies(effects) == [b"m"]
    assert not of_type(effects, m.BasicReturn)


def test_headers_binding_bad_x_match() -> None:
    c = connected()
    c.declare("q")
    code, _text = channel_close(c.bind("q", "amq.headers", arguments={"x-match": "some"}))
    assert code == 406


def test_queue_declare_counts_and_server_name() -> None:
    c = connected()
    ok = of_type(c.declare(""), m.QueueDeclareOk)[0]
    assert ok.queue.startswith("amq.gen-") and len(ok.queue) == len("amq.gen-") + 22
    c.declare("q")
    c.publish("", "q")
    c.publish("", "q")
    ok = of_type(c.declare("q", passive=True), m.QueueDeclareOk)[0]
    assert (ok.message_count, ok.consumer_count) == (2, 0)
    c.consume("q", "t")
    ok = of_type(c.declare("q"), m.QueueDeclareOk)[0]
    assert ok.consumer_count == 1


def test_queue_passive_missing_and_reserved_name() -> None:
    c = connected()
    assert channel_close(c.declare("nope", passive=True)) == (404, "NOT_FOUND - no queue 'nope' in vhost '/'")
    c.open(1)
    assert channel_close(c.declare("amq.q")) == (
        403, "ACCESS_REFUSED - queue name 'amq.q' contains reserved prefix 'amq.*'")


def test_queue_inequivalent_durable_and_args() -> None:
    c = connected()
    c.declare("q", durable=True)
    assert channel_close(c.declare("q", durable=False)) == (
        406, "PRECONDITION_FAILED - inequivalent arg 'durable' for queue 'q' in vhost '/': "
             "received 'false' but current is 'true'")
    c.open(1)
    assert channel_close(c.declare("q", durable=True, arguments={"x-max-length": 10})) == (
        406, "PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue 'q' in vhost '/': "
             "received the value '10' of type 'long' but current is none")


@pytest.mark.parametrize(("args", "detail"), [
    ({"x-max-length": -1}, "invalid arg 'x-max-length' for queue 'q' in vhost '/': {value_negative,-1}"),
    ({"x-message-ttl": "x"}, "invalid arg 'x-message-ttl' for queue 'q' in vhost '/': {unacceptable_type,longstr}"),
    ({"x-expires": 0}, "invalid arg 'x-expires' for queue 'q' in vhost '/': {value_zero,0}"),
    ({"x-max-priority": 300}, "invalid arg 'x-max-priority' for queue 'q' in vhost '/': {value_too_large,300,255}"),
    ({"x-overflow": "nah"}, "invalid arg 'x-overflow' for queue 'q' in vhost '/': {invalid_overflow,<<\"nah\">>}"),
    ({"x-single-active-consumer": 1},
     "invalid arg 'x-single-active-consumer' for queue 'q' in vhost '/': {unacceptable_type,long}"),
    ({"x-dead-letter-routing-key": "k"},
     "invalid arg 'x-dead-letter-routing-key' for queue 'q' in vhost '/': routing_key_but_no_dlx_defined"),
    ({"x-queue-type": "stream"},
     "invalid arg 'x-queue-type' for queue 'q' in vhost '/': {unsupported_queue_type,<<\"stream\">>}"),
    ({"x-delivery-limit": -2}, "invalid arg 'x-delivery-limit' for queue 'q' in vhost '/': {value_negative,-2}"),
])
def test_queue_argument_validation(args: dict[str, object], detail: str) -> None:
    c = connected()
    assert channel_close(c.declare("q", arguments=args)) == (406, "PRECONDITION_FAILED - " + detail)


def test_exclusive_queue_locked_for_others_and_deleted_on_close() -> None:
    c1 = connected()
    c2 = connected(c1.broker, 2)
    c1.declare("ex", exclusive=True)
    locked = (405, "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue 'ex' in vhost '/'. It could be "
                   "originally declared on another connection or the exclusive property value does not match that "
                   "of the original declaration.")
    assert channel_close(c2.declare("ex", passive=True)) == locked
    c2.open(1)
    assert channel_close(c2.consume("ex")) == locked
    c2.open(1)
    assert channel_close(c2.declare("ex", exclusive=True)) == locked
    c1.close()
    c2.open(1)
    assert channel_close(c2.declare("ex", passive=True))[0] == 404


def test_queue_delete_if_unused_if_empty() -> None:
    c = connected()
    c.declare("q")
    c.consume("q", "t")
    assert channel_close(c.call(m.QueueDelete(queue="q", if_unused=True))) == (
        406, "PRECONDITION_FAILED - queue 'q' in vhost '/' in use")
    c.open(1)
    c.publish("", "q")
    assert channel_close(c.call(m.QueueDelete(queue="q", if_empty=True))) == (
        406, "PRECONDITION_FAILED - queue 'q' in vhost '/' not empty")
    c.open(1)
    ok = of_type(c.call(m.QueueDelete(queue="q")), m.QueueDeleteOk)[0]
    assert ok.message_count == 1
    assert of_type(c.call(m.QueueDelete(queue="q")), m.QueueDeleteOk)


def test_queue_delete_cancels_consumers_on_other_connections() -> None:
    c1 = connected()
    c2 = connected(c1.broker, 2)
    c1.declare("q")
    c2.consume("q", "ctag")
    effects = c1.call(m.QueueDelete(queue="q"))
    cancels = [e for e in effects if e.conn_id == 2 and isinstance(getattr(e, "method", None), m.BasicCancel)]
    assert cancels and cancels[0].method.consumer_tag == "ctag"


def test_purge_counts_ready_messages() -> None:
    c = connected()
    c.declare("q")
    for _ in range(3):
        c.publish("", "q")
    assert of_type(c.call(m.QueuePurge(queue="q")), m.QueuePurgeOk)[0].message_count == 3
    assert of_type(c.declare("q", passive=True), m.QueueDeclareOk)[0].message_count == 0


def test_bind_missing_queue_or_exchange() -> None:
    c = connected()
    c.declare("q")
    assert channel_close(c.bind("q", "nope", "k")) == (404, "NOT_FOUND - no exchange 'nope' in vhost '/'")
    c.open(1)
    assert channel_close(c.bind("nope", "amq.direct", "k")) == (404, "NOT_FOUND - no queue 'nope' in vhost '/'")


def test_empty_queue_name_means_last_declared() -> None:
    c = connected()
    assert channel_close(c.bind("", "amq.direct", "k")) == (404, "NOT_FOUND - no previously declared queue")
    c.open(1)
    c.declare("q")
    c.bind("", "amq.direct", "k")
    c.consume("", "t", no_ack=True)
    assert bodies(c.publish("amq.direct", "k", b"b")) == [b"b"]


def test_topic_routing_through_broker() -> None:
    c = connected()
    for name, key in [("all", "#"), ("stock", "stock.*"), ("usd", "*.usd")]:
        c.declare(name)
        c.bind(name, "amq.topic", key)
        c.consume(name, name, no_ack=True)
    effects = c.publish("amq.topic", "stock.usd", b"m")
    assert sorted(d.method.consumer_tag for d in deliveries(effects)) == ["all", "stock", "usd"]


def test_durable_definitions_are_persisted() -> None:
    c = connected()
    c.call(m.ExchangeDeclare(exchange="dx", type="fanout", durable=True))
    c.declare("dq", durable=True)
    effects = c.bind("dq", "dx")
    records = [r for p in persists(effects) for r in p.records]
    assert records == [BindingRecord("/", "dx", "queue", "dq", "", {})]
    effects = c.call(m.QueueDelete(queue="dq"))
    records = [r for p in persists(effects) for r in p.records]
    assert QueueRecord("/", "dq", deleted=True) in records
    assert any(isinstance(r, BindingRecord) and r.deleted for r in records)
    effects = c.call(m.ExchangeDelete(exchange="dx"))
    assert [r for p in persists(effects) for r in p.records] == [ExchangeRecord("/", "dx", "fanout", deleted=True)]


def test_transient_definitions_are_not_persisted() -> None:
    c = connected()
    assert persists(c.declare("q")) == []
    assert persists(c.declare("dq", durable=True, exclusive=True)) == []


def test_x_expires_deletes_unused_queue() -> None:
    c = connected()
    c.declare("q", arguments={"x-expires": 1000})
    c.broker.tick(500)
    assert of_type(c.declare("q", passive=True), m.QueueDeclareOk)
    c.broker.tick(1600)
    assert channel_close(c.declare("q", passive=True))[0] == 404




def test_server_names_come_from_injected_rng() -> None:
    from node.broker.broker import Broker, BrokerConfig
    from tests.broker.harness import Client

    broker = Broker(BrokerConfig(rng=lambda n: bytes(n)))
    c = Client(broker)
    c.open(1)
    assert of_type(c.declare(""), m.QueueDeclareOk)[0].queue == "amq.gen-AAAAAAAAAAAAAAAAAAAAAA"
    assert of_type(c.consume("amq.gen-AAAAAAAAAAAAAAAAAAAAAA"), m.BasicConsumeOk)[0].consumer_tag == (
        "amq.ctag-AAAAAAAAAAAAAAAAAAAAAA")


def test_queue_delete_ok_comes_before_the_cancel_of_a_consumer_on_the_same_channel() -> None:
    # RabbitMQ replies queue.delete-ok first; the consumer_cancel_notify basic.cancel follows. kombu's
    # test_ack_from_another_thread deletes the queue from the consuming channel without an on_cancel callback:
    # a cancel before the delete-ok makes py-amqp raise ConsumerCancelled inside queue_delete.
    c1 = connected()
    c2 = connected(c1.broker, 2)
    c1.declare("q")
    c1.consume("q", "ctag")
    c2.consume("q", "other")
    sent = [(e.conn_id, type(e.method).__name__) for e in c1.call(m.QueueDelete(queue="q"))
            if isinstance(getattr(e, "method", None), (m.QueueDeleteOk, m.BasicCancel))]
    assert sent[0] == (1, "QueueDeleteOk")
    assert sorted(sent[1:]) == [(1, "BasicCancel"), (2, "BasicCancel")]
