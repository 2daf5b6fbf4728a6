"""Queue arguments end to end through the broker: priority, single active consumer, delivery limit, overflow
with dead lettering, exchange-to-exchange unbind, headers exchange."""

from __future__ import annotations

from node.amqp import methods as m
from tests.broker.harness import bodies, connected, deliveries, of_type


def test_priority_queue_delivers_highest_first() -> None:
    c = connected()
    c.declare("pq", arguments={"x-max-priority": 10})
    for body, priority in [(b"low", 1), (b"high", 9), (b"mid", 5)]:
        c.publish("", "pq", body, priority=priority)
    assert bodies(c.consume("pq", "t", no_ack=True)) == [b"high", b"mid", b"low"]


def test_single_active_consumer() -> None:
    c = connected()
    c.declare("sac", arguments={"x-single-active-consumer": True})
    c.consume("sac", "a", no_ack=True)
    c.consume("sac", "b", no_ack=True)
    tags = [deliveries(c.publish("", "sac"))[0].method.consumer_tag for _ in range(3)]
    assert tags == ["a", "a", "a"]
    c.call(m.BasicCancel(consumer_tag="a"))
    assert deliveries(c.publish("", "sac"))[0].method.consumer_tag == "b"


def test_delivery_limit_dead_letters_after_requeues() -> None:
    c = connected()
    c.declare("dead")
    c.declare("work", arguments={"x-delivery-limit": 1, "x-dead-letter-exchange": "",
                                 "x-dead-letter-routing-key": "dead"})
    c.publish("", "work", b"poison")
    c.call(m.BasicQos(prefetch_count=1))
    c.consume("work", "t")
    tag = 1
    for _ in range(3):
        ds = [d for d in deliveries(c.call(m.BasicNack(delivery_tag=tag, requeue=True))) if d.body == b"poison"]
        if not ds:
            break
        tag = ds[0].method.delivery_tag
    ok = of_type(c.declare("dead", passive=True), m.QueueDeclareOk)[0]
    assert ok.message_count == 1


def test_reject_publish_dlx_nacks_and_dead_letters() -> None:
    c = connected()
    c.declare("overflowed")
    c.declare("small", arguments={"x-max-length": 1, "x-overflow": "reject-publish-dlx",
                                  "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "overflowed"})
    c.call(m.ConfirmSelect())
    c.publish("", "small", b"1")
    effects = c.publish("", "small", b"2")
    assert [n.delivery_tag for n in of_type(effects, m.BasicNack)] == [2]
    assert of_type(c.declare("overflowed", passive=True), m.QueueDeclareOk)[0].message_count == 1


def test_exchange_unbind_stops_routing() -> None:
    c = connected()
    c.call(m.ExchangeDeclare(exchange="src", type="fanout"))
    c.call(m.ExchangeDeclare(exchange="dst", type="fanout"))
    c.call(m.ExchangeBind(destination="dst", source="src"))
    c.declare("q")
    c.bind("q", "dst")
    c.consume("q", "t", no_ack=True)
    assert bodies(c.publish("src", "", b"1")) == [b"1"]
    assert of_type(c.call(m.ExchangeUnbind(destination="dst", source="src")), m.ExchangeUnbindOk)
    assert bodies(c.publish("src", "", b"2")) == []


def test_headers_exchange_through_broker() -> None:
    c = connected()
    c.declare("q")
    c.bind("q", "amq.match", arguments={"x-match": "all", "format": "pdf", "type": "report"})
    c.consume("q", "t", no_ack=True)
    assert bodies(c.publish("amq.match", "", b"yes", headers={"format": "pdf", "type": "report"})) == [b"yes"]
    assert bodies(c.publish("amq.match", "", b"no", headers={"format": "pdf"})) == []


def test_queue_message_ttl_argument() -> None:
    c = connected()
    c.declare("ttl", arguments={"x-message-ttl": 100})
    c.publish("", "ttl")
    c.broker.tick(150)
    assert of_type(c.declare("ttl", passive=True), m.QueueDeclareOk)[0].message_count == 0


def test_next_deadline_reports_ttl_and_expires() -> None:
    c = connected()
    assert c.broker.next_deadline_ms() is None
    c.declare("e", arguments={"x-expires": 5000})
    assert c.broker.next_deadline_ms() == 5000
    c.declare("ttl", arguments={"x-message-ttl": 100})
    c.publish("", "ttl")
    assert c.broker.next_deadline_ms() == 100


def test_quorum_queue_type_accepted_as_classic() -> None:
    c = connected()
    assert of_type(c.declare("qq", durable=True, arguments={"x-queue-type": "quorum"}), m.QueueDeclareOk)
