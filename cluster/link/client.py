"""LinkConnection: a trio AMQP 0-9-1 client for links (shovels, federation), the thin I/O around
node/amqp/client.py's `ClientConnection`.

How it works: `open_link(uri)` is an async context manager. It connects (under the URI's connection timeout),
runs the handshake and yields a `LinkConnection`; a reader task feeds the socket's bytes to the protocol object and
a timer task calls its `tick` (heartbeats). Synchronous methods (`call`: declare, qos, consume, confirm.select,
channel.open) wait for their reply, one at a time per channel. Everything else the server sends (deliveries,
returns, publisher confirms, consumer cancels, channel and connection closes) goes, in order, to `events`, a trio
memory channel the caller reads (or, after `route_events`, to a channel shared with other connections). `publish`/`ack`/`nack` only buffer frames; `flush()` writes them (one send for a
whole batch). When the connection ends (server close, EOF, missed heartbeats, our close), a `Closed` event is the
last one on `events`, and calls waiting or made afterwards raise `LinkClosed`. Leaving the context closes the
connection politely (Connection.Close, Close-Ok awaited for at most 2 s) and cancels the tasks. Reconnecting is the
caller's business: a link simply opens a new `open_link` after its delay. An `amqps` URI gets TLS over the socket
(`tls_context`: RabbitMQ's URI keys, cluster/link/uri.py); the TLS handshake runs under the connection timeout, and
a failed one (an untrusted or misnamed certificate, no TLS at the other end) is an `OSError` like a refused
connection.
"""

from __future__ import annotations

import math
import ssl
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio

from cluster.link.uri import AmqpUri
from node.amqp import methods as m
from node.amqp.client import (
    ChannelClosed,
    ChannelReady,
    ClientConnection,
    ClientEvent,
    ClientSettings,
    Closed,
    MethodIn,
    Opened,
)
from node.amqp.properties import BasicProperties

READ_SIZE = 256 * 1024


class LinkClosed(Exception):
    """The connection (or the channel a call was on) is closed; `code`/`text` say why."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(f"{code} {text}")
        self.code = code
        self.text = text


def _now_ms() -> int:
    return int(trio.current_time() * 1000)


def wall_ms() -> int:
    """Wall-clock milliseconds: the time base of the shovel and federation link machines."""
    return int(time.time() * 1000)


class _Waiter:
    __slots__ = ("done", "error", "expect", "result")

    def __init__(self, expect: tuple[type[m.Method], ...]) -> None:
        self.expect = expect
        self.done = trio.Event()
        self.result: m.Method | None = None
        self.error: LinkClosed | None = None


class LinkConnection:
    def __init__(self, stream: trio.abc.Stream, conn: ClientConnection) -> None:
        self.stream = stream
        self.conn = conn
        self.closed: Closed | None = None
        self._send_lock = trio.Lock()
        self._opened = trio.Event()
        self._waiters: dict[int, _Waiter] = {}
        self._call_locks: dict[int, trio.Lock] = {}
        self._ready: dict[int, trio.Event] = {}
        self._events_in, self.events = trio.open_memory_channel[ClientEvent](math.inf)
        self._route: tuple[trio.MemorySendChannel[tuple[str, ClientEvent]], str] | None = None

    # ------------------------------------------------------------ API
    @property
    def server_properties(self) -> dict[str, Any]:
        return self.conn.server_properties

    async def channel(self) -> int:
        """Open a channel and wait for Open-Ok; its number."""
        self._check_open()
        number = self.conn.open_channel(_now_ms())
        ready = self._ready[number] = trio.Event()
        await self.flush()
        await ready.wait()
        self._ready.pop(number, None)
        self._check_open()
        if number not in self._call_locks:
            raise LinkClosed(504, f"channel {number} closed while opening")
        return number

    async def call(self, channel: int, method: m.Method, *expect: type[m.Method]) -> m.Method:
        """Send a synchronous method and wait for its reply (one of `expect`)."""
        lock = self._call_locks.get(channel)
        if lock is None:
            raise LinkClosed(504, f"channel {channel} is not open")
        async with lock:
            self._check_open()
            waiter = self._waiters[channel] = _Waiter(expect)
            self.conn.send_method(channel, method, _now_ms())
            await self.flush()
            await waiter.done.wait()
            if waiter.error is not None:
                raise waiter.error
            assert waiter.result is not None
            return waiter.result

    def publish(self, channel: int, exchange: str, routing_key: str, properties: BasicProperties, body: bytes,
                mandatory: bool = False) -> int:
        """Buffer a publish (sent by the next `flush`); its confirm sequence number (0 without confirms)."""
        self._check_open()
        return self.conn.publish(channel, exchange, routing_key, properties, body, mandatory, _now_ms())

    def ack(self, channel: int, delivery_tag: int, multiple: bool = False) -> None:
        self._check_open()
        self.conn.send_method(channel, m.BasicAck(delivery_tag, multiple), _now_ms())

    def nack(self, channel: int, delivery_tag: int, multiple: bool = False, requeue: bool = True) -> None:
        self._check_open()
        self.conn.send_method(channel, m.BasicNack(delivery_tag, multiple, requeue), _now_ms())

    def route_events(self, channel: trio.MemorySendChannel[tuple[str, ClientEvent]], tag: str,
                     keep: Callable[[ClientEvent], bool] = lambda event: True) -> None:
        """From now on, put `(tag, event)` on `channel` (unbounded) instead of on `events`, synchronously as the
        socket's bytes are parsed: a reader of several connections gets whole bursts in one batch, with no task
        switch per event. Events already on `events` move over first, those `keep` accepts."""
        while True:
            try:
                event = self.events.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                break
            if keep(event):
                channel.send_nowait((tag, event))
        self._route = (channel, tag)

    async def flush(self) -> None:
        async with self._send_lock:
            data = self.conn.data_to_send()
            if data:
                try:
                    await self.stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                    self._lost(f"send failed: {exc}")

    async def aclose(self, timeout_s: float = 2.0) -> None:
        if self.closed is None:
            self.conn.close(now_ms=_now_ms())
            self._dispatch()
            await self.flush()
            with trio.move_on_after(timeout_s):
                while self.closed is None:
                    await trio.sleep(0.01)
        with trio.move_on_after(1):
            await self.stream.aclose()

    # ------------------------------------------------------------ internals
    def _check_open(self) -> None:
        if self.closed is not None:
            raise LinkClosed(self.closed.reply_code, self.closed.reply_text)

    def _lost(self, reason: str) -> None:
        self.conn.connection_lost(reason)
        self._dispatch()

    def _dispatch(self) -> None:
        for event in self.conn.next_events():
            if isinstance(event, MethodIn):
                waiter = self._waiters.get(event.channel)
                if waiter is not None and isinstance(event.method, waiter.expect):
                    del self._waiters[event.channel]
                    waiter.result = event.method
                    waiter.done.set()
                    continue
            elif isinstance(event, ChannelReady):
                self._call_locks[event.channel] = trio.Lock()
                ready = self._ready.get(event.channel)
                if ready is not None:
                    ready.set()
                continue
            elif isinstance(event, Opened):
                self._opened.set()
                continue
            elif isinstance(event, ChannelClosed):
                self._call_locks.pop(event.channel, None)
                self._end_waiter(event.channel, LinkClosed(event.reply_code, event.reply_text))
                ready = self._ready.get(event.channel)
                if ready is not None:
                    ready.set()
            elif isinstance(event, Closed):
                self.closed = event
                self._opened.set()
                for channel in list(self._waiters):
                    self._end_waiter(channel, LinkClosed(event.reply_code, event.reply_text))
                for ready in self._ready.values():
                    ready.set()
                self._call_locks.clear()
            if self._route is not None:
                self._route[0].send_nowait((self._route[1], event))
                continue
            self._events_in.send_nowait(event)
            if isinstance(event, Closed):
                self._events_in.close()

    def _end_waiter(self, channel: int, error: LinkClosed) -> None:
        waiter = self._waiters.pop(channel, None)
        if waiter is not None:
            waiter.error = error
            waiter.done.set()

    async def _reader(self) -> None:
        while self.closed is None:
            try:
                data = await self.stream.receive_some(READ_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                self._lost(f"connection lost: {exc}")
                return
            if not data:
                self._lost("connection closed by the server (EOF)")
                return
            self.conn.receive_data(bytes(data), _now_ms())
            self._dispatch()
            await self.flush()

    async def _timer(self) -> None:
        while self.closed is None:
            deadline = self.conn.next_deadline_ms()
            await trio.sleep(1.0 if deadline is None else max(0.0, (deadline - _now_ms()) / 1000))
            self.conn.tick(_now_ms())
            self._dispatch()
            await self.flush()


def _single(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The one exception inside (nested) groups of one, or None."""
    inner: BaseException = group
    while isinstance(inner, BaseExceptionGroup):
        if len(inner.exceptions) != 1:
            return None
        inner = inner.exceptions[0]
    return inner


async def _handshake(link: LinkConnection, timeout_s: float) -> None:
    with trio.fail_after(timeout_s):
        await link.flush()
        while not link._opened.is_set():
            try:
                data = await link.stream.receive_some(READ_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                link._lost(f"connection lost during the handshake: {exc}")
                break
            if not data:
                link._lost("connection closed by the server during the handshake (EOF)")
                break
            link.conn.receive_data(bytes(data), _now_ms())
            link._dispatch()
            await link.flush()
    link._check_open()


def tls_context(uri: AmqpUri) -> ssl.SSLContext:
    """The client TLS context of an amqps URI (files read now: a missing one is an OSError)."""
    context = ssl.create_default_context(cafile=uri.cacertfile or None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if uri.verify == "verify_none":
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif uri.tls_server_name is None:
        context.check_hostname = False  # (server_name_indication=disable: the chain is still verified)
    if uri.certfile:
        context.load_cert_chain(uri.certfile, uri.keyfile or None)
    return context


async def _connect(uri: AmqpUri) -> trio.abc.Stream:
    """A TCP stream, with TLS on it for amqps (handshake done), under the URI's connection timeout."""
    with trio.fail_after(uri.connection_timeout_ms / 1000):
        tcp = await trio.open_tcp_stream(uri.host, uri.port)
        if not uri.tls:
            return tcp
        try:
            stream = trio.SSLStream(tcp, tls_context(uri), server_hostname=uri.tls_server_name)
            await stream.do_handshake()
        except BaseException as exc:
            with trio.CancelScope(shield=True):
                await tcp.aclose()
            if isinstance(exc, trio.BrokenResourceError):
                cause = exc.__cause__ or exc
                raise OSError(f"TLS handshake with {uri.host}:{uri.port} failed: {cause}") from None
            raise
        return stream


@asynccontextmanager
async def open_link(uri: AmqpUri, connection_name: str = "") -> AsyncIterator[LinkConnection]:
    """Connect and handshake (LinkClosed on refusal, OSError/trio.TooSlowError when unreachable), yield the
    connection, close it on exit. An exception of the body comes out as itself, not inside an exception group."""
    settings = ClientSettings(username=uri.username, password=uri.password, vhost=uri.vhost,
                              heartbeat_s=uri.heartbeat_s, frame_max=uri.frame_max, channel_max=uri.channel_max,
                              connection_name=connection_name)
    timeout_s = uri.connection_timeout_ms / 1000
    stream = await _connect(uri)
    link = LinkConnection(stream, ClientConnection(settings, _now_ms()))
    try:
        await _handshake(link, timeout_s)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(link._reader)
                nursery.start_soon(link._timer)
                try:
                    yield link
                finally:
                    with trio.CancelScope(shield=True):
                        await link.aclose()
                    nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            single = _single(group)
            if single is None:
                raise
            raise single from None
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(1):
            await stream.aclose()
