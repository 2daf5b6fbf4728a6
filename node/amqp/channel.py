"""Per-channel state and content assembly (Basic.Publish method, then header, then body frames).

`ChannelAssembly.content_frame` takes the frames that follow a Basic.Publish and returns the finished
(method, properties, body) once body_size bytes have arrived. The body size is checked against the message size
limit when the header arrives, before any body is buffered (406 closes the channel, as RabbitMQ does); wrong frame
types are 505 UNEXPECTED_FRAME connection errors, a body longer than announced 501 (rabbit_command_assembler).
"""

from __future__ import annotations

from node.amqp.codec import DecodeError
from node.amqp.errors import ChannelProtocolError, ProtocolError
from node.amqp.methods import BasicPublish
from node.amqp.properties import BasicProperties, decode_content_header
from node.amqp.spec import CLASS_BASIC, FRAME_BODY, FRAME_HEADER, ReplyCode

Content = tuple[BasicPublish, BasicProperties, bytes]


class ChannelAssembly:
    """One channel's content assembly. The last content header that decoded to properties without a `headers`
    table is remembered (its payload bytes, properties and body size): a publisher repeating it (the common case)
    gets the same shared `BasicProperties` without a decode, after the same checks passed for those very bytes."""

    __slots__ = ("body_parts", "body_received", "body_size", "close_ok_owed", "close_sent", "closing", "last_header",
                 "last_header_content", "properties", "publish")

    def __init__(self) -> None:
        self.closing = False  # either side sent Channel.Close: the client's frames but Close/Close-Ok are discarded
        self.close_ok_owed = False  # the client sent Close; the broker answers it once it handled what came before
        self.close_sent = False  # we sent Close and wait for the client's Close-Ok
        self.publish: BasicPublish | None = None
        self.properties: BasicProperties | None = None
        self.body_size = 0
        self.body_received = 0
        self.body_parts: list[bytes] = []
        self.last_header = b""  # never a valid header payload (those are >= 14 bytes)
        self.last_header_content: tuple[BasicProperties, int] | None = None

    def reset_content(self) -> None:
        self.publish = None
        self.properties = None
        self.body_parts = []
        self.body_size = self.body_received = 0

    def content_frame(self, frame_type: int, payload: bytes, max_message_size: int) -> Content | None:
        """Feed the next frame of a publish; the finished content, or None while more is due."""
        if self.properties is None:
            if frame_type != FRAME_HEADER:
                raise ProtocolError(
                    ReplyCode.UNEXPECTED_FRAME,
                    "expected content header for class 60, got non content header frame instead",
                    60,
                    40,
                )
            return self._content_header(payload, max_message_size)
        if frame_type != FRAME_BODY:
            raise ProtocolError(
                ReplyCode.UNEXPECTED_FRAME,
                "expected content body, got non content body frame instead",
                60,
                40,
            )
        self.body_received += len(payload)
        if self.body_received > self.body_size:
            raise ProtocolError(
                ReplyCode.FRAME_ERROR,
                f"content body is longer than the {self.body_size} bytes announced in its content header",
                60,
                40,
            )
        self.body_parts.append(payload)
        return self.take_content() if self.body_received == self.body_size else None

    def _content_header(self, payload: bytes, max_message_size: int) -> Content | None:
        if payload == self.last_header and self.last_header_content is not None:
            properties, body_size = self.last_header_content
            if body_size <= max_message_size:
                self.properties = properties
                self.body_size = body_size
                return self.take_content() if body_size == 0 else None
        try:
            class_id, body_size, properties = decode_content_header(payload)
        except DecodeError as error:
            raise ProtocolError(ReplyCode.FRAME_ERROR, f"cannot decode content header: {error}", 60, 40)
        if class_id != CLASS_BASIC or payload[2:4] != b"\x00\x00":
            raise ProtocolError(
                ReplyCode.UNEXPECTED_FRAME,
                f"expected content header for class 60, got one for class {class_id} instead",
                60,
                40,
            )
        if body_size > max_message_size:
            raise ChannelProtocolError(
                ReplyCode.PRECONDITION_FAILED,
                f"message size {body_size} is larger than configured max size {max_message_size}",
                60,
                40,
            )
        self.properties = properties
        self.body_size = body_size
        if properties.headers is None:
            self.last_header = payload
            self.last_header_content = (properties, body_size)
        return self.take_content() if body_size == 0 else None

    def take_content(self) -> Content:
        """The finished content (all `body_size` bytes have arrived); the channel is ready for the next one."""
        parts = self.body_parts
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        publish, properties = self.publish, self.properties
        assert publish is not None and properties is not None
        self.reset_content()
        return publish, properties, body
