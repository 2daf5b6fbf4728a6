"""A real node pages a long durable queue: 50k persistent messages (five times the default in-memory limit of
10k, and past the store's inline recovery threshold of 20k records); the first 15k consumed and acked (paged in
from the log while the node runs), kill -9, restart, the other 35k consumed in order (redelivered, as every
recovered message) and acked, kill -9 again: nothing comes back. 2000 transient messages published after the
persistent ones are spilled to disk (the queue is paging) and are gone after the restart, as in RabbitMQ.

Durability without a confirm per message: the messages go out on channel 1 without confirms, then one confirmed
marker on channel 2 of the same connection; the broker handles a connection's frames in order and one group
commit covers every append made before it, so the marker's confirm means every earlier message was fsynced.
"""

from __future__ import annotations

from pathlib import Path

import pika

from bench.recovery import NodeUnderTest, queue_message_count

MESSAGES = 50_000
QUEUE = "paged"
MARKERS = "paged-markers"
FIRST = 15_000  # consumed before the kill
TRANSIENT = 2_000


def _consume(connection: pika.BlockingConnection, count: int) -> tuple[list[int], int]:
    """Consume and ack `count` messages: (their numbers in arrival order, how many were flagged redelivered)."""
    channel = connection.channel()
    channel.basic_qos(prefetch_count=500)
    received: list[int] = []
    flagged = 0
    for method, _props, body in channel.consume(QUEUE, inactivity_timeout=60):
        assert method is not None, f"stalled after {len(received)} messages"
        received.append(int(body[:8]))
        flagged += bool(method.redelivered)
        if len(received) % 250 == 0 or len(received) == count:
            channel.basic_ack(method.delivery_tag, multiple=True)
        if len(received) == count:
            break
    channel.cancel()
    channel.close()
    return received, flagged


def _connect(node: NodeUnderTest) -> pika.BlockingConnection:
    params = pika.ConnectionParameters(host="127.0.0.1", port=node.endpoint.port, heartbeat=0,
                                       blocked_connection_timeout=120)
    return pika.BlockingConnection(params)


def _durable_marker(connection: pika.BlockingConnection) -> None:
    marker = connection.channel()
    marker.confirm_delivery()
    marker.queue_declare(MARKERS, durable=True, arguments={"x-max-length": 4})
    marker.basic_publish("", MARKERS, b"marker", pika.BasicProperties(delivery_mode=2))
    marker.close()


def test_a_long_queue_survives_kill_and_comes_back_in_order(tmp_path: Path) -> None:
    node = NodeUnderTest(tmp_path / "data", tmp_path / "node.log")
    try:
        node.spawn()
        node.wait_answers()
        connection = _connect(node)
        channel = connection.channel()
        channel.queue_declare(QUEUE, durable=True)
        persistent = pika.BasicProperties(delivery_mode=2)
        for n in range(MESSAGES):
            channel.basic_publish("", QUEUE, b"%08d" % n + b"." * 200, persistent)
        for n in range(TRANSIENT):
            channel.basic_publish("", QUEUE, b"t%07d" % n, pika.BasicProperties(delivery_mode=1))
        _durable_marker(connection)
        assert queue_message_count(node.endpoint, QUEUE) == MESSAGES + TRANSIENT
        received, flagged = _consume(connection, FIRST)
        assert received == list(range(FIRST)) and flagged == 0, "in order, never delivered before: unflagged"
        _durable_marker(connection)  # the acks are durable too
        connection.close()
        node.kill9()

        node.spawn()
        node.wait_answers()
        assert queue_message_count(node.endpoint, QUEUE) == MESSAGES - FIRST
        connection = _connect(node)
        received, flagged = _consume(connection, MESSAGES - FIRST)
        assert received == list(range(FIRST, MESSAGES)), "every message, once, in publish order"
        assert flagged == MESSAGES - FIRST, "recovered messages are flagged redelivered"
        _durable_marker(connection)
        connection.close()
        node.kill9()

        node.spawn()
        node.wait_answers()
        assert queue_message_count(node.endpoint, QUEUE) == 0, "no acked message comes back"
    finally:
        node.stop()
