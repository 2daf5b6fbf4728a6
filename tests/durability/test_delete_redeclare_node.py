"""A real node (kill -9): a durable queue deleted and declared again under the same name has only the new queue's
messages after a restart, whether the kill lands right after the re-declare and new publishes, or between the
delete and the re-declare (the re-declare then happens on the restarted node). Every crash point of the store's
records is covered deterministically by test_delete_redeclare.py; this one shows the whole node path (pika).
"""

from __future__ import annotations

from pathlib import Path

import pika

from bench.recovery import NodeUnderTest

QUEUE = "reborn"
MARKER = "reborn-marker"
PERSISTENT = pika.BasicProperties(delivery_mode=2)


def _connect(node: NodeUnderTest) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(host="127.0.0.1", port=node.endpoint.port,
                                                             heartbeat=0))


def _publish_confirmed(channel: pika.adapters.blocking_connection.BlockingChannel, bodies: list[bytes]) -> None:
    for body in bodies:
        channel.basic_publish("", QUEUE, body, PERSISTENT, mandatory=True)  # confirm_delivery: waits for each


def _drain(node: NodeUnderTest) -> list[bytes]:
    connection = _connect(node)
    channel = connection.channel()
    channel.queue_declare(QUEUE, durable=True)
    bodies: list[bytes] = []
    while True:
        method, _props, body = channel.basic_get(QUEUE, auto_ack=True)
        if method is None:
            break
        bodies.append(body)
    connection.close()
    return bodies


def test_delete_redeclare_then_kill_brings_back_only_the_new_messages(tmp_path: Path) -> None:
    node = NodeUnderTest(tmp_path / "data", tmp_path / "node.log")
    old = [b"old-%03d" % n for n in range(100)]
    new = [b"new-%03d" % n for n in range(20)]
    later = [b"later-%03d" % n for n in range(5)]
    try:
        node.spawn()
        node.wait_answers()
        connection = _connect(node)
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare(QUEUE, durable=True)
        _publish_confirmed(channel, old)
        holder = connection.channel()  # 10 of the old messages delivered, unacked, when the queue is deleted
        holder.basic_qos(prefetch_count=10)
        holder.basic_consume(QUEUE, lambda *_args: None)
        connection.process_data_events(time_limit=0.5)
        channel.queue_delete(QUEUE)
        channel.queue_declare(QUEUE, durable=True)
        _publish_confirmed(channel, new)
        node.kill9()
        node.spawn()
        node.wait_answers()
        assert _drain(node) == new  # (drained with auto-ack: the queue is empty now)

        connection = _connect(node)
        channel = connection.channel()
        channel.confirm_delivery()
        _publish_confirmed(channel, new)
        channel.queue_delete(QUEUE)
        # delete-ok waits for the fsync (node/broker/reply_gate.py); the marker's publish is a second witness
        channel.queue_declare(MARKER, durable=True)
        channel.basic_publish("", MARKER, b"marker", PERSISTENT)
        connection.close()
        node.kill9()  # between the delete and the re-declare
        node.spawn()
        node.wait_answers()
        connection = _connect(node)
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare(QUEUE, durable=True)
        _publish_confirmed(channel, later)
        node.kill9()
        node.spawn()
        node.wait_answers()
        assert _drain(node) == later
    finally:
        node.stop()
