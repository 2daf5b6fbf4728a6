"""AMQP 0-9-1 primitive and field-table codec (the wire types every other codec is built from).

Decoders take `(buf, offset)` and return `(value, new_offset)`; they raise `DecodeError` on malformed input
(never struct.error/IndexError to callers, see `decode_guard`). Encoders return bytes.

Field-table value types and their Python types (decode -> encode is lossless for these choices):
  t bool | b B U u I i L l int | f d float (floats are always encoded as `d`, 64-bit) | D decimal.Decimal
  | s int (RabbitMQ's short-int) | S str when valid UTF-8, else bytes (bytes encode back to `S`)
  | A list | T datetime (UTC-aware; naive datetimes are taken as UTC) | F dict | V None | x bytearray.
Python ints encode with the smallest type, as pamqp does: b, s, u, I, i, l. Short strings and table keys are
decoded with `surrogateescape`, so non-UTF-8 names round-trip byte for byte.
Bounds: nesting depth of tables/arrays is at most `TABLE_DEPTH_MAX`; every length is checked against the buffer.
"""

from __future__ import annotations

import datetime
import decimal
import struct
from collections.abc import Callable
from typing import Any, Final

TABLE_DEPTH_MAX: Final = 32

U8: Final = struct.Struct(">B")
I8: Final = struct.Struct(">b")
U16: Final = struct.Struct(">H")
I16: Final = struct.Struct(">h")
U32: Final = struct.Struct(">I")
I32: Final = struct.Struct(">i")
U64: Final = struct.Struct(">Q")
I64: Final = struct.Struct(">q")
F32: Final = struct.Struct(">f")
F64: Final = struct.Struct(">d")
DECIMAL: Final = struct.Struct(">Bi")

_EPOCH: Final = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


class DecodeError(ValueError):
    """The bytes are not a well-formed AMQP value (maps to 502 SYNTAX_ERROR / 501 FRAME_ERROR)."""


class EncodeError(ValueError):
    """A Python value cannot be put on the wire (too long, out of range, unsupported type)."""


def decode_shortstr(buf: bytes, offset: int) -> tuple[str, int]:
    length = buf[offset]
    end = offset + 1 + length
    if end > len(buf):
        raise DecodeError("short string runs past the end of the frame")
    return buf[offset + 1 : end].decode("utf-8", "surrogateescape"), end


def decode_longstr(buf: bytes, offset: int) -> tuple[bytes, int]:
    (length,) = U32.unpack_from(buf, offset)
    end = offset + 4 + length
    if end > len(buf):
        raise DecodeError("long string runs past the end of the frame")
    return bytes(buf[offset + 4 : end]), end


def decode_text(buf: bytes, offset: int) -> tuple[str, int]:
    raw, end = decode_longstr(buf, offset)
    return raw.decode("utf-8", "surrogateescape"), end


def encode_shortstr(value: str) -> bytes:
    raw = value.encode("utf-8", "surrogateescape")
    if len(raw) > 255:
        raise EncodeError(f"short string is {len(raw)} bytes, the limit is 255")
    return bytes((len(raw),)) + raw


def encode_longstr(value: bytes | str) -> bytes:
    raw = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else bytes(value)
    return U32.pack(len(raw)) + raw


def _fixed(fmt: struct.Struct) -> Callable[[bytes, int], tuple[Any, int]]:
    size = fmt.size

    def decode(buf: bytes, offset: int) -> tuple[Any, int]:
        return fmt.unpack_from(buf, offset)[0], offset + size

    return decode


def _decode_bool(buf: bytes, offset: int) -> tuple[bool, int]:
    return buf[offset] != 0, offset + 1


def _decode_decimal(buf: bytes, offset: int) -> tuple[decimal.Decimal, int]:
    scale, mantissa = DECIMAL.unpack_from(buf, offset)
    return decimal.Decimal(mantissa).scaleb(-scale), offset + 5


def _decode_table_longstr(buf: bytes, offset: int) -> tuple[str | bytes, int]:
    raw, end = decode_longstr(buf, offset)
    try:
        return raw.decode("utf-8"), end
    except UnicodeDecodeError:
        return raw, end


def _decode_timestamp(buf: bytes, offset: int) -> tuple[datetime.datetime, int]:
    (seconds,) = U64.unpack_from(buf, offset)
    try:
        return _EPOCH + datetime.timedelta(seconds=seconds), offset + 8
    except OverflowError:
        raise DecodeError(f"timestamp {seconds} is out of range")


def _decode_bytearray(buf: bytes, offset: int) -> tuple[bytearray, int]:
    raw, end = decode_longstr(buf, offset)
    return bytearray(raw), end


def _decode_void(buf: bytes, offset: int) -> tuple[None, int]:
    return None, offset


_SCALAR_DECODERS: Final[dict[int, Callable[[bytes, int], tuple[Any, int]]]] = {
    ord("t"): _decode_bool,
    ord("b"): _fixed(I8),
    ord("B"): _fixed(U8),
    ord("U"): _fixed(I16),
    ord("u"): _fixed(U16),
    ord("I"): _fixed(I32),
    ord("i"): _fixed(U32),
    ord("L"): _fixed(I64),
    ord("l"): _fixed(I64),
    ord("f"): _fixed(F32),
    ord("d"): _fixed(F64),
    ord("D"): _decode_decimal,
    ord("s"): _fixed(I16),
    ord("S"): _decode_table_longstr,
    ord("T"): _decode_timestamp,
    ord("V"): _decode_void,
    ord("x"): _decode_bytearray,
}


def _decode_value(buf: bytes, offset: int, depth: int) -> tuple[Any, int]:
    kind = buf[offset]
    offset += 1
    if kind == 0x46:  # F
        return _decode_table_at(buf, offset, depth + 1)
    if kind == 0x41:  # A
        return _decode_array_at(buf, offset, depth + 1)
    decoder = _SCALAR_DECODERS.get(kind)
    if decoder is None:
        raise DecodeError(f"unknown field value type {chr(kind)!r}")
    return decoder(buf, offset)


def _decode_table_at(buf: bytes, offset: int, depth: int) -> tuple[dict[str, Any], int]:
    if depth > TABLE_DEPTH_MAX:
        raise DecodeError(f"field tables nested deeper than {TABLE_DEPTH_MAX}")
    (length,) = U32.unpack_from(buf, offset)
    offset += 4
    end = offset + length
    if end > len(buf):
        raise DecodeError("field table runs past the end of the frame")
    table: dict[str, Any] = {}
    while offset < end:
        key, offset = decode_shortstr(buf, offset)
        table[key], offset = _decode_value(buf, offset, depth)
    if offset != end:
        raise DecodeError("field table length does not match its contents")
    return table, end


def _decode_array_at(buf: bytes, offset: int, depth: int) -> tuple[list[Any], int]:
    if depth > TABLE_DEPTH_MAX:
        raise DecodeError(f"field arrays nested deeper than {TABLE_DEPTH_MAX}")
    (length,) = U32.unpack_from(buf, offset)
    offset += 4
    end = offset + length
    if end > len(buf):
        raise DecodeError("field array runs past the end of the frame")
    items: list[Any] = []
    while offset < end:
        value, offset = _decode_value(buf, offset, depth)
        items.append(value)
    if offset != end:
        raise DecodeError("field array length does not match its contents")
    return items, end


def decode_table(buf: bytes, offset: int) -> tuple[dict[str, Any], int]:
    """Decode a length-prefixed field table at `offset`."""
    if buf[offset : offset + 4] == b"\x00\x00\x00\x00":
        return {}, offset + 4
    return _decode_table_at(buf, offset, 0)


def decode_table_body(buf: bytes) -> dict[str, Any]:
    """Decode table entries with no length prefix (the AMQPLAIN response format)."""
    table: dict[str, Any] = decode_guard(lambda: _decode_table_at(U32.pack(len(buf)) + buf, 0, 0)[0])
    return table


def decode_guard(fn: Callable[[], Any]) -> Any:
    """Run a decoder, turning any low-level failure on hostile bytes into DecodeError."""
    try:
        return fn()
    except DecodeError:
        raise
    except (struct.error, IndexError, ValueError, OverflowError, RecursionError) as exc:
        raise DecodeError(f"malformed data: {exc}") from exc


def _encode_int(value: int) -> bytes:
    if -128 <= value <= 127:
        return b"b" + I8.pack(value)
    if -32768 <= value <= 32767:
        return b"s" + I16.pack(value)
    if 0 <= value <= 65535:
        return b"u" + U16.pack(value)
    if -2147483648 <= value <= 2147483647:
        return b"I" + I32.pack(value)
    if 0 <= value <= 4294967295:
        return b"i" + U32.pack(value)
    if -9223372036854775808 <= value <= 9223372036854775807:
        return b"l" + I64.pack(value)
    raise EncodeError(f"integer {value} does not fit in 64 bits")


def _encode_decimal(value: decimal.Decimal) -> bytes:
    sign, digits, exponent = value.as_tuple()
    if not isinstance(exponent, int):
        raise EncodeError(f"decimal {value} is not finite")
    mantissa = int("".join(map(str, digits)) or "0")
    if exponent > 0:
        mantissa *= 10**exponent
        exponent = 0
    scale = -exponent
    if sign:
        mantissa = -mantissa
    if scale > 255 or not -2147483648 <= mantissa <= 2147483647:
        raise EncodeError(f"decimal {value} does not fit AMQP's scale octet + 32-bit value")
    return b"D" + DECIMAL.pack(scale, mantissa)


def _encode_timestamp(value: datetime.datetime) -> bytes:
    if value.tzinfo is None or value.tzinfo.utcoffset(value) is None:
        value = value.replace(tzinfo=datetime.UTC)
    seconds = int((value - _EPOCH).total_seconds())
    if seconds < 0:
        raise EncodeError(f"timestamp {value} is before 1970")
    return b"T" + U64.pack(seconds)


def encode_value(value: Any, depth: int = 0) -> bytes:
    """Encode one tagged field value (type octet + value)."""
    if isinstance(value, bool):
        return b"t\x01" if value else b"t\x00"
    if isinstance(value, int):
        return _encode_int(value)
    if isinstance(value, str):
        return b"S" + encode_longstr(value)
    if isinstance(value, bytearray):
        return b"x" + encode_longstr(bytes(value))
    if isinstance(value, bytes):
        return b"S" + encode_longstr(value)
    if isinstance(value, float):
        return b"d" + F64.pack(value)
    if isinstance(value, decimal.Decimal):
        return _encode_decimal(value)
    if isinstance(value, datetime.datetime):
        return _encode_timestamp(value)
    if value is None:
        return b"V"
    if depth >= TABLE_DEPTH_MAX:
        raise EncodeError(f"field tables nested deeper than {TABLE_DEPTH_MAX}")
    if isinstance(value, dict):
        return b"F" + _encode_table(value, depth + 1)
    if isinstance(value, (list, tuple)):
        body = b"".join(encode_value(item, depth + 1) for item in value)
        return b"A" + U32.pack(len(body)) + body
    raise EncodeError(f"cannot put a {type(value).__name__} in a field table")


def _encode_table(table: dict[str, Any], depth: int) -> bytes:
    if not table:
        return b"\x00\x00\x00\x00"
    body = b"".join(encode_shortstr(key) + encode_value(value, depth) for key, value in table.items())
    return U32.pack(len(body)) + body


def encode_table(table: dict[str, Any] | None) -> bytes:
    """Encode a length-prefixed field table (None and {} both give the empty table)."""
    return _encode_table(table or {}, 0)
