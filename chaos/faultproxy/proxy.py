"""One fault proxy (listener + upstream) and its links, with the toxics applied to live traffic (trio).

How it works: an enabled `Proxy` listens on its address; each accepted client gets a `Link` to the upstream. A link
runs, per direction (upstream = client to server, downstream = server to client), a reader task that puts chunks
with their arrival time into a bounded memory channel (32 chunks of at most 32 KiB: when the writer is held, TCP
back-pressure reaches the sender) and a writer task that applies the active toxics of that stream to each chunk, in
this fixed order: timeout (hold the data while the toxic exists), latency (+ jitter, measured from arrival, so the
delay is pipelined as Toxiproxy does), limit_data (forward up to the limit, then close), slicer (pieces with a
delay in microseconds between them), bandwidth (100 ms worth of bytes at a time, each after size / rate).
A watcher task enforces the timers: `timeout` > 0 closes the link that long after the toxic reached it,
`reset_peer` resets both sockets (SO_LINGER 0) after its timeout. A source's EOF closes the link after the buffered data and any slow_close delay.
Whether a toxic applies to a link is rolled once per link against its toxicity with the server's seeded
random.Random. Toxic changes wake every link through the proxy's `changed` event.
"""

from __future__ import annotations

import contextlib
import random
import socket
import struct
from dataclasses import dataclass

import trio

from chaos.faultproxy.toxics import ToxicSpec, jittered_ms, slice_sizes

CHUNK_BYTES_MAX = 32 * 1024
CHUNKS_BUFFERED_MAX = 32
UPSTREAM_CONNECT_TIMEOUT_S = 5.0
_EOF = b""


@dataclass(frozen=True, slots=True)
class ActiveToxic:
    serial: int
    spec: ToxicSpec


def split_host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"bad address {address!r}: expected host:port")
    return host.strip("[]"), int(port)


class Proxy:
    def __init__(self, name: str, listen: str, upstream: str, rng: random.Random) -> None:
        split_host_port(listen)
        split_host_port(upstream)
        self.name, self.listen, self.upstream = name, listen, upstream
        self.enabled = False
        self.toxics: dict[str, ActiveToxic] = {}
        self.changed = trio.Event()
        self.rng = rng
        self.links: set[Link] = set()
        self._serial = 0
        self._scope: trio.CancelScope | None = None
        self._stopped = trio.Event()

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "listen": self.listen, "upstream": self.upstream, "enabled": self.enabled,
                "toxics": [toxic.spec.to_json() for toxic in self.toxics.values()]}

    def notify(self) -> None:
        old, self.changed = self.changed, trio.Event()
        old.set()

    def add_toxic(self, spec: ToxicSpec) -> None:
        self._serial += 1
        self.toxics[spec.name] = ActiveToxic(self._serial, spec)
        self.notify()

    def update_toxic(self, spec: ToxicSpec) -> None:
        self.toxics[spec.name] = ActiveToxic(self.toxics[spec.name].serial, spec)
        self.notify()

    def remove_toxic(self, name: str) -> None:
        del self.toxics[name]
        self.notify()

    def clear_toxics(self) -> None:
        self.toxics.clear()
        self.notify()

    async def enable(self, nursery: trio.Nursery) -> None:
        """Start listening (binding port 0 resolves `listen` to the real port); raises OSError if it cannot."""
        if not self.enabled:
            await nursery.start(self._serve)

    async def disable(self) -> None:
        """Stop listening and drop every link, as Toxiproxy does."""
        if self.enabled and self._scope is not None:
            self._scope.cancel()
            await self._stopped.wait()

    async def _serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        host, port = split_host_port(self.listen)
        self._stopped = trio.Event()
        try:
            with trio.CancelScope() as scope:
                self._scope = scope
                listeners = await trio.open_tcp_listeners(port, host=host)
                self.listen = f"{host}:{listeners[0].socket.getsockname()[1]}"
                self.enabled = True
                task_status.started()
                async with trio.open_nursery() as links:
                    for listener in listeners:
                        links.start_soon(self._accept_loop, listener, links)
        finally:
            self.enabled = False
            self._scope = None
            self._stopped.set()

    async def _accept_loop(self, listener: trio.SocketListener, links: trio.Nursery) -> None:
        async with listener:
            while True:
                client = await listener.accept()
                links.start_soon(self._run_link, client)

    async def _run_link(self, client: trio.SocketStream) -> None:
        host, port = split_host_port(self.upstream)
        try:
            with trio.fail_after(UPSTREAM_CONNECT_TIMEOUT_S):
                server = await trio.open_tcp_stream(host, port)
        except (OSError, trio.TooSlowError):
            await client.aclose()
            return
        link = Link(self, client, server)
        self.links.add(link)
        try:
            await link.run()
        finally:
            self.links.discard(link)


class Link:
    """One client connection and its upstream connection."""

    def __init__(self, proxy: Proxy, client: trio.SocketStream, server: trio.SocketStream) -> None:
        self.proxy, self.client, self.server = proxy, client, server
        self._rolled: dict[int, bool] = {}
        self._first_seen_s: dict[int, float] = {}
        self._scope = trio.CancelScope()
        self._sent_bytes = {"upstream": 0, "downstream": 0}

    def active(self, stream: str | None = None) -> list[ToxicSpec]:
        """Toxics that apply to this link (toxicity rolled once per link), optionally of one stream."""
        result = []
        for toxic in self.proxy.toxics.values():
            if toxic.serial not in self._rolled:
                self._rolled[toxic.serial] = self.proxy.rng.random() < toxic.spec.toxicity
                self._first_seen_s[toxic.serial] = trio.current_time()
            if self._rolled[toxic.serial] and (stream is None or toxic.spec.stream == stream):
                result.append(toxic.spec)
        return result

    async def run(self) -> None:
        async with self.client, self.server:
            with self._scope:
                async with trio.open_nursery() as nursery:
                    for stream, source, sink in (("upstream", self.client, self.server),
                                                 ("downstream", self.server, self.client)):
                        send, receive = trio.open_memory_channel[tuple[float, bytes]](CHUNKS_BUFFERED_MAX)
                        nursery.start_soon(self._read, source, send)
                        nursery.start_soon(self._write, stream, receive, sink)
                    nursery.start_soon(self._watch_timers)

    def close(self) -> None:
        self._scope.cancel()

    def reset(self) -> None:
        for stream in (self.client, self.server):
            with contextlib.suppress(OSError):
                stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close()

    async def _read(self, source: trio.SocketStream,
                    send: trio.MemorySendChannel[tuple[float, bytes]]) -> None:
        async with send:
            while True:
                try:
                    data = await source.receive_some(CHUNK_BYTES_MAX)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    data = _EOF
                await send.send((trio.current_time(), data))
                if not data:
                    return

    async def _write(self, stream: str, receive: trio.MemoryReceiveChannel[tuple[float, bytes]],
                     sink: trio.SocketStream) -> None:
        async with receive:
            async for arrival_s, data in receive:
                await self._hold_while_timeout(stream)
                if not data:
                    await self._slow_close(stream)
                    self.close()
                    return
                try:
                    await self._forward(stream, arrival_s, data, sink)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    self.close()
                    return

    async def _hold_while_timeout(self, stream: str) -> None:
        while True:
            changed = self.proxy.changed
            if not any(t.type == "timeout" for t in self.active(stream)):
                return
            await changed.wait()

    async def _slow_close(self, stream: str) -> None:
        delays = [t.attr("delay") for t in self.active(stream) if t.type == "slow_close"]
        if delays:
            await trio.sleep(max(delays) / 1000.0)

    async def _forward(self, stream: str, arrival_s: float, data: bytes, sink: trio.SocketStream) -> None:
        toxics = self.active(stream)
        rng = self.proxy.rng
        delay_ms = sum(jittered_ms(t.attr("latency"), t.attr("jitter"), rng) for t in toxics if t.type == "latency")
        if delay_ms > 0:
            await trio.sleep_until(arrival_s + delay_ms / 1000.0)
        limits = [t.attr("bytes") for t in toxics if t.type == "limit_data"]
        if limits:
            allowed = max(0, min(limits) - self._sent_bytes[stream])
            if allowed <= len(data):
                await self._send(stream, data[:allowed], sink, toxics)
                self.close()
                return
        await self._send(stream, data, sink, toxics)

    async def _send(self, stream: str, data: bytes, sink: trio.SocketStream, toxics: list[ToxicSpec]) -> None:
        slicers = [t for t in toxics if t.type == "slicer"]
        pieces = [data]
        if slicers and data:
            slicer = slicers[0]
            sizes = slice_sizes(len(data), slicer.attr("average_size"), slicer.attr("size_variation"),
                                self.proxy.rng)
            offsets = [sum(sizes[:i]) for i in range(len(sizes))]
            pieces = [data[offset:offset + size] for offset, size in zip(offsets, sizes, strict=True)]
        rates = [t.attr("rate") for t in toxics if t.type == "bandwidth" and t.attr("rate") > 0]
        for index, piece in enumerate(pieces):
            if index and slicers:
                await trio.sleep(slicers[0].attr("delay") / 1_000_000.0)
            if rates:
                await self._send_throttled(stream, piece, sink, min(rates))
            elif piece:
                await sink.send_all(piece)
                self._sent_bytes[stream] += len(piece)

    async def _send_throttled(self, stream: str, data: bytes, sink: trio.SocketStream, rate_kb_per_s: int) -> None:
        """Bandwidth: 100 ms worth of bytes at a time, each piece sent after the time it takes at the rate."""
        piece_bytes = max(1, rate_kb_per_s * 100)
        for offset in range(0, len(data), piece_bytes):
            piece = data[offset:offset + piece_bytes]
            await trio.sleep(len(piece) / (rate_kb_per_s * 1000.0))
            await sink.send_all(piece)
            self._sent_bytes[stream] += len(piece)

    async def _watch_timers(self) -> None:
        """Close (timeout > 0) or reset (reset_peer) the link once such a toxic has been on it long enough."""
        while True:
            changed = self.proxy.changed
            timed = [t for t in self.proxy.toxics.values()
                     if t.spec in self.active() and (t.spec.type == "reset_peer"
                                                     or (t.spec.type == "timeout" and t.spec.attr("timeout") > 0))]
            if not timed:
                await changed.wait()
                continue
            due = min((self._first_seen_s[t.serial] + t.spec.attr("timeout") / 1000.0, t.spec.type) for t in timed)
            with trio.move_on_at(due[0]):
                await changed.wait()
                continue
            if due[1] == "reset_peer":
                self.reset()
            else:
                self.close()
            return
