"""The PROXY protocol header parser (node/amqp/proxy_protocol.py): v1 and v2, incremental, bounded, strict."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from node.amqp.proxy_protocol import (
    V1_BYTES_MAX,
    V2_BYTES_MAX,
    V2_SIGNATURE,
    ProxyHeader,
    ProxyProtocolError,
    parse_proxy_header,
    v1_header,
    v2_header,
)

AMQP = b"AMQP\x00\x00\x09\x01"
SRC, DST = ("203.0.113.7", 51234), ("192.0.2.2", 5672)
SRC6, DST6 = ("2001:db8::7", 40000), ("2001:db8::1", 5672)


@pytest.mark.parametrize("header, expected", [
    (v1_header(SRC, DST), ProxyHeader(1, len(v1_header(SRC, DST)), SRC, DST)),
    (v1_header(SRC6, DST6), ProxyHeader(1, len(v1_header(SRC6, DST6)), SRC6, DST6)),
    (b"PROXY UNKNOWN\r\n", ProxyHeader(1, 15)),
    (b"PROXY UNKNOWN ffff::1 ffff::2 1 2\r\n", ProxyHeader(1, 35)),
    (v2_header(SRC, DST), ProxyHeader(2, 28, SRC, DST)),
    (v2_header(SRC6, DST6), ProxyHeader(2, 52, SRC6, DST6)),
    (v2_header(SRC, DST, tlvs=b"\x04\x00\x02ab"), ProxyHeader(2, 33, SRC, DST)),  # a TLV is skipped
    (v2_header(None, None), ProxyHeader(2, 16)),  # LOCAL: HAProxy's health checks
])
def test_valid_headers_parse_and_leave_the_amqp_bytes(header: bytes, expected: ProxyHeader) -> None:
    parsed = parse_proxy_header(header + AMQP)
    assert parsed == expected
    assert (header + AMQP)[parsed.length:] == AMQP


@pytest.mark.parametrize("header", [v1_header(SRC, DST), v2_header(SRC6, DST6), v2_header(None, None)])
def test_a_header_arriving_byte_by_byte_needs_more_until_complete(header: bytes) -> None:
    for end in range(len(header)):
        assert parse_proxy_header(header[:end]) is None
    assert parse_proxy_header(header) is not None


def _v2(command: int, family: int, body: bytes, length: int | None = None) -> bytes:
    size = len(body) if length is None else length
    return V2_SIGNATURE + bytes([0x20 | command, family]) + size.to_bytes(2, "big") + body


@pytest.mark.parametrize("data, message", [
    (AMQP, "no PROXY protocol header"),  # a plain AMQP client
    (b"GET / HTTP/1.1\r\n", "no PROXY protocol header"),
    (b"PROXZ TCP4", "no PROXY protocol header"),
    (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n", "CRLF"),
    (b"PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n", "PROXY TCP4|TCP6"),
    (b"PROXY TCP5 1.2.3.4 5.6.7.8 1 2\r\n", "PROXY TCP4|TCP6"),
    (b"PROXY TCP4 ::1 5.6.7.8 1 2\r\n", "bad TCP4 address"),
    (b"PROXY TCP6 1.2.3.4 ::1 1 2\r\n", "bad TCP6 address"),
    (b"PROXY TCP4 1.2.3.4 5.6.7.8 65536 2\r\n", "bad port"),
    (b"PROXY TCP4 1.2.3.4 5.6.7.8 01 2\r\n", "bad port"),
    (b"PROXY TCP4 1.2.3.4 5.6.7.8 -1 2\r\n", "bad port"),
    (b"PROXY TCP4 1.2.3.4 5.6.7.8 \xff 2\r\n", "not ASCII"),
    (b"PROXY " + b"x" * (V1_BYTES_MAX - 6), f"longer than {V1_BYTES_MAX}"),
    (V2_SIGNATURE[:5] + b"X", "no PROXY protocol header"),
    (V2_SIGNATURE + bytes([0x10, 0x11, 0, 12]) + bytes(12), "unknown version 1"),
    (_v2(0x2, 0x11, bytes(12)), "unknown command 2"),
    (_v2(0x1, 0x12, bytes(12)), "unsupported address family"),  # UDP
    (_v2(0x1, 0x11, bytes(8)), "too few"),
    (_v2(0x1, 0x21, bytes(12)), "too few"),
    (_v2(0x1, 0x11, b"", length=V2_BYTES_MAX), f"exceeds {V2_BYTES_MAX}"),  # refused before the rest arrives
])
def test_malformed_headers_are_refused(data: bytes, message: str) -> None:
    with pytest.raises(ProxyProtocolError, match=message):
        parse_proxy_header(data)


def test_a_v1_line_at_the_limit_parses_and_one_byte_more_does_not() -> None:
    head = b"PROXY UNKNOWN "
    line = head + b"x" * (V1_BYTES_MAX - len(head) - 2) + b"\r\n"
    assert len(line) == V1_BYTES_MAX
    assert parse_proxy_header(line) == ProxyHeader(1, V1_BYTES_MAX)
    with pytest.raises(ProxyProtocolError):
        parse_proxy_header(line[:-2] + b"x\r\n")


@given(st.binary(max_size=300))
def test_arbitrary_bytes_give_a_header_more_or_a_clean_refusal(data: bytes) -> None:
    try:
        parsed = parse_proxy_header(data)
    except ProxyProtocolError:
        return
    assert parsed is None or parsed.length <= len(data)
    if parsed is None:  # waiting for more is only allowed within the bounds
        assert len(data) < V2_BYTES_MAX


@given(st.sampled_from([v1_header(SRC, DST), v2_header(SRC, DST), v2_header(SRC6, DST6)]),
       st.integers(min_value=0, max_value=51), st.integers(min_value=0, max_value=7))
def test_any_flipped_bit_in_a_header_is_refused_or_names_other_addresses(header: bytes, index: int, bit: int) -> None:
    index %= len(header)
    mutated = bytearray(header)
    mutated[index] ^= 1 << bit
    try:
        parsed = parse_proxy_header(bytes(mutated) + AMQP)
    except ProxyProtocolError:
        return
    original = parse_proxy_header(header)
    assert parsed != original or bytes(mutated) == header
