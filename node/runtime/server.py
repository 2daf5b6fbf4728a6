"""The trio server of one node: listeners, one task tree per connection, node timers and graceful shutdown.

Nursery tree (after hypercorn): `serve` opens the node nursery with the signal watcher, the broker timer, the
resource probe and the storage commit loop; inside it the server nursery holds the accept loop and a handler
nursery with one child nursery per connection (a reader task and a writer task).

The reader owns its connection's protocol core (`ServerConnection`): it reads under a deadline taken from the
core's `next_deadline_ms` (heartbeats) or the handshake timeout, feeds `receive_data`, and calls `dispatch`. The
writer drains the bytes `dispatch` collected and writes them under a lock with a shielded, time-bounded
`send_all`, so cancellation never leaves half a frame on the wire. `dispatch` (node/runtime/dispatch.py) is the only
place events meet the broker: it passes each event to `Broker.handle` and carries out the returned effects on the
connection named by their `conn_id` (which may be another connection: deliveries), repeating until no connection
has events left.
All of this runs on the trio thread, so the broker needs no locks. Output per connection is bounded: above
`output_buffer_high_bytes` the broker is told the connection is not writable (it stops delivering to it) and
below `output_buffer_low_bytes` it is told again that it is. A connection the broker blocked (a publisher during
a memory or disk alarm) is not read until the alarm clears, as in RabbitMQ, so a client that ignores
connection.blocked cannot push more data into the node. Credit flow (as RabbitMQ's between readers and queues):
after a read, a publisher whose target queue is behind its draining consumers (`Broker.publish_flow_behind`) is not
read again until the queue caught up, as long as the backlog keeps going down (at most `FLOW_PAUSE_MAX_S`); a pause
in which it stopped going down for `FLOW_STALL_S` (the consumer, not the node, is slow) turns pausing off for that
connection for `FLOW_QUIET_S`. Without it a publisher's read (a whole read of small publishes) outweighs a
consumer's (acks that free at most its prefetch), so the queue grows without bound while the consumer waits for
turns (docs/benchmarks.md, "Publishes starving deliveries: credit flow").
In cluster mode the broker decides instead (`node/broker/credit_flow.py`, which also counts the publishes still on
their way through Raft): its `PauseReading` effect stops reading a connection until `ResumeReading`; heartbeats
keep flowing to the client and the core does not count the peer's silence meanwhile (`hold_reading`). Also in
cluster mode a refused login or vhost is held by the core until the node caught up with the metadata (`_recheck`,
docs/management.md "AMQP logins too").

PROXY protocol (docs/configuration.md): on a listener with it on (`proxy_protocol` for `port`, or the extra
`proxy_protocol_port` listener) `handle_connection` first reads the PROXY v1/v2 header (node/amqp/proxy_protocol.py)
within the handshake timeout and registers the connection with the client address it names (loopback-only users,
listings, logs), feeding the bytes that followed the header to the core; a connection without a valid header is
closed, logged and counted (`proxy_refused`) before the broker ever hears of it.

TLS (amqps, docs/configuration.md): the `ssl_port` listener wraps each accepted stream in a `trio.SSLStream` with
the context of node/runtime/tls.py and completes the TLS handshake within the handshake timeout before the AMQP
protocol header is read; a failed, late or abandoned handshake (a plain AMQP client, an untrusted or missing client
certificate) closes that connection only, logged and counted (`tls_refused`). With `ssl_cert_login` a verified client
certificate's login name is handed to the core, which then offers EXTERNAL. On an amqps listener with the PROXY
protocol (`ssl_port` with `proxy_protocol`, or the extra `ssl_proxy_protocol_port`: HAProxy's TLS passthrough) the
PROXY header comes first, in the clear; the bytes read after it (the start of the ClientHello) are handed to the TLS
layer ahead of the socket's (`PrefixedStream`, node/runtime/tls.py).

Reads are at most RECEIVE_SIZE_BYTES (32 KiB, ~190 small publishes): one read is handled in one go on the trio
thread, so its size bounds how long every other connection waits for a turn (deliveries sit in the consumer's
output until its writer runs). In cluster mode reads stay at REPLICATED_RECEIVE_SIZE_BYTES: there a read's
publishes to a queue become one Raft entry (EnqueueMany), so smaller reads would make more, smaller entries. The
measurements behind both sizes are in docs/benchmarks.md ("Socket read sizes").
"""

from __future__ import annotations

import errno
import logging
import signal
import ssl
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, cast

import trio

from node.amqp.connection import ConnectionLimits, ServerConnection, reply_text
from node.amqp.events import ConnectionClosed
from node.amqp.methods import ConnectionCloseOk
from node.amqp.proxy_protocol import V2_BYTES_MAX, ProxyHeader, ProxyProtocolError, parse_proxy_header
from node.amqp.spec import ReplyCode
from node.broker.effects import HoldCloseOk, PageIn, PauseReading, ResumeReading, SendCloseOk
from node.runtime.config import NodeConfig
from node.runtime.dispatch import Connection, Dispatcher, mono_ms, wall_ms
from node.runtime.hot_path_gc import hot_path_gc
from node.runtime.probes import ResourceProbe
from node.runtime.store import Store
from node.runtime.tls import PrefixedStream, certificate_login, server_context, tls_handshake

log = logging.getLogger("raftmq.node")

RECEIVE_SIZE_BYTES = 32 * 1024  # per read: bounds one connection's turn (see the module docstring)
REPLICATED_RECEIVE_SIZE_BYTES = 256 * 1024  # cluster mode: a read's publishes are one Raft entry per queue
BLOCKED_POLL_S = 0.1  # how often a blocked connection looks whether its alarm cleared (and sends heartbeats)
BROKER_TICK_MS_MAX = 1_000
FLOW_POLL_S = 0.001  # how often a paused publisher looks whether its queues caught up
FLOW_PAUSE_MAX_S = 0.25  # longest pause of a publisher behind its queues, per read
FLOW_STALL_S = 0.05  # a pause ends when the backlog did not go down for this long (the consumer is slow)
FLOW_QUIET_S = 0.5  # after a stalled pause: no pauses for this long (a stalled consumer must not throttle)
SHUTDOWN_REPLY_TEXT = "broker forced connection closure with reason 'shutdown'"
PROXY_READ_BYTES = V2_BYTES_MAX  # reads while waiting for the PROXY header (what follows it goes to the core)
ACCEPT_CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})


def _is_loopback(host: str) -> bool:
    return host.startswith("127.") or host in ("::1", "localhost") or host.startswith("::ffff:127.")


def _peer_host(stream: trio.SocketStream) -> str:
    try:
        peer = stream.socket.getpeername()
    except OSError:
        return ""
    return str(peer[0]) if isinstance(peer, tuple) else str(peer)


class Node(Dispatcher):
    """One broker node: owns the broker, the store and every live connection."""

    def __init__(self, config: NodeConfig, broker: Any, store: Store | Any, probe: ResourceProbe) -> None:
        self.config = config
        self.broker = broker
        self.store = store
        self.probe = probe
        self.limits = ConnectionLimits(
            frame_max=config.frame_max,
            channel_max=config.channel_max,
            heartbeat_s=config.heartbeat_s,
            max_message_size=config.max_message_size_bytes,
            handshake_timeout_ms=config.handshake_timeout_ms,
        )
        self.connections: dict[int, Connection] = {}
        # Effects that are neither Persist nor for a connection (cluster mode: ProposeQueue), by exact type.
        self.effect_sinks: dict[type, Callable[[Any], None]] = {}
        pages = getattr(store, "pages", None)  # single-node paging (node/runtime/paging_io.py)
        if pages is not None:
            self.effect_sinks[PageIn] = pages.request
        self.next_conn_id = 1
        self.listeners: list[trio.SocketListener] = []
        self.bound_ports: list[int] = []
        self.ready = trio.Event()
        self.shutting_down = False
        self.all_closed = trio.Event()
        self.stop_requested = trio.Event()  # set by a signal or `request_stop`; starts the graceful shutdown
        self._dirty: deque[Connection] = deque()
        replicated = bool(getattr(getattr(broker, "config", None), "replicated", False))
        # Credit flow: a single node polls `publish_flow_behind` after each read; in cluster mode the broker decides
        # and says PauseReading / ResumeReading (node/broker/credit_flow.py).
        self._flow_behind: Callable[[int], int] | None = (
            None if replicated else getattr(broker, "publish_flow_behind", None))
        # Cluster mode (set by the cluster runtime): waits until this node has every definition committed before
        # the call; a refused login or vhost is asked again after it (`_recheck`).
        self.catch_up_definitions: Callable[[], Awaitable[bool]] | None = None
        self.effect_sinks[PauseReading] = self._pause_reading
        self.effect_sinks[ResumeReading] = self._resume_reading
        self.effect_sinks[HoldCloseOk] = self._hold_close_ok
        self.effect_sinks[SendCloseOk] = self._send_close_ok
        self.receive_size_bytes = REPLICATED_RECEIVE_SIZE_BYTES if replicated else RECEIVE_SIZE_BYTES
        self.flow_pauses = 0  # credit flow: publisher reads held back, and those that stalled
        self.flow_pauses_stalled = 0
        self.proxy_refused = 0  # connections refused on a PROXY protocol listener (no valid header in time)
        self.proxy_ports: list[int] = []  # bound ports of the PROXY-protocol-only listener (proxy_protocol_port)
        self.tls_refused = 0  # amqps connections whose TLS handshake failed or did not finish in time
        self.tls_ports: list[int] = []  # bound ports of the amqps listener (ssl_port)
        self.tls_proxy_ports: list[int] = []  # bound ports of the amqps PROXY listener (ssl_proxy_protocol_port)
        self.tls_context: ssl.SSLContext | None = (
            server_context(config) if config.ssl_port or config.ssl_proxy_protocol_port else None)
        self._server_scope: trio.CancelScope | None = None

    # ------------------------------------------------------------------------------------- connections
    async def handle_connection(self, stream: trio.SocketStream, proxy_protocol: bool = False,
                                tls: bool = False) -> None:
        """Serve one client connection; on a PROXY protocol listener, first read the header naming the client; on
        the amqps listener, first complete the TLS handshake."""
        host = _peer_host(stream)
        initial = b""
        conn_stream: trio.abc.Stream = stream
        identity: str | None = None
        if proxy_protocol:
            got = await self._read_proxy_header(stream, host)
            if got is None:
                with trio.CancelScope(shield=True), trio.move_on_after(1):
                    await stream.aclose()
                return
            header, initial = got
            if header.source is not None:
                log.debug("connection from %s:%d via proxy %s", header.source[0], header.source[1], host)
                host = header.source[0]
        if tls:
            transport: trio.abc.Stream = PrefixedStream(stream, initial) if initial else stream
            initial = b""
            ssl_stream = await self._tls_handshake(transport, host)
            if ssl_stream is None:
                with trio.CancelScope(shield=True), trio.move_on_after(1):
                    await stream.aclose()
                return
            conn_stream = ssl_stream
            if self.config.ssl_cert_login:
                identity = certificate_login(ssl_stream.getpeercert(binary_form=True),
                                             self.config.ssl_cert_login_from)
        conn_id = self.next_conn_id
        self.next_conn_id += 1
        core = ServerConnection(self.broker.authenticator_for(conn_id), self.limits, mono_ms(), identity)
        conn = Connection(conn_id, conn_stream, core)
        self.connections[conn_id] = conn
        self.broker.open_connection(conn_id, host, _is_loopback(host))
        try:
            async with trio.open_nursery() as nursery:
                conn.cancel_scope = nursery.cancel_scope
                nursery.start_soon(self._writer, conn)
                if initial:  # the client's first bytes came with the PROXY header
                    conn.core.receive_data(initial, mono_ms())
                    self._mark(conn)
                    self.dispatch_guarded(conn)
                await self._reader(conn)
                conn.finished = True
                conn.output_ready.set()
        finally:
            self._forget(conn)
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await conn_stream.aclose()  # (TLS: a close_notify first, without waiting for the peer's)
            if conn_stream is not stream:
                await trio.aclose_forcefully(stream)

    async def _tls_handshake(self, stream: trio.abc.Stream, peer: str) -> trio.SSLStream[trio.abc.Stream] | None:
        """The TLS stream once its handshake completed within the handshake timeout; None (the connection is
        refused: logged and counted) when it failed, was late or the peer hung up."""
        assert self.tls_context is not None
        ssl_stream, reason = await tls_handshake(stream, self.tls_context, self.config.handshake_timeout_ms)
        if ssl_stream is None:
            self.tls_refused += 1
            log.warning("amqps connection from %s refused: %s", peer or "?", reason)
        return ssl_stream

    async def _read_proxy_header(self, stream: trio.SocketStream, peer: str) -> tuple[ProxyHeader, bytes] | None:
        """The PROXY protocol header and the bytes that followed it, read within the handshake timeout; None (the
        connection is refused: logged and counted) when it is missing, malformed, late or the peer hung up."""
        data = b""
        reason = f"no PROXY protocol header within {self.config.handshake_timeout_ms} ms"
        with trio.move_on_after(self.config.handshake_timeout_ms / 1000):
            while True:
                try:
                    header = parse_proxy_header(data)
                except ProxyProtocolError as exc:
                    reason = str(exc)
                    break
                if header is not None:
                    return header, data[header.length:]
                try:
                    chunk = await stream.receive_some(PROXY_READ_BYTES)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                    reason = f"read failed before the end of the PROXY protocol header: {exc!r}"
                    break
                if not chunk:
                    reason = "closed before the end of the PROXY protocol header"
                    break
                data += chunk
        self.proxy_refused += 1
        log.warning("connection from %s refused: %s", peer or "?", reason)
        return None

    def _forget(self, conn: Connection) -> None:
        conn.finished = True
        if not conn.broker_told_closed:
            conn.broker_told_closed = True
            closed = ConnectionClosed(reply_code=int(ReplyCode.CONNECTION_FORCED), reply_text="connection lost")
            try:
                self.dispatch(self.broker.handle(conn.conn_id, closed, wall_ms()))
            except Exception:
                log.exception("connection %d: internal error while cleaning up", conn.conn_id)
                self._clear_dirty()
        self.connections.pop(conn.conn_id, None)
        if self.shutting_down and not self.connections:
            self.all_closed.set()

    def _read_timeout_s(self, conn: Connection) -> float:
        """Reads wait at most until the core's next deadline (heartbeats, handshake, close-ok)."""
        deadline = conn.core.next_deadline_ms()
        if deadline is None:
            return float("inf")
        return max(0, deadline - mono_ms()) / 1000.0

    async def _reader(self, conn: Connection) -> None:
        stream = conn.stream
        while not conn.finished:
            data = None
            with trio.move_on_after(self._read_timeout_s(conn)):
                try:
                    # (bytes from a SocketStream and from an SSLStream alike; typed bytes | bytearray)
                    data = cast(bytes, await stream.receive_some(self.receive_size_bytes))
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    return
                if not data:
                    return  # peer closed
            if data is None:
                conn.core.tick(mono_ms())
            else:
                if conn.core.blocked:  # blocked while this read was pending: hold its bytes (at most one read)
                    await self._wait_unblocked(conn)
                conn.core.receive_data(data, mono_ms())
            self._mark(conn)
            self.dispatch_guarded(conn)
            if conn.core.awaiting_recheck:
                await self._recheck(conn)
            if conn.core.blocked:
                await self._wait_unblocked(conn)
            if conn.read_paused:
                await self._wait_read_resumed(conn)
            elif self._flow_behind is not None:
                backlog = self._flow_behind(conn.conn_id)
                if backlog:
                    await self._wait_for_queues(conn, self._flow_behind, backlog)
        await self._wait_flushed(conn)

    async def _recheck(self, conn: Connection) -> None:
        """Cluster mode: the core holds a refused login or connection.open (the user, vhost or permission may be
        committed through another node and not applied here yet): ask again once this node caught up with the
        metadata (bounded by the cluster runtime); a refusal then is final."""
        catch_up = self.catch_up_definitions
        if catch_up is not None:
            await catch_up()
        conn.core.recheck(mono_ms())
        self._mark(conn)
        self.dispatch_guarded(conn)

    async def _wait_for_queues(self, conn: Connection, behind: Callable[[int], int], backlog: int) -> None:
        """Credit flow: hold a publisher's next read while a queue it published to is behind its consumers, so
        the consumers' reads and writes get the turns that publishes took. Bounded by FLOW_PAUSE_MAX_S; when the
        backlog stops going down for FLOW_STALL_S its consumers are slow, and pausing stops for FLOW_QUIET_S."""
        now_s = trio.current_time()
        if now_s < conn.flow_quiet_until_s:
            return
        self.flow_pauses += 1
        deadline_s = now_s + FLOW_PAUSE_MAX_S
        stall_s = now_s + FLOW_STALL_S
        while now_s < deadline_s:
            await trio.sleep(FLOW_POLL_S)
            if conn.finished or conn.core.blocked:
                return
            now_s = trio.current_time()
            current = behind(conn.conn_id)
            if not current:
                return
            if current < backlog:  # the consumers are draining it
                backlog = current
                stall_s = now_s + FLOW_STALL_S
            elif now_s >= stall_s:
                self.flow_pauses_stalled += 1
                conn.flow_quiet_until_s = now_s + FLOW_QUIET_S
                return

    def _hold_close_ok(self, effect: HoldCloseOk) -> None:
        """The client closed; the broker answers once the close's definition changes are committed (cluster
        mode: its exclusive queues' deletion): the connection stays until `SendCloseOk` (or the peer goes)."""
        conn = self.connections.get(effect.conn_id)
        if conn is not None:
            conn.close_ok_held = True

    def _send_close_ok(self, effect: SendCloseOk) -> None:
        conn = self.connections.get(effect.conn_id)
        if conn is None or conn.finished or not conn.close_ok_held:
            return
        conn.close_ok_held = False
        conn.core.send_method(0, ConnectionCloseOk())
        conn.finished = True
        self._mark(conn)

    def _pause_reading(self, effect: PauseReading) -> None:
        conn = self.connections.get(effect.conn_id)
        if conn is not None and not conn.read_paused:
            conn.read_paused = True
            conn.read_resumed = trio.Event()
            conn.core.hold_reading(True)

    def _resume_reading(self, effect: ResumeReading) -> None:
        conn = self.connections.get(effect.conn_id)
        if conn is not None and conn.read_paused:
            conn.read_paused = False
            conn.read_resumed.set()

    async def _wait_read_resumed(self, conn: Connection) -> None:
        """Credit flow in cluster mode: the broker paused this publisher (a queue it publishes to is behind) and
        resumes it once the queue caught up; heartbeats keep flowing to the client meanwhile."""
        self.flow_pauses += 1
        while conn.read_paused and not conn.finished:
            with trio.move_on_after(BLOCKED_POLL_S):
                await conn.read_resumed.wait()
            conn.core.tick(mono_ms())
            self._mark(conn)
            self.dispatch_guarded(conn)
        conn.core.hold_reading(False)

    async def _wait_unblocked(self, conn: Connection) -> None:
        """A blocked connection (a publisher during a resource alarm) is not read until the alarm clears, as in
        RabbitMQ: its publishes wait in the client and the kernel's socket buffer, not in our memory. Heartbeats
        keep flowing to the client; the core does not count the peer's silence while blocked."""
        while conn.core.blocked and not conn.finished:
            await trio.sleep(BLOCKED_POLL_S)
            conn.core.tick(mono_ms())
            self._mark(conn)
            self.dispatch_guarded(conn)

    async def _wait_flushed(self, conn: Connection) -> None:
        """After ConnectionClosed: give the writer a bounded time to flush close/close-ok."""
        with trio.move_on_after(self.config.write_timeout_ms / 1000):
            while conn.output:
                await trio.sleep(0.005)

    async def _writer(self, conn: Connection) -> None:
        write_timeout_s = self.config.write_timeout_ms / 1000
        while True:
            await conn.output_ready.wait()
            conn.output_ready = trio.Event()
            while conn.output:
                data = b"".join(conn.output) if len(conn.output) > 1 else conn.output[0]
                conn.output.clear()
                ok = await self._send(conn, data, write_timeout_s)
                if not ok:
                    if conn.cancel_scope is not None:
                        conn.cancel_scope.cancel()
                    return
                conn.output_bytes = max(0, conn.output_bytes - len(data))
                if conn.output_bytes <= self.config.output_buffer_low_bytes and not conn.finished:
                    # Also after every flush: the broker tops up its consumers' delivery credit here.
                    conn.writable = True
                    self.dispatch_guarded(conn, lambda: self.broker.set_writable(conn.conn_id, True))
            if conn.finished and not conn.output:
                return

    async def _send(self, conn: Connection, data: bytes, timeout_s: float) -> bool:
        """Write all of `data` or fail; shielded so a cancellation never cuts a frame in half."""
        sent = False
        async with conn.send_lock:
            with trio.CancelScope(shield=True), trio.move_on_after(timeout_s):
                try:
                    await conn.stream.send_all(data)
                    sent = True
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    pass
        return sent

    # ---------------------------------------------------------------------------------------- listeners
    async def _accept_loop(self, listener: trio.SocketListener, handlers: trio.Nursery,
                           proxy_protocol: bool = False, tls: bool = False) -> None:
        backoff_ms = 10
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if exc.errno in ACCEPT_CAPACITY_ERRNOS:
                    log.warning("accept: %s; backing off %d ms", exc, backoff_ms)
                    await trio.sleep(backoff_ms / 1000)
                    backoff_ms = min(backoff_ms * 2, self.config.accept_backoff_ms_max)
                    continue
                raise
            backoff_ms = 10
            if self.config.connection_max and len(self.connections) >= self.config.connection_max:
                log.warning("connection_max %d reached; refusing a connection", self.config.connection_max)
                await stream.aclose()
                continue
            handlers.start_soon(self.handle_connection, stream, proxy_protocol, tls)

    async def serve_connections(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        host = self.config.listen_address or None
        self.listeners = await trio.open_tcp_listeners(self.config.port, host=host)
        self.bound_ports = sorted({listener.socket.getsockname()[1] for listener in self.listeners})
        proxy_listeners: list[trio.SocketListener] = []
        if self.config.proxy_protocol_port:
            proxy_listeners = await trio.open_tcp_listeners(self.config.proxy_protocol_port, host=host)
            self.proxy_ports = sorted({listener.socket.getsockname()[1] for listener in proxy_listeners})
        tls_listeners: list[trio.SocketListener] = []
        if self.config.ssl_port:
            tls_listeners = await trio.open_tcp_listeners(self.config.ssl_port, host=host)
            self.tls_ports = sorted({listener.socket.getsockname()[1] for listener in tls_listeners})
        tls_proxy_listeners: list[trio.SocketListener] = []
        if self.config.ssl_proxy_protocol_port:
            tls_proxy_listeners = await trio.open_tcp_listeners(self.config.ssl_proxy_protocol_port, host=host)
            self.tls_proxy_ports = sorted({listener.socket.getsockname()[1] for listener in tls_proxy_listeners})
        main_proxy = self.config.proxy_protocol
        async with trio.open_nursery() as handlers:
            with trio.CancelScope() as accept_scope:
                self._server_scope = accept_scope
                async with trio.open_nursery() as acceptors:
                    for listener in self.listeners:
                        acceptors.start_soon(self._accept_loop, listener, handlers, main_proxy)
                    for listener in proxy_listeners:
                        acceptors.start_soon(self._accept_loop, listener, handlers, True)
                    for listener in tls_listeners:
                        acceptors.start_soon(self._accept_loop, listener, handlers, main_proxy, True)
                    for listener in tls_proxy_listeners:
                        acceptors.start_soon(self._accept_loop, listener, handlers, True, True)
                    self.ready.set()
                    task_status.started(self.bound_ports)
            for listener in [*self.listeners, *proxy_listeners, *tls_listeners, *tls_proxy_listeners]:
                await listener.aclose()
            await self._close_all_connections()
            handlers.cancel_scope.cancel()

    async def _close_all_connections(self) -> None:
        """Shutdown: close every connection with 320 and wait (bounded) for the clients to answer."""
        self.shutting_down = True
        if not self.connections:
            self.all_closed.set()
        for conn in list(self.connections.values()):
            if not conn.finished:
                conn.core.close_connection(
                    int(ReplyCode.CONNECTION_FORCED), reply_text(ReplyCode.CONNECTION_FORCED, SHUTDOWN_REPLY_TEXT))
                self._mark(conn)
        self.dispatch()
        with trio.move_on_after(self.config.shutdown_timeout_ms / 1000):
            await self.all_closed.wait()

    def request_stop(self) -> None:
        """Begin the graceful shutdown (what SIGTERM does)."""
        self.stop_requested.set()

    def stop_accepting(self) -> None:
        if self._server_scope is not None:
            self._server_scope.cancel()

    # ------------------------------------------------------------------------------------------ timers
    async def broker_timer(self) -> None:
        """Tick the broker when its next deadline (TTL, x-expires) is due, and at least once a second."""
        period_s = self.config.broker_tick_ms / 1000
        last_tick_ms = wall_ms()
        while True:
            await trio.sleep(period_s)
            now = wall_ms()
            deadline = self.broker.next_deadline_ms()
            if (deadline is not None and deadline <= now) or now - last_tick_ms >= BROKER_TICK_MS_MAX:
                last_tick_ms = now
                try:
                    self.dispatch(self.broker.tick(now))
                except Exception:
                    log.exception("broker tick failed")
                    self._clear_dirty()

    async def resource_watch(self) -> None:
        period_s = self.config.resource_probe_interval_ms / 1000
        while True:
            for kind, active in self.probe.changes():
                log.warning("alarm %s %s", kind, "set" if active else "cleared")
                self.dispatch(self.broker.set_alarm(kind, active))
            with trio.move_on_after(period_s):
                await self.probe.wait_forced_change()

    async def watch_signals(self) -> None:
        wanted = {signal.SIGTERM, signal.SIGINT}
        if self.config.test_signal_alarms:
            wanted |= {signal.SIGUSR1, signal.SIGUSR2}
        with trio.open_signal_receiver(*wanted) as signals:
            async for signum in signals:
                if signum == signal.SIGUSR1:
                    self.probe.toggle_forced("memory")
                elif signum == signal.SIGUSR2:
                    self.probe.toggle_forced("disk")
                elif self.stop_requested.is_set():
                    log.info("signal %s: already shutting down", signal.Signals(signum).name)
                else:
                    log.info("signal %s: shutting down", signal.Signals(signum).name)
                    self.request_stop()


async def run_node(node: Node, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Run the node until SIGTERM/SIGINT (or `node.request_stop()`), then shut down gracefully."""
    with hot_path_gc():
        await _run_node(node, task_status=task_status)


async def _run_node(node: Node, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(node.watch_signals)
        nursery.start_soon(node.broker_timer)
        nursery.start_soon(node.resource_watch)
        nursery.start_soon(node.store.commit_loop, node)
        pages = getattr(node.store, "pages", None)
        if pages is not None:  # recovered queues' first pages are in memory before the first client
            await pages.serve_once(node)
            nursery.start_soon(pages.run, node)
        async with trio.open_nursery() as server_nursery:
            ports = await server_nursery.start(node.serve_connections)
            task_status.started(ports)
            server_nursery.start_soon(_stop_when_requested, node)
        await node.store.flush()
        nursery.cancel_scope.cancel()


async def _stop_when_requested(node: Node) -> None:
    await node.stop_requested.wait()
    node.stop_accepting()
