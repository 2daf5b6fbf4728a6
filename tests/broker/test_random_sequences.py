"""Random sequences of channel events never crash the broker and keep its bookkeeping consistent.

Every input must end in effects (replies, deliveries or an AMQP close); no exception escapes `handle`. After each
run, closing every connection leaves no consumers, no getters and no exclusive queues behind, and every message is
either ready in its queue or gone.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from node.amqp import events as ev
from node.amqp import methods as m
from node.amqp.properties import BasicProperties
from node.broker.broker import Broker

_queues = st.sampled_from(["q1", "q2", "", "amq.rabbitmq.reply-to", "dl"])
_exchanges = st.sampled_from(["", "amq.direct", "amq.topic", "amq.fanout", "x", "dlx", "nope"])
_keys = st.sampled_from(["q1", "q2", "a.b", "#", "k", "amq.rabbitmq.reply-to.zzz"])
_tags = st.integers(min_value=0, max_value=6)
_channels = st.integers(min_value=1, max_value=2)

_methods = st.one_of(
    st.builds(m.QueueDeclare, queue=_queues, durable=st.booleans(), exclusive=st.booleans(),
              auto_delete=st.booleans(), passive=st.booleans(),
              arguments=st.sampled_from([{}, {"x-max-length": 2}, {"x-dead-letter-exchange": "dlx"},
                                         {"x-message-ttl": 5}, {"x-max-length": -1}])),
    st.builds(m.ExchangeDeclare, exchange=_exchanges, type=st.sampled_from(["direct", "topic", "fanout", "headers"]),
              auto_delete=st.booleans()),
    st.builds(m.QueueBind, queue=_queues, exchange=_exchanges, routing_key=_keys),
    st.builds(m.QueueUnbind, queue=_queues, exchange=_exchanges, routing_key=_keys),
    st.builds(m.ExchangeBind, destination=_exchanges, source=_exchanges, routing_key=_keys),
    st.builds(m.QueuePurge, queue=_queues),
    st.builds(m.QueueDelete, queue=_queues, if_unused=st.booleans()),
    st.builds(m.ExchangeDelete, exchange=_exchanges),
    st.builds(m.BasicConsume, queue=_queues, consumer_tag=st.sampled_from(["", "c1", "c2"]), no_ack=st.booleans(),
              exclusive=st.booleans()),
    st.builds(m.BasicCancel, consumer_tag=st.sampled_from(["c1", "c2", "zz"])),
    st.builds(m.BasicGet, queue=_queues, no_ack=st.booleans()),
    st.builds(m.BasicAck, delivery_tag=_tags, multiple=st.booleans()),
    st.builds(m.BasicNack, delivery_tag=_tags, multiple=st.booleans(), requeue=st.booleans()),
    st.builds(m.BasicReject, delivery_tag=_tags, requeue=st.booleans()),
    st.builds(m.BasicQos, prefetch_count=st.integers(0, 3), global_=st.booleans()),
    st.builds(m.BasicRecover, requeue=st.just(True)),
    st.builds(m.ChannelFlow, active=st.booleans()),
    st.builds(m.ConfirmSelect), st.builds(m.TxSelect), st.builds(m.TxCommit), st.builds(m.TxRollback),
)

_events = st.one_of(
    st.tuples(st.just("method"), _channels, _methods),
    st.tuples(st.just("publish"), _channels, st.tuples(_exchanges, _keys, st.sampled_from([1, 2]),
                                                       st.booleans())),
    st.tuples(st.just("close_channel"), _channels, st.none()),
    st.tuples(st.just("open_channel"), _channels, st.none()),
    st.tuples(st.just("tick"), _channels, st.none()),
    st.tuples(st.just("writable"), _channels, st.booleans()),
)


def _run(broker: Broker, conn_id: int, step: tuple[str, int, Any], now_ms: int) -> None:
    kind, channel, arg = step
    if kind == "method":
        broker.handle(conn_id, ev.MethodReceived(channel, arg), now_ms)
    elif kind == "publish":
        exchange, key, mode, mandatory = arg
        props = BasicProperties(delivery_mode=mode, reply_to="amq.rabbitmq.reply-to" if key == "k" else None)
        broker.handle(conn_id, ev.ContentReceived(channel, m.BasicPublish(exchange=exchange, routing_key=key,
                                                                          mandatory=mandatory), props, b"b"), now_ms)
    elif kind == "close_channel":
        broker.handle(conn_id, ev.ChannelClosed(channel), now_ms)
    elif kind == "open_channel":
        broker.handle(conn_id, ev.ChannelOpened(channel), now_ms)
    elif kind == "tick":
        broker.tick(now_ms)
    else:
        broker.set_writable(conn_id, bool(arg))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(1, 2), _events), max_size=40))
def test_random_event_sequences(steps: list[tuple[int, tuple[str, int, Any]]]) -> None:
    broker = Broker()
    for conn_id in (1, 2):
        broker.open_connection(conn_id, "127.0.0.1", True)
        broker.handle(conn_id, ev.ConnectionOpened("/", "guest", {"capabilities": {"consumer_cancel_notify": True}}),
                      0)
        broker.handle(conn_id, ev.ChannelOpened(1), 0)
        broker.handle(conn_id, ev.ChannelOpened(2), 0)
    for i, (conn_id, step) in enumerate(steps):
        _run(broker, conn_id, step, i * 3)
    for persist_token in range(1, 400):
        broker.on_persisted(persist_token)
    for conn_id in (1, 2):
        broker.handle(conn_id, ev.ConnectionClosed(200, "bye"), 10_000)
    assert broker.consumers == {}
    assert broker.getters == {}
    assert broker.reply_tokens == {}
    for queue in broker.vhosts["/"].queues.values():
        assert queue.exclusive_owner is None
        assert queue.consumers == {}
        assert queue.machine.unacked_count == 0
        assert queue.machine.consumer_count == 0
