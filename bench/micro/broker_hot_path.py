"""Micro benchmark of the broker model's hot path, in process: publish -> route -> enqueue -> deliver -> ack.

Drives `Broker.handle` with node.amqp events (no sockets, no codec) and prints messages per second for a few
shapes: publish only into a queue, publish with a consumer and per-message acks (prefetch 100), the same with
publisher confirms, a topic exchange with 100 bindings, and persistent messages to a durable queue with confirms
released by `on_persisted`. Usage: .venv/bin/python -m bench.micro.broker_hot_path [n_messages]

Times are CPU seconds of this process (`time.process_time`), not wall-clock: the shared 2-core machine is loaded,
and wall time then measures the other tenants more than the broker.
"""

from __future__ import annotations

import sys
import time

from node.amqp import events as ev
from node.amqp import methods as m
from node.amqp.properties import BasicProperties
from node.broker.broker import Broker
from node.broker.effects import Persist, Send, SendContent


def _broker() -> Broker:
    broker = Broker()
    broker.open_connection(1, "127.0.0.1", True)
    broker.handle(1, ev.ConnectionOpened("/", "guest", {}), 0)
    broker.handle(1, ev.ChannelOpened(1), 0)
    broker.handle(1, ev.ChannelOpened(2), 0)
    return broker


def _call(broker: Broker, method: object, channel: int = 1) -> list[object]:
    """One method, with what it wrote made durable at once (a durable queue's declare-ok, and every reply after it
    on the connection, waits for its Persist)."""
    effects: list[object] = list(broker.handle(1, ev.MethodReceived(channel, method), 0))  # type: ignore[arg-type]
    for effect in list(effects):
        if type(effect) is Persist:
            effects.extend(broker.on_persisted(effect.token))
    return effects


def _rate(label: str, n: int, seconds: float) -> None:
    print(f"{label:<46} {n / seconds:>12,.0f} msg/s")


def publish_only(n: int) -> None:
    broker = _broker()
    _call(broker, m.QueueDeclare(queue="q"))
    event = ev.ContentReceived(1, m.BasicPublish(exchange="", routing_key="q"), BasicProperties(), b"x" * 100)
    start = time.process_time()
    for _ in range(n):
        broker.handle(1, event, 0)
    _rate("publish only (default exchange)", n, time.process_time() - start)


def publish_consume_ack(n: int, confirm: bool, exchange: str = "", routing_key: str = "q") -> float:
    broker = _broker()
    _call(broker, m.QueueDeclare(queue="q"))
    if exchange == "amq.topic":
        for i in range(100):
            if i:
                _call(broker, m.QueueDeclare(queue=f"q{i}"))
            _call(broker, m.QueueBind(queue="q" if i == 0 else f"q{i}", exchange="amq.topic",
                                      routing_key="a.*.c" if i == 0 else f"x{i}.#"))
    if confirm:
        _call(broker, m.ConfirmSelect())
    _call(broker, m.BasicQos(prefetch_count=100), 2)
    _call(broker, m.BasicConsume(queue="q", consumer_tag="c"), 2)
    event = ev.ContentReceived(1, m.BasicPublish(exchange=exchange, routing_key=routing_key), BasicProperties(),
                               b"x" * 100)
    delivered = 0
    start = time.process_time()
    for _ in range(n):
        for effect in broker.handle(1, event, 0):
            if type(effect) is SendContent and effect.channel == 2:
                delivered += 1
                broker.handle(1, ev.MethodReceived(2, m.BasicAck(delivery_tag=effect.method.delivery_tag)), 0)
    seconds = time.process_time() - start
    assert delivered == n, (delivered, n)
    return seconds


def persistent_confirms(n: int) -> None:
    broker = _broker()
    _call(broker, m.QueueDeclare(queue="dq", durable=True))
    _call(broker, m.ConfirmSelect())
    event = ev.ContentReceived(1, m.BasicPublish(exchange="", routing_key="dq"), BasicProperties(delivery_mode=2),
                               b"x" * 100)
    acks = 0
    start = time.process_time()
    for _ in range(n):
        for effect in broker.handle(1, event, 0):
            if type(effect) is Persist:
                for reply in broker.on_persisted(effect.token):
                    if type(reply) is Send and type(reply.method) is m.BasicAck:
                        acks = reply.method.delivery_tag if reply.method.multiple else acks + 1
    seconds = time.process_time() - start
    assert acks == n, (acks, n)
    _rate("persistent publish + confirm (durable queue)", n, seconds)


def persistent_confirms_batched(n: int, per_read: int = 64) -> None:
    """As the runtime can drive it: one read's publishes through `handle_many` (one Persist for them all) and the
    commit's tokens through `on_persisted_many` (one multiple ack)."""
    broker = _broker()
    _call(broker, m.QueueDeclare(queue="dq", durable=True))
    _call(broker, m.ConfirmSelect())
    events = [ev.ContentReceived(1, m.BasicPublish(exchange="", routing_key="dq"), BasicProperties(delivery_mode=2),
                                 b"x" * 100)] * per_read
    confirmed = 0
    start = time.process_time()
    for _ in range(n // per_read):
        tokens = [e.token for e in broker.handle_many(1, events, 0) if type(e) is Persist]
        for effect in broker.on_persisted_many(tokens):
            confirmed = effect.method.delivery_tag  # type: ignore[union-attr]
    seconds = time.process_time() - start
    assert confirmed == n // per_read * per_read
    _rate(f"persistent, {per_read} per read (handle_many) + confirm", confirmed, seconds)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 50_000
    publish_only(n)
    _rate("publish + deliver + ack", n, publish_consume_ack(n, False))
    _rate("publish + confirm + deliver + ack", n, publish_consume_ack(n, True))
    _rate("topic (100 bindings) + deliver + ack", n, publish_consume_ack(n, False, "amq.topic", "a.b.c"))
    persistent_confirms(n)
    if hasattr(Broker, "handle_many"):
        persistent_confirms_batched(n)


if __name__ == "__main__":
    main()
