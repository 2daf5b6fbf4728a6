"""A small blocking AMQP 0-9-1 client for setting up benchmarks: handshake, channels and synchronous methods.

It is used for everything that is not the hot path: the control connection that declares and deletes queues,
exchanges and bindings, and the setup phase of each load-generator process (open channels, confirm.select,
basic.qos, basic.consume). The hot loops in `bench.loadgen` then take over the raw socket (`BenchConnection.sock`).
A server-sent channel.close or connection.close surfaces as `ProtocolError` with the reply code and text.
"""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass

from bench import frames
from bench.frames import Frame, FrameBuffer, ProtocolError

RECV_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where a broker listens and how to log in."""

    host: str
    port: int
    username: str = "guest"
    password: str = "guest"
    vhost: str = "/"
    tls_ca: str = ""  # amqps: the CA file the broker's certificate is checked with ("" = plain AMQP)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def parse_target(text: str) -> Endpoint:
    """`host:port` (port defaults to 5672)."""
    host, _, port = text.rpartition(":")
    if not host:
        return Endpoint(text, 5672)
    return Endpoint(host, int(port))


class BenchConnection:
    """One AMQP connection with a blocking socket; methods are synchronous (send, then wait for the reply)."""

    def __init__(self, endpoint: Endpoint, timeout_s: float = 30.0) -> None:
        self.endpoint = endpoint
        self.sock = socket.create_connection((endpoint.host, endpoint.port), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if endpoint.tls_ca:  # an ssl.SSLSocket from here on (bench.loadgen reads it without MSG_DONTWAIT)
            context = ssl.create_default_context(cafile=endpoint.tls_ca)
            self.sock = context.wrap_socket(self.sock, server_hostname=endpoint.host)
        self.buffer = FrameBuffer()
        self.pending: list[Frame] = []
        self.frame_max = 131072
        self._handshake()

    def _handshake(self) -> None:
        self.sock.sendall(frames.PROTOCOL_HEADER)
        self.wait_method(0, frames.CONNECTION_START)
        self.sock.sendall(frames.connection_start_ok(self.endpoint.username, self.endpoint.password))
        tune = self.wait_method(0, frames.CONNECTION_TUNE)
        channel_max, frame_max, _ = frames.parse_tune(tune.payload)
        self.channel_max = channel_max or 2047
        self.frame_max = min(frame_max or 131072, 131072)
        # heartbeat 0: the benchmark's processes are busy in tight loops and their runs are short.
        self.sock.sendall(frames.connection_tune_ok(self.channel_max, self.frame_max, 0))
        self.sock.sendall(frames.connection_open(self.endpoint.vhost))
        self.wait_method(0, frames.CONNECTION_OPEN_OK)

    def _read_more(self) -> None:
        data = self.sock.recv(RECV_BYTES)
        if not data:
            raise ProtocolError(f"{self.endpoint.address} closed the connection")
        self.buffer.feed(data)
        self.pending.extend(self.buffer.frames())

    def _next_frame(self) -> Frame:
        while not self.pending:
            self._read_more()
        return self.pending.pop(0)

    def next_frame(self) -> Frame:
        """The next frame in arrival order, whatever it is (blocks up to the socket's timeout: TimeoutError)."""
        return self._next_frame()

    def wait_method(self, channel: int, expected: tuple[int, int]) -> Frame:
        """Read until the expected method arrives on `channel`. Other frames stay in `pending` in arrival order
        (replies on other channels, early deliveries), except a close, which raises `ProtocolError`."""
        scanned = 0
        while True:
            while scanned < len(self.pending):
                received = self.pending[scanned]
                if received.frame_type == frames.FRAME_METHOD:
                    self._raise_on_close(received)
                    if received.channel == channel and received.method_id == expected:
                        del self.pending[scanned]
                        return received
                scanned += 1
            self._read_more()

    def _raise_on_close(self, received: Frame) -> None:
        method_id = received.method_id
        if method_id == frames.CONNECTION_CLOSE:
            code, text = frames.parse_close(received.payload)
            self.sock.sendall(frames.connection_close_ok())
            raise ProtocolError(f"connection closed by server: {code} {text}")
        if method_id == frames.CHANNEL_CLOSE:
            code, text = frames.parse_close(received.payload)
            self.sock.sendall(frames.channel_close_ok(received.channel))
            raise ProtocolError(f"channel {received.channel} closed by server: {code} {text}")

    def call(self, channel: int, request: bytes, expected: tuple[int, int]) -> Frame:
        self.sock.sendall(request)
        return self.wait_method(channel, expected)

    def call_many(self, channel: int, requests: list[bytes], expected: tuple[int, int]) -> None:
        """Pipeline requests on one channel and wait for all their replies (replies come in order)."""
        for start in range(0, len(requests), 100):
            chunk = requests[start : start + 100]
            self.sock.sendall(b"".join(chunk))
            for _ in chunk:
                self.wait_method(channel, expected)

    def open_channel(self, channel: int) -> None:
        self.call(channel, frames.channel_open(channel), frames.CHANNEL_OPEN_OK)

    def open_channels(self, channels: list[int]) -> None:
        self.sock.sendall(b"".join(frames.channel_open(channel) for channel in channels))
        for channel in channels:
            self.wait_method(channel, frames.CHANNEL_OPEN_OK)

    def close(self, timeout_s: float = 2.0) -> None:
        """Best-effort graceful close: connection.close, wait briefly for close-ok, then drop the socket."""
        try:
            self.sock.settimeout(timeout_s)
            self.sock.sendall(frames.connection_close())
            self.pending.clear()
            while True:
                received = self._next_frame()
                if received.frame_type == frames.FRAME_METHOD and received.method_id == frames.CONNECTION_CLOSE_OK:
                    break
        except (OSError, ProtocolError):
            pass
        finally:
            self.sock.close()


def probe(endpoint: Endpoint, timeout_s: float = 2.0) -> bool:
    """True when a full AMQP handshake succeeds (the broker is up and serving)."""
    try:
        connection = BenchConnection(endpoint, timeout_s=timeout_s)
    except (OSError, ProtocolError):
        return False
    connection.close(timeout_s)
    return True
