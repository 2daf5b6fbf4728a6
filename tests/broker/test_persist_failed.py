"""`Broker.on_persist_failed`: a definition change that can never be made durable (cluster mode: the metadata
group refused it or did not commit it in time) closes the waiting channel with the given error; its held ok, and
anything else it held, never leaves (node/broker/reply_gate.py)."""

from __future__ import annotations

from node.amqp import methods as m
from node.broker.effects import CloseChannel, Effect
from tests.broker.harness import Client, connected, deliveries, methods, new_broker, of_type, persists


def durable_client() -> Client:
    return connected(new_broker(durable_replies=True))


def token_of(effects: list[Effect]) -> int:
    [persist] = persists(effects)
    return persist.token


def closes(effects: list[Effect]) -> list[CloseChannel]:
    return [e for e in effects if isinstance(e, CloseChannel)]


def test_failed_declare_closes_the_channel_instead_of_answering_ok() -> None:
    c = durable_client()
    token = token_of(c.declare("dq", durable=True))
    failed = c.broker.on_persist_failed(token, 541, "INTERNAL_ERROR - not committed")
    assert of_type(failed, m.QueueDeclareOk) == []
    assert closes(failed) == [CloseChannel(1, 1, 541, "INTERNAL_ERROR - not committed", 50, 10)]
    assert 1 not in c.broker.conns[1].channels and not c.broker.held and not c.broker.held_gates
    assert methods(c.broker.on_persisted(token)) == []  # a late success report finds nothing


def test_later_replies_of_the_failed_channel_are_dropped_too() -> None:
    c = durable_client()
    effects = c.declare("dq", durable=True)
    effects += c.call(m.BasicQos(prefetch_count=1))  # held behind the declare
    failed = c.broker.on_persist_failed(token_of(effects), 404, "NOT_FOUND - no vhost")
    assert methods(failed) == [] and [e.reply_code for e in closes(failed)] == [404]


def test_other_channels_are_unaffected() -> None:
    c = durable_client()
    c.open(2)
    failing = token_of(c.declare("one", durable=True))
    succeeding = token_of(c.declare("two", durable=True, channel=2))
    failed = c.broker.on_persist_failed(failing, 541, "x")
    assert [(e.channel, e.reply_code) for e in closes(failed)] == [(1, 541)]
    assert of_type(failed, m.QueueDeclareOk) == []
    released = c.broker.on_persisted(succeeding)
    assert [e.channel for e in released if isinstance(e, CloseChannel)] == []
    assert len(of_type(released, m.QueueDeclareOk)) == 1


def test_held_deliveries_go_back_to_the_queue() -> None:
    c = durable_client()
    for p in persists(c.declare("dq", durable=True)):
        c.broker.on_persisted(p.token)
    c.consume("dq", tag="t")
    token = token_of(c.declare("other", durable=True))
    publisher = connected(c.broker, conn_id=2)
    assert deliveries(publisher.publish("", "dq", b"m")) == []  # held behind the declare
    failed = c.broker.on_persist_failed(token, 541, "x")
    assert deliveries(failed) == [] and len(closes(failed)) == 1
    publisher.open(2)
    got = publisher.consume("dq", tag="u", channel=2)
    assert [d.body for d in deliveries(got)] == [b"m"]  # requeued by the channel's close, delivered again
