"""Dead lettering: x-death headers, routing keys, expiration removal, cycle detection, overflow."""

from __future__ import annotations

import datetime

from node.amqp import methods as m
from tests.broker.harness import Client, connected, deliveries


def _dlx_setup(**queue_args: object) -> Client:
    c = connected()
    c.call(m.ExchangeDeclare(exchange="dlx", type="fanout"))
    c.declare("dead")
    c.bind("dead", "dlx")
    args = {"x-dead-letter-exchange": "dlx", **queue_args}
    c.declare("work", arguments=args)
    c.consume("dead", "dl", no_ack=True)
    return c


def test_rejected_message_gets_x_death() -> None:
    c = _dlx_setup()
    c.now_ms = 5000
    c.publish("", "work", b"job", expiration="60000")
    c.consume("work", "w")
    effects = c.call(m.BasicReject(delivery_tag=1, requeue=False))
    [dead] = [d for d in deliveries(effects) if d.method.consumer_tag == "dl"]
    headers = dead.properties.headers
    [death] = headers["x-death"]
    assert death == {
        "count": 1, "reason": "rejected", "queue": "work",
        "time": datetime.datetime.fromtimestamp(5, tz=datetime.UTC),
        "exchange": "", "routing-keys": ["work"], "original-expiration": "60000",
    }
    assert headers["x-first-death-reason"] == "rejected"
    assert headers["x-first-death-queue"] == "work"
    assert headers["x-first-death-exchange"] == ""
    assert dead.properties.expiration is None
    assert (dead.method.exchange, dead.method.routing_key) == ("dlx", "work")


def test_dead_letter_routing_key_override() -> None:
    c = connected()
    c.declare("target")
    c.declare("work", arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "target"})
    c.publish("", "work", b"late", expiration="10")
    c.broker.tick(100)
    got = c.call(m.BasicGet(queue="target", no_ack=True))
    [ok] = [e for e in got if isinstance(e.method, m.BasicGetOk)]
    assert ok.body == b"late" and ok.method.routing_key == "target"
    assert ok.properties.headers["x-death"][0]["reason"] == "expired"


def test_expired_and_maxlen_reasons() -> None:
    c = _dlx_setup(**{"x-max-length": 1})
    c.publish("", "work", b"first")
    effects = c.publish("", "work", b"second")
    [dead] = deliveries(effects)
    assert dead.body == b"first" and dead.properties.headers["x-death"][0]["reason"] == "maxlen"
    c2 = _dlx_setup(**{"x-message-ttl": 50})
    c2.publish("", "work", b"old")
    [dead] = deliveries(c2.broker.tick(100))
    assert dead.properties.headers["x-death"][0]["reason"] == "expired"


def test_cycle_is_dropped_but_rejections_may_loop() -> None:
    c = connected()
    # q1 dead-letters into q2, q2 dead-letters back into q1 (via the default exchange).
    c.declare("q1", arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "q2",
                               "x-message-ttl": 10})
    c.declare("q2", arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "q1",
                               "x-message-ttl": 10})
    c.publish("", "q1", b"loop")
    c.broker.tick(20)   # q1 -> q2
    c.broker.tick(40)   # q2 -> q1 would be a cycle of expiries: dropped
    queues = c.broker.vhosts["/"].queues
    assert queues["q1"].machine.ready_count == 0 and queues["q2"].machine.ready_count == 0


def test_repeated_death_increments_count() -> None:
    c = connected()
    c.declare("retry", arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "retry"})
    c.publish("", "retry", b"r")
    c.consume("retry", "t")
    d1 = deliveries(c.call(m.BasicReject(delivery_tag=1, requeue=False)))
    assert d1[0].properties.headers["x-death"][0]["count"] == 1
    d2 = deliveries(c.call(m.BasicReject(delivery_tag=d1[0].method.delivery_tag, requeue=False)))
    deaths = d2[0].properties.headers["x-death"]
    assert len(deaths) == 1 and deaths[0]["count"] == 2


def test_missing_dlx_drops() -> None:
    c = connected()
    c.declare("work", arguments={"x-dead-letter-exchange": "gone"})
    c.publish("", "work")
    c.consume("work", "t")
    assert deliveries(c.call(m.BasicReject(delivery_tag=1, requeue=False))) == []
