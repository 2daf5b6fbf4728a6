"""Publishing: mandatory/immediate, checks, confirms (with persistence), tx, direct reply-to, alarms."""

from __future__ import annotations

from node.amqp import methods as m
from node.broker.effects import Block, Unblock
from node.broker.records import MessageRecord, MessageRemovedRecord
from tests.broker.harness import (
    bodies,
    channel_close,
    connected,
    connection_close,
    deliveries,
    of_type,
    persists,
)


def test_mandatory_unroutable_returns_312() -> None:
    c = connected()
    effects = c.publish("amq.direct", "nowhere", b"b", mandatory=True)
    ret = of_type(effects, m.BasicReturn)[0]
    assert (ret.reply_code, ret.reply_text, ret.exchange, ret.routing_key) == (312, "NO_ROUTE", "amq.direct",
                                                                             "nowhere")
    assert c.publish("amq.direct", "nowhere") == []


def test_immediate_is_not_implemented() -> None:
    c = connected()
    assert connection_close(c.publish("", "q", immediate=True)) == (540, "NOT_IMPLEMENTED - immediate=true")


def test_publish_to_missing_exchange() -> None:
    c = connected()
    assert channel_close(c.publish("nope", "k")) == (404, "NOT_FOUND - no exchange 'nope' in vhost '/'")


def test_user_id_must_match() -> None:
    c = connected()
    assert channel_close(c.publish("", "q", user_id="mallory")) == (
        406, "PRECONDITION_FAILED - user_id property set to 'mallory' but authenticated user was 'guest'")


def test_bad_expiration() -> None:
    c = connected()
    assert channel_close(c.publish("", "q", expiration="soon")) == (
        406, "PRECONDITION_FAILED - invalid expiration 'soon': no_integer")
    c.open(1)
    assert channel_close(c.publish("", "q", expiration="-5"))[1].endswith("{value_negative,-5}")


def test_per_message_ttl_expires_on_tick() -> None:
    c = connected()
    c.declare("q")
    c.publish("", "q", expiration="100")
    c.broker.tick(200)
    assert of_type(c.declare("q", passive=True), m.QueueDeclareOk)[0].message_count == 0


def test_confirms_transient_ack_immediately_and_coalesce() -> None:
    c = connected()
    assert of_type(c.call(m.ConfirmSelect()), m.ConfirmSelectOk)
    c.declare("q")
    acks = of_type(c.publish("", "q"), m.BasicAck)
    assert [(a.delivery_tag, a.multiple) for a in acks] == [(1, False)]
    acks = of_type(c.publish("", "unroutable", mandatory=True), m.BasicAck)
    assert [(a.delivery_tag, a.multiple) for a in acks] == [(2, False)]


def test_confirm_waits_for_persist_of_persistent_message_in_durable_queue() -> None:
    c = connected()
    c.call(m.ConfirmSelect())
    c.declare("dq", durable=True)
    effects = c.publish("", "dq", b"p1", delivery_mode=2)
    assert of_type(effects, m.BasicAck) == []
    [persist] = persists(effects)
    [record] = persist.records
    assert isinstance(record, MessageRecord) and record.body == b"p1" and record.queue == "dq"
    effects2 = c.publish("", "dq", b"p2", delivery_mode=2)
    token2 = persists(effects2)[0].token
    assert of_type(c.broker.on_persisted(token2), m.BasicAck)[0].delivery_tag == 2
    acks = of_type(c.broker.on_persisted(persist.token), m.BasicAck)
    assert [(a.delivery_tag, a.multiple) for a in acks] == [(1, False)]


def test_persistent_message_to_transient_queue_not_persisted() -> None:
    c = connected()
    c.call(m.ConfirmSelect())
    c.declare("q")
    effects = c.publish("", "q", delivery_mode=2)
    assert persists(effects) == [] and of_type(effects, m.BasicAck)


def test_ack_of_persisted_message_writes_removal() -> None:
    c = connected()
    c.declare("dq", durable=True)
    c.publish("", "dq", delivery_mode=2)
    c.consume("dq", "t")
    records = [r for p in persists(c.ack(1)) for r in p.records]
    assert records == [MessageRemovedRecord("/", "dq", 1)]


def test_reject_publish_overflow_nacks() -> None:
    c = connected()
    c.call(m.ConfirmSelect())
    c.declare("q", arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    assert of_type(c.publish("", "q"), m.BasicAck)
    nacks = of_type(c.publish("", "q"), m.BasicNack)
    assert [n.delivery_tag for n in nacks] == [2]


def test_confirm_and_tx_are_exclusive() -> None:
    c = connected()
    c.call(m.ConfirmSelect())
    assert channel_close(c.call(m.TxSelect())) == (406, "PRECONDITION_FAILED - cannot switch from confirm to tx mode")
    c.open(1)
    c.call(m.TxSelect())
    assert channel_close(c.call(m.ConfirmSelect())) == (
        406, "PRECONDITION_FAILED - cannot switch from tx to confirm mode")


def test_tx_buffers_publishes_until_commit_and_rollback_discards() -> None:
    c = connected()
    c.declare("q")
    c2 = connected(c.broker, 2)
    c2.consume("q", "t", no_ack=True)
    assert of_type(c.call(m.TxSelect()), m.TxSelectOk)
    assert deliveries(c.publish("", "q", b"a")) == []
    effects = c.call(m.TxCommit())
    assert of_type(effects, m.TxCommitOk) and bodies(effects) == [b"a"]
    c.publish("", "q", b"b")
    effects = c.call(m.TxRollback())
    assert of_type(effects, m.TxRollbackOk) and bodies(effects) == []


def test_tx_acks_apply_on_commit_and_restore_on_rollback() -> None:
    c = connected()
    c.declare("q")
    c.publish("", "q")
    c.call(m.TxSelect())
    c.consume("q", "t")
    c.ack(1)
    c.call(m.TxRollback())
    c.ack(1)
    c.call(m.TxCommit())
    c.call(m.BasicCancel(consumer_tag="t"))
    assert of_type(c.declare("q", passive=True), m.QueueDeclareOk)[0].message_count == 0


def test_tx_commit_without_select() -> None:
    c = connected()
    assert channel_close(c.call(m.TxCommit())) == (406, "PRECONDITION_FAILED - channel is not transactional")


def test_direct_reply_to_round_trip() -> None:
    broker_client = connected()
    server = connected(broker_client.broker, 2)
    server.declare("rpc")
    server.consume("rpc", "srv", no_ack=True)
    assert channel_close(broker_client.consume("amq.rabbitmq.reply-to", "r")) == (
        406, "PRECONDITION_FAILED - reply consumer cannot acknowledge")
    broker_client.open(1)
    assert channel_close(broker_client.publish("", "rpc", reply_to="amq.rabbitmq.reply-to")) == (
        406, "PRECONDITION_FAILED - fast reply consumer does not exist")
    broker_client.open(1)
    broker_client.consume("amq.rabbitmq.reply-to", "r", no_ack=True)
    request = deliveries(broker_client.publish("", "rpc", b"req", reply_to="amq.rabbitmq.reply-to"))[0]
    reply_to = request.properties.reply_to
    assert reply_to.startswith("amq.rabbitmq.reply-to.")
    reply = deliveries(server.publish("", reply_to, b"resp"))
    assert [(d.conn_id, d.body, d.method.consumer_tag) for d in reply] == [(1, b"resp", "r")]
    broker_client.close()
    assert of_type(server.publish("", reply_to, b"late", mandatory=True), m.BasicReturn)


def test_alarm_blocks_publishers_and_unblocks() -> None:
    c1 = connected()
    c2 = connected(c1.broker, 2)
    c1.publish("", "q")
    effects = c1.broker.set_alarm("memory", True)
    assert effects == [Block(1, "low on memory")]
    assert c2.publish("", "q") == [Block(2, "low on memory")]
    assert c1.broker.set_alarm("disk", True) == []
    assert c1.broker.set_alarm("memory", False) == []
    assert sorted(c1.broker.set_alarm("disk", False), key=lambda e: e.conn_id) == [Unblock(1), Unblock(2)]


def test_tx_commit_ok_waits_for_persistence_in_order() -> None:
    c = connected()
    c.declare("dq", durable=True)
    c.call(m.TxSelect())
    c.publish("", "dq", b"1", delivery_mode=2)
    first = c.call(m.TxCommit())
    assert of_type(first, m.TxCommitOk) == []
    c.publish("", "dq", b"2", delivery_mode=2)
    second = c.call(m.TxCommit())
    [t1] = [p.token for p in persists(first) if p.records and isinstance(p.records[0], MessageRecord)]
    [t2] = [p.token for p in persists(second) if p.records and isinstance(p.records[0], MessageRecord)]
    assert of_type(c.broker.on_persisted(t2), m.TxCommitOk) == []
    assert len(of_type(c.broker.on_persisted(t1), m.TxCommitOk)) == 2
    assert len(of_type(c.call(m.TxCommit()), m.TxCommitOk)) == 1


def test_mandatory_return_precedes_confirm_ack() -> None:
    c = connected()
    c.call(m.ConfirmSelect())
    kinds = [type(x) for x in c.publish("amq.direct", "nowhere", mandatory=True) if hasattr(x, "method")]
    assert kinds and [k.__name__ for k in kinds] == ["SendContent", "Send"]
    effects = c.publish("amq.direct", "nowhere", mandatory=True)
    assert isinstance(effects[0].method, m.BasicReturn) and isinstance(effects[1].method, m.BasicAck)


def test_confirm_ack_multiple_for_contiguous_batch() -> None:
    from node.broker import publish
    from node.broker.channel import ChannelState

    c = connected()
    ch = ChannelState(1, 1, 99, confirm=True, next_publish_seq=4)
    publish.confirm_ready(c.broker, ch, (1, 2, 3), ())
    assert [(a.delivery_tag, a.multiple) for a in of_type(c.broker.take_effects(), m.BasicAck)] == [(3, True)]


def test_one_persist_per_entry_point_and_confirm_after_it() -> None:
    c = connected()
    c.call(m.ConfirmSelect())
    c.declare("d1", durable=True)
    c.declare("d2", durable=True)
    c.call(m.ExchangeDeclare(exchange="fx", type="fanout", durable=True))
    c.bind("d1", "fx")
    c.bind("d2", "fx")
    effects = c.publish("fx", "", b"p", delivery_mode=2)
    [persist] = persists(effects)
    assert [(r.queue, r.msg_id) for r in persist.records] == [("d1", 1), ("d2", 1)]  # type: ignore[union-attr]
    acks = of_type(c.broker.on_persisted(persist.token), m.BasicAck)
    assert [(a.delivery_tag, a.multiple) for a in acks] == [(1, False)]


def test_handle_many_batches_one_reads_persists_and_confirms() -> None:
    from node.amqp import events as ev
    from node.amqp.properties import BasicProperties

    c = connected()
    c.call(m.ConfirmSelect())
    c.declare("dq", durable=True)
    publish = ev.ContentReceived(1, m.BasicPublish(exchange="", routing_key="dq"), BasicProperties(delivery_mode=2),
                                 b"p")
    effects = c.broker.handle_many(1, [publish] * 5, 0)
    [persist] = persists(effects)
    assert [r.msg_id for r in persist.records] == [1, 2, 3, 4, 5]  # type: ignore[union-attr]
    assert of_type(effects, m.BasicAck) == []
    acks = of_type(c.broker.on_persisted(persist.token), m.BasicAck)
    assert [(a.delivery_tag, a.multiple) for a in acks] == [(5, True)]


def test_handle_many_has_the_effects_of_handle_one_by_one() -> None:
    from node.amqp import events as ev
    from node.amqp.properties import BasicProperties

    def script() -> list[object]:
        body = BasicProperties()
        return [
            ev.MethodReceived(1, m.QueueDeclare(queue="q")), ev.MethodReceived(1, m.ConfirmSelect()),
            ev.MethodReceived(1, m.BasicConsume(queue="q", consumer_tag="a")),
            ev.ContentReceived(1, m.BasicPublish(exchange="", routing_key="q"), body, b"1"),
            ev.MethodReceived(1, m.BasicAck(delivery_tag=1)),
            ev.ContentReceived(1, m.BasicPublish(exchange="nope", routing_key="q"), body, b"2"),
            ev.ContentReceived(1, m.BasicPublish(exchange="", routing_key="q"), body, b"3"),
        ]

    one = connected()
    one_by_one = [e for event in script() for e in one.handle(event)]
    many = connected()
    assert many.broker.handle_many(1, script(), 0) == one_by_one


def test_on_persisted_many_confirms_a_commit_with_one_multiple_ack() -> None:
    c = connected()
    c.call(m.ConfirmSelect())
    c.declare("dq", durable=True)
    tokens = [persists(c.publish("", "dq", delivery_mode=2))[0].token for _ in range(4)]
    acks = of_type(c.broker.on_persisted_many(tokens[1:]), m.BasicAck)
    assert [(a.delivery_tag, a.multiple) for a in acks] == [(2, False), (3, False), (4, False)]
    acks = of_type(c.broker.on_persisted_many([tokens[0]]), m.BasicAck)
    assert [(a.delivery_tag, a.multiple) for a in acks] == [(1, False)]
    more = [persists(c.publish("", "dq", delivery_mode=2))[0].token for _ in range(3)]
    acks = of_type(c.broker.on_persisted_many(more), m.BasicAck)
    assert [(a.delivery_tag, a.multiple) for a in acks] == [(7, True)]


def test_confirm_batch_coalesces_the_run_up_to_the_floor_then_acks_the_rest() -> None:
    from node.broker import publish
    from node.broker.channel import ChannelState

    c = connected()
    ch = ChannelState(1, 1, 99, confirm=True, next_publish_seq=8, confirm_waiting={4: 1})
    publish.confirm_ready(c.broker, ch, (1, 2, 3, 6, 7), ())
    acks = of_type(c.broker.take_effects(), m.BasicAck)
    assert [(a.delivery_tag, a.multiple) for a in acks] == [(3, True), (6, False), (7, False)]
    assert ch.confirm_floor == 3
