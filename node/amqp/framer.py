"""Incremental, bounded AMQP 0-9-1 framer: bytes in, `(frame_type, channel, payload)` tuples out.

How it works: the first 8 bytes must be the protocol header (anything else is `BadProtocolHeader`, which the
connection answers with our header before closing). After that, each frame's 7-byte header is peeked; its size is
checked against `frame_max_bytes` *before* any payload is buffered, then the frame is taken only once it is complete
and its end octet is 0xCE. Partial input just waits for more data and is never an error.
Bound: between calls the framer holds at most one partial frame (<= frame_max_bytes + 8 bytes); complete frames in
one `feed` are returned together, so memory is bounded by the caller's read size plus one frame.
"""

from __future__ import annotations

import struct
from typing import Final

from node.amqp.spec import FRAME_END, FRAME_HEADER_SIZE, PROTOCOL_HEADER

RawFrame = tuple[int, int, bytes]
FRAME_HEADER_STRUCT: Final = struct.Struct(">BHI")  # frame type, channel, payload size
_HEADER: Final = FRAME_HEADER_STRUCT


class FramingError(Exception):
    """The byte stream is broken beyond recovery: the connection must close with 501 FRAME_ERROR."""


class BadProtocolHeader(Exception):
    """The peer did not open with AMQP 0-9-1's protocol header."""

    def __init__(self, received: bytes) -> None:
        super().__init__(f"bad protocol header {received!r}")
        self.received = received


class Framer:
    """Turns a byte stream into frames. Not thread-safe; one per connection.

    A partial frame is kept in a bytearray together with the byte count it needs (`_need`), so a peer trickling
    one byte at a time costs amortised O(1) per byte, not a copy of the whole partial frame.
    """

    __slots__ = ("_buffer", "_header_seen", "_need", "frame_max_bytes")

    def __init__(self, frame_max_bytes: int, expect_protocol_header: bool = True) -> None:
        self._buffer = bytearray()
        self._need = 8 if expect_protocol_header else FRAME_HEADER_SIZE
        self._header_seen = not expect_protocol_header
        self.frame_max_bytes = frame_max_bytes

    @property
    def header_seen(self) -> bool:
        return self._header_seen

    @property
    def buffered_bytes(self) -> int:
        return len(self._buffer)

    def feed(self, data: bytes) -> tuple[list[RawFrame], Exception | None]:
        """Add bytes; return the complete frames and, if the stream broke after them, the error.

        Frames before the error are valid and must be processed before acting on the error.
        """
        frames: list[RawFrame] = []
        if self._buffer:
            self._buffer += data
            if len(self._buffer) < self._need:
                return frames, self._check_partial_header()
            buf = bytes(self._buffer)
            self._buffer = bytearray()
        else:
            buf = bytes(data)
        offset = 0
        if not self._header_seen:
            if len(buf) < 8:
                self._buffer = bytearray(buf)
                return frames, self._check_partial_header()
            if buf[:8] != PROTOCOL_HEADER:
                return frames, BadProtocolHeader(buf[:8])
            self._header_seen = True
            offset = 8
        error, offset = self._parse(buf, offset, frames)
        if error is None and offset < len(buf):
            self._buffer = bytearray(buf[offset:])
        return frames, error

    def take_buffer(self, data: bytes) -> bytes | None:
        """After the protocol header: the bytes to parse from offset 0 (a kept partial frame joined with `data`),
        or None while the partial frame is still incomplete. The caller parses frames itself (`parse_frames`, or
        the connection's fused publish loop, which checks every frame as `_parse` does) and hands the unparsed
        rest back with `keep_rest`."""
        if self._buffer:
            self._buffer += data
            if len(self._buffer) < self._need:
                return None
            buf = bytes(self._buffer)
            self._buffer = bytearray()
            return buf
        return data

    def keep_rest(self, buf: bytes, offset: int, need: int) -> None:
        """Keep `buf[offset:]` (an incomplete frame, `need` bytes of which must be buffered to go on)."""
        if offset < len(buf):
            self._buffer = bytearray(buf[offset:])
        self._need = need

    def parse_frames(self, buf: bytes, offset: int, frames: list[RawFrame]) -> tuple[Exception | None, int]:
        """The complete frames of `buf` from `offset` (checked), the error that stopped them, and the offset of
        the unparsed rest; the rest is kept for the next call unless an error ended the stream."""
        error, offset = self._parse(buf, offset, frames)
        if error is None and offset < len(buf):
            self._buffer = bytearray(buf[offset:])
        return error, offset

    def _check_partial_header(self) -> Exception | None:
        if not self._header_seen and not PROTOCOL_HEADER.startswith(bytes(self._buffer[:4])):
            received = bytes(self._buffer)
            self._buffer = bytearray()
            return BadProtocolHeader(received)
        return None

    def _parse(self, buf: bytes, offset: int, frames: list[RawFrame]) -> tuple[Exception | None, int]:
        end = len(buf)
        frame_max = self.frame_max_bytes
        unpack = _HEADER.unpack_from
        self._need = FRAME_HEADER_SIZE
        while end - offset >= FRAME_HEADER_SIZE:
            frame_type, channel, size = unpack(buf, offset)
            if size > frame_max:
                return FramingError(
                    f"frame size {size} is larger than the negotiated frame_max {frame_max} "
                    f"(frame type {frame_type}, channel {channel})"
                ), offset
            frame_end = offset + FRAME_HEADER_SIZE + size
            if frame_end >= end:
                self._need = frame_end + 1 - offset
                break
            if buf[frame_end] != FRAME_END:
                return FramingError(
                    f"invalid frame end marker 0x{buf[frame_end]:02x} (frame type {frame_type}, channel {channel})"
                ), offset
            frames.append((frame_type, channel, buf[offset + FRAME_HEADER_SIZE : frame_end]))
            offset = frame_end + 1
        return None, offset
