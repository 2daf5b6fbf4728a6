"""Small helpers shared by the integration tests (pika blocking API)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import pika
import pika.exceptions
import pytest
from pamqp import frame
from pika.adapters.blocking_connection import BlockingChannel

WAIT_S = 10.0  # generous: only an upper bound for things that should happen promptly


def drain(ch: BlockingChannel, queue: str, limit: int = 10_000) -> list[bytes]:
    """basic.get (auto-ack) until get-empty; the bodies in order."""
    bodies = []
    for _ in range(limit):
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            break
        bodies.append(body)
    return bodies


def queue_depth(ch: BlockingChannel, queue: str) -> int:
    return int(ch.queue_declare(queue, passive=True).method.message_count)


def wait_until(
    condition: Callable[[], bool], conn: pika.BlockingConnection | None = None, timeout_s: float = WAIT_S
) -> bool:
    """Poll `condition` (processing connection events meanwhile) until it holds or the wait runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        if conn is not None:
            conn.process_data_events(time_limit=0.05)
        else:
            time.sleep(0.05)
    return condition()


def expect_channel_error(code: int, action: Callable[[], object]) -> pika.exceptions.ChannelClosedByBroker:
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        action()
    assert info.value.reply_code == code, info.value
    return info.value


def expect_connection_error(code: int, action: Callable[[], object]) -> pika.exceptions.ConnectionClosedByBroker:
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        action()
    assert info.value.reply_code == code, info.value
    return info.value


def publish(ch: BlockingChannel, exchange: str, routing_key: str, body: bytes | str, **props: object) -> None:
    ch.basic_publish(exchange, routing_key, body, pika.BasicProperties(**props))  # type: ignore[arg-type]


def read_frame(sock: socket.socket, buffer: bytearray) -> object:
    """The next whole frame's pamqp value from a raw socket, `buffer` holding what was read beyond it."""
    while True:
        if buffer:
            try:
                consumed, _channel, value = frame.unmarshal(bytes(buffer))
            except Exception:  # pamqp raises UnmarshalingException for incomplete frames
                consumed = 0
            if consumed:
                del buffer[:consumed]
                return value
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        buffer.extend(chunk)
