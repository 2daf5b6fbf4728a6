"""ChannelTable: frames on channels 1..65535 -- opening a channel, the methods a client may send, content frames.

A frame on an open channel is either content of a pending Basic.Publish (header, then body frames, assembled by
`ChannelAssembly`) or a method: Basic.Publish starts content, Channel.Close starts the close handshake
(connection_closing.py), methods only a server sends and connection-class methods are 503, Access.Request is
answered here, and everything else goes to the broker as `MethodReceived`. A frame on an unknown channel must be
Channel.Open; channel_max bounds how many channels are open at once (and the user's max-channels limit applies).
"""

from __future__ import annotations

from typing import Final

from node.amqp import methods as m
from node.amqp.channel import ChannelAssembly
from node.amqp.codec import encode_method_frame
from node.amqp.connection_base import ConnectionState
from node.amqp.connection_handshake import ConnectionHandshake
from node.amqp.errors import ProtocolError, amqp_method_name
from node.amqp.events import ChannelClosed, ChannelOpened, ContentReceived, MethodReceived
from node.amqp.spec import (
    CLASS_CONNECTION,
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    ReplyCode,
)

_CLIENT_MAY_SEND_OK: Final = frozenset({m.ChannelFlowOk, m.ChannelCloseOk, m.BasicCancelOk})
_SERVER_ONLY: Final = frozenset(
    cls
    for cls in m.METHOD_CLASSES
    if (cls.NAME.endswith("Ok") and cls not in _CLIENT_MAY_SEND_OK)
    or cls in (m.BasicReturn, m.BasicDeliver, m.BasicGetEmpty)
)


class ChannelTable(ConnectionHandshake):
    """Frames on channels other than 0."""

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
