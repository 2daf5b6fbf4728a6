"""ConnectionClosing: the close handshakes of channels and of the connection, and how protocol errors end them.

Errors follow RabbitMQ 3.x (rabbit_reader / rabbit_channel / rabbit_command_assembler): before authentication
completes, errors close the socket without a Close frame (except 403 with the client's authentication_failure_close
capability, see connection_handshake.py); later, hard errors (`ProtocolError`) send Connection.Close and soft errors
(`ChannelProtocolError`) Channel.Close. A closing channel ignores everything but Close/Close-Ok (spec 4.2.4 /
2.3.5.2).

`ChannelClosed` is emitted once, as soon as the channel is gone for the broker (we sent Close, or the client did);
the broker answers the client's Close (`send_method(ChannelCloseOk)`) once it has handled what came before it, so
a Close of ours for an earlier method goes out first; crossing Closes each get a Close-Ok, and the number is free
once both are answered (rabbit_channel's `closing` state). The client's Connection.Close works the same way
(CLOSE_RECEIVED, answered by `send_method(0, ConnectionCloseOk)`, as RabbitMQ's reader waits for its channels).
When we send Connection.Close we wait for Close-Ok (CLOSING) until `close_ok_timeout_ms`.
"""

from __future__ import annotations

from node.amqp import methods as m
from node.amqp.codec import DecodeError, UnknownMethodError, decode_method, encode_method_frame
from node.amqp.connection_base import ConnectionBase, ConnectionState
from node.amqp.errors import ChannelProtocolError, ProtocolError, safe_text
from node.amqp.events import ChannelClosed, ConnectionClosed
from node.amqp.spec import FRAME_METHOD, ReplyCode


class ConnectionClosing(ConnectionBase):
    """Closing channels and the connection, from either side."""

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

    def _frame_while_closing(self, frame_type: int, payload: bytes) -> None:
        method = _method_or_none(frame_type, payload)
        if isinstance(method, m.ConnectionCloseOk):
            code, text = self._pending_close
            self._finish(code, text)
        elif isinstance(method, m.ConnectionClose):
            self._write(encode_method_frame(0, m.ConnectionCloseOk()))
            code, text = self._pending_close
            self._finish(code, text)

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


def _method_or_none(frame_type: int, payload: bytes) -> m.Method | None:
    """While closing, only a (close or close-ok) method matters: anything else, or undecodable, is ignored."""
    if frame_type != FRAME_METHOD:
        return None
    try:
        return decode_method(payload)
    except (UnknownMethodError, DecodeError):
        return None
