"""ServerConnection: the sans-I/O server side of one AMQP 0-9-1 connection (model: h11/h2).

Feed bytes with `receive_data(data, now_ms)`, collect `next_events()`, drain `data_to_send()`, call `tick(now_ms)` by
`next_deadline_ms()`. The broker answers with `send_method`/`send_content`/`send_deliver`/`close_channel`/... .
While `awaiting_recheck` (a refused login or vhost that may be stale, cluster mode) the runtime calls `recheck`
once it caught up with the cluster's definitions.

States: AWAIT_HEADER -> STARTING (Start sent) -> TUNING (Tune sent) -> OPENING -> OPEN -> CLOSING (we sent
Connection.Close, waiting for Close-Ok) or CLOSE_RECEIVED (the client sent it) -> CLOSED.

The class is built in layers, one module each, every layer using only the ones below it:
  connection.py            ServerConnection: the public API -- bytes in, sends, flow (block, hold_reading), timers
  connection_input.py      FrameInput: parsed frames to events, with the fused publish hot path
  connection_channels.py   ChannelTable: Channel.Open, the methods a client may send on a channel, content frames
  connection_handshake.py  ConnectionHandshake: Start/Tune/Open and Update-Secret
  connection_closing.py    ConnectionClosing: channel and connection close handshakes, errors to closes
  connection_base.py       ConnectionBase: limits, state, channel table, events, output buffer, the end

Heartbeats: the heartbeat in the client's Tune-Ok is used as is. We send a heartbeat frame when nothing was sent
for heartbeat/2; when nothing was received for 2 x heartbeat we close the socket without a Close frame, as RabbitMQ
does, emitting ConnectionClosed(501, "missed heartbeats from client, timeout: Ns"). While the connection is blocked
or its reading held (credit flow) the runtime does not read the socket, so the client's silence is not counted.
"""

from __future__ import annotations

from node.amqp import methods as m
from node.amqp.auth import Authenticator
from node.amqp.codec import (
    encode_ack_frame,
    encode_content_frames,
    encode_deliver_frames,
    encode_method_frame,
)
from node.amqp.connection_base import ConnectionLimits, ConnectionState
from node.amqp.connection_input import FrameInput
from node.amqp.errors import reply_text
from node.amqp.properties import BasicProperties
from node.amqp.spec import HEARTBEAT_FRAME, ReplyCode

__all__ = ["Authenticator", "ConnectionLimits", "ConnectionState", "ServerConnection", "reply_text"]


class ServerConnection(FrameInput):
    """One client connection, server side. Never raises on bad input."""

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

    def recheck(self, now_ms: int) -> None:
        """The runtime caught up with the cluster's definitions (or gave up waiting): the held login or
        connection.open is handled again, then what came after it; a refusal now is final."""
        held, self._held_input = self._held_input, None
        self.awaiting_recheck = False
        self._rechecked = True
        if held is not None and not self.closed:
            self._now_ms = now_ms
            self._receive_frames(held[0], held[1], now_ms)

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
