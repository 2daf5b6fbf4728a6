"""Minimal AMQP 0-9-1 frame encoder and parser for the benchmark's load generator.

The load generator must stay far cheaper than the broker it measures, so it never builds method objects: it encodes
the handful of client methods it sends straight into bytes (most of them once, before the run starts) and parses
only what it needs from the server (method ids, basic.ack/nack, basic.deliver's delivery tag, and the first bytes
of a body). It is deliberately independent of `node.amqp`: a test tool must not share the bugs of what it tests.

How it works: `method_frame` packs `class_id, method_id` and pre-encoded arguments into a type-1 frame; the small
`encode_*` helpers build argument blobs (shortstr, longstr, field tables of str/int/bool); `publish_blob` returns
the three frames (basic.publish, content header, body) of one message as one `bytes`; `FrameBuffer` splits a byte
stream into `(frame_type, channel, payload)` tuples incrementally (partial input just waits for more bytes).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = b"\xce"
FRAME_END_BYTE = 0xCE
FRAME_HEADER_SIZE = 7

# (class_id, method_id) pairs the benchmark cares about.
CONNECTION_START = (10, 10)
CONNECTION_TUNE = (10, 30)
CONNECTION_OPEN_OK = (10, 41)
CONNECTION_CLOSE = (10, 50)
CONNECTION_CLOSE_OK = (10, 51)
CONNECTION_BLOCKED = (10, 60)
CONNECTION_UNBLOCKED = (10, 61)
CHANNEL_OPEN_OK = (20, 11)
CHANNEL_CLOSE = (20, 40)
CHANNEL_CLOSE_OK = (20, 41)
EXCHANGE_DECLARE_OK = (40, 11)
QUEUE_DECLARE_OK = (50, 11)
QUEUE_BIND_OK = (50, 21)
QUEUE_PURGE_OK = (50, 31)
QUEUE_DELETE_OK = (50, 41)
BASIC_QOS_OK = (60, 11)
BASIC_CONSUME_OK = (60, 21)
BASIC_DELIVER = (60, 60)
BASIC_ACK = (60, 80)
BASIC_NACK = (60, 120)
CONFIRM_SELECT_OK = (85, 11)

_FRAME_HEAD = struct.Struct(">BHI")
_METHOD_IDS = struct.Struct(">HH")
_U64 = struct.Struct(">Q")

PERSISTENT = 2
TRANSIENT = 1


class ProtocolError(Exception):
    """The server sent something the benchmark client cannot continue after (close, bad frame end)."""


@dataclass(frozen=True, slots=True)
class Frame:
    """One parsed frame: type, channel and the raw payload (without the end octet)."""

    frame_type: int
    channel: int
    payload: bytes

    @property
    def method_id(self) -> tuple[int, int]:
        """(class_id, method_id) of a method frame."""
        class_id, method_id = _METHOD_IDS.unpack_from(self.payload, 0)
        return (class_id, method_id)


# --- encoding -----------------------------------------------------------------------------------------------


def encode_shortstr(value: str) -> bytes:
    raw = value.encode("utf-8")
    if len(raw) > 255:
        raise ValueError(f"shortstr longer than 255 bytes: {value[:40]!r}...")
    return bytes([len(raw)]) + raw


def encode_longstr(value: bytes) -> bytes:
    return struct.pack(">I", len(value)) + value


def encode_table(table: dict[str, str | int | bool]) -> bytes:
    """A field table of the value types the benchmark needs: str (S), bool (t) and int (l, signed 64-bit)."""
    parts: list[bytes] = []
    for key, value in table.items():
        parts.append(encode_shortstr(key))
        if isinstance(value, bool):
            parts.append(b"t" + (b"\x01" if value else b"\x00"))
        elif isinstance(value, int):
            parts.append(b"l" + struct.pack(">q", value))
        else:
            parts.append(b"S" + encode_longstr(value.encode("utf-8")))
    body = b"".join(parts)
    return struct.pack(">I", len(body)) + body


def frame(frame_type: int, channel: int, payload: bytes) -> bytes:
    return _FRAME_HEAD.pack(frame_type, channel, len(payload)) + payload + FRAME_END


def method_frame(channel: int, class_id: int, method_id: int, arguments: bytes = b"") -> bytes:
    return frame(FRAME_METHOD, channel, _METHOD_IDS.pack(class_id, method_id) + arguments)


def bits(*flags: bool) -> bytes:
    """Pack consecutive bit fields into one octet, first flag in the lowest bit."""
    value = 0
    for position, flag in enumerate(flags):
        if flag:
            value |= 1 << position
    return bytes([value])


def connection_start_ok(username: str, password: str) -> bytes:
    response = b"\x00" + username.encode() + b"\x00" + password.encode()
    properties = encode_table({"product": "raftmq-bench", "platform": "Python"})
    arguments = properties + encode_shortstr("PLAIN") + encode_longstr(response) + encode_shortstr("en_US")
    return method_frame(0, 10, 11, arguments)


def connection_tune_ok(channel_max: int, frame_max: int, heartbeat_s: int) -> bytes:
    return method_frame(0, 10, 31, struct.pack(">HIH", channel_max, frame_max, heartbeat_s))


def connection_open(vhost: str) -> bytes:
    return method_frame(0, 10, 40, encode_shortstr(vhost) + encode_shortstr("") + b"\x00")


def connection_close() -> bytes:
    return method_frame(0, 10, 50, struct.pack(">H", 200) + encode_shortstr("bye") + struct.pack(">HH", 0, 0))


def connection_close_ok() -> bytes:
    return method_frame(0, 10, 51)


def channel_open(channel: int) -> bytes:
    return method_frame(channel, 20, 10, encode_shortstr(""))


def channel_close_ok(channel: int) -> bytes:
    return method_frame(channel, 20, 41)


def confirm_select(channel: int) -> bytes:
    return method_frame(channel, 85, 10, b"\x00")


def exchange_declare(channel: int, name: str, kind: str, durable: bool) -> bytes:
    arguments = (
        b"\x00\x00" + encode_shortstr(name) + encode_shortstr(kind)
        + bits(False, durable, False, False, False) + encode_table({})
    )
    return method_frame(channel, 40, 10, arguments)


def exchange_delete(channel: int, name: str) -> bytes:
    return method_frame(channel, 40, 20, b"\x00\x00" + encode_shortstr(name) + bits(False, False))


def queue_declare(channel: int, name: str, durable: bool, arguments: dict[str, str | int | bool]) -> bytes:
    flags = bits(False, durable, False, False, False)  # passive, durable, exclusive, auto-delete, no-wait
    return method_frame(channel, 50, 10, b"\x00\x00" + encode_shortstr(name) + flags + encode_table(arguments))


def queue_bind(channel: int, queue: str, exchange: str, routing_key: str) -> bytes:
    arguments = (
        b"\x00\x00" + encode_shortstr(queue) + encode_shortstr(exchange) + encode_shortstr(routing_key)
        + b"\x00" + encode_table({})
    )
    return method_frame(channel, 50, 20, arguments)


def queue_purge(channel: int, queue: str) -> bytes:
    return method_frame(channel, 50, 30, b"\x00\x00" + encode_shortstr(queue) + b"\x00")


def queue_delete(channel: int, queue: str) -> bytes:
    return method_frame(channel, 50, 40, b"\x00\x00" + encode_shortstr(queue) + bits(False, False, False))


def basic_qos(channel: int, prefetch_count: int) -> bytes:
    return method_frame(channel, 60, 10, struct.pack(">IH", 0, prefetch_count) + b"\x00")


def basic_consume(channel: int, queue: str, consumer_tag: str) -> bytes:
    flags = bits(False, False, False, False)  # no-local, no-ack, exclusive, no-wait
    arguments = b"\x00\x00" + encode_shortstr(queue) + encode_shortstr(consumer_tag) + flags + encode_table({})
    return method_frame(channel, 60, 20, arguments)


def basic_ack(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    return method_frame(channel, 60, 80, _U64.pack(delivery_tag) + bits(multiple))


def content_header(channel: int, body_size: int, delivery_mode: int) -> bytes:
    # class 60, weight 0, body size, property flags with only delivery-mode (bit 12) set, then the octet.
    payload = struct.pack(">HHQHB", 60, 0, body_size, 1 << 12, delivery_mode)
    return frame(FRAME_HEADER, channel, payload)


def publish_prefix(channel: int, exchange: str, routing_key: str, body_size: int, delivery_mode: int) -> bytes:
    """basic.publish + content header + the head of the body frame: append exactly `body_size` bytes and
    FRAME_END to get one complete message."""
    publish = method_frame(
        channel, 60, 40, b"\x00\x00" + encode_shortstr(exchange) + encode_shortstr(routing_key) + bits(False, False)
    )
    body_head = _FRAME_HEAD.pack(FRAME_BODY, channel, body_size)
    return publish + content_header(channel, body_size, delivery_mode) + body_head


def stamped_body(timestamp_ns: int, body_size: int) -> bytes:
    """A body of `body_size` bytes whose first 8 carry a send timestamp (monotonic ns, big-endian)."""
    if body_size < 8:
        raise ValueError("bodies carry an 8-byte timestamp, so body_size must be >= 8")
    return _U64.pack(timestamp_ns) + b"x" * (body_size - 8)


# --- parsing ------------------------------------------------------------------------------------------------


class FrameBuffer:
    """Incremental frame splitter: feed bytes, take complete frames; partial frames wait for more input."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def frames(self) -> list[Frame]:
        found: list[Frame] = []
        buffer = self._buffer
        position = 0
        while len(buffer) - position >= FRAME_HEADER_SIZE + 1:
            frame_type, channel, size = _FRAME_HEAD.unpack_from(buffer, position)
            end = position + FRAME_HEADER_SIZE + size
            if end >= len(buffer):
                break
            if buffer[end] != FRAME_END_BYTE:
                raise ProtocolError(f"bad frame end octet 0x{buffer[end]:02x}")
            found.append(Frame(frame_type, channel, bytes(buffer[position + FRAME_HEADER_SIZE : end])))
            position = end + 1
        del buffer[:position]
        return found


def parse_shortstr(payload: bytes, offset: int) -> tuple[str, int]:
    length = payload[offset]
    start = offset + 1
    return payload[start : start + length].decode("utf-8", "replace"), start + length


def parse_close(payload: bytes) -> tuple[int, str]:
    """reply-code and reply-text of a connection.close or channel.close payload."""
    (reply_code,) = struct.unpack_from(">H", payload, 4)
    reply_text, _ = parse_shortstr(payload, 6)
    return reply_code, reply_text


def parse_tune(payload: bytes) -> tuple[int, int, int]:
    """channel-max, frame-max, heartbeat of connection.tune."""
    channel_max, frame_max, heartbeat_s = struct.unpack_from(">HIH", payload, 4)
    return channel_max, frame_max, heartbeat_s


def parse_ack(payload: bytes | bytearray | memoryview, offset: int = 0) -> tuple[int, bool]:
    """delivery-tag and multiple of basic.ack / basic.nack starting at `offset` (the class id)."""
    (tag,) = _U64.unpack_from(payload, offset + 4)
    return tag, bool(payload[offset + 12] & 1)


def parse_deliver_tag(payload: bytes | bytearray | memoryview, offset: int = 0) -> int:
    """delivery-tag of basic.deliver: after class/method ids and the consumer-tag shortstr."""
    tag_length = payload[offset + 4]
    value: int = _U64.unpack_from(payload, offset + 5 + tag_length)[0]
    return value


def parse_queue_declare_ok(payload: bytes) -> tuple[str, int, int]:
    """queue name, message count and consumer count of queue.declare-ok."""
    name, offset = parse_shortstr(payload, 4)
    message_count, consumer_count = struct.unpack_from(">II", payload, offset)
    return name, message_count, consumer_count
