"""Framer: protocol header negotiation, incremental frames, size check before buffering, frame-end check."""

from __future__ import annotations

from node.amqp.framer import BadProtocolHeader, Framer, FramingError
from node.amqp.spec import PROTOCOL_HEADER


def frame(frame_type: int, channel: int, payload: bytes, end: bytes = b"\xce") -> bytes:
    return bytes([frame_type]) + channel.to_bytes(2, "big") + len(payload).to_bytes(4, "big") + payload + end


def test_header_then_frames_in_one_read() -> None:
    framer = Framer(4096)
    frames, error = framer.feed(PROTOCOL_HEADER + frame(1, 0, b"abcd") + frame(8, 0, b""))
    assert error is None and frames == [(1, 0, b"abcd"), (8, 0, b"")]
    assert framer.header_seen and framer.buffered_bytes == 0


def test_partial_input_is_never_an_error() -> None:
    framer = Framer(65536)
    data = PROTOCOL_HEADER + frame(3, 7, bytes(range(256)) * 100) + frame(1, 7, b"xy")
    out = []
    for i in range(len(data)):
        frames, error = framer.feed(data[i : i + 1])
        assert error is None
        out += frames
        assert framer.buffered_bytes <= 25600 + 8
    assert out == [(3, 7, bytes(range(256)) * 100), (1, 7, b"xy")]


def test_wrong_protocol_header_detected_early_and_late() -> None:
    frames, error = Framer(4096).feed(b"GET ")
    assert frames == [] and isinstance(error, BadProtocolHeader)
    frames, error = Framer(4096).feed(b"AMQP\x01\x01\x00\x0a")
    assert isinstance(error, BadProtocolHeader) and error.received == b"AMQP\x01\x01\x00\x0a"


def test_size_checked_before_payload_arrives() -> None:
    framer = Framer(4096)
    framer.feed(PROTOCOL_HEADER)
    frames, error = framer.feed(b"\x03\x00\x01\x00\x10\x00\x01")  # only the 7-byte header of a 1 MiB frame
    assert frames == [] and isinstance(error, FramingError)
    assert "frame size 1048577 is larger than the negotiated frame_max 4096" in str(error)


def test_payload_of_exactly_frame_max_is_accepted() -> None:
    framer = Framer(4096, expect_protocol_header=False)
    frames, error = framer.feed(frame(3, 1, b"x" * 4096))
    assert error is None and len(frames) == 1


def test_bad_frame_end_after_valid_frames() -> None:
    framer = Framer(4096, expect_protocol_header=False)
    frames, error = framer.feed(frame(1, 1, b"ok") + frame(1, 1, b"bad", end=b"\x00"))
    assert frames == [(1, 1, b"ok")]
    assert isinstance(error, FramingError) and "invalid frame end marker 0x00" in str(error)
