"""Credit flow between publishers and queues: the broker says when a publisher's queue is behind its draining
consumers (`Broker.publish_flow_behind`), and the runtime then holds that publisher's next read (bounded)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
from pamqp import commands, frame

from node.amqp import events as ev
from node.amqp import methods as m
from node.amqp.properties import BasicProperties
from node.broker.broker import Broker
from tests.broker.harness import connected, new_broker
from tests.integration.rawclient import RawClient
from tests.runtime.test_server import serving

PUBLISHER, CONSUMER = 1, 2


def _publish_read(broker: Broker, count: int, queue: str = "q") -> None:
    """One read's worth of publishes, handed over the way the runtime does (`handle_many`)."""
    method = m.BasicPublish(exchange="", routing_key=queue)
    events = [ev.ContentReceived(1, method, BasicProperties(), b"x") for _ in range(count)]
    broker.handle_many(PUBLISHER, events, 0)


def _broker_with_consumer(prefetch: int, ready_max: int = 5) -> tuple[Broker, Any]:
    broker = new_broker(publish_flow_ready_max=ready_max)
    publisher = connected(broker, PUBLISHER)
    publisher.declare("q")
    consumer = connected(broker, CONSUMER)
    consumer.call(m.BasicQos(prefetch_count=prefetch))
    consumer.consume("q", "t")
    return broker, consumer


def test_a_queue_behind_its_draining_consumer_holds_its_publisher() -> None:
    broker, consumer = _broker_with_consumer(prefetch=2)
    _publish_read(broker, 5)  # 2 delivered, 3 ready
    assert not broker.publish_flow_behind(PUBLISHER)
    _publish_read(broker, 10)  # 13 ready > 5
    assert broker.publish_flow_behind(PUBLISHER)
    assert not broker.publish_flow_behind(CONSUMER)  # it published nothing
    for tag in range(1, 13, 2):  # each multiple ack frees two, two more are delivered
        consumer.ack(tag + 1, multiple=True)
    assert broker.vhosts["/"].queues["q"].machine.ready_count == 1
    assert not broker.publish_flow_behind(PUBLISHER)


def test_a_consumer_whose_socket_is_full_or_gone_holds_nobody() -> None:
    broker, consumer = _broker_with_consumer(prefetch=2)
    _publish_read(broker, 20)
    assert broker.publish_flow_behind(PUBLISHER)
    broker.set_writable(CONSUMER, False)  # the consumer does not read: its queue may grow, as in RabbitMQ
    assert not broker.publish_flow_behind(PUBLISHER)
    broker.set_writable(CONSUMER, True)
    assert broker.publish_flow_behind(PUBLISHER)
    consumer.close()
    assert not broker.publish_flow_behind(PUBLISHER)


def test_a_read_without_publishes_or_a_closed_connection_forgets_the_queues() -> None:
    broker, _consumer = _broker_with_consumer(prefetch=2)
    _publish_read(broker, 20)
    assert broker.publish_flow_behind(PUBLISHER)
    broker.handle_many(PUBLISHER, [ev.MethodReceived(1, m.BasicQos(prefetch_count=3))], 0)
    assert not broker.publish_flow_behind(PUBLISHER)
    _publish_read(broker, 1)
    assert broker.publish_flow_behind(PUBLISHER)
    broker.handle(PUBLISHER, ev.ConnectionClosed(200, "bye"), 0)
    assert not broker.flow_routes


def test_zero_turns_credit_flow_off() -> None:
    broker, _consumer = _broker_with_consumer(prefetch=2, ready_max=0)
    _publish_read(broker, 50)
    assert not broker.publish_flow_behind(PUBLISHER)


# --- the runtime --------------------------------------------------------------------------------------------------

MESSAGES = 3000
BATCH = 500  # publishes per write: one read holds far more than the queue's flow limit


async def _client(port: int) -> RawClient:
    client = RawClient(await trio.open_tcp_stream("127.0.0.1", port))
    await client.open()
    await client.open_channel()
    return client


async def _consume_acking(client: RawClient, expected: int, prefetch: int) -> None:
    """Consume with a per-consumer prefetch, acking everything read so far after each chunk (as the bench)."""
    await client.stream.send_all(frame.marshal(commands.Basic.Qos(prefetch_count=prefetch), 1))
    await client.consume("q", no_ack=False)
    buffer = client.buffer
    delivered = 0
    while delivered < expected:
        chunk = await client.stream.receive_some(65536)
        assert chunk, "node closed the consumer"
        buffer.extend(chunk)
        offset, last_tag = 0, 0
        while offset < len(buffer):
            try:
                consumed, _channel, value = frame.unmarshal(bytes(buffer[offset:offset + 65536]))
            except Exception:  # an incomplete frame
                break
            offset += consumed
            if isinstance(value, commands.Basic.Deliver):
                delivered += 1
                last_tag = value.delivery_tag
        del buffer[:offset]
        if last_tag:
            await client.stream.send_all(frame.marshal(commands.Basic.Ack(delivery_tag=last_tag, multiple=True), 1))


async def _publish(client: RawClient, count: int) -> None:
    frames = client.publish_frames("q", b"m" * 100)
    for start in range(0, count, BATCH):
        await client.stream.send_all(frames * min(BATCH, count - start))


async def test_a_publisher_ahead_of_an_acking_consumer_is_paused_and_everything_arrives(tmp_path: Path) -> None:
    async with serving(tmp_path) as (node, port):
        node.broker.config.publish_flow_ready_max = 50
        consumer = await _client(port)
        await consumer.declare_queue("q")
        publisher = await _client(port)
        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_consume_acking, consumer, MESSAGES, 100)
                await trio.sleep(0.05)  # the consumer is attached before the first publish
                nursery.start_soon(_publish, publisher, MESSAGES)
        assert node.flow_pauses >= 1
        assert node.broker.vhosts["/"].queues["q"].machine.ready_count == 0
        await consumer.stream.aclose()
        await publisher.stream.aclose()


async def test_a_consumer_that_stops_acking_does_not_stop_its_publisher(tmp_path: Path) -> None:
    async with serving(tmp_path) as (node, port):
        node.broker.config.publish_flow_ready_max = 50
        consumer = await _client(port)
        await consumer.declare_queue("q")
        await consumer.stream.send_all(frame.marshal(commands.Basic.Qos(prefetch_count=10), 1))
        await consumer.consume("q", no_ack=False)  # reads nothing more, acks nothing
        publisher = await _client(port)
        queue = node.broker.vhosts["/"].queues["q"]
        with trio.fail_after(120):
            await _publish(publisher, MESSAGES)
            while queue.machine.ready_count < MESSAGES - 10:
                await trio.sleep(0.01)
        assert node.flow_pauses_stalled >= 1  # the pause gave up: the consumer, not the node, is slow
        await consumer.stream.aclose()
        await publisher.stream.aclose()
