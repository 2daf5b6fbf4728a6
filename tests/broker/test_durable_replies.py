"""Single node: a reply to a method that changed durable definitions leaves only after `on_persisted` for the
records that method wrote (node/broker/reply_gate.py); the channel's later effects wait behind it, in order, while
other channels, publishes, acks and confirms are unaffected."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from node.amqp import methods as m
from node.broker.effects import Effect, Send
from tests.broker.harness import Client, connected, deliveries, methods, new_broker, of_type, persists


def durable_client() -> Client:
    return connected(new_broker(durable_replies=True))


def settle(c: Client, effects: list[Effect]) -> list[Effect]:
    """Report every Persist of `effects` durable; the effects that releases."""
    out: list[Effect] = []
    for p in persists(effects):
        out += c.broker.on_persisted(p.token)
    return out


def setup(c: Client) -> None:
    settle(c, c.call(m.ExchangeDeclare(exchange="dx", type="direct", durable=True)))
    settle(c, c.call(m.ExchangeDeclare(exchange="dx2", type="fanout", durable=True)))
    settle(c, c.declare("dq", durable=True))


def purge_with_messages(c: Client) -> list[Effect]:
    settle(c, c.publish("", "dq", b"1", delivery_mode=2))
    return c.call(m.QueuePurge(queue="dq"))


def tx_commit_with_ack(c: Client) -> list[Effect]:
    settle(c, c.publish("", "dq", b"1", delivery_mode=2))
    settle(c, c.call(m.TxSelect()))
    [ok] = of_type(c.call(m.BasicGet(queue="dq")), m.BasicGetOk)
    c.call(m.BasicAck(delivery_tag=ok.delivery_tag))
    return c.call(m.TxCommit())


CASES: dict[str, tuple[Callable[[Client], list[Effect]], type]] = {
    "queue.declare": (lambda c: c.declare("new", durable=True), m.QueueDeclareOk),
    "queue.delete": (lambda c: c.call(m.QueueDelete(queue="dq")), m.QueueDeleteOk),
    "queue.bind": (lambda c: c.bind("dq", "dx", "k"), m.QueueBindOk),
    "queue.unbind": (lambda c: (settle(c, c.bind("dq", "dx", "k")),
                                c.call(m.QueueUnbind(queue="dq", exchange="dx", routing_key="k")))[1],
                     m.QueueUnbindOk),
    "queue.purge": (purge_with_messages, m.QueuePurgeOk),
    "exchange.declare": (lambda c: c.call(m.ExchangeDeclare(exchange="nx", type="topic", durable=True)),
                         m.ExchangeDeclareOk),
    "exchange.delete": (lambda c: c.call(m.ExchangeDelete(exchange="dx")), m.ExchangeDeleteOk),
    "exchange.bind": (lambda c: c.call(m.ExchangeBind(destination="dx2", source="dx", routing_key="k")),
                      m.ExchangeBindOk),
    "exchange.unbind": (lambda c: (settle(c, c.call(m.ExchangeBind(destination="dx2", source="dx", routing_key="k"))),
                                   c.call(m.ExchangeUnbind(destination="dx2", source="dx", routing_key="k")))[1],
                        m.ExchangeUnbindOk),
    "tx.commit": (tx_commit_with_ack, m.TxCommitOk),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_reply_waits_for_its_records(name: str) -> None:
    c = durable_client()
    setup(c)
    act, reply = CASES[name]
    effects = act(c)
    assert persists(effects) and all(p.records for p in persists(effects))
    assert of_type(effects, reply) == []
    released = settle(c, effects)
    assert len(of_type(released, reply)) == 1


def test_without_records_no_wait() -> None:
    c = durable_client()
    setup(c)
    assert len(of_type(c.declare("dq", durable=True), m.QueueDeclareOk)) == 1  # exists already: nothing written
    assert len(of_type(c.declare("tmp"), m.QueueDeclareOk)) == 1  # transient
    assert len(of_type(c.call(m.QueueDelete(queue="missing")), m.QueueDeleteOk)) == 1
    assert len(of_type(c.call(m.ExchangeDeclare(exchange="tx", type="direct")), m.ExchangeDeclareOk)) == 1


def test_later_replies_of_the_channel_wait_in_order_other_channels_do_not() -> None:
    c = durable_client()
    c.open(2)
    effects = c.declare("dq", durable=True)
    effects += c.call(m.BasicQos(prefetch_count=5))
    effects += c.call(m.QueueDeclare(queue="dq", passive=True))
    other = c.call(m.BasicQos(prefetch_count=5), channel=2)
    assert methods(effects) == []
    assert len(of_type(other, m.BasicQosOk)) == 1
    released = settle(c, effects)
    assert [type(x) for x in methods(released)] == [m.QueueDeclareOk, m.BasicQosOk, m.QueueDeclareOk]
    assert len(of_type(c.call(m.BasicQos(prefetch_count=1)), m.BasicQosOk)) == 1  # released: no longer held


def test_an_error_after_a_waiting_reply_waits_behind_it() -> None:
    c = durable_client()
    effects = c.declare("dq", durable=True)
    effects += c.declare("dq", durable=False)  # inequivalent: channel close
    assert methods(effects) == [] and not [e for e in effects if type(e).__name__ == "CloseChannel"]
    released = settle(c, effects)
    assert [type(e).__name__ for e in released if type(e).__name__ in ("Send", "CloseChannel")] == [
        "Send", "CloseChannel"]


def test_publishes_acks_and_confirms_do_not_wait() -> None:
    c = durable_client()
    setup(c)
    c.call(m.ConfirmSelect())
    publisher = c.publish("", "dq", b"p", delivery_mode=2)
    assert of_type(publisher, m.BasicAck) == []  # a confirm waits for its own token, as before
    assert len(of_type(settle(c, publisher), m.BasicAck)) == 1
    c.open(2)
    consumed = c.consume("dq", tag="t", channel=2)
    assert len(of_type(consumed, m.BasicConsumeOk)) == 1 and len(deliveries(consumed)) == 1
    acked = c.ack(deliveries(consumed)[0].method.delivery_tag, channel=2)
    assert persists(acked)  # the removal is written, and nothing is held behind it
    assert not c.broker.held
    again = c.publish("", "dq", b"q", delivery_mode=2)
    assert len(deliveries(again)) == 1  # delivered at once to channel 2


def test_deliveries_to_a_waiting_channel_follow_its_reply() -> None:
    c = durable_client()
    setup(c)
    c.consume("dq", tag="t")
    publisher = connected(c.broker, conn_id=2)
    effects = c.declare("other", durable=True)
    delivered = publisher.publish("", "dq", b"m")
    assert deliveries(delivered) == []
    released = settle(c, effects)
    kinds = [type(x) for x in methods(released)]
    assert kinds == [m.QueueDeclareOk, m.BasicDeliver]


def test_client_closing_the_channel_drops_what_waits() -> None:
    c = durable_client()
    effects = c.declare("dq", durable=True)
    c.close_channel(1)
    c.open(1)
    assert methods(settle(c, effects)) == []  # the old channel's reply never reaches the new one
    assert not c.broker.held


def test_connection_gone_drops_what_waits() -> None:
    c = durable_client()
    effects = c.declare("dq", durable=True)
    c.close()
    assert not c.broker.held
    assert [e for e in settle(c, effects) if isinstance(e, Send)] == []


def test_on_persisted_many_releases_before_confirms() -> None:
    c = durable_client()
    c.call(m.ConfirmSelect())
    effects: list[Any] = c.declare("dq", durable=True)
    effects += c.publish("", "dq", b"1", delivery_mode=2)
    tokens = [p.token for p in persists(effects)]
    released = c.broker.on_persisted_many(tokens)
    assert [type(x) for x in methods(released)] == [m.QueueDeclareOk, m.BasicAck]
