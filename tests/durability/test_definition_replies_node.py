"""A real node (kill -9 right after the reply): queue.declare-ok and queue.delete-ok of a durable queue leave only
once the change is fsynced, so a crash just after the reply cannot undo it (node/broker/reply_gate.py).

The node runs with a slow disk (`test_fsync_delay_ms`: each commit sleeps before its fsync) and
`test_drop_unsynced_on_kill` (a restart cuts the log back to what was fsynced), so a reply that left before its
fsync would lose the change here nearly every time: the delete would bring the whole queue back with its
messages, the declare would leave no queue.
"""

from __future__ import annotations

from pathlib import Path

import pika
import pika.exceptions
import pytest

from bench.recovery import NodeUnderTest

SLOW_DISK_ARGS = ("--test-drop-unsynced-on-kill", "true", "--test-fsync-delay-ms", "300")
PERSISTENT = pika.BasicProperties(delivery_mode=2)


def _connect(node: NodeUnderTest) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(host="127.0.0.1", port=node.endpoint.port,
                                                             heartbeat=0))


def _restart(node: NodeUnderTest) -> None:
    node.kill9()
    node.spawn()
    node.wait_answers()


def _exists(node: NodeUnderTest, queue: str) -> int | None:
    """The queue's message count, or None when the node does not know it."""
    connection = _connect(node)
    try:
        frame = connection.channel().queue_declare(queue, passive=True)
        return int(frame.method.message_count)
    except pika.exceptions.ChannelClosedByBroker as exc:
        assert exc.reply_code == 404
        return None
    finally:
        if connection.is_open:
            connection.close()


@pytest.mark.timeout(120)
def test_declare_and_delete_survive_a_kill_right_after_the_reply(tmp_path: Path) -> None:
    node = NodeUnderTest(tmp_path / "data", tmp_path / "node.log", SLOW_DISK_ARGS)
    try:
        node.spawn()
        node.wait_answers()
        connection = _connect(node)
        connection.channel().queue_declare("declared", durable=True)
        _restart(node)  # kill -9 right after declare-ok
        assert _exists(node, "declared") == 0

        connection = _connect(node)
        channel = connection.channel()
        channel.queue_declare("doomed", durable=True)
        for n in range(50):
            channel.basic_publish("", "doomed", b"m-%d" % n, PERSISTENT)
        confirming = connection.channel()
        confirming.confirm_delivery()
        confirming.basic_publish("", "doomed", b"last", PERSISTENT)  # its confirm: all 51 are durable
        assert _exists(node, "doomed") == 51
        channel.queue_delete("doomed")
        _restart(node)  # kill -9 right after delete-ok
        assert _exists(node, "doomed") is None
        assert _exists(node, "declared") == 0
    finally:
        node.stop()
