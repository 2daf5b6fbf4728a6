"""Persistence records: cbor round trip, streams, and Broker.recover rebuilding definitions and messages."""

from __future__ import annotations

import cbor2

from node.amqp import methods as m
from node.broker.auth import Permission
from node.broker.broker import Broker
from node.broker.records import DEFINITIONS_STREAM, MessageRecord, Record, from_cbor, queue_stream, to_cbor
from tests.broker.harness import Client, connected, deliveries, of_type, persists


def _all_records(effect_lists: list[list[object]]) -> list[Record]:
    out: list[Record] = []
    for effects in effect_lists:
        for p in persists(effects):  # type: ignore[arg-type]
            out.extend(p.records)
    return out


def test_records_round_trip_through_cbor_and_name_streams() -> None:
    c = connected()
    log = [
        c.call(m.ExchangeDeclare(exchange="dx", type="topic", durable=True, arguments={"alternate-exchange": "ae"})),
        c.declare("dq", durable=True, arguments={"x-max-length": 5}),
        c.bind("dq", "dx", "a.#"),
        c.publish("dx", "a.b", b"body", delivery_mode=2, headers={"h": [1, "x"]}, content_type="text/plain"),
    ]
    records = _all_records(log)
    assert records
    for record in records:
        assert from_cbor(cbor2.loads(cbor2.dumps(to_cbor(record)))) == record
    streams = {r.stream for r in records}
    assert streams == {DEFINITIONS_STREAM, queue_stream("/", "dq")}


def test_recover_rebuilds_definitions_and_messages() -> None:
    c = connected()
    broker = c.broker
    broker.add_user("bob", "pw", ("monitoring",))
    broker.set_permissions("bob", "/", Permission("^b", ".*", ".*"))
    boot = [p for p in broker.take_effects()]
    log = [
        boot,
        c.call(m.ExchangeDeclare(exchange="dx", type="direct", durable=True)),
        c.declare("dq", durable=True),
        c.declare("transient"),
        c.bind("dq", "dx", "k"),
        c.bind("transient", "dx", "k"),
        c.publish("dx", "k", b"keep", delivery_mode=2),
        c.publish("dx", "k", b"acked", delivery_mode=2),
        c.publish("dx", "k", b"transient-msg", delivery_mode=1),
    ]
    c.consume("dq", "t")
    log.append(c.ack(2))  # "acked" was delivery tag 2 on dq
    records = _all_records(log)
    restarted = Broker()
    restarted.recover(records)
    assert "bob" in restarted.users.users
    assert restarted.users.allowed("bob", "/", "configure", "bq")
    vhost = restarted.vhosts["/"]
    assert "dx" in vhost.exchanges and "dq" in vhost.queues and "transient" not in vhost.queues
    assert vhost.route("dx", "k", None) == ("dq",)
    c2 = Client(restarted)
    c2.open(1)
    assert of_type(c2.declare("dq", passive=True), m.QueueDeclareOk)[0].message_count == 1
    [d] = deliveries(c2.consume("dq", "t"))
    assert d.body == b"keep" and d.method.redelivered
    assert c2.broker.vhosts["/"].queues["dq"].persisted_ids == {1}


def test_deleted_queue_messages_not_recovered() -> None:
    c = connected()
    log = [c.declare("dq", durable=True), c.publish("", "dq", delivery_mode=2), c.call(m.QueueDelete(queue="dq"))]
    restarted = Broker()
    restarted.recover(_all_records(log))
    assert "dq" not in restarted.vhosts["/"].queues


def test_message_record_fields() -> None:
    c = connected()
    [p] = persists(c.declare("dq", durable=True))
    effects = c.publish("", "dq", b"x", delivery_mode=2, priority=3)
    [record] = persists(effects)[0].records
    assert isinstance(record, MessageRecord)
    assert record.properties == {"delivery_mode": 2, "priority": 3}
    assert p.records[0].stream == DEFINITIONS_STREAM


def test_recreated_queue_does_not_resurrect_old_messages_when_streams_replay_apart() -> None:
    c = connected()
    log = [c.declare("dq", durable=True), c.publish("", "dq", b"old", delivery_mode=2),
           c.publish("", "dq", b"old2", delivery_mode=2), c.call(m.QueueDelete(queue="dq")), c.declare("dq", durable=True),
           c.publish("", "dq", b"new", delivery_mode=2)]
    records = _all_records(log)
    definitions = [r for r in records if r.stream == DEFINITIONS_STREAM]
    queue_records = [r for r in records if r.stream != DEFINITIONS_STREAM]
    restarted = Broker()
    restarted.recover(definitions + queue_records)
    c2 = Client(restarted)
    c2.open(1)
    assert [d.body for d in deliveries(c2.consume("dq", "t", no_ack=True))] == [b"new"]


def test_hand_written_to_cbor_matches_field_order_for_every_record_type() -> None:
    import dataclasses

    from node.broker import records as r

    samples: list[Record] = [
        r.VHostRecord("v", True), r.UserRecord("u", "h", ("a", "b")), r.PermissionRecord("u", "v", "c", "w", "r"),
        r.ExchangeRecord("v", "x", "topic", True, False, {"alternate-exchange": "ae"}),
        r.QueueRecord("v", "q", False, {"x-max-length": 1}, True),
        r.BindingRecord("v", "x", "queue", "q", "k", {"a": [1]}), MessageRecord("v", "q", 3, "x", "k", {}, b"b", 2),
        r.MessageRemovedRecord("v", "q", 3),
    ]
    for record in samples:
        fields = [list(v) if isinstance(v, tuple) else v for v in dataclasses.astuple(record)]
        encoded = to_cbor(record)
        assert encoded[1:] == fields
        assert from_cbor(cbor2.loads(cbor2.dumps(encoded))) == record
    assert {to_cbor(s)[0] for s in samples} == {"vhost", "user", "perm", "exchange", "queue", "binding", "msg",
                                                "msg-removed"}
