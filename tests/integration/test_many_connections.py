"""Many concurrent connections, and accept back-off when the node runs out of file descriptors."""

from __future__ import annotations

import os
import resource
from typing import Any

import pika
import trio

from tests.integration.conftest import Target
from tests.integration.helpers import drain, publish
from tests.integration.nodeproc import NodeProcess, external_target
from tests.integration.rawclient import RawClient

# An external broker (e.g. a packaged RabbitMQ at ulimit -n 1024) may have fewer descriptors than this needs.
CONNECTIONS = int(os.environ.get("RAFTMQ_TEST_CONNECTIONS", "200" if external_target() else "1000"))


async def _open_many(host: str, port: int, count: int, opened: list[RawClient]) -> None:
    limiter = trio.CapacityLimiter(200)  # connect in waves; all stay open together

    async def one() -> None:
        async with limiter:
            stream = await trio.open_tcp_stream(host, port)
            client = RawClient(stream)
            await client.open()
            opened.append(client)

    async with trio.open_nursery() as nursery:
        for _ in range(count):
            nursery.start_soon(one)


async def test_a_thousand_concurrent_connections(amqp_target: Target) -> None:
    opened: list[RawClient] = []
    try:
        with trio.fail_after(120):
            await _open_many(amqp_target.host, amqp_target.port, CONNECTIONS, opened)
        assert len(opened) == CONNECTIONS
        ok = await trio.to_thread.run_sync(_pika_round_trip, amqp_target)
        assert ok == [b"still-serving"]
    finally:
        for client in opened:
            await client.stream.aclose()


def _pika_round_trip(target: Target) -> list[bytes]:
    connection = pika.BlockingConnection(target.params())
    try:
        ch = connection.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        publish(ch, "", q, b"still-serving")
        return drain(ch, q)
    finally:
        connection.close()


def _low_fd_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))


async def test_accept_backs_off_when_file_descriptors_run_out(tmp_path: Any) -> None:
    """Single mode only: the descriptor limit is one node process's, and the back-off is its accept loop, the same
    code in cluster mode (where HAProxy, not the client, would hold the extra connections)."""
    if external_target() is not None:
        import pytest

        pytest.skip("needs control of the node process")
    node = NodeProcess(tmp_path / "node", preexec=_low_fd_limit)
    await trio.to_thread.run_sync(node.start)
    target = Target(node.host, node.port, node)
    streams: list[trio.SocketStream] = []
    try:
        # Far more connections than descriptors: the node must neither crash nor spin, only wait.
        for _ in range(100):
            streams.append(await trio.open_tcp_stream(node.host, node.port))
        with trio.fail_after(30):  # until the accept loop met EMFILE (a loaded machine may take a while)
            while "backing off" not in node.log_tail(200_000):
                await trio.sleep(0.1)
        for stream in streams:
            await stream.aclose()
        streams.clear()
        with trio.fail_after(60):
            assert await trio.to_thread.run_sync(_pika_round_trip, target) == [b"still-serving"]
        assert node.process is not None and node.process.poll() is None
        assert "backing off" in node.log_tail(200_000)
    finally:
        for stream in streams:
            await stream.aclose()
        node.stop()
