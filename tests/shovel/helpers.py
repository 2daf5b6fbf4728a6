"""Helpers for shovel tests on real processes: raftmq nodes with their management port, pika checks, waiting."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika

from node import ctl
from tests.integration.nodeproc import NodeProcess


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_node(workdir: Path) -> tuple[NodeProcess, int]:
    """A started `raftmq node` and its management port (open)."""
    mport = free_port()
    node = NodeProcess(workdir, extra_args=("--management-port", str(mport))).start()
    wait_until(lambda: _accepts(mport), 30, f"management port {mport} never opened")
    return node, mport


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def wait_until(check: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval_s)
    raise AssertionError(f"{what} (last: {last!r})")


def uri(port: int, host: str = "127.0.0.1") -> str:
    return f"amqp://guest:guest@{host}:{port}"


def ctl_call(mport: int, *argv: str) -> tuple[int, Any]:
    """`raftmq ctl --json ...` in-process; (exit code, decoded JSON or None)."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = ctl.main(["--node", f"127.0.0.1:{mport}", "--json", *argv])
    text = out.getvalue().strip()
    try:
        return code, json.loads(text) if text else err.getvalue()
    except ValueError:
        return code, text + err.getvalue()


def connect(port: int, host: str = "127.0.0.1") -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(host, port,
                                                             credentials=pika.PlainCredentials("guest", "guest")))


def publish(port: int, queue: str, count: int, declare: dict[str, Any] | None = None, prefix: str = "m") -> None:
    """`count` persistent messages to `queue` (declared durable first), publisher confirms on."""
    with connect(port) as conn:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True, arguments=declare)
        ch.confirm_delivery()
        for n in range(count):
            ch.basic_publish("", queue, f"{prefix}{n}".encode(), pika.BasicProperties(delivery_mode=2))


def count(port: int, queue: str) -> int:
    """The queue's ready messages; -1 while it does not exist."""
    with connect(port) as conn:
        try:
            return int(conn.channel().queue_declare(queue, passive=True).method.message_count)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code == 404:
                return -1
            raise


def drain(port: int, queue: str) -> list[tuple[bytes, dict[str, Any]]]:
    """Every message of the queue (body, headers), acked."""
    got: list[tuple[bytes, dict[str, Any]]] = []
    with connect(port) as conn:
        ch = conn.channel()
        while True:
            method, props, body = ch.basic_get(queue)
            if method is None:
                return got
            got.append((body, dict(props.headers or {})))
            ch.basic_ack(method.delivery_tag)
