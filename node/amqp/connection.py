"""ServerConnection: the sans-I/O server side of one AMQP 0-9-1 connection (model: h11/h2).

Feed bytes with `receive_data(data, now_ms)`, collect `next_events()`, drain `data_to_send()`, call `tick(now_ms)` by
`next_deadline_ms()`. The broker answers with `send_method`/`send_content`/`send_deliver`/`close_channel`/... .

States: AWAIT_HEADER -> STARTING (Start sent) -> TUNING (Tune sent) -> OPENING -> OPEN -> CLOSING (we sent
Connection.Close, waiting for Close-Ok) or CLOSE_RECEIVED (the client sent it: the broker answers with
`send_method(0, ConnectionCloseOk)` once it has handled what came before, so a channel's Close for an earlier
method goes out first, as RabbitMQ's reader waits for its channels) -> CLOSED. Errors follow RabbitMQ 3.x
(rabbit_reader / rabbit_channel / rabbit_command_assembler): before authentication completes, errors close the
socket without a Close frame (except 403 with the client's authentication_failure_close capability); later, hard
errors send Connection.Close and soft errors Channel.Close. A closing channel ignores everything but Close/Close-Ok (spec 4.2.4 / 2.3.5.2).
`ChannelClosed` is emitted once, as soon as the channel is gone for the broker (we sent Close, or the client did);
the broker answers the client's Close (`send_method(ChannelCloseOk)`) once it has handled what came before it, so
a Close of ours for an earlier method goes out first; crossing Closes each get a Close-Ok, and the number is free
once both are answered (rabbit_channel's `closing` state). Connection.Update-Secret checks the user again with the
new secret as its password.

Heartbeats: the heartbeat in the client's Tune-Ok is used as is (RabbitMQ does this; clients pick the lower
non-zero of theirs and ours). We send a heartbeat frame when nothing was sent for heartbeat/2; when nothing was
received for 2 x heartbeat we close the socket without a Close frame, as RabbitMQ does, emitting
ConnectionClosed(501, "missed heartbeats from client, timeout: Ns").

Bounds: the framer holds at most one partial frame (<= frame_max); a message body at most max_message_size
(checked against the header's body size before any body is buffered); events per receive_data call at most one per
frame; the output buffer at most `output_buffer_max_bytes` -- past it the peer is not reading and the connection is
aborted with ConnectionClosed(506). `output_buffer_bytes` lets the broker throttle deliveries well before that.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Final

from node.amqp import methods as m
from node.amqp.auth import EXTERNAL, MECHANISMS, Authenticator, parse_sasl_response, server_properties
from node.amqp.channel import ChannelAssembly
from node.amqp.codec import (
    DecodeError,
    UnknownMethodError,
    decode_method,
    decode_publish_cached,
    encode_ack_frame,
    encode_content_frames,
    encode_deliver_frames,
    encode_method_frame,
)
from node.amqp.errors import (
    ChannelProtocolError,
    ProtocolError,
    amqp_method_name,
    check_negotiated,
    reply_text,
    safe_text,
)
from node.amqp.events import (
    ChannelClosed,
    ChannelOpened,
    ConnectionClosed,
    ConnectionOpened,
    ContentReceived,
    Event,
    MethodReceived,
)
from node.amqp.framer import FRAME_HEADER_STRUCT as _FRAME_HEADER
from node.amqp.framer import BadProtocolHeader, Framer, RawFrame
from node.amqp.properties import BasicProperties
from node.amqp.spec import (
    CLASS_CONNECTION,
    FRAME_BODY,
    FRAME_END,
    FRAME_HEADER,
    FRAME_HEADER_SIZE,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_MIN_SIZE,
    HEARTBEAT_FRAME,
    PROTOCOL_HEADER,
    ReplyCode,
)

_new_tuple = tuple.__new__  # ContentReceived(...) without the Python-level __new__ (hot path)
_PUBLISH_KEY: Final = b"\x00\x3c\x00\x28"  # class 60 (basic), method 40 (publish)

__all__ = ["Authenticator", "ConnectionLimits", "ConnectionState", "ServerConnection", "reply_text"]


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    frame_max: int = 131072
    channel_max: int = 2047
    heartbeat_s: int = 60
    max_message_size: int = 128 * 1024 * 1024
    output_buffer_max_bytes: int = 256 * 1024 * 1024
    handshake_timeout_ms: int = 10_000
    close_ok_timeout_ms: int = 30_000
    product: str = "raftmq"
    version: str = "0.1.0"
    platform: str = "Python 3.11"
    cluster_name: str = ""  # sent as the `cluster_name` server property when set (federation's loop check)


class ConnectionState(Enum):
    AWAIT_HEADER = "await_header"
    STARTING = "starting"
    TUNING = "tuning"
    OPENING = "opening"
    OPEN = "open"
    CLOSING = "closing"
    CLOSE_RECEIVED = "close_received"  # the client sent Connection.Close; the broker answers it (Close-Ok)
    CLOSED = "closed"


_CLIENT_MAY_SEND_OK: Final = frozenset({m.ChannelFlowOk, m.ChannelCloseOk, m.BasicCancelOk})
_SERVER_ONLY: Final = frozenset(
    cls
    for cls in m.METHOD_CLASSES
    if (cls.NAME.endswith("Ok") and cls not in _CLIENT_MAY_SEND_OK)
    or cls in (m.BasicReturn, m.BasicDeliver, m.BasicGetEmpty)
)


class ServerConnection:
    """One client connection, server side. Never raises on bad input."""

    def __init__(self, authenticator: Authenticator, limits: ConnectionLimits | None = None, now_ms: int = 0,
                 external_identity: str | None = None):
        self.authenticator = authenticator
        # The login name of the client's verified TLS certificate (the runtime sets it on amqps with ssl_cert_login):
        # EXTERNAL is offered then, and logs in as this user (the client's SASL response is not used).
        self.external_identity = external_identity
        self.limits = limits or ConnectionLimits()
        self.state = ConnectionState.AWAIT_HEADER
        self.channel_max = self.limits.channel_max
        self.frame_max = self.limits.frame_max
        self.heartbeat_s = 0
        self.username = ""
        self.vhost = ""
        self.client_properties: dict[str, Any] = {}
        self.blocked = False
        self.reading_held = False  # the runtime does not read the socket (credit flow): silence is not counted
        self._blocked_reason = ""
        self._framer = Framer(self.limits.frame_max)
        self._channels: dict[int, ChannelAssembly] = {}
        self._events: list[Event] = []
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._now_ms = now_ms
        self._handshake_deadline_ms = now_ms + self.limits.handshake_timeout_ms
        self._close_deadline_ms: int | None = None
        self._last_recv_ms = now_ms
        self._last_send_ms = now_ms
        self._pending_close: tuple[int, str] = (0, "")

    # ------------------------------------------------------------ public API
    @property
    def closed(self) -> bool:
        return self.state is ConnectionState.CLOSED

    @property
    def output_buffer_bytes(self) -> int:
        return self._out_bytes

    @property
    def open_channels(self) -> frozenset[int]:
        return frozenset(n for n, ch in self._channels.items() if not ch.closing)

    def client_capability(self, name: str) -> bool:
        capabilities = self.client_properties.get("capabilities")
        return isinstance(capabilities, dict) and capabilities.get(name) is True

    def receive_data(self, data: bytes, now_ms: int) -> None:
        if self.state is ConnectionState.CLOSED or self.state is ConnectionState.CLOSE_RECEIVED or not data:
            return
        self._last_recv_ms = self._now_ms = now_ms
        framer = self._framer
        if self.state is ConnectionState.OPEN and framer.header_seen:
            buf = framer.take_buffer(data)
            if buf is not None:
                self._receive_open(buf, now_ms)
            return
        frames, error = framer.feed(data)
        if self.state is ConnectionState.AWAIT_HEADER and framer.header_seen:
            self._send_start()
        self._receive_frames(frames, error, now_ms)

    def _receive_frames(self, frames: list[RawFrame], error: Exception | None, now_ms: int) -> None:
        """Handle parsed frames, then the error that ended the stream after them (if any)."""
        if self.state is ConnectionState.OPEN:
            self._receive_frames_open(frames, now_ms)
        else:
            for frame_type, channel, payload in frames:
                self._handle_frame(frame_type, channel, payload, now_ms)
                if self.closed or self.state is ConnectionState.CLOSE_RECEIVED:
                    return
        if self.closed or self.state is ConnectionState.CLOSE_RECEIVED:  # nothing after the client's Close counts
            return
        if isinstance(error, BadProtocolHeader):
            self._write(PROTOCOL_HEADER)
            self._finish(
                ReplyCode.FRAME_ERROR, f"bad protocol header {error.received!r}, expected AMQP 0-9-1"
            )
        elif error is not None:
            # We have lost sync with the peer: send Close but do not wait for Close-Ok.
            self._fail(ProtocolError(ReplyCode.FRAME_ERROR, str(error)), now_ms)
            self._finish(ReplyCode.FRAME_ERROR, reply_text(ReplyCode.FRAME_ERROR, str(error)))

    def _receive_open(self, buf: bytes, now_ms: int) -> None:
        """The fused publish path of an open connection: a Basic.Publish whose content header repeats its channel's
        last one (checked already) and whose body is one frame is taken as one step from the buffer, with every
        framing check of `Framer._parse` on all three frames; all else (and every error) goes through
        `_receive_frames`, in order."""
        framer = self._framer
        frame_max = framer.frame_max_bytes
        end = len(buf)
        offset = 0
        pending: list[RawFrame] = []  # parsed frames not handled yet (handled before any fused publish)
        channels = self._channels
        events = self._events
        max_message_size = self.limits.max_message_size
        unpack = _FRAME_HEADER.unpack_from
        need = FRAME_HEADER_SIZE
        while end - offset >= FRAME_HEADER_SIZE:
            frame_type, channel, size = unpack(buf, offset)
            method_end = offset + FRAME_HEADER_SIZE + size
            if size > frame_max or (method_end < end and buf[method_end] != FRAME_END):
                frames: list[RawFrame] = []
                error, _ = framer.parse_frames(buf, offset, frames)  # reports it exactly as the framer does
                self._receive_frames(pending + frames, error, now_ms)
                return
            if method_end >= end:
                need = method_end + 1 - offset
                break
            if frame_type == FRAME_METHOD and channel and buf.startswith(_PUBLISH_KEY, offset + FRAME_HEADER_SIZE):
                head = method_end + 1
                if end - head >= FRAME_HEADER_SIZE:
                    header_type, header_channel, header_size = unpack(buf, head)
                    body = head + FRAME_HEADER_SIZE + header_size + 1
                    if (header_type == FRAME_HEADER and header_channel == channel and header_size <= frame_max
                            and end - body >= FRAME_HEADER_SIZE and buf[body - 1] == FRAME_END):
                        body_type, body_channel, body_size = unpack(buf, body)
                        body_end = body + FRAME_HEADER_SIZE + body_size
                        if (body_type == FRAME_BODY and body_channel == channel and body_size <= frame_max
                                and body_end < end and buf[body_end] == FRAME_END):
                            if pending:
                                self._receive_frames_open(pending, now_ms)
                                pending = []
                                if self.state is not ConnectionState.OPEN:
                                    break
                            ch = channels.get(channel)
                            if (ch is not None and not ch.closing and ch.publish is None and ch.properties is None
                                    and header_size == len(ch.last_header)
                                    and buf.startswith(ch.last_header, head + FRAME_HEADER_SIZE)):
                                last = ch.last_header_content
                                if last is not None and last[1] == body_size and 0 < body_size <= max_message_size:
                                    try:
                                        publish = decode_publish_cached(buf[offset + FRAME_HEADER_SIZE:method_end])
                                    except Exception:  # malformed: the general path decodes it again, reports it
                                        pass
                                    else:
                                        events.append(_new_tuple(ContentReceived, (
                                            channel, publish, last[0], buf[body + FRAME_HEADER_SIZE:body_end])))
                                        offset = body_end + 1
                                        continue
            pending.append((frame_type, channel, buf[offset + FRAME_HEADER_SIZE:method_end]))
            offset = method_end + 1
        if self.state is not ConnectionState.OPEN:  # closing or closed: the rest takes the general path
            frames = []
            error, _ = framer.parse_frames(buf, offset, frames)
            self._receive_frames(frames, error, now_ms)
            return
        framer.keep_rest(buf, offset, need)
        if pending:
            self._receive_frames_open(pending, now_ms)

    def _receive_frames_open(self, frames: list[RawFrame], now_ms: int) -> None:
        """The publish hot path: Basic.Publish method frames and body frames on an open channel are handled inline
        (no per-frame call chain); everything else, including every error, takes `_handle_frame`."""
        channels = self._channels
        events = self._events
        open_state = ConnectionState.OPEN
        max_message_size = self.limits.max_message_size
        for index, (frame_type, channel, payload) in enumerate(frames):
            ch = channels.get(channel) if channel else None
            if ch is not None and not ch.closing:
                if frame_type == FRAME_BODY:
                    properties = ch.properties
                    if properties is not None:
                        if len(payload) == ch.body_size and not ch.body_parts:  # the whole body in one frame
                            publish = ch.publish
                            ch.publish = ch.properties = None  # (take_content without the join)
                            ch.body_size = 0
                            events.append(_new_tuple(ContentReceived, (channel, publish, properties, payload)))
                            continue
                        received = ch.body_received + len(payload)
                        if received < ch.body_size:
                            ch.body_received = received
                            ch.body_parts.append(payload)
                            continue
                        if received == ch.body_size:
                            ch.body_received = received
                            ch.body_parts.append(payload)
                            publish, properties, body = ch.take_content()
                            events.append(_new_tuple(ContentReceived, (channel, publish, properties, body)))
                            continue
                elif frame_type == FRAME_HEADER and ch.publish is not None and ch.properties is None:
                    if payload == ch.last_header:  # the publisher repeats its last header: checked already
                        last = ch.last_header_content
                        if last is not None and 0 < last[1] <= max_message_size:
                            ch.properties, ch.body_size = last
                            continue
                    try:
                        content = ch.content_frame(FRAME_HEADER, payload, max_message_size)
                    except ProtocolError:
                        pass  # nothing was changed: the slow path raises it again and reports it
                    else:
                        if content is not None:
                            events.append(ContentReceived(channel, *content))
                        continue
                elif frame_type == FRAME_METHOD and ch.publish is None and payload[:4] == _PUBLISH_KEY:
                    try:
                        ch.publish = decode_publish_cached(payload)
                        continue
                    except Exception:  # malformed: the slow path decodes it again and reports it properly
                        pass
            self._handle_frame(frame_type, channel, payload, now_ms)
            if self.state is not open_state:  # closing or closed: the rest takes the general path
                for frame_type, channel, payload in frames[index + 1 :]:
                    if self.state is ConnectionState.CLOSED or self.state is ConnectionState.CLOSE_RECEIVED:
                        return
                    self._handle_frame(frame_type, channel, payload, now_ms)
                return

    def next_events(self) -> list[Event]:
        events, self._events = self._events, []
        return events

    def data_to_send(self) -> bytes:
        if not self._out:
            return b""
        data = self._out[0] if len(self._out) == 1 else b"".join(self._out)
        self._out = []
        self._out_bytes = 0
        self._last_send_ms = self._now_ms  # the latest time we know of: early, never late, heartbeats
        return data

    def send_method(self, channel: int, method: m.Method) -> None:
        cls = type(method)
        if cls is m.ChannelCloseOk:
            self._answer_channel_close(channel)
        elif cls is m.ConnectionCloseOk:
            self._answer_connection_close()
        elif self._channel_writable(channel):
            self._write(encode_method_frame(channel, method))

    def send_content(self, channel: int, method: m.Method, properties: BasicProperties, body: bytes) -> None:
        if self._channel_writable(channel):
            self._write(encode_content_frames(channel, method, properties, body, self.frame_max))

    def send_deliver(
        self,
        channel: int,
        consumer_tag: str,
        delivery_tag: int,
        redelivered: bool,
        exchange: str,
        routing_key: str,
        properties: BasicProperties,
        body: bytes,
    ) -> None:
        ch = self._channels.get(channel)  # (_channel_writable, inlined for this hot path)
        if (ch is None or ch.closing or self.state is not ConnectionState.OPEN) and (
                channel != 0 or not self._channel_writable(channel)):
            return
        self._write(encode_deliver_frames(channel, consumer_tag, delivery_tag, redelivered, exchange, routing_key,
                                          properties, body, self.frame_max))

    def send_ack(self, channel: int, delivery_tag: int, multiple: bool = False) -> None:
        """Publisher confirm (Basic.Ack), hot path."""
        if self._channel_writable(channel):
            self._write(encode_ack_frame(channel, delivery_tag, multiple))

    def close_channel(
        self, channel: int, reply_code: int, reply_text: str, class_id: int = 0, method_id: int = 0
    ) -> None:
        ch = self._channels.get(channel)
        state = self.state
        if ch is None or ch.close_sent or (state is not ConnectionState.OPEN
                                           and state is not ConnectionState.CLOSE_RECEIVED):
            return
        close = m.ChannelClose(reply_code, safe_text(reply_text), class_id, method_id)
        if ch.closing:  # the client's Close is not answered yet: ours goes first, as RabbitMQ's channel does
            if ch.close_ok_owed:
                ch.close_sent = True
                self._write(encode_method_frame(channel, close))
            return
        ch.closing = ch.close_sent = True
        ch.reset_content()
        self._write(encode_method_frame(channel, close))
        self._events.append(ChannelClosed(channel))

    def close_connection(
        self, reply_code: int, reply_text: str, class_id: int = 0, method_id: int = 0
    ) -> None:
        if self.state is ConnectionState.CLOSE_RECEIVED:  # the client is closing it already: just answer
            self._answer_connection_close()
            return
        if self.state in (ConnectionState.CLOSING, ConnectionState.CLOSED):
            return
        if self.state in (ConnectionState.AWAIT_HEADER, ConnectionState.STARTING):
            self._finish(reply_code, reply_text)
            return
        self._send_connection_close(reply_code, reply_text, class_id, method_id, now_ms=None)

    def block(self, reason: str) -> None:
        if self.blocked:
            return
        self.blocked = True
        self._blocked_reason = reason
        if self.state is ConnectionState.OPEN and self.client_capability("connection.blocked"):
            self._write(encode_method_frame(0, m.ConnectionBlocked(reason)))

    def unblock(self) -> None:
        if not self.blocked:
            return
        self.blocked = False
        # While blocked the runtime stops reading this connection (as RabbitMQ does), so the peer's heartbeats sat
        # unread in the socket: its silence is counted again only from now.
        self._last_recv_ms = self._now_ms
        if self.state is ConnectionState.OPEN and self.client_capability("connection.blocked"):
            self._write(encode_method_frame(0, m.ConnectionUnblocked()))

    def hold_reading(self, held: bool) -> None:
        """The runtime stops (True) or starts again (False) reading the socket without telling the client (credit
        flow): as while blocked, the peer's heartbeats sit unread meanwhile, so its silence counts only from the
        moment reading starts again."""
        if held == self.reading_held:
            return
        self.reading_held = held
        if not held:
            self._last_recv_ms = self._now_ms

    def tick(self, now_ms: int) -> None:
        self._now_ms = max(self._now_ms, now_ms)
        state = self.state
        if state is ConnectionState.CLOSED or state is ConnectionState.CLOSE_RECEIVED:
            return
        if state is ConnectionState.CLOSING:
            if self._close_deadline_ms is not None and now_ms >= self._close_deadline_ms:
                self._finish(*self._pending_close)  # no Close-Ok in time: give up waiting, keep the reason
            return
        if state is not ConnectionState.OPEN and now_ms >= self._handshake_deadline_ms:
            self._finish(ReplyCode.CONNECTION_FORCED, f"handshake timeout ({state.value})")
            return
        if self.heartbeat_s:
            self._tick_heartbeat(now_ms)

    def next_deadline_ms(self) -> int | None:
        state = self.state
        if state is ConnectionState.CLOSED or state is ConnectionState.CLOSE_RECEIVED:
            return None
        if state is ConnectionState.CLOSING:
            return self._close_deadline_ms
        deadlines = []
        if self.heartbeat_s:
            interval_ms = self.heartbeat_s * 1000
            deadlines.append(self._last_send_ms + interval_ms // 2)
            if not (self.blocked or self.reading_held):
                deadlines.append(self._last_recv_ms + 2 * interval_ms)
        if state is not ConnectionState.OPEN:
            deadlines.append(self._handshake_deadline_ms)
        return min(deadlines) if deadlines else None

    # ------------------------------------------------------------ internals: output and finishing
    def _write(self, data: bytes) -> None:
        if self.state is ConnectionState.CLOSED:
            return
        self._out.append(data)
        self._out_bytes += len(data)
        if self._out_bytes > self.limits.output_buffer_max_bytes:
            self._out = []
            self._out_bytes = 0
            self._finish(
                ReplyCode.RESOURCE_ERROR,
                f"output buffer exceeded {self.limits.output_buffer_max_bytes} bytes: the client is not reading",
            )

    def _channel_writable(self, channel: int) -> bool:
        if channel == 0:
            return self.state not in (ConnectionState.CLOSED, ConnectionState.AWAIT_HEADER)
        ch = self._channels.get(channel)
        return ch is not None and not ch.closing and self.state is ConnectionState.OPEN

    def _finish(self, reply_code: int, reply_text: str) -> None:
        """The connection is over: tell the broker about every channel still open, then about the connection."""
        if self.state is ConnectionState.CLOSED:
            return
        if self.state is ConnectionState.CLOSE_RECEIVED:  # the broker was told already
            self._channels.clear()
            self.state = ConnectionState.CLOSED
            return
        for number, ch in self._channels.items():
            if not ch.closing:
                self._events.append(ChannelClosed(number))
        self._channels.clear()
        self._events.append(ConnectionClosed(reply_code, reply_text))
        self.state = ConnectionState.CLOSED

    def _send_connection_close(
        self, reply_code: int, text: str, class_id: int, method_id: int, now_ms: int | None
    ) -> None:
        self._write(
            encode_method_frame(0, m.ConnectionClose(reply_code, safe_text(text), class_id, method_id))
        )
        for number, ch in self._channels.items():
            if not ch.closing:
                self._events.append(ChannelClosed(number))
        self._channels.clear()
        if self.state is ConnectionState.CLOSED:
            return
        self.state = ConnectionState.CLOSING
        base_ms = now_ms if now_ms is not None else self._last_recv_ms
        self._close_deadline_ms = base_ms + self.limits.close_ok_timeout_ms
        self._pending_close = (reply_code, text)

    def _fail(self, error: ProtocolError, now_ms: int) -> None:
        if self.state in (ConnectionState.CLOSING, ConnectionState.CLOSE_RECEIVED, ConnectionState.CLOSED):
            return
        if self.state in (ConnectionState.AWAIT_HEADER, ConnectionState.STARTING):
            self._finish(error.code, error.text)  # RabbitMQ closes the socket silently before login completes
            return
        self._send_connection_close(error.code, error.text, error.class_id, error.method_id, now_ms)

    def _fail_channel(self, channel: int, error: ChannelProtocolError) -> None:
        self.close_channel(channel, error.code, error.text, error.class_id, error.method_id)

    def _tick_heartbeat(self, now_ms: int) -> None:
        interval_ms = self.heartbeat_s * 1000
        if not (self.blocked or self.reading_held) and now_ms - self._last_recv_ms >= 2 * interval_ms:
            self._finish(
                ReplyCode.FRAME_ERROR, f"missed heartbeats from client, timeout: {self.heartbeat_s}s"
            )
            return
        if now_ms - self._last_send_ms >= interval_ms // 2 and not self._out:
            self._write(HEARTBEAT_FRAME)
            self._last_send_ms = now_ms

    # ------------------------------------------------------------ internals: input
    def _handle_frame(self, frame_type: int, channel: int, payload: bytes, now_ms: int) -> None:
        if self.state is ConnectionState.CLOSE_RECEIVED:
            return
        try:
            if channel == 0:
                self._frame_on_connection(frame_type, payload, now_ms)
            else:
                self._frame_on_channel(frame_type, channel, payload)
        except ChannelProtocolError as error:
            self._fail_channel(channel, error)
        except ProtocolError as error:
            self._fail(error, now_ms)

    def _decode(self, payload: bytes) -> m.Method:
        try:
            return decode_method(payload)
        except UnknownMethodError as error:
            if error.known_class:
                raise ProtocolError(
                    ReplyCode.COMMAND_INVALID,
                    f"unknown method {error.method_id} in class {error.class_id}",
                    error.class_id,
                    error.method_id,
                )
            raise ProtocolError(
                ReplyCode.NOT_IMPLEMENTED,
                f"unknown class {error.class_id} (method {error.method_id})",
                error.class_id,
                error.method_id,
            )
        except DecodeError as error:
            class_id, method_id = (payload[0] << 8 | payload[1], payload[2] << 8 | payload[3])
            raise ProtocolError(
                ReplyCode.FRAME_ERROR, f"cannot decode method frame: {error}", class_id, method_id
            )

    def _frame_on_connection(self, frame_type: int, payload: bytes, now_ms: int) -> None:
        if frame_type == FRAME_HEARTBEAT:
            if payload:
                raise ProtocolError(ReplyCode.FRAME_ERROR, "heartbeat frame with a non-empty payload")
            return
        if self.state is ConnectionState.CLOSING:
            self._frame_while_closing(frame_type, payload)
            return
        if frame_type not in (FRAME_METHOD, FRAME_HEADER, FRAME_BODY):
            raise ProtocolError(ReplyCode.FRAME_ERROR, f"unknown frame type {frame_type}")
        if frame_type != FRAME_METHOD:
            raise ProtocolError(
                ReplyCode.UNEXPECTED_FRAME, f"frame type {frame_type} is not allowed on channel 0"
            )
        method = self._decode(payload)
        if isinstance(method, m.ConnectionClose):
            if self.state is ConnectionState.OPEN:
                self._close_received(method)
                return
            self._write(encode_method_frame(0, m.ConnectionCloseOk()))  # during the handshake: at once
            self._finish(method.reply_code, method.reply_text)
            return
        handler = _CONNECTION_HANDLERS.get((self.state, type(method)))
        if handler is None:
            raise ProtocolError(
                ReplyCode.CHANNEL_ERROR,
                f"unexpected method {amqp_method_name(type(method))} in connection state {self.state.value}",
                method.CLASS_ID,
                method.METHOD_ID,
            )
        handler(self, method, now_ms)

    def _frame_while_closing(self, frame_type: int, payload: bytes) -> None:
        method = _method_or_none(frame_type, payload)
        if isinstance(method, m.ConnectionCloseOk):
            code, text = self._pending_close
            self._finish(code, text)
        elif isinstance(method, m.ConnectionClose):
            self._write(encode_method_frame(0, m.ConnectionCloseOk()))
            code, text = self._pending_close
            self._finish(code, text)

    # -- handshake handlers
    def _send_start(self) -> None:
        limits = self.limits
        start = m.ConnectionStart(
            0,
            9,
            server_properties(limits.product, limits.version, limits.platform, limits.cluster_name),
            " ".join(self._mechanisms()),
            "en_US",
        )
        self._write(encode_method_frame(0, start))
        self.state = ConnectionState.STARTING

    def _mechanisms(self) -> tuple[str, ...]:
        return MECHANISMS if self.external_identity is None else (*MECHANISMS, EXTERNAL)

    def _on_start_ok(self, method: m.Method, now_ms: int) -> None:
        assert isinstance(method, m.ConnectionStartOk)
        self.client_properties = method.client_properties
        if method.mechanism not in self._mechanisms():
            raise ProtocolError(
                ReplyCode.COMMAND_INVALID, f"unknown authentication mechanism '{method.mechanism}'", 10, 11
            )
        if method.mechanism == EXTERNAL and self.external_identity is not None:
            username = self.authenticator.authenticate(EXTERNAL, self.external_identity.encode("utf-8", "surrogateescape"))
        elif parse_sasl_response(method.mechanism, method.response) is None:
            raise ProtocolError(
                ReplyCode.SYNTAX_ERROR, f"malformed {method.mechanism} response from the client", 10, 11
            )
        else:
            username = self.authenticator.authenticate(method.mechanism, method.response)
        if username is None:
            text = reply_text(
                ReplyCode.ACCESS_REFUSED,
                f"Login was refused using authentication mechanism {method.mechanism}. "
                "For details see the broker logfile.",
            )
            if self.client_capability("authentication_failure_close"):
                self._write(encode_method_frame(0, m.ConnectionClose(ReplyCode.ACCESS_REFUSED, text, 0, 0)))
            self._finish(ReplyCode.ACCESS_REFUSED, text)
            return
        self.username = username
        self.state = ConnectionState.TUNING
        tune = m.ConnectionTune(self.limits.channel_max, self.limits.frame_max, self.limits.heartbeat_s)
        self._write(encode_method_frame(0, tune))

    def _on_tune_ok(self, method: m.Method, now_ms: int) -> None:
        assert isinstance(method, m.ConnectionTuneOk)
        check_negotiated("frame_max", FRAME_MIN_SIZE, self.limits.frame_max, method.frame_max)
        check_negotiated("channel_max", 1, self.limits.channel_max, method.channel_max)
        self.frame_max = method.frame_max or self.limits.frame_max
        self.channel_max = method.channel_max or 65535
        self.heartbeat_s = method.heartbeat
        self._framer.frame_max_bytes = self.frame_max
        self._last_send_ms = now_ms
        self.state = ConnectionState.OPENING

    def _on_open(self, method: m.Method, now_ms: int) -> None:
        assert isinstance(method, m.ConnectionOpen)
        vhost = method.virtual_host
        if not self.authenticator.vhost_access(self.username, vhost):
            raise ProtocolError(
                ReplyCode.NOT_ALLOWED, f"access to vhost '{vhost}' refused for user '{self.username}'", 10, 40
            )
        limit = self.authenticator.connection_limit_reached(vhost)
        if limit is not None:  # RabbitMQ's text (rabbit_reader); checked after the access check, as there
            raise ProtocolError(ReplyCode.NOT_ALLOWED, f"access to vhost '{vhost}' refused for user "
                                f"'{self.username}': connection limit ({limit}) is reached", 10, 40)
        limit = self._user_limit("max-connections")
        if limit is not None:  # RabbitMQ's text (rabbit_reader:is_over_user_connection_limit)
            raise ProtocolError(ReplyCode.NOT_ALLOWED, f"Connection refused for user '{self.username}': user "
                                f"connection limit ({limit}) is reached", 10, 40)
        self.vhost = vhost
        self.state = ConnectionState.OPEN
        self._write(encode_method_frame(0, m.ConnectionOpenOk()))
        self._events.append(
            ConnectionOpened(
                vhost,
                self.username,
                self.client_properties,
                self.channel_max,
                self.frame_max,
                self.heartbeat_s,
            )
        )
        if self.blocked and self.client_capability("connection.blocked"):
            self._write(encode_method_frame(0, m.ConnectionBlocked(self._blocked_reason)))

    def _user_limit(self, name: str, own: int = 0) -> int | None:
        """The user's limit `name` when reached (the authenticator's `user_limit_reached`, when it has one)."""
        check = getattr(self.authenticator, "user_limit_reached", None)
        return None if check is None else check(self.username, name, own)

    def _on_update_secret(self, method: m.Method, now_ms: int) -> None:
        """Connection.Update-Secret (RabbitMQ's extension): the new secret is the user's password now; the user
        is checked again with it, and its vhost access too. Refused: 530, which closes the connection."""
        assert isinstance(method, m.ConnectionUpdateSecret)
        response = b"\0" + self.username.encode("utf-8", "surrogateescape") + b"\0" + method.new_secret
        if self.authenticator.authenticate("PLAIN", response) != self.username:
            raise ProtocolError(
                ReplyCode.NOT_ALLOWED, "New secret was refused by one of the backends: invalid credentials", 10, 70
            )
        if not self.authenticator.vhost_access(self.username, self.vhost):
            raise ProtocolError(
                ReplyCode.NOT_ALLOWED, f"access to vhost '{self.vhost}' refused for user '{self.username}'", 10, 70
            )
        self._write(encode_method_frame(0, m.ConnectionUpdateSecretOk()))

    # -- channels
    def _frame_on_channel(self, frame_type: int, channel: int, payload: bytes) -> None:
        state = self.state
        if state is not ConnectionState.OPEN:
            if state is ConnectionState.CLOSING:
                return
            raise ProtocolError(
                ReplyCode.UNEXPECTED_FRAME,
                f"frame type {frame_type} on channel {channel} before connection.open",
            )
        ch = self._channels.get(channel)
        if ch is not None and not ch.closing:
            if ch.publish is not None:
                self._content_frame(ch, frame_type, channel, payload)
                return
            if frame_type == FRAME_METHOD:
                self._channel_method(ch, channel, self._decode(payload))
                return
        if frame_type == FRAME_HEARTBEAT:
            raise ProtocolError(ReplyCode.UNEXPECTED_FRAME, f"heartbeat frame on channel {channel}")
        if frame_type not in (FRAME_METHOD, FRAME_HEADER, FRAME_BODY):
            raise ProtocolError(ReplyCode.FRAME_ERROR, f"unknown frame type {frame_type}")
        if ch is None:
            self._frame_on_new_channel(frame_type, channel, payload)
        elif ch.closing:
            self._frame_on_closing_channel(frame_type, channel, payload)
        else:
            raise ProtocolError(
                ReplyCode.UNEXPECTED_FRAME, "expected method frame, got non method frame instead"
            )

    def _frame_on_new_channel(self, frame_type: int, channel: int, payload: bytes) -> None:
        # channel_max bounds how many channels are open (closing ones included), not their numbers: any number
        # 1..65535 may be opened, as in RabbitMQ 3.10.
        if len(self._channels) >= self.channel_max:
            raise ProtocolError(
                ReplyCode.NOT_ALLOWED,
                f"number of channels opened ({len(self._channels)}) has reached the negotiated channel_max "
                f"({self.channel_max})",
            )
        method = self._decode(payload) if frame_type == FRAME_METHOD else None
        if not isinstance(method, m.ChannelOpen):
            class_id, method_id = (method.CLASS_ID, method.METHOD_ID) if method is not None else (0, 0)
            raise ProtocolError(ReplyCode.CHANNEL_ERROR, "expected 'channel.open'", class_id, method_id)
        limit = self._user_limit("max-channels", len(self._channels))
        if limit is not None:  # RabbitMQ's text; a connection error there too (rabbit_reader, not_allowed)
            raise ProtocolError(ReplyCode.NOT_ALLOWED, f"number of channels opened for user '{self.username}' "
                                f"has reached the maximum allowed user limit of ({limit})")
        self._channels[channel] = ChannelAssembly()
        self._write(encode_method_frame(channel, m.ChannelOpenOk()))
        self._events.append(ChannelOpened(channel))

    def _frame_on_closing_channel(self, frame_type: int, channel: int, payload: bytes) -> None:
        """A closing channel takes only Close-Ok (for our Close) and Close (the client's, crossing ours); the number
        is free once every Close on it was answered. A Channel.Open before that is 504, as in RabbitMQ."""
        ch = self._channels[channel]
        method = _method_or_none(frame_type, payload)
        if isinstance(method, m.ChannelCloseOk):
            if ch.close_sent:
                ch.close_sent = False
                if not ch.close_ok_owed:
                    del self._channels[channel]
        elif isinstance(method, m.ChannelClose):
            if ch.close_sent and not ch.close_ok_owed:  # closes crossed: answer now, then wait for its Close-Ok
                self._write(encode_method_frame(channel, m.ChannelCloseOk()))
        elif isinstance(method, m.ChannelOpen):
            raise ProtocolError(ReplyCode.CHANNEL_ERROR, "second 'channel.open' seen", 20, 10)

    def _close_received(self, method: m.ConnectionClose) -> None:
        """The client closes the connection: every channel is gone for the broker, which answers (Close-Ok) once it
        has handled everything before; until then a channel may still get our Close for an earlier method."""
        for number, ch in self._channels.items():
            if not ch.closing:
                ch.closing = ch.close_ok_owed = True
                ch.reset_content()
                self._events.append(ChannelClosed(number))
        self._events.append(ConnectionClosed(method.reply_code, method.reply_text, by_client=True))
        self.state = ConnectionState.CLOSE_RECEIVED

    def _answer_connection_close(self) -> None:
        if self.state is not ConnectionState.CLOSE_RECEIVED:
            return
        self._write(encode_method_frame(0, m.ConnectionCloseOk()))
        self._channels.clear()
        self.state = ConnectionState.CLOSED

    def _answer_channel_close(self, channel: int) -> None:
        """The broker's Close-Ok for the client's Close, after the broker's replies to what came before it (so a
        Close of ours for an earlier method, such as a publish to a missing exchange, goes out first)."""
        ch = self._channels.get(channel)
        if ch is None or not ch.close_ok_owed or self.state is not ConnectionState.OPEN:
            return
        ch.close_ok_owed = False
        self._write(encode_method_frame(channel, m.ChannelCloseOk()))
        if not ch.close_sent:
            del self._channels[channel]

    def _channel_method(self, ch: ChannelAssembly, channel: int, method: m.Method) -> None:
        cls = type(method)
        if cls is m.BasicPublish:
            assert isinstance(method, m.BasicPublish)
            ch.publish = method
            return
        if cls is m.ChannelClose:  # answered by the broker (send_method ChannelCloseOk) after what came before
            ch.closing = ch.close_ok_owed = True
            ch.reset_content()
            self._events.append(ChannelClosed(channel, by_client=True))
            return
        if method.CLASS_ID == CLASS_CONNECTION or cls in _SERVER_ONLY:
            raise ProtocolError(
                ReplyCode.COMMAND_INVALID,
                f"method {amqp_method_name(cls)} is not allowed from a client on channel {channel}",
                method.CLASS_ID,
                method.METHOD_ID,
            )
        if cls is m.ChannelOpen:
            raise ProtocolError(ReplyCode.CHANNEL_ERROR, "second 'channel.open' seen", 20, 10)
        if cls is m.AccessRequest:
            self._write(encode_method_frame(channel, m.AccessRequestOk()))
            return
        if cls is m.ChannelCloseOk or cls is m.BasicCancelOk:
            return  # nothing of ours to acknowledge: ignore, as RabbitMQ does
        self._events.append(MethodReceived(channel, method))

    def _content_frame(self, ch: ChannelAssembly, frame_type: int, channel: int, payload: bytes) -> None:
        content = ch.content_frame(frame_type, payload, self.limits.max_message_size)
        if content is not None:
            self._events.append(ContentReceived(channel, *content))


_CONNECTION_HANDLERS: Final[dict[tuple[ConnectionState, type[m.Method]], Any]] = {
    (ConnectionState.STARTING, m.ConnectionStartOk): ServerConnection._on_start_ok,
    (ConnectionState.TUNING, m.ConnectionTuneOk): ServerConnection._on_tune_ok,
    (ConnectionState.OPENING, m.ConnectionOpen): ServerConnection._on_open,
    (ConnectionState.OPEN, m.ConnectionUpdateSecret): ServerConnection._on_update_secret,
}


def _method_or_none(frame_type: int, payload: bytes) -> m.Method | None:
    """While closing, only a (close or close-ok) method matters: anything else, or undecodable, is ignored."""
    if frame_type != FRAME_METHOD:
        return None
    try:
        return decode_method(payload)
    except (UnknownMethodError, DecodeError):
        return None
