"""ConnectionBase: the state every part of a server connection shares, its output buffer and how it ends.

The bottom of `ServerConnection`'s parts (see node/amqp/connection.py): the negotiated limits, the state, the
channel table (`ChannelAssembly` per open channel number), the event list the broker drains with `next_events()`,
and the output buffer drained with `data_to_send()`. `_finish` ends the connection: it tells the broker about every
channel still open, then about the connection (`ConnectionClosed`).

Bounds: the output buffer holds at most `output_buffer_max_bytes` -- past it the peer is not reading and the
connection is aborted with ConnectionClosed(506). `output_buffer_bytes` lets the broker throttle deliveries well
before that.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from node.amqp import methods as m
from node.amqp.auth import Authenticator
from node.amqp.channel import ChannelAssembly
from node.amqp.codec import DecodeError, UnknownMethodError, decode_method
from node.amqp.errors import ProtocolError
from node.amqp.events import ChannelClosed, ConnectionClosed, Event
from node.amqp.framer import Framer, RawFrame
from node.amqp.spec import ReplyCode


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


class ConnectionBase:
    """The shared state of one server connection, its output and its end (the parts above add the rest)."""

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
        # A login or vhost refusal the authenticator says may come from a stale copy of the definitions (cluster
        # mode: a user, vhost or permission committed through another node and not applied here yet) waits while
        # the runtime catches up (`awaiting_recheck`, then `recheck`); the frames from the refused one on are held.
        self.awaiting_recheck = False
        self._rechecked = False
        self._held_input: tuple[list[RawFrame], Exception | None] | None = None

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

    def _user_limit(self, name: str, own: int = 0) -> int | None:
        """The user's limit `name` when reached (the authenticator's `user_limit_reached`, when it has one)."""
        check = getattr(self.authenticator, "user_limit_reached", None)
        return None if check is None else check(self.username, name, own)

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
