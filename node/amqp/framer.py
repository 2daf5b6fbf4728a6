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
_HEADER: Final = struct.Struct(">BHI")


class FramingError(Exception):
    """The byte stream is broken beyond recovery: the connection must close with 501 FRAME_ERROR."""


class BadProtocolHeader(Exception):
    """The peer did not open with AMQP 0-9-1's protocol header."""

    def __init__(self, received: bytes) -> None:
        super().__init__(f"bad protocol header {received!r}")
        self.received = received


class Framer:
    """Turns a byte stream into frames. Not thread-safe; one per connection."""

    __slots__ = ("_buffer", "_header_seen", "frame_max_bytes")

    def __init__(self, frame_max_bytes: int, expect_protocol_header: bool = True) -> None:
        self._buffer = b""
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
        buf = self._buffer + data if self._buffer else bytes(data)
        offset = 0
        frames: list[RawFrame] = []
        if not self._header_seen:
            if len(buf) < 8:
                self._buffer = buf
                if not PROTOCOL_HEADER.startswith(buf[:4]):
                    return frames, BadProtocolHeader(buf)
                return frames, None
            if buf[:8] != PROTOCOL_HEADER:
                self._buffer = b""
                return frames, BadProtocolHeader(buf[:8])
            self._header_seen = True
            offset = 8
        end = len(buf)
        frame_max = self.frame_max_bytes
        unpack = _HEADER.unpack_from
        error: Exception | None = None
        while end - offset >= FRAME_HEADER_SIZE:
            frame_type, channel, size = unpack(buf, offset)
            if size > frame_max:
                error = FramingError(
                    f"frame size {size} is larger than the negotiated frame_max {frame_max} "
                    f"(frame type {frame_type}, channel {channel})"
                )
                break
            frame_end = offset + FRAME_HEADER_SIZE + size
            if frame_end >= end:
                break
            if buf[frame_end] != FRAME_END:
                error = FramingError(
                    f"invalid frame end marker 0x{buf[frame_end]:02x} (frame type {frame_type}, channel {channel})"
                )
                break
            frames.append((frame_type, channel, buf[offset + FRAME_HEADER_SIZE : frame_end]))
            offset = frame_end + 1
        self._buffer = b"" if error is not None else buf[offset:]
        return frames, error
