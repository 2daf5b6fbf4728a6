"""The owner barrier (replicated mode): an exclusive queue of another node's connection is answered for only after a
metadata read barrier, and a client's Connection.Close is answered only once its exclusive queues' deletion is
committed (node/broker/broker.py; docs/ARCHITECTURE.md, "Exclusive queues in a cluster")."""

from __future__ import annotations

from node.amqp import events as ev
from node.amqp import methods as m
from node.broker.broker import Broker, BrokerConfig
from node.broker.effects import CloseChannel, Effect, HoldCloseOk, Persist, Send, SendCloseOk
from node.broker.records import ExchangeRecord, MetadataBarrierRecord, QueueRecord
from tests.broker.harness import connected, methods

REMOTE_OWNER = "a/1/7"  # a connection of node a


def _node_b() -> Broker:
    broker = Broker(BrokerConfig(node_name="b", boot_id=2, replicated=True))
    broker.apply_records([QueueRecord("/", "reply", durable=False, exclusive_owner=REMOTE_OWNER)])
    return broker


def _barrier(effects: list[Effect]) -> int:
    (persist,) = [e for e in effects if isinstance(e, Persist)]
    assert persist.records == (MetadataBarrierRecord(),)
    return persist.token


def test_a_queue_whose_owner_left_meanwhile_is_not_found_after_the_barrier() -> None:
    broker = _node_b()
    client = connected(broker)
    effects = client.declare("reply", passive=True)
    token = _barrier(effects)
    assert methods(effects) == []  # nothing answered yet
    later = client.call(m.QueueDeclare(queue="other", passive=True))  # the channel's next method waits behind it
    assert later == []
    broker.apply_records([QueueRecord("/", "reply", deleted=True)])  # the owner's close committed before
    closes = [e for e in broker.on_persisted(token) if isinstance(e, CloseChannel)]
    assert [(c.reply_code, c.method_id) for c in closes] == [(404, m.QueueDeclare.METHOD_ID)]


def test_a_live_owner_still_locks_the_queue_after_the_barrier_and_publishes_are_not_held() -> None:
    broker = _node_b()
    publisher = connected(broker, conn_id=2)
    assert not any(isinstance(e, Persist) for e in publisher.publish("", "reply"))  # an RPC reply: never waits
    client = connected(broker)
    token = _barrier(client.consume("reply", "t"))
    closes = [e for e in broker.on_persisted(token) if isinstance(e, CloseChannel)]
    assert [c.reply_code for c in closes] == [405]


def test_close_ok_waits_for_the_deletion_of_the_connection_s_exclusive_queues() -> None:
    broker = Broker(BrokerConfig(node_name="a", boot_id=1, replicated=True))
    owner = connected(broker)
    for effect in owner.declare("mine", exclusive=True):
        if isinstance(effect, Persist):
            broker.on_persisted(effect.token)
    effects = owner.handle(ev.ConnectionClosed(200, "bye", by_client=True))
    (persist,) = [e for e in effects if isinstance(e, Persist)]
    assert QueueRecord("/", "mine", deleted=True) in persist.records
    assert [type(e) for e in effects if not isinstance(e, Persist)] == [HoldCloseOk]
    assert broker.on_persisted(persist.token) == [SendCloseOk(owner.conn_id)]
    plain = connected(broker, conn_id=2)  # without exclusive queues: answered at once
    assert [e for e in plain.handle(ev.ConnectionClosed(200, "bye", by_client=True)) if isinstance(e, Send)] == [
        Send(2, 0, m.ConnectionCloseOk())]


def test_a_queue_declared_on_another_node_meanwhile_is_found_after_the_barrier() -> None:
    broker = Broker(BrokerConfig(node_name="b", boot_id=2, replicated=True))
    client = connected(broker)
    token = _barrier(client.declare("fresh", passive=True))
    broker.apply_records([QueueRecord("/", "fresh", exclusive_owner=REMOTE_OWNER)])  # committed before the barrier
    closes = [e for e in broker.on_persisted(token) if isinstance(e, CloseChannel)]
    assert [c.reply_code for c in closes] == [405]
    missing = connected(broker, conn_id=3)
    token = _barrier(missing.declare("nowhere", passive=True))
    closes = [e for e in broker.on_persisted(token) if isinstance(e, CloseChannel)]
    assert [c.reply_code for c in closes] == [404]


def test_an_exchange_declared_on_another_node_meanwhile_is_found_after_the_barrier() -> None:
    """A passive declare of an exchange, and a bind to or from one, this node does not know yet wait for a metadata
    barrier (it may have been declared through another node a moment ago); after it the answer is the real one."""
    broker = Broker(BrokerConfig(node_name="b", boot_id=2, replicated=True))
    broker.apply_records([QueueRecord("/", "q")])
    client = connected(broker)
    token = _barrier(client.call(m.ExchangeDeclare(exchange="fresh", type="topic", passive=True)))
    later = client.bind("q", "fresh", "k")  # the channel's next method waits behind it
    assert methods(later) == []
    broker.apply_records([ExchangeRecord("/", "fresh", "topic")])  # committed before the barrier
    answered = broker.on_persisted(token)
    assert methods(answered) == [m.ExchangeDeclareOk()] and not [e for e in answered if isinstance(e, CloseChannel)]
    missing = connected(broker, conn_id=3)
    token = _barrier(missing.call(m.ExchangeBind(destination="fresh", source="nowhere")))
    closes = [e for e in broker.on_persisted(token) if isinstance(e, CloseChannel)]
    assert [(c.reply_code, c.method_id) for c in closes] == [(404, m.ExchangeBind.METHOD_ID)]
