"""The trio server in-process: bounded output for a consumer that stops reading, and graceful shutdown."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from node.runtime.config import NodeConfig
from node.runtime.main import build_broker
from node.runtime.probes import ResourceProbe
from node.runtime.server import Node, run_node
from node.runtime.store import Store
from tests.integration.rawclient import RawClient

HIGH_BYTES = 256 * 1024
LOW_BYTES = 64 * 1024
BODY_BYTES = 16 * 1024
MESSAGES = 1500  # 24 MB: far more than the kernel's socket buffers and the output bound together


@asynccontextmanager
async def serving(tmp_path: Path, **overrides: object) -> AsyncIterator[tuple[Node, int]]:
    config = dataclasses.replace(
        NodeConfig(port=0, listen_address="127.0.0.1", data_dir=str(tmp_path), shutdown_timeout_ms=2000,
                   output_buffer_high_bytes=HIGH_BYTES, output_buffer_low_bytes=LOW_BYTES),
        **overrides,
    )
    store = Store.open(tmp_path)
    node = Node(config, build_broker(config), store, ResourceProbe(config, tmp_path))
    async with trio.open_nursery() as nursery:
        ports = await nursery.start(run_node, node)
        try:
            yield node, ports[0]
        finally:
            node.request_stop()


async def _client(port: int) -> RawClient:
    client = RawClient(await trio.open_tcp_stream("127.0.0.1", port))
    await client.open()
    await client.open_channel()
    return client


async def test_a_consumer_that_stops_reading_holds_bounded_output(tmp_path: Path) -> None:
    async with serving(tmp_path) as (node, port):
        consumer = await _client(port)
        await consumer.declare_queue("slow")
        await consumer.consume("slow", no_ack=True)
        consumer_conn = max(node.connections.values(), key=lambda c: c.conn_id)
        publisher = await _client(port)
        frames = publisher.publish_frames("slow", b"x" * BODY_BYTES)
        peak_bytes = 0
        with trio.fail_after(120):
            for start in range(0, MESSAGES, 50):
                await publisher.stream.send_all(frames * min(50, MESSAGES - start))
                peak_bytes = max(peak_bytes, consumer_conn.output_bytes)
            vhost = node.broker.vhosts["/"]
            while vhost.queues["slow"].machine.ready_count == 0:  # the broker keeps the rest in the queue
                await trio.sleep(0.01)
                peak_bytes = max(peak_bytes, consumer_conn.output_bytes)
        assert consumer_conn.writable is False
        # One read's worth of deliveries may land before the broker hears "not writable".
        assert peak_bytes < HIGH_BYTES + 2 * 1024 * 1024, peak_bytes
        await publisher.stream.aclose()
        await consumer.stream.aclose()


async def test_shutdown_closes_connections_with_320(tmp_path: Path) -> None:
    async with serving(tmp_path) as (node, port):
        client = await _client(port)
        node.request_stop()
        with trio.fail_after(30):
            close = await client.read_method()
        assert close.reply_code == 320
        assert close.reply_text == "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"
        await client.stream.aclose()


async def test_a_broker_bug_closes_only_that_connection_with_541(tmp_path: Path) -> None:
    async with serving(tmp_path) as (node, port):
        real_handle, real_handle_many = node.broker.handle, node.broker.handle_many

        def check(event: object) -> None:
            if getattr(getattr(event, "method", None), "routing_key", "") == "boom":
                raise RuntimeError("injected broker bug")

        def handle(conn_id: int, event: object, now_ms: int) -> object:
            check(event)
            return real_handle(conn_id, event, now_ms)

        def handle_many(conn_id: int, events: list[object], now_ms: int) -> object:
            for event in events:
                check(event)
            return real_handle_many(conn_id, events, now_ms)

        node.broker.handle = handle
        node.broker.handle_many = handle_many
        victim = await _client(port)
        bystander = await _client(port)
        await victim.stream.send_all(victim.publish_frames("boom", b"x"))
        with trio.fail_after(30):
            close = await victim.read_method()
        assert close.reply_code == 541
        await bystander.declare_queue("still-fine")  # the node and other connections carry on
        await victim.stream.aclose()
        await bystander.stream.aclose()
