"""The PROXY protocol header (HAProxy's, versions 1 and 2) that a load balancer puts before a client's bytes.

What it is for: behind HAProxy every connection comes from the proxy's address, so a node cannot tell a local
client from a remote one (loopback-only users, connection listings, logs). With `send-proxy-v2` HAProxy first
sends a header naming the client's real address; a listener with the PROXY protocol on reads it before the AMQP
protocol header (node/runtime/server.py) and refuses a connection that does not start with a valid one.

How it works: `parse_proxy_header(data)` is pure and incremental: given the bytes received so far it returns a
`ProxyHeader` (with how many bytes the header took; the rest is the client's AMQP data), None when more bytes are
needed, or raises `ProxyProtocolError` as soon as the bytes cannot be a valid header. It is bounded: a version 1
line is at most `V1_BYTES_MAX` (107) bytes including CRLF, a version 2 header at most `V2_BYTES_MAX`, checked
from its length field before waiting for the rest. Version 1: `PROXY TCP4|TCP6 src dst sport dport\\r\\n` (the
addresses must be of the named family), or `PROXY UNKNOWN ...\\r\\n`. Version 2: the 12-byte signature, version 2,
command LOCAL (a connection of the proxy itself, such as its health checks: the socket's own addresses stand) or
PROXY, then the address family: TCP over IPv4 or IPv6 carries the addresses; UNSPEC and UNIX carry none we use
(treated as LOCAL, as the specification allows); UDP is refused (AMQP runs over TCP). TLVs after the addresses
are skipped. A header without addresses has `source` None.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

V1_PREFIX = b"PROXY "
V1_BYTES_MAX = 107
V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
V2_FIXED_BYTES = 16  # signature, version/command, family/protocol, length
V2_BYTES_MAX = 4096  # header with TLVs; HAProxy's default send-proxy-v2 sends 16 + 12 or 16 + 36
V2_VERSION = 0x2
V2_LOCAL, V2_PROXY = 0x0, 0x1
_FAMILY_ADDRESS_BYTES = {0x11: 12, 0x21: 36}  # TCP over IPv4, TCP over IPv6
_FAMILY_NO_ADDRESS = {0x00, 0x31, 0x32}  # UNSPEC, UNIX stream, UNIX datagram: keep the socket's addresses
_V1_FAMILIES = {"TCP4": ipaddress.IPv4Address, "TCP6": ipaddress.IPv6Address}


class ProxyProtocolError(ValueError):
    """The bytes are not a valid PROXY protocol header (the message says what is wrong)."""


@dataclass(frozen=True, slots=True)
class ProxyHeader:
    """A parsed header: the client (`source`) and the address it connected to (`destination`), or None for both
    when the header carries no addresses (v2 LOCAL, v1 UNKNOWN); `length` bytes of the input were the header."""

    version: int
    length: int
    source: tuple[str, int] | None = None
    destination: tuple[str, int] | None = None


def parse_proxy_header(data: bytes) -> ProxyHeader | None:
    """The header at the start of `data`, None if more bytes are needed; ProxyProtocolError if it is invalid."""
    if data[:1] == V1_PREFIX[:1]:
        return _parse_v1(data)
    if data[:1] == V2_SIGNATURE[:1]:
        return _parse_v2(data)
    if not data:
        return None
    raise ProxyProtocolError("no PROXY protocol header")


def _parse_v1(data: bytes) -> ProxyHeader | None:
    known = min(len(data), len(V1_PREFIX))
    if data[:known] != V1_PREFIX[:known]:
        raise ProxyProtocolError("no PROXY protocol header")
    end = data.find(b"\r\n", 0, V1_BYTES_MAX)
    if end < 0:
        if len(data) >= V1_BYTES_MAX:
            raise ProxyProtocolError(f"PROXY v1 line longer than {V1_BYTES_MAX} bytes")
        if b"\n" in data or (b"\r" in data[:-1]):
            raise ProxyProtocolError("PROXY v1 line not ended by CRLF")
        return None
    try:
        line = data[:end].decode("ascii")
    except UnicodeDecodeError:
        raise ProxyProtocolError("PROXY v1 line is not ASCII") from None
    parts = line.split(" ")
    if parts[1:2] == ["UNKNOWN"]:
        return ProxyHeader(1, end + 2)
    if len(parts) != 6 or parts[1] not in _V1_FAMILIES:
        raise ProxyProtocolError(f"PROXY v1 line is not 'PROXY TCP4|TCP6 src dst sport dport': {line[:60]!r}")
    family = _V1_FAMILIES[parts[1]]
    try:
        source, destination = family(parts[2]), family(parts[3])
    except ValueError:
        raise ProxyProtocolError(f"PROXY v1: bad {parts[1]} address in {line[:60]!r}") from None
    return ProxyHeader(1, end + 2, (str(source), _v1_port(parts[4])), (str(destination), _v1_port(parts[5])))


def _v1_port(text: str) -> int:
    if not text.isdigit() or len(text) > 5 or (len(text) > 1 and text[0] == "0") or int(text) > 65535:
        raise ProxyProtocolError(f"PROXY v1: bad port {text[:8]!r}")
    return int(text)


def _parse_v2(data: bytes) -> ProxyHeader | None:
    known = min(len(data), len(V2_SIGNATURE))
    if data[:known] != V2_SIGNATURE[:known]:
        raise ProxyProtocolError("no PROXY protocol header")
    if len(data) < V2_FIXED_BYTES:
        return None
    version, command = data[12] >> 4, data[12] & 0x0F
    if version != V2_VERSION:
        raise ProxyProtocolError(f"PROXY v2: unknown version {version}")
    if command not in (V2_LOCAL, V2_PROXY):
        raise ProxyProtocolError(f"PROXY v2: unknown command {command}")
    family = data[13]
    length = V2_FIXED_BYTES + int.from_bytes(data[14:16], "big")
    if length > V2_BYTES_MAX:
        raise ProxyProtocolError(f"PROXY v2 header of {length} bytes exceeds {V2_BYTES_MAX}")
    address_bytes = _FAMILY_ADDRESS_BYTES.get(family)
    if command == V2_PROXY and address_bytes is None and family not in _FAMILY_NO_ADDRESS:
        raise ProxyProtocolError(f"PROXY v2: unsupported address family/protocol 0x{family:02x}")
    if address_bytes is not None and length < V2_FIXED_BYTES + address_bytes:
        raise ProxyProtocolError(f"PROXY v2: {length - V2_FIXED_BYTES} address bytes are too few for 0x{family:02x}")
    if len(data) < length:
        return None
    if command == V2_LOCAL or address_bytes is None:
        return ProxyHeader(2, length)
    body = data[V2_FIXED_BYTES:V2_FIXED_BYTES + address_bytes]
    size = 4 if family == 0x11 else 16
    make = ipaddress.IPv4Address if family == 0x11 else ipaddress.IPv6Address
    source, destination = make(body[:size]), make(body[size:2 * size])
    ports = body[2 * size:]
    return ProxyHeader(2, length, (str(source), int.from_bytes(ports[:2], "big")),
                       (str(destination), int.from_bytes(ports[2:4], "big")))


def v2_header(source: tuple[str, int] | None, destination: tuple[str, int] | None, tlvs: bytes = b"") -> bytes:
    """A version 2 header (PROXY over TCP with both addresses, or LOCAL when `source` is None): for tests and tools."""
    if source is None or destination is None:
        return V2_SIGNATURE + bytes([V2_VERSION << 4 | V2_LOCAL, 0x00]) + len(tlvs).to_bytes(2, "big") + tlvs
    src, dst = ipaddress.ip_address(source[0]), ipaddress.ip_address(destination[0])
    family = 0x11 if src.version == 4 else 0x21
    body = src.packed + dst.packed + source[1].to_bytes(2, "big") + destination[1].to_bytes(2, "big") + tlvs
    return V2_SIGNATURE + bytes([V2_VERSION << 4 | V2_PROXY, family]) + len(body).to_bytes(2, "big") + body


def v1_header(source: tuple[str, int], destination: tuple[str, int]) -> bytes:
    """A version 1 line naming both addresses: for tests and tools."""
    family = "TCP4" if ipaddress.ip_address(source[0]).version == 4 else "TCP6"
    return f"PROXY {family} {source[0]} {destination[0]} {source[1]} {destination[1]}\r\n".encode()
