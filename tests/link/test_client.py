"""The link client (cluster/link/client.py over node/amqp/client.py) against a real raftmq node and a real
RabbitMQ 3.10 node: handshake, confirms, consume with prefetch, ack/nack, errors, heartbeats, server-side closes.
pika checks from the other side what the link did."""

from __future__ import annotations

import uuid

import pika
import pytest
import trio

from cluster.link.client import LinkClosed, LinkConnection, open_link
from cluster.link.uri import parse_uri
from node.amqp import methods as m
from node.amqp.client import ChannelClosed, Closed, ContentIn, MethodIn
from node.amqp.properties import BasicProperties
from tests.integration.nodeproc import NodeProcess
from tests.link.conftest import Broker


def _queue() -> str:
    return f"link-{uuid.uuid4().hex[:10]}"


def _pika(broker: Broker) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(broker.host, broker.port,
                                                             credentials=pika.PlainCredentials("guest", "guest")))


async def _next(link: LinkConnection, kind: type, timeout_s: float = 10.0) -> object:
    with trio.fail_after(timeout_s):
        while True:
            event = await link.events.receive()
            if isinstance(event, kind):
                return event


async def test_publish_with_confirms_then_consume_with_prefetch_and_ack(broker: Broker) -> None:
    queue = _queue()
    async with open_link(parse_uri(broker.uri()), "link-test") as link:
        ch = await link.channel()
        ok = await link.call(ch, m.QueueDeclare(queue=queue, durable=True), m.QueueDeclareOk)
        assert isinstance(ok, m.QueueDeclareOk) and ok.queue == queue
        await link.call(ch, m.ConfirmSelect(), m.ConfirmSelectOk)
        props = BasicProperties(delivery_mode=2, headers={"n": 1}, content_type="text/plain")
        seqs = [link.publish(ch, "", queue, props, f"m{n}".encode()) for n in range(50)]
        await link.flush()
        assert seqs == list(range(1, 51))
        confirmed: set[int] = set()
        with trio.fail_after(20):
            while len(confirmed) < 50:
                event = await link.events.receive()
                assert isinstance(event, MethodIn) and isinstance(event.method, m.BasicAck), event
                tag = event.method.delivery_tag
                confirmed |= set(range(1, tag + 1)) if event.method.multiple else {tag}
        consumer = await link.channel()
        await link.call(consumer, m.BasicQos(prefetch_count=10), m.BasicQosOk)
        await link.call(consumer, m.BasicConsume(queue=queue, consumer_tag="t1"), m.BasicConsumeOk)
        bodies: list[bytes] = []
        with trio.fail_after(20):
            while len(bodies) < 50:
                delivery = await link.events.receive()
                assert isinstance(delivery, ContentIn), delivery
                assert isinstance(delivery.method, m.BasicDeliver)
                assert delivery.properties.headers == {"n": 1} and delivery.properties.delivery_mode == 2
                bodies.append(delivery.body)
                link.ack(consumer, delivery.method.delivery_tag)
                await link.flush()
        assert bodies == [f"m{n}".encode() for n in range(50)]
        await link.call(consumer, m.BasicCancel(consumer_tag="t1"), m.BasicCancelOk)
        purged = await link.call(ch, m.QueueDelete(queue=queue), m.QueueDeleteOk)
        assert isinstance(purged, m.QueueDeleteOk) and purged.message_count == 0


async def test_prefetch_limits_unacked_deliveries_and_nack_requeues(broker: Broker) -> None:
    queue = _queue()
    with _pika(broker) as conn:
        pch = conn.channel()
        pch.queue_declare(queue)
        for n in range(5):
            pch.basic_publish("", queue, f"x{n}".encode())
    async with open_link(parse_uri(broker.uri())) as link:
        ch = await link.channel()
        await link.call(ch, m.BasicQos(prefetch_count=2), m.BasicQosOk)
        await link.call(ch, m.BasicConsume(queue=queue, consumer_tag="c"), m.BasicConsumeOk)
        first = [await _next(link, ContentIn) for _ in range(2)]
        with trio.move_on_after(0.5):  # the prefetch holds the third one back
            extra = await _next(link, ContentIn)
            pytest.fail(f"a third delivery arrived past prefetch 2: {extra}")
        tag = first[0].method.delivery_tag  # type: ignore[attr-defined]
        link.nack(ch, tag, requeue=True)
        link.ack(ch, first[1].method.delivery_tag)  # type: ignore[attr-defined]
        await link.flush()
        seen = [await _next(link, ContentIn) for _ in range(2)]
        redelivered = [d for d in seen if d.method.redelivered]  # type: ignore[attr-defined]
        assert [d.body for d in redelivered] == [first[0].body]  # type: ignore[attr-defined]
        await link.call(ch, m.QueueDelete(queue=queue), m.QueueDeleteOk)


async def test_soft_error_closes_the_channel_only(broker: Broker) -> None:
    async with open_link(parse_uri(broker.uri())) as link:
        ch = await link.channel()
        with pytest.raises(LinkClosed) as refused:
            await link.call(ch, m.QueueDeclare(queue=_queue(), passive=True), m.QueueDeclareOk)
        assert refused.value.code == 404
        closed = await _next(link, ChannelClosed)
        assert isinstance(closed, ChannelClosed) and closed.by_server and closed.reply_code == 404
        again = await link.channel()
        ok = await link.call(again, m.QueueDeclare(queue="", exclusive=True), m.QueueDeclareOk)
        assert isinstance(ok, m.QueueDeclareOk) and ok.queue


async def test_wrong_password_and_unknown_vhost_are_refused(broker: Broker) -> None:
    with pytest.raises(LinkClosed) as bad_login:
        async with open_link(parse_uri(broker.uri(password="wrong"))):
            pytest.fail("opened with a wrong password")
    assert bad_login.value.code == 403
    with pytest.raises(LinkClosed) as bad_vhost:
        async with open_link(parse_uri(broker.uri(vhost="no-such-vhost"))):
            pytest.fail("opened an unknown vhost")
    assert bad_vhost.value.code in (530, 402)


async def test_heartbeats_keep_an_idle_connection_open(broker: Broker) -> None:
    async with open_link(parse_uri(broker.uri(query="heartbeat=1"))) as link:
        assert link.conn.heartbeat_s == 1
        await trio.sleep(3.5)  # several heartbeat periods with nothing else sent
        assert link.closed is None
        ch = await link.channel()
        await link.call(ch, m.QueueDeclare(queue="", exclusive=True), m.QueueDeclareOk)


async def test_basic_return_of_an_unroutable_mandatory_publish(broker: Broker) -> None:
    async with open_link(parse_uri(broker.uri())) as link:
        ch = await link.channel()
        link.publish(ch, "", _queue(), BasicProperties(), b"nowhere", mandatory=True)
        await link.flush()
        returned = await _next(link, ContentIn)
        assert isinstance(returned, ContentIn) and isinstance(returned.method, m.BasicReturn)
        assert returned.method.reply_code == 312 and returned.body == b"nowhere"


async def test_node_stopping_ends_the_link_with_closed(private_node: NodeProcess) -> None:
    async with open_link(parse_uri(f"amqp://guest:guest@{private_node.host}:{private_node.port}")) as link:
        ch = await link.channel()
        await link.call(ch, m.QueueDeclare(queue="", exclusive=True), m.QueueDeclareOk)
        await trio.to_thread.run_sync(private_node.stop)
        closed = await _next(link, Closed, timeout_s=30)
        assert isinstance(closed, Closed) and closed.by_server
        with pytest.raises(LinkClosed):
            await link.call(ch, m.QueueDeclare(queue="", exclusive=True), m.QueueDeclareOk)
