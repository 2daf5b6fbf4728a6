"""Basic content properties (the 14 of class Basic) and the content-header codec.

A content header payload is: class-id (short), weight (short, 0), body-size (longlong), property-flags (short;
bit 15 = content_type ... bit 2 = cluster_id; bit 0 would announce another flags word, which Basic never needs and
which we reject), then the present properties in order. `timestamp` is an int of seconds since the epoch (the
field-table `T` type is a datetime instead, see fieldtable.py). Unset properties are None.

Two bounded caches make the publish -> deliver path cheap (RabbitMQ also keeps a publisher's encoded properties):
- decoded: a content header whose property list was seen recently (and has no `headers` table, the one mutable
  value) decodes to the same shared `BasicProperties` object, without parsing or allocating;
- encoded: the encoded property list of a `BasicProperties` object, by identity, recorded when it is decoded (the
  publisher's own bytes, reused verbatim on delivery) or first encoded. `encode_properties` consults it first.
Both rely on `BasicProperties` being a value: never mutate a `headers` dict in place after decoding or sending it
(build a new one with `dataclasses.replace`). Each cache is cleared when full; a miss costs one decode/encode.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from node.amqp.fieldtable import (
    U8,
    U64,
    DecodeError,
    decode_guard,
    decode_shortstr,
    decode_table,
    encode_shortstr,
    encode_table,
)
from node.amqp.spec import CLASS_BASIC

HEADER_PREFIX: Final = struct.Struct(">HHQH")  # class-id, weight, body-size, property-flags


@dataclass(frozen=True, slots=True)
class BasicProperties:
    content_type: str | None = None
    content_encoding: str | None = None
    headers: dict[str, Any] | None = None
    delivery_mode: int | None = None
    priority: int | None = None
    correlation_id: str | None = None
    reply_to: str | None = None
    expiration: str | None = None
    message_id: str | None = None
    timestamp: int | None = None
    type: str | None = None
    user_id: str | None = None
    app_id: str | None = None
    cluster_id: str | None = None


EMPTY_PROPERTIES: Final = BasicProperties()

# (name, flag bit, kind) in wire order.
PROPERTY_LAYOUT: Final = (
    ("content_type", 1 << 15, "shortstr"),
    ("content_encoding", 1 << 14, "shortstr"),
    ("headers", 1 << 13, "table"),
    ("delivery_mode", 1 << 12, "octet"),
    ("priority", 1 << 11, "octet"),
    ("correlation_id", 1 << 10, "shortstr"),
    ("reply_to", 1 << 9, "shortstr"),
    ("expiration", 1 << 8, "shortstr"),
    ("message_id", 1 << 7, "shortstr"),
    ("timestamp", 1 << 6, "timestamp"),
    ("type", 1 << 5, "shortstr"),
    ("user_id", 1 << 4, "shortstr"),
    ("app_id", 1 << 3, "shortstr"),
    ("cluster_id", 1 << 2, "shortstr"),
)
_KNOWN_FLAGS: Final = sum(bit for _, bit, _ in PROPERTY_LAYOUT)


_DECODED_MAX: Final = 1024  # distinct header-less property lists (each at most ~3.3 KiB of short strings)
_ENCODED_MAX: Final = 8192  # properties objects whose encoding is remembered (roughly the messages in flight)
_decoded: dict[bytes, BasicProperties] = {}  # flags + property list bytes -> the shared decoded properties
_encoded: dict[int, tuple[BasicProperties, int, bytes]] = {}  # id(properties) -> (properties, flags, encoded)


def _remember_encoded(properties: BasicProperties, flags: int, encoded: bytes) -> None:
    if len(_encoded) >= _ENCODED_MAX:
        _encoded.clear()
    _encoded[id(properties)] = (properties, flags, encoded)  # the strong reference keeps the id unique


def encode_properties(properties: BasicProperties) -> tuple[int, bytes]:
    """Return (property-flags, encoded property list); the remembered encoding when there is one."""
    cached = _encoded.get(id(properties))
    if cached is not None and cached[0] is properties:
        return cached[1], cached[2]
    flags, encoded = _encode_properties(properties)
    _remember_encoded(properties, flags, encoded)
    return flags, encoded


def _encode_properties(properties: BasicProperties) -> tuple[int, bytes]:
    flags = 0
    parts: list[bytes] = []
    for name, bit, kind in PROPERTY_LAYOUT:
        value = getattr(properties, name)
        if value is None:
            continue
        flags |= bit
        if kind == "shortstr":
            parts.append(encode_shortstr(value))
        elif kind == "table":
            parts.append(encode_table(value))
        elif kind == "octet":
            parts.append(U8.pack(value))
        else:
            parts.append(U64.pack(value))
    return flags, b"".join(parts)


def encode_content_header(body_size: int, properties: BasicProperties, class_id: int = CLASS_BASIC) -> bytes:
    """Encode a content header payload (without frame header/end)."""
    if properties is EMPTY_PROPERTIES:
        return HEADER_PREFIX.pack(class_id, 0, body_size, 0)
    flags, encoded = encode_properties(properties)
    return HEADER_PREFIX.pack(class_id, 0, body_size, flags) + encoded


def _decode_octet(buf: bytes, offset: int) -> tuple[int, int]:
    return buf[offset], offset + 1


def _decode_timestamp(buf: bytes, offset: int) -> tuple[int, int]:
    return U64.unpack_from(buf, offset)[0], offset + 8


_DECODERS: Final[dict[str, Callable[[bytes, int], tuple[Any, int]]]] = {
    "shortstr": decode_shortstr,
    "table": decode_table,
    "octet": _decode_octet,
    "timestamp": _decode_timestamp,
}
_PLANS_MAX: Final = 4096  # distinct property-flag combinations remembered (16384 exist; real clients use few)
_plans: dict[int, tuple[tuple[str, Callable[[bytes, int], tuple[Any, int]]], ...]] = {}


def _plan(flags: int) -> tuple[tuple[str, Callable[[bytes, int], tuple[Any, int]]], ...]:
    plan = _plans.get(flags)
    if plan is None:
        plan = tuple((name, _DECODERS[kind]) for name, bit, kind in PROPERTY_LAYOUT if flags & bit)
        if len(_plans) < _PLANS_MAX:
            _plans[flags] = plan
    return plan


def _decode_property_list(payload: bytes, flags: int) -> BasicProperties:
    if flags & ~_KNOWN_FLAGS:
        raise DecodeError(f"content header has unknown property flags 0x{flags:04x}")
    values: dict[str, Any] = {}
    offset = HEADER_PREFIX.size
    for name, decode in _plan(flags):
        values[name], offset = decode(payload, offset)
    if offset != len(payload):
        raise DecodeError("content header has trailing bytes")
    return BasicProperties(**values)


def decode_content_header(payload: bytes) -> tuple[int, int, BasicProperties]:
    """Decode a content header payload into (class_id, body_size, properties). Raises DecodeError."""
    if len(payload) < HEADER_PREFIX.size:
        raise DecodeError("content header is shorter than 14 bytes")
    class_id, _weight, body_size, flags = HEADER_PREFIX.unpack_from(payload, 0)
    if flags == 0:
        if len(payload) != HEADER_PREFIX.size:
            raise DecodeError("content header has trailing bytes")
        return class_id, body_size, EMPTY_PROPERTIES
    raw = payload[12:]  # property flags + property list
    properties = _decoded.get(raw)
    if properties is None:
        properties = decode_guard(lambda: _decode_property_list(payload, flags))
        _remember_encoded(properties, flags, raw[2:])
        if properties.headers is None:
            if len(_decoded) >= _DECODED_MAX:
                _decoded.clear()
            _decoded[raw] = properties
    return class_id, body_size, properties
