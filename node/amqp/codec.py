"""Method and frame codec: a generic, table-driven codec for every method plus hand-written hot paths.

The generic codec compiles each method class's `WIRE` layout (see methods.py) into an encoder and a decoder;
consecutive `bit` fields share one octet, low bit first, as the spec says. The hot path -- Basic.Publish,
Basic.Ack/Nack/Reject decode, Basic.Deliver (+ header + body frames) encode and Basic.Ack encode for confirms -- is
written out with precompiled `struct.Struct`s and one bytes join per call, and tested byte for byte against both
the generic codec and pamqp. Decoders raise `DecodeError` (malformed) or `UnknownMethodError`; never anything else.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Final

from node.amqp.fieldtable import (
    U8,
    U16,
    U32,
    U64,
    DecodeError,
    decode_guard,
    decode_longstr,
    decode_shortstr,
    decode_table,
    decode_text,
    encode_longstr,
    encode_shortstr,
    encode_table,
)
from node.amqp.methods import (
    METHOD_CLASSES,
    BasicAck,
    BasicNack,
    BasicPublish,
    BasicReject,
    Method,
)
from node.amqp.properties import (
    EMPTY_PROPERTIES,
    HEADER_PREFIX,
    BasicProperties,
    decode_content_header,
    encode_content_header,
    encode_properties,
)
from node.amqp.spec import CLASS_BASIC, FRAME_BODY, FRAME_END_BYTE, FRAME_HEADER, FRAME_METHOD, FRAME_OVERHEAD

FRAME_HEADER_STRUCT: Final = struct.Struct(">BHI")
METHOD_ID_STRUCT: Final = struct.Struct(">HH")


class UnknownMethodError(Exception):
    """The class or method id is not one we know."""

    def __init__(self, class_id: int, method_id: int, known_class: bool) -> None:
        super().__init__(f"unknown method {class_id}.{method_id}")
        self.class_id = class_id
        self.method_id = method_id
        self.known_class = known_class


Decoder = Callable[[bytes], Method]
Encoder = Callable[[Method], bytes]

_RESERVED_DEFAULTS: Final[dict[str, Any]] = {
    "octet": 0,
    "short": 0,
    "long": 0,
    "longlong": 0,
    "shortstr": "",
    "longstr": b"",
    "text": "",
    "bit": False,
    "table": {},
}
_FIELD_DECODERS: Final[dict[str, Callable[[bytes, int], tuple[Any, int]]]] = {
    "shortstr": decode_shortstr,
    "longstr": decode_longstr,
    "text": decode_text,
    "table": decode_table,
}
_FIXED: Final[dict[str, struct.Struct]] = {
    "octet": U8,
    "short": U16,
    "long": U32,
    "longlong": U64,
}
_FIELD_ENCODERS: Final[dict[str, Callable[[Any], bytes]]] = {
    "shortstr": encode_shortstr,
    "longstr": encode_longstr,
    "text": encode_longstr,
    "table": encode_table,
    "octet": U8.pack,
    "short": U16.pack,
    "long": U32.pack,
    "longlong": U64.pack,
}


def _compile_decoder(cls: type[Method]) -> Decoder:
    wire = cls.WIRE

    def decode(payload: bytes) -> Method:
        offset = 4
        values: dict[str, Any] = {}
        bit_index = 8
        bits = 0
        for name, kind in wire:
            if kind == "bit":
                if bit_index == 8:
                    bits = payload[offset]
                    offset += 1
                    bit_index = 0
                value: Any = bool(bits & (1 << bit_index))
                bit_index += 1
            else:
                bit_index = 8
                fixed = _FIXED.get(kind)
                if fixed is not None:
                    (value,) = fixed.unpack_from(payload, offset)
                    offset += fixed.size
                else:
                    value, offset = _FIELD_DECODERS[kind](payload, offset)
            if name is not None:
                values[name] = value
        if offset != len(payload):
            raise DecodeError(f"{cls.NAME} has {len(payload) - offset} trailing bytes")
        return cls(**values)

    return decode


def _compile_encoder(cls: type[Method]) -> Encoder:
    wire = cls.WIRE
    prefix = METHOD_ID_STRUCT.pack(cls.CLASS_ID, cls.METHOD_ID)

    def encode(method: Method) -> bytes:
        parts = [prefix]
        bits = 0
        bit_index = 0
        for name, kind in wire:
            value = _RESERVED_DEFAULTS[kind] if name is None else getattr(method, name)
            if kind == "bit":
                if value:
                    bits |= 1 << bit_index
                bit_index += 1
                if bit_index == 8:
                    parts.append(U8.pack(bits))
                    bits = bit_index = 0
                continue
            if bit_index:
                parts.append(U8.pack(bits))
                bits = bit_index = 0
            parts.append(_FIELD_ENCODERS[kind](value))
        if bit_index:
            parts.append(U8.pack(bits))
        return b"".join(parts)

    return encode


GENERIC_DECODERS: Final[dict[int, Decoder]] = {
    (cls.CLASS_ID << 16) | cls.METHOD_ID: _compile_decoder(cls) for cls in METHOD_CLASSES
}
GENERIC_ENCODERS: Final[dict[type[Method], Encoder]] = {cls: _compile_encoder(cls) for cls in METHOD_CLASSES}
KNOWN_CLASS_IDS: Final = frozenset(cls.CLASS_ID for cls in METHOD_CLASSES)


# ---------------------------------------------------------------- hot-path decoders
_ACK_STRUCT: Final = struct.Struct(">QB")


def decode_publish(payload: bytes) -> BasicPublish:
    """Basic.Publish: reserved short, exchange, routing-key, mandatory/immediate bits."""
    ex_len = payload[6]
    ex_end = 7 + ex_len
    rk_len = payload[ex_end]
    rk_end = ex_end + 1 + rk_len
    if rk_end + 1 != len(payload):
        raise DecodeError("Basic.Publish has the wrong length")
    bits = payload[rk_end]
    return BasicPublish(
        payload[7:ex_end].decode("utf-8", "surrogateescape"),
        payload[ex_end + 1 : rk_end].decode("utf-8", "surrogateescape"),
        bool(bits & 1),
        bool(bits & 2),
    )


_PUBLISHES_MAX: Final = 4096  # distinct Basic.Publish payloads remembered (exchange, routing key, flags)
_publishes: dict[bytes, BasicPublish] = {}


def decode_publish_cached(payload: bytes) -> BasicPublish:
    """`decode_publish`, sharing one (immutable) BasicPublish per distinct payload: publishers repeat them."""
    method = _publishes.get(payload)
    if method is None:
        method = decode_publish(payload)
        if len(_publishes) >= _PUBLISHES_MAX:
            _publishes.clear()
        _publishes[payload] = method
    return method


def decode_ack(payload: bytes) -> BasicAck:
    if len(payload) != 13:
        raise DecodeError("Basic.Ack has the wrong length")
    tag, bits = _ACK_STRUCT.unpack_from(payload, 4)
    return BasicAck(tag, bool(bits & 1))


def decode_reject(payload: bytes) -> BasicReject:
    if len(payload) != 13:
        raise DecodeError("Basic.Reject has the wrong length")
    tag, bits = _ACK_STRUCT.unpack_from(payload, 4)
    return BasicReject(tag, bool(bits & 1))


def decode_nack(payload: bytes) -> BasicNack:
    if len(payload) != 13:
        raise DecodeError("Basic.Nack has the wrong length")
    tag, bits = _ACK_STRUCT.unpack_from(payload, 4)
    return BasicNack(tag, bool(bits & 1), bool(bits & 2))


_DECODERS: Final[dict[int, Decoder]] = dict(GENERIC_DECODERS)
_DECODERS[(60 << 16) | 40] = decode_publish
_DECODERS[(60 << 16) | 80] = decode_ack
_DECODERS[(60 << 16) | 90] = decode_reject
_DECODERS[(60 << 16) | 120] = decode_nack


def decode_method(payload: bytes) -> Method:
    """Decode a method frame payload. Raises UnknownMethodError or DecodeError, nothing else."""
    if len(payload) < 4:
        raise DecodeError("method frame payload is shorter than 4 bytes")
    (key,) = U32.unpack_from(payload, 0)
    decoder = _DECODERS.get(key)
    if decoder is None:
        raise UnknownMethodError(key >> 16, key & 0xFFFF, (key >> 16) in KNOWN_CLASS_IDS)
    method: Method = decode_guard(lambda: decoder(payload))
    return method


def decode_method_generic(payload: bytes) -> Method:
    """The table-driven decoder only (for tests comparing it with the fast paths)."""
    (key,) = U32.unpack_from(payload, 0)
    decoder = GENERIC_DECODERS.get(key)
    if decoder is None:
        raise UnknownMethodError(key >> 16, key & 0xFFFF, (key >> 16) in KNOWN_CLASS_IDS)
    result: Method = decode_guard(lambda: decoder(payload))
    return result


# ---------------------------------------------------------------- encoders
def encode_method(method: Method) -> bytes:
    """Encode a method frame payload (class-id, method-id, arguments)."""
    return GENERIC_ENCODERS[type(method)](method)


def encode_frame(frame_type: int, channel: int, payload: bytes) -> bytes:
    return FRAME_HEADER_STRUCT.pack(frame_type, channel, len(payload)) + payload + FRAME_END_BYTE


def encode_method_frame(channel: int, method: Method) -> bytes:
    return encode_frame(FRAME_METHOD, channel, encode_method(method))


def encode_body_frames(channel: int, body: bytes, frame_max: int) -> bytes:
    """Body frames, each carrying at most frame_max - 8 bytes; no frame at all for an empty body."""
    chunk = frame_max - FRAME_OVERHEAD
    size = len(body)
    if size <= chunk:
        if not size:
            return b""
        return FRAME_HEADER_STRUCT.pack(FRAME_BODY, channel, size) + body + FRAME_END_BYTE
    view = memoryview(body)
    parts: list[bytes | memoryview] = []
    for start in range(0, size, chunk):
        piece = view[start : start + chunk]
        parts += (FRAME_HEADER_STRUCT.pack(FRAME_BODY, channel, len(piece)), piece, FRAME_END_BYTE)
    return b"".join(parts)


def encode_content_frames(
    channel: int, method: Method, properties: BasicProperties, body: bytes, frame_max: int
) -> bytes:
    """Method frame + content header frame + body frames, as one bytes object."""
    header = _header_payload(len(body), properties)
    return b"".join(
        (
            encode_method_frame(channel, method),
            FRAME_HEADER_STRUCT.pack(FRAME_HEADER, channel, len(header)),
            header,
            FRAME_END_BYTE,
            encode_body_frames(channel, body, frame_max),
        )
    )


def _header_payload(body_size: int, properties: BasicProperties) -> bytes:
    if properties is EMPTY_PROPERTIES:
        return HEADER_PREFIX.pack(CLASS_BASIC, 0, body_size, 0)
    flags, encoded = encode_properties(properties)
    return HEADER_PREFIX.pack(CLASS_BASIC, 0, body_size, flags) + encoded


# Deliver: frame header (type, channel, size) + class/method ids; then shortstr consumer tag.
_DELIVER_PREFIX: Final = struct.Struct(">BHIHH")
_DELIVER_TAG: Final = struct.Struct(">QB")
_HEADER_FRAME_PREFIX: Final = struct.Struct(">BHIHHQH")  # frame header + class, weight, body size, flags
_ACK_FRAME: Final = struct.Struct(">BHIHHQBB")


_DELIVER_PARTS_MAX: Final = 4096  # (channel, consumer tag, exchange, routing key) combinations remembered
_deliver_parts: dict[tuple[int, str, str, str], tuple[bytes, bytes]] = {}
# (channel, consumer tag, exchange, routing key, id(properties), body size) -> (properties, bytes before the
# delivery tag, bytes from after it to the body); the properties object is kept so that its id stays unique.
_DELIVER_SKELETONS_MAX: Final = 4096
_deliver_skeletons: dict[tuple[int, str, str, str, int, int], tuple[BasicProperties, bytes, bytes]] = {}


def _deliver_method_parts(channel: int, consumer_tag: str, exchange: str, routing_key: str) -> tuple[bytes, bytes]:
    """The Basic.Deliver method frame around its delivery tag: (frame header .. consumer tag, exchange .. end)."""
    key = (channel, consumer_tag, exchange, routing_key)
    parts = _deliver_parts.get(key)
    if parts is not None:
        return parts
    ctag = consumer_tag.encode("utf-8", "surrogateescape")
    exch = exchange.encode("utf-8", "surrogateescape")
    rkey = routing_key.encode("utf-8", "surrogateescape")
    if len(ctag) > 255 or len(exch) > 255 or len(rkey) > 255:
        raise ValueError("consumer tag, exchange and routing key are limited to 255 bytes")
    method_size = 4 + 1 + len(ctag) + 9 + 1 + len(exch) + 1 + len(rkey)
    head = _DELIVER_PREFIX.pack(FRAME_METHOD, channel, method_size, 60, 60) + bytes((len(ctag),)) + ctag
    tail = bytes((len(exch),)) + exch + bytes((len(rkey),)) + rkey + b"\xce"
    if len(_deliver_parts) >= _DELIVER_PARTS_MAX:
        _deliver_parts.clear()
    parts = _deliver_parts[key] = (head, tail)
    return parts


def encode_deliver_frames(
    channel: int,
    consumer_tag: str,
    delivery_tag: int,
    redelivered: bool,
    exchange: str,
    routing_key: str,
    properties: BasicProperties,
    body: bytes,
    frame_max: int,
) -> bytes:
    """Basic.Deliver + content header + body frames in one join (the consumer hot path).

    The method frame's fixed parts are cached per (channel, consumer tag, exchange, routing key) and the property
    list comes from `encode_properties` (the publisher's own bytes when they are remembered). A single-frame body's
    frames around the delivery tag and the body are remembered per (channel, consumer tag, exchange, routing key,
    properties object, body size): a repeat is one lookup, one pack and one join."""
    body_size = len(body)
    key = (channel, consumer_tag, exchange, routing_key, id(properties), body_size)
    skeleton = _deliver_skeletons.get(key)
    if skeleton is not None and skeleton[0] is properties and body_size <= frame_max - FRAME_OVERHEAD:
        return b"".join((skeleton[1], _DELIVER_TAG.pack(delivery_tag, 1 if redelivered else 0), skeleton[2], body,
                         FRAME_END_BYTE))
    head, tail = _deliver_method_parts(channel, consumer_tag, exchange, routing_key)
    if properties is EMPTY_PROPERTIES:
        flags, encoded_props = 0, b""
    else:
        flags, encoded_props = encode_properties(properties)
    if 0 < body_size <= frame_max - FRAME_OVERHEAD:
        body_head = FRAME_HEADER_STRUCT.pack(FRAME_BODY, channel, body_size)
        body_end = FRAME_END_BYTE
        if len(_deliver_skeletons) >= _DELIVER_SKELETONS_MAX:
            _deliver_skeletons.clear()
        header_frame = _HEADER_FRAME_PREFIX.pack(FRAME_HEADER, channel, 14 + len(encoded_props), 60, 0, body_size,
                                                 flags)
        _deliver_skeletons[key] = (properties, head, b"".join((tail, header_frame, encoded_props, b"\xce",
                                                                body_head)))
    else:
        body_head, body, body_end = b"", encode_body_frames(channel, body, frame_max), b""
    return b"".join(
        (
            head,
            _DELIVER_TAG.pack(delivery_tag, 1 if redelivered else 0),
            tail,
            _HEADER_FRAME_PREFIX.pack(
                FRAME_HEADER, channel, 14 + len(encoded_props), 60, 0, body_size, flags
            ),
            encoded_props,
            b"\xce",
            body_head,
            body,
            body_end,
        )
    )


def encode_ack_frame(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    """Basic.Ack method frame (publisher confirms)."""
    return _ACK_FRAME.pack(FRAME_METHOD, channel, 13, 60, 80, delivery_tag, 1 if multiple else 0, 0xCE)


def encode_nack_frame(channel: int, delivery_tag: int, multiple: bool, requeue: bool = False) -> bytes:
    """Basic.Nack method frame (publisher confirms)."""
    bits = (1 if multiple else 0) | (2 if requeue else 0)
    return _ACK_FRAME.pack(FRAME_METHOD, channel, 13, 60, 120, delivery_tag, bits, 0xCE)


__all__ = [
    "FRAME_HEADER_STRUCT",
    "DecodeError",
    "UnknownMethodError",
    "decode_ack",
    "decode_content_header",
    "decode_method",
    "decode_method_generic",
    "decode_nack",
    "decode_publish",
    "decode_publish_cached",
    "decode_reject",
    "encode_ack_frame",
    "encode_body_frames",
    "encode_content_frames",
    "encode_content_header",
    "encode_deliver_frames",
    "encode_frame",
    "encode_method",
    "encode_method_frame",
    "encode_nack_frame",
]
