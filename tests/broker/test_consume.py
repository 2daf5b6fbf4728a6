"""Consumers: round-robin, priorities, exclusive, no-ack, cancel, get, ack/nack/reject, recover, qos, flow."""

from __future__ import annotations

from node.amqp import events as ev
from node.amqp import methods as m
from tests.broker.harness import (
    channel_close,
    connected,
    connection_close,
    deliveries,
    of_type,
)


def _setup(n: int = 0):  # type: ignore[no-untyped-def]
    c = connected()
    c.declare("q")
    for i in range(n):
        c.publish("", "q", f"m{i}".encode())
    return c


def test_consume_ok_precedes_deliveries_and_tags_count_up() -> None:
    c = _setup(3)
    effects = c.consume("q", "t")
    assert isinstance(effects[0].method, m.BasicConsumeOk)
    ds = deliveries(effects)
    assert [d.body for d in ds] == [b"m0", b"m1", b"m2"]
    assert [d.method.delivery_tag for d in ds] == [1, 2, 3]
    assert all(d.method.routing_key == "q" and d.method.exchange == "" for d in ds)


def test_server_generated_consumer_tag_and_duplicate_tag() -> None:
    c = _setup()
    tag = of_type(c.consume("q"), m.BasicConsumeOk)[0].consumer_tag
    assert tag.startswith("amq.ctag-")
    assert connection_close(c.consume("q", tag)) == (530, f"NOT_ALLOWED - attempt to reuse consumer tag '{tag}'")


def test_round_robin_between_consumers() -> None:
    c = _setup()
    c.consume("q", "a", no_ack=True)
    c.consume("q", "b", no_ack=True)
    tags = [deliveries(c.publish("", "q"))[0].method.consumer_tag for _ in range(4)]
    assert tags == ["a", "b", "a", "b"]


def test_round_robin_two_consumers_one_channel_with_acks() -> None:
    c = _setup()
    c.consume("q", "a")
    c.consume("q", "b")
    tags = []
    for i in range(10):
        for d in deliveries(c.publish("", "q", str(i).encode())):
            tags.append(d.method.consumer_tag)
            c.ack(d.method.delivery_tag)
    assert tags == ["a", "b"] * 5


def test_consumer_attached_while_not_writable_is_not_starved() -> None:
    c = _setup()
    c.consume("q", "a")
    c.broker.set_writable(1, False)
    c.consume("q", "b")
    held = [deliveries(c.publish("", "q", str(i).encode())) for i in range(10)]
    assert held == [[]] * 10
    tags = [d.method.consumer_tag for d in deliveries(c.broker.set_writable(1, True))]
    assert tags == ["a", "b"] * 5


def test_consumer_priority() -> None:
    c = _setup()
    c.consume("q", "low", no_ack=True)
    c.consume("q", "high", no_ack=True, arguments={"x-priority": 10})
    tags = [deliveries(c.publish("", "q"))[0].method.consumer_tag for _ in range(3)]
    assert tags == ["high", "high", "high"]


def test_exclusive_consumer() -> None:
    c = _setup()
    c.consume("q", "a")
    assert channel_close(c.consume("q", "b", exclusive=True)) == (
        403, "ACCESS_REFUSED - queue 'q' in vhost '/' in exclusive use")
    c2 = connected(c.broker, 2)
    c2.declare("q2")
    c2.consume("q2", "x", exclusive=True)
    assert channel_close(c2.consume("q2", "y")) == (403, "ACCESS_REFUSED - queue 'q2' in vhost '/' in exclusive use")


def test_ack_single_multiple_and_unknown_tag() -> None:
    c = _setup(3)
    c.consume("q", "t")
    assert c.ack(1) == []
    c.ack(3, multiple=True)
    assert channel_close(c.ack(2)) == (406, "PRECONDITION_FAILED - unknown delivery tag 2")


def test_double_ack_is_unknown_tag() -> None:
    c = _setup(1)
    c.consume("q", "t")
    c.ack(1)
    assert channel_close(c.ack(1)) == (406, "PRECONDITION_FAILED - unknown delivery tag 1")


def test_nack_requeue_redelivers_with_flag() -> None:
    c = _setup(1)
    c.call(m.BasicQos(prefetch_count=1))
    c.consume("q", "t")
    effects = c.call(m.BasicNack(delivery_tag=1, requeue=True))
    ds = deliveries(effects)
    assert ds and ds[0].method.redelivered and ds[0].method.delivery_tag == 2


def test_reject_without_requeue_drops() -> None:
    c = _setup(1)
    c.consume("q", "t")
    c.call(m.BasicReject(delivery_tag=1, requeue=False))
    c.call(m.BasicCancel(consumer_tag="t"))
    assert of_type(c.declare("q", passive=True), m.QueueDeclareOk)[0].message_count == 0


def test_cancel_keeps_unacked_ackable_and_stops_deliveries() -> None:
    c = _setup(2)
    c.call(m.BasicQos(prefetch_count=1))
    c.consume("q", "t")
    effects = c.call(m.BasicCancel(consumer_tag="t"))
    assert of_type(effects, m.BasicCancelOk)[0].consumer_tag == "t"
    assert deliveries(c.ack(1)) == []
    ok = of_type(c.declare("q", passive=True), m.QueueDeclareOk)[0]
    assert (ok.message_count, ok.consumer_count) == (1, 0)


def test_channel_close_requeues_unacked_as_redelivered() -> None:
    c = _setup(2)
    c.consume("q", "t")
    c.close_channel()
    c.open(2)
    effects = c.consume("q", "t2", channel=2)
    assert [d.method.redelivered for d in deliveries(effects)] == [True, True]


def test_connection_close_requeues_for_other_connection() -> None:
    c1 = _setup(1)
    c1.consume("q", "t")
    c2 = connected(c1.broker, 2)
    c2.consume("q", "t2")
    effects = c1.close()
    ds = [d for d in deliveries(effects) if d.conn_id == 2]
    assert ds and ds[0].method.redelivered


def test_basic_get_ok_empty_and_ack() -> None:
    c = _setup(2)
    ok = c.call(m.BasicGet(queue="q"))
    got = of_type(ok, m.BasicGetOk)[0]
    assert (got.delivery_tag, got.message_count, got.redelivered) == (1, 1, False)
    c.ack(1)
    c.call(m.BasicGet(queue="q", no_ack=True))
    assert of_type(c.call(m.BasicGet(queue="q")), m.BasicGetEmpty)
    assert channel_close(c.ack(2)) == (406, "PRECONDITION_FAILED - unknown delivery tag 2")


def test_basic_get_unacked_returns_on_close() -> None:
    c = _setup(1)
    c.call(m.BasicGet(queue="q"))
    c.close_channel()
    c.open(1)
    got = of_type(c.call(m.BasicGet(queue="q")), m.BasicGetOk)[0]
    assert got.redelivered


def test_recover_requeues_and_recover_false_not_implemented() -> None:
    c = _setup(1)
    c.consume("q", "t")
    effects = c.call(m.BasicRecover(requeue=True))
    assert of_type(effects, m.BasicRecoverOk)
    assert [d.method.redelivered for d in deliveries(effects)] == [True]
    assert connection_close(c.call(m.BasicRecoverAsync(requeue=False))) == (540, "NOT_IMPLEMENTED - requeue=false")


def test_per_consumer_prefetch() -> None:
    c = _setup(5)
    c.call(m.BasicQos(prefetch_count=2))
    assert len(deliveries(c.consume("q", "a"))) == 2
    assert len(deliveries(c.ack(1))) == 1


def test_global_prefetch_limits_channel_across_consumers() -> None:
    c = connected()
    c.declare("q1")
    c.declare("q2")
    for _ in range(5):
        c.publish("", "q1")
        c.publish("", "q2")
    c.call(m.BasicQos(prefetch_count=3, global_=True))
    first = deliveries(c.consume("q1", "a")) + deliveries(c.consume("q2", "b"))
    assert len(first) == 3
    more = deliveries(c.ack(first[-1].method.delivery_tag, multiple=True))
    assert len(more) == 3


def test_global_and_per_consumer_prefetch_together() -> None:
    c = _setup(10)
    c.call(m.BasicQos(prefetch_count=2, global_=False))
    c.call(m.BasicQos(prefetch_count=3, global_=True))
    assert len(deliveries(c.consume("q", "a"))) == 2
    assert len(deliveries(c.consume("q", "b"))) == 1


def test_prefetch_size_not_implemented() -> None:
    c = _setup()
    assert connection_close(c.call(m.BasicQos(prefetch_size=10))) == (540, "NOT_IMPLEMENTED - prefetch_size!=0 (10)")


def test_channel_flow_active_is_answered_and_inactive_is_540_as_in_rabbitmq_3() -> None:
    c = _setup()
    assert of_type(c.call(m.ChannelFlow(active=True)), m.ChannelFlowOk)[0].active is True
    assert connection_close(c.call(m.ChannelFlow(active=False))) == (540, "NOT_IMPLEMENTED - active=false")


def test_set_writable_bounds_outstanding_deliveries() -> None:
    from node.broker.broker import Broker, BrokerConfig
    from tests.broker.harness import Client

    broker = Broker(BrokerConfig(consumer_credit_window=4))
    c = Client(broker)
    c.open(1)
    c.declare("q")
    for _ in range(20):
        c.publish("", "q")
    assert len(deliveries(c.consume("q", "t", no_ack=True))) == 4
    broker.set_writable(1, False)
    assert deliveries(broker.tick(1)) == []
    total = 0
    for _ in range(10):
        total += len(deliveries(broker.set_writable(1, True)))
    assert total == 16


def test_auto_delete_queue_deleted_after_last_consumer() -> None:
    c = connected()
    c.declare("ad", auto_delete=True)
    c.consume("ad", "t")
    c.call(m.BasicCancel(consumer_tag="t"))
    assert channel_close(c.declare("ad", passive=True))[0] == 404


def test_server_cancel_only_with_capability() -> None:
    c1 = connected()
    c2 = connected(c1.broker, 2, cancel_notify=False)
    c1.declare("q")
    c2.consume("q", "t")
    assert [e for e in c1.call(m.QueueDelete(queue="q")) if e.conn_id == 2] == []


def test_methods_on_unopened_channel_are_ignored() -> None:
    c = _setup()
    assert c.handle(ev.MethodReceived(7, m.QueueDeclare(queue="z"))) == []
