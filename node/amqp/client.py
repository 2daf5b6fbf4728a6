"""ClientConnection: the sans-I/O client side of one AMQP 0-9-1 connection, for links (shovels, federation).

Feed bytes with `receive_data(data, now_ms)`, collect `next_events()`, drain `data_to_send()`, call `tick(now_ms)`
by `next_deadline_ms()`. The runtime (cluster/link/client.py) owns the socket and the waiting; this class owns the
protocol: the handshake (PLAIN only), channel numbers, content assembly of deliveries and returns, publisher
confirm sequence numbers, heartbeats and the close handshakes.

States: AWAIT_START (protocol header sent) -> AWAIT_TUNE (Start-Ok sent) -> AWAIT_OPEN_OK (Tune-Ok and Open sent)
-> OPEN -> CLOSING (we sent Connection.Close) -> CLOSED. A server's Connection.Close at any point is answered with
Close-Ok and ends the connection with `Closed(code, text, by_server=True)`; RabbitMQ closes with 403 on a refused
login (we advertise `authentication_failure_close`) and 530 on a vhost we may not open. Channel.Close from the
server is answered with Close-Ok and reported as `ChannelClosed(by_server=True)`.

Heartbeats: the heartbeat is the lower non-zero of ours and the server's (0 only when both are 0), as pika and
RabbitMQ's Erlang client pick it. A heartbeat frame goes out when nothing was sent for heartbeat/2; when nothing
was received for 2 x heartbeat the connection ends with `Closed(501, "missed heartbeats from server")` (the
runtime then drops the socket).

Confirms: `confirm_select(channel)` switches the channel's publish counter on; `publish` then returns the
publish's sequence number (1, 2, ...), which the server's Basic.Ack / Basic.Nack (reported as `MethodIn`) refer to.
Errors in what the server sends (undecodable frames, content out of order) end the connection with
`Closed(code, text)` after sending Connection.Close, as a client library would.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Final

from node.amqp import methods as m
from node.amqp.codec import (
    DecodeError,
    UnknownMethodError,
    decode_method,
    encode_content_frames,
    encode_method_frame,
)
from node.amqp.framer import Framer
from node.amqp.properties import BasicProperties, decode_content_header
from node.amqp.spec import (
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    HEARTBEAT_FRAME,
    PROTOCOL_HEADER,
    ReplyCode,
)

CLIENT_CAPABILITIES: Final = {
    "publisher_confirms": True, "consumer_cancel_notify": True, "basic.nack": True, "connection.blocked": True,
    "authentication_failure_close": True, "exchange_exchange_bindings": True, "per_consumer_qos": True,
}


class ClientState(Enum):
    AWAIT_START = "await_start"
    AWAIT_TUNE = "await_tune"
    AWAIT_OPEN_OK = "await_open_ok"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


# ---------------------------------------------------------------- events
@dataclass(frozen=True, slots=True)
class Opened:
    """The handshake is done: channels may be opened."""

    server_properties: dict[str, Any]
    channel_max: int
    frame_max: int
    heartbeat_s: int


@dataclass(frozen=True, slots=True)
class ChannelReady:
    channel: int


@dataclass(frozen=True, slots=True)
class MethodIn:
    """A method from the server on an open channel (a synchronous reply, Basic.Ack/Nack of a confirm, Basic.Cancel
    of a consumer, Channel.Flow) or Connection.Blocked/Unblocked on channel 0."""

    channel: int
    method: m.Method


@dataclass(frozen=True, slots=True)
class ContentIn:
    """A complete Basic.Deliver, Basic.Return or Basic.GetOk with its properties and body."""

    channel: int
    method: m.BasicDeliver | m.BasicReturn | m.BasicGetOk
    properties: BasicProperties
    body: bytes


@dataclass(frozen=True, slots=True)
class ChannelClosed:
    channel: int
    reply_code: int
    reply_text: str
    by_server: bool


@dataclass(frozen=True, slots=True)
class Closed:
    """The connection is over: flush `data_to_send()` and close the socket."""

    reply_code: int
    reply_text: str
    by_server: bool


ClientEvent = Opened | ChannelReady | MethodIn | ContentIn | ChannelClosed | Closed


@dataclass(slots=True)
class _Channel:
    open: bool = False
    closing: bool = False
    confirming: bool = False
    next_seq: int = 1
    content: m.BasicDeliver | m.BasicReturn | m.BasicGetOk | None = None
    properties: BasicProperties | None = None
    body_size: int = 0
    body: list[bytes] = field(default_factory=list)
    received: int = 0


class ClientError(Exception):
    """A call that the connection's state does not allow (a programming error of the caller)."""


@dataclass(frozen=True, slots=True)
class ClientSettings:
    username: str = "guest"
    password: str = "guest"
    vhost: str = "/"
    heartbeat_s: int = 60
    frame_max: int = 131072
    channel_max: int = 2047
    connection_name: str = ""
    product: str = "raftmq-link"


class ClientConnection:
    """One connection to a broker, client side. Never raises on what the server sends."""

    def __init__(self, settings: ClientSettings, now_ms: int = 0) -> None:
        self.settings = settings
        self.state = ClientState.AWAIT_START
        self.frame_max = settings.frame_max
        self.channel_max = settings.channel_max
        self.heartbeat_s = 0
        self.server_properties: dict[str, Any] = {}
        self.blocked = False
        self._framer = Framer(max(settings.frame_max, 131072), expect_protocol_header=False)
        self._channels: dict[int, _Channel] = {}
        self._events: list[ClientEvent] = []
        self._out: list[bytes] = [PROTOCOL_HEADER]
        self._last_recv_ms = now_ms
        self._last_send_ms = now_ms

    # ------------------------------------------------------------ runtime side
    @property
    def closed(self) -> bool:
        return self.state is ClientState.CLOSED

    def receive_data(self, data: bytes, now_ms: int) -> None:
        if self.closed or not data:
            return
        self._last_recv_ms = now_ms
        frames, error = self._framer.feed(data)
        for frame_type, channel, payload in frames:
            try:
                self._frame(frame_type, channel, payload)
            except (DecodeError, UnknownMethodError) as exc:
                self._fail(ReplyCode.FRAME_ERROR, f"cannot decode a frame from the server: {exc}")
            if self.closed:
                return
        if error is not None:
            self._fail(ReplyCode.FRAME_ERROR, f"framing error from the server: {error}")

    def connection_lost(self, reason: str) -> None:
        """The socket ended (EOF or an error) before the close handshake finished."""
        if not self.closed:
            self._finish(ReplyCode.CONNECTION_FORCED, reason, by_server=True)

    def next_events(self) -> list[ClientEvent]:
        events, self._events = self._events, []
        return events

    def data_to_send(self) -> bytes:
        if not self._out:
            return b""
        data = b"".join(self._out)
        self._out = []
        return data

    def next_deadline_ms(self) -> int | None:
        if self.heartbeat_s <= 0 or self.closed:
            return None
        half = self.heartbeat_s * 500
        return min(self._last_send_ms + half, self._last_recv_ms + 4 * half)

    def tick(self, now_ms: int) -> None:
        if self.heartbeat_s <= 0 or self.closed:
            return
        if now_ms - self._last_recv_ms >= self.heartbeat_s * 2000:
            self._finish(ReplyCode.FRAME_ERROR, f"missed heartbeats from server, timeout: {self.heartbeat_s}s",
                         by_server=False)
            return
        if now_ms - self._last_send_ms >= self.heartbeat_s * 500:
            self._write(HEARTBEAT_FRAME, now_ms)

    # ------------------------------------------------------------ caller side
    def open_channel(self, now_ms: int = 0) -> int:
        """Send Channel.Open on the lowest free number; `ChannelReady(n)` follows on Open-Ok."""
        self._require_open()
        for number in range(1, self.channel_max + 1):
            if number not in self._channels:
                self._channels[number] = _Channel()
                self._write(encode_method_frame(number, m.ChannelOpen()), now_ms)
                return number
        raise ClientError(f"all {self.channel_max} channels are in use")

    def send_method(self, channel: int, method: m.Method, now_ms: int = 0) -> None:
        """Any method without content on an open channel (declare, qos, consume, ack, nack, cancel, ...)."""
        ch = self._open_channel(channel)
        if isinstance(method, m.ConfirmSelect):
            ch.confirming = True
        self._write(encode_method_frame(channel, method), now_ms)

    def publish(self, channel: int, exchange: str, routing_key: str, properties: BasicProperties, body: bytes,
                mandatory: bool = False, now_ms: int = 0) -> int:
        """Basic.Publish with its content; the confirm sequence number (0 when the channel does not confirm)."""
        ch = self._open_channel(channel)
        method = m.BasicPublish(exchange=exchange, routing_key=routing_key, mandatory=mandatory)
        self._write(encode_content_frames(channel, method, properties, body, self.frame_max), now_ms)
        if not ch.confirming:
            return 0
        seq = ch.next_seq
        ch.next_seq += 1
        return seq

    def close_channel(self, channel: int, now_ms: int = 0) -> None:
        ch = self._open_channel(channel)
        ch.closing = True
        self._write(encode_method_frame(channel, m.ChannelClose(ReplyCode.REPLY_SUCCESS, "Goodbye")), now_ms)

    def close(self, reply_code: int = ReplyCode.REPLY_SUCCESS, reply_text: str = "Goodbye", now_ms: int = 0) -> None:
        """Start the close handshake (`Closed` follows on Close-Ok); a connection not yet open just ends."""
        if self.state is ClientState.OPEN:
            self.state = ClientState.CLOSING
            self._write(encode_method_frame(0, m.ConnectionClose(reply_code, reply_text, 0, 0)), now_ms)
        elif self.state is not ClientState.CLOSING and not self.closed:
            self._finish(reply_code, reply_text, by_server=False)

    # ------------------------------------------------------------ internals
    def _require_open(self) -> None:
        if self.state is not ClientState.OPEN:
            raise ClientError(f"the connection is {self.state.value}, not open")

    def _open_channel(self, channel: int) -> _Channel:
        self._require_open()
        ch = self._channels.get(channel)
        if ch is None or not ch.open or ch.closing:
            raise ClientError(f"channel {channel} is not open")
        return ch

    def _write(self, data: bytes, now_ms: int | None = None) -> None:
        self._out.append(data)
        if now_ms is not None:
            self._last_send_ms = max(self._last_send_ms, now_ms)

    def _finish(self, code: int, text: str, by_server: bool) -> None:
        self.state = ClientState.CLOSED
        self._channels.clear()
        self._events.append(Closed(code, text, by_server))

    def _fail(self, code: int, text: str) -> None:
        """A protocol error of the server: send Connection.Close (when open) and end at once."""
        if self.state in (ClientState.OPEN, ClientState.AWAIT_OPEN_OK):
            self._write(encode_method_frame(0, m.ConnectionClose(code, text[:255], 0, 0)))
        self._finish(code, text, by_server=False)

    def _frame(self, frame_type: int, channel: int, payload: bytes) -> None:
        if frame_type == FRAME_HEARTBEAT:
            return
        if frame_type == FRAME_METHOD:
            method = decode_method(payload)
            if channel == 0:
                self._connection_method(method)
            else:
                self._channel_method(channel, method)
            return
        ch = self._channels.get(channel)
        if ch is None or ch.content is None:
            self._fail(ReplyCode.UNEXPECTED_FRAME, f"content frame on channel {channel} without a method")
            return
        if frame_type == FRAME_HEADER and ch.properties is None:
            _cls, ch.body_size, ch.properties = decode_content_header(payload)
        elif frame_type == FRAME_BODY and ch.properties is not None:
            ch.body.append(payload)
            ch.received += len(payload)
            if ch.received > ch.body_size:
                self._fail(ReplyCode.FRAME_ERROR, "content body longer than its header announced")
                return
        else:
            self._fail(ReplyCode.UNEXPECTED_FRAME, f"unexpected frame type {frame_type} on channel {channel}")
            return
        if ch.received == ch.body_size:
            self._events.append(ContentIn(channel, ch.content, ch.properties, b"".join(ch.body)))
            ch.content, ch.properties, ch.body, ch.body_size, ch.received = None, None, [], 0, 0

    def _connection_method(self, method: m.Method) -> None:
        state = self.state
        if isinstance(method, m.ConnectionClose):
            self._write(encode_method_frame(0, m.ConnectionCloseOk()))
            self._finish(method.reply_code, method.reply_text, by_server=True)
        elif isinstance(method, m.ConnectionCloseOk) and state is ClientState.CLOSING:
            self._finish(ReplyCode.REPLY_SUCCESS, "closed", by_server=False)
        elif isinstance(method, m.ConnectionStart) and state is ClientState.AWAIT_START:
            self._start(method)
        elif isinstance(method, m.ConnectionTune) and state is ClientState.AWAIT_TUNE:
            self._tune(method)
        elif isinstance(method, m.ConnectionOpenOk) and state is ClientState.AWAIT_OPEN_OK:
            self.state = ClientState.OPEN
            self._events.append(Opened(self.server_properties, self.channel_max, self.frame_max, self.heartbeat_s))
        elif isinstance(method, (m.ConnectionBlocked, m.ConnectionUnblocked)) and state is ClientState.OPEN:
            self.blocked = isinstance(method, m.ConnectionBlocked)
            self._events.append(MethodIn(0, method))
        elif state is not ClientState.CLOSING:
            self._fail(ReplyCode.COMMAND_INVALID, f"unexpected {method.NAME} on channel 0 in state {state.value}")

    def _start(self, start: m.ConnectionStart) -> None:
        self.server_properties = dict(start.server_properties)
        if "PLAIN" not in start.mechanisms.split():
            self._finish(ReplyCode.ACCESS_REFUSED, f"the server offers no PLAIN login: {start.mechanisms!r}",
                         by_server=False)
            return
        s = self.settings
        props: dict[str, Any] = {"product": s.product, "platform": "Python", "capabilities": CLIENT_CAPABILITIES}
        if s.connection_name:
            props["connection_name"] = s.connection_name
        response = b"\x00" + s.username.encode() + b"\x00" + s.password.encode()
        self._write(encode_method_frame(0, m.ConnectionStartOk(props, "PLAIN", response, "en_US")))
        self.state = ClientState.AWAIT_TUNE

    def _tune(self, tune: m.ConnectionTune) -> None:
        s = self.settings
        self.channel_max = _lower_nonzero(s.channel_max, tune.channel_max) or 65535
        self.frame_max = _lower_nonzero(s.frame_max, tune.frame_max) or 131072
        self.heartbeat_s = _lower_nonzero(s.heartbeat_s, tune.heartbeat)
        self._write(encode_method_frame(0, m.ConnectionTuneOk(self.channel_max, self.frame_max, self.heartbeat_s)))
        self._write(encode_method_frame(0, m.ConnectionOpen(s.vhost)))
        self.state = ClientState.AWAIT_OPEN_OK

    def _channel_method(self, channel: int, method: m.Method) -> None:
        ch = self._channels.get(channel)
        if ch is None:
            self._fail(ReplyCode.CHANNEL_ERROR, f"{method.NAME} on channel {channel}, which is not open")
            return
        if isinstance(method, m.ChannelClose):
            self._write(encode_method_frame(channel, m.ChannelCloseOk()))
            del self._channels[channel]
            self._events.append(ChannelClosed(channel, method.reply_code, method.reply_text, by_server=True))
        elif isinstance(method, m.ChannelCloseOk):
            del self._channels[channel]
            self._events.append(ChannelClosed(channel, ReplyCode.REPLY_SUCCESS, "closed", by_server=False))
        elif ch.closing:
            return  # after our Close, everything but Close/Close-Ok is dropped (spec 4.2.4)
        elif isinstance(method, m.ChannelOpenOk):
            ch.open = True
            self._events.append(ChannelReady(channel))
        elif isinstance(method, (m.BasicDeliver, m.BasicReturn, m.BasicGetOk)):
            if ch.content is not None:
                self._fail(ReplyCode.UNEXPECTED_FRAME, f"{method.NAME} on channel {channel} inside a content")
                return
            ch.content = method
        elif isinstance(method, m.ChannelFlow):
            self._write(encode_method_frame(channel, m.ChannelFlowOk(method.active)))
            self._events.append(MethodIn(channel, method))
        else:
            self._events.append(MethodIn(channel, method))


def _lower_nonzero(ours: int, theirs: int) -> int:
    if ours and theirs:
        return min(ours, theirs)
    return ours or theirs
