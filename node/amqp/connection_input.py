"""FrameInput: from parsed frames to events -- the general path, and the fused publish path of an open connection.

The general path hands each frame to `_handle_frame`: channel 0 to the handshake and close handling, other channels
to the channel table; a `ProtocolError` becomes a connection close, a `ChannelProtocolError` a channel close. Once
the connection is open, the publish hot path (`_receive_open`, `_receive_frames_open`) handles Basic.Publish method,
header and body frames inline, and takes a whole publish (method, a content header repeating its channel's last
one, a one-frame body) in one step from the buffer; everything else, and every error, goes the general way, in order.

Bounds: the framer holds at most one partial frame (<= frame_max); a message body at most max_message_size
(checked against the header's body size before any body is buffered); events per receive_data call at most one per
frame.
"""

from __future__ import annotations

from typing import Final

from node.amqp import methods as m
from node.amqp.codec import decode_publish_cached, encode_method_frame
from node.amqp.connection_base import ConnectionState
from node.amqp.connection_channels import ChannelTable
from node.amqp.connection_handshake import CONNECTION_HANDLERS
from node.amqp.errors import ChannelProtocolError, ProtocolError, amqp_method_name, reply_text
from node.amqp.events import ContentReceived
from node.amqp.framer import FRAME_HEADER_STRUCT as _FRAME_HEADER
from node.amqp.framer import BadProtocolHeader, RawFrame
from node.amqp.spec import (
    FRAME_BODY,
    FRAME_END,
    FRAME_HEADER,
    FRAME_HEADER_SIZE,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    PROTOCOL_HEADER,
    ReplyCode,
)

_new_tuple = tuple.__new__  # ContentReceived(...) without the Python-level __new__ (hot path)
_PUBLISH_KEY: Final = b"\x00\x3c\x00\x28"  # class 60 (basic), method 40 (publish)


class FrameInput(ChannelTable):
    """Parsed frames in, events (and replies) out."""

    def _receive_frames(self, frames: list[RawFrame], error: Exception | None, now_ms: int) -> None:
        """Handle parsed frames, then the error that ended the stream after them (if any)."""
        if self._held_input is not None:  # (a refusal waits for `recheck`: these come after it)
            held, held_error = self._held_input
            self._held_input = (held + frames, error or held_error)
            return
        if self.state is ConnectionState.OPEN:
            self._receive_frames_open(frames, now_ms)
        else:
            for index, (frame_type, channel, payload) in enumerate(frames):
                self._handle_frame(frame_type, channel, payload, now_ms)
                if self.awaiting_recheck:
                    self._held_input = (frames[index:], error)
                    return
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
        handler = CONNECTION_HANDLERS.get((self.state, type(method)))
        if handler is None:
            raise ProtocolError(
                ReplyCode.CHANNEL_ERROR,
                f"unexpected method {amqp_method_name(type(method))} in connection state {self.state.value}",
                method.CLASS_ID,
                method.METHOD_ID,
            )
        handler(self, method, now_ms)
