"""A real node under a forced memory alarm (test_signal_alarms + SIGUSR1; RSS not asserted) spills the messages a
queue holds in memory to disk, and nothing is lost or reordered (node/broker/paging.py, "Under the memory alarm").

The in-memory limit is 1000 (floor 100 under the alarm). Phase 1: 3000 messages (every third transient) wait in
a durable queue; the alarm goes on; all are consumed, while the alarm stays on, in exact publish order, unflagged.
Phase 2: the alarm off, 3000 more; the alarm on again, then kill -9 and restart: exactly the persistent ones come
back, in order, flagged redelivered.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pika

from bench.recovery import NodeUnderTest, queue_message_count
from tests.paging.test_node_paging import _connect, _consume, _durable_marker

QUEUE = "paged"
COUNT = 3000
WAIT_S = 60.0


def _is_persistent(n: int) -> bool:
    return n % 3 != 1


def _publish(connection: pika.BlockingConnection, first: int) -> None:
    channel = connection.channel()
    for n in range(first, first + COUNT):
        channel.basic_publish("", QUEUE, b"%08d" % n + b"." * 100,
                              pika.BasicProperties(delivery_mode=2 if _is_persistent(n) else 1))
    channel.close()
    _durable_marker(connection)  # every message above is in the store


def _toggle_memory_alarm(node: NodeUnderTest, log_path: Path, word: str, times_seen: int) -> None:
    """SIGUSR1 and wait until the node logged the alarm `word` ("set"/"cleared") `times_seen` times."""
    os.kill(node.pid, signal.SIGUSR1)
    deadline = time.monotonic() + WAIT_S
    while log_path.read_text(errors="replace").count(f"alarm memory {word}") < times_seen:
        assert time.monotonic() < deadline, f"no 'alarm memory {word}' in the node log"
        time.sleep(0.05)


def test_a_real_node_spills_under_the_memory_alarm_and_keeps_order(tmp_path: Path) -> None:
    log_path = tmp_path / "node.log"
    node = NodeUnderTest(tmp_path / "data", log_path,
                         ("--test-signal-alarms", "true", "--queue-messages-in-memory-max", "1000"))
    try:
        node.spawn()
        node.wait_answers()
        connection = _connect(node)
        connection.channel().queue_declare(QUEUE, durable=True)
        _publish(connection, 0)
        connection.close()  # (a connection that published is blocked under the alarm)
        _toggle_memory_alarm(node, log_path, "set", 1)
        assert queue_message_count(node.endpoint, QUEUE) == COUNT
        connection = _connect(node)
        received, flagged = _consume(connection, COUNT)
        assert received == list(range(COUNT)) and flagged == 0, "in publish order, never delivered: unflagged"

        _toggle_memory_alarm(node, log_path, "cleared", 1)
        _publish(connection, COUNT)
        connection.close()
        _toggle_memory_alarm(node, log_path, "set", 2)
        assert queue_message_count(node.endpoint, QUEUE) == COUNT
        node.kill9()

        node.spawn()
        node.wait_answers()
        expected = [n for n in range(COUNT, 2 * COUNT) if _is_persistent(n)]
        assert queue_message_count(node.endpoint, QUEUE) == len(expected)
        connection = _connect(node)
        received, flagged = _consume(connection, len(expected))
        assert received == expected, "the persistent ones, once each, in order"
        assert flagged == len(expected), "recovered messages are flagged redelivered"
        connection.close()
    finally:
        node.stop()
