"""Micro-benchmark of the AMQP hot path (not a test): publish decode, deliver encode, acks, full receive path.

Run: .venv/bin/python -m bench.micro.amqp_codec [seconds_per_case]
Prints operations per second for each case. Single-threaded, pure Python; numbers depend on the machine.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from node.amqp.codec import (
    decode_method,
    decode_method_generic,
    encode_ack_frame,
    encode_content_frames,
    encode_deliver_frames,
    encode_method,
    encode_method_frame,
)
from node.amqp.connection import ConnectionLimits, ServerConnection
from node.amqp.methods import (
    BasicAck,
    BasicDeliver,
    BasicPublish,
    ChannelOpen,
    ConnectionOpen,
    ConnectionTuneOk,
)
from node.amqp.properties import BasicProperties, decode_content_header, encode_content_header
from node.amqp.spec import PROTOCOL_HEADER


def rate(name: str, fn: Callable[[], object], seconds: float, per_call: int = 1) -> float:
    calls = 0
    batch = 1000
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(batch):
            fn()
        calls += batch
        now = time.perf_counter()
        if now >= deadline:
            break
    ops = calls * per_call / (now - start)
    print(f"{name:<52} {ops:>12,.0f} /s")
    return ops


class _AllowAll:
    def authenticate(self, mechanism: str, response: bytes) -> str | None:
        return "guest"

    def vhost_access(self, username: str, vhost: str) -> bool:
        return True

    def connection_limit_reached(self, vhost: str) -> int | None:
        return None


def _open_connection() -> ServerConnection:
    from node.amqp.methods import ConnectionStartOk

    conn = ServerConnection(_AllowAll(), ConnectionLimits())
    conn.receive_data(PROTOCOL_HEADER, 0)
    conn.receive_data(encode_method_frame(0, ConnectionStartOk({}, "PLAIN", b"\0guest\0guest", "en_US")), 0)
    conn.receive_data(encode_method_frame(0, ConnectionTuneOk(2047, 131072, 0)), 0)
    conn.receive_data(encode_method_frame(0, ConnectionOpen("/")), 0)
    conn.receive_data(encode_method_frame(1, ChannelOpen()), 0)
    conn.next_events()
    conn.data_to_send()
    return conn


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
    props = BasicProperties(
        content_type="application/json", delivery_mode=2, headers={"trace": "abc", "n": 1}
    )
    body = b"x" * 256
    publish_payload = encode_method(BasicPublish("amq.direct", "orders.created", False, False))
    header_payload = encode_content_header(len(body), props)
    empty_header = encode_content_header(len(body), BasicProperties())
    ack_payload = encode_method(BasicAck(123456, False))

    print(f"python {sys.version.split()[0]}, {seconds:.1f}s per case, body {len(body)} bytes")
    rate("Basic.Publish decode (fast path)", lambda: decode_method(publish_payload), seconds)
    rate(
        "Basic.Publish decode (generic table codec)", lambda: decode_method_generic(publish_payload), seconds
    )
    rate("content header decode (3 properties)", lambda: decode_content_header(header_payload), seconds)
    rate("content header decode (no properties)", lambda: decode_content_header(empty_header), seconds)
    rate("Basic.Ack decode", lambda: decode_method(ack_payload), seconds)
    rate(
        "Basic.Deliver+header+body encode (fast path)",
        lambda: encode_deliver_frames(
            1, "ctag-1", 42, False, "amq.direct", "orders.created", props, body, 131072
        ),
        seconds,
    )
    deliver = BasicDeliver("ctag-1", 42, False, "amq.direct", "orders.created")
    rate(
        "Basic.Deliver+header+body encode (generic)",
        lambda: encode_content_frames(1, deliver, props, body, 131072),
        seconds,
    )
    rate("Basic.Ack frame encode (confirms)", lambda: encode_ack_frame(1, 42, False), seconds)

    _pamqp_reference(seconds, body, publish_payload)

    # Full receive path: bytes -> framer -> assembly -> ContentReceived, 100 publishes per read.
    message = (
        encode_method_frame(1, BasicPublish("amq.direct", "orders.created"))
        + b"\x02\x00\x01"
        + len(header_payload).to_bytes(4, "big")
        + header_payload
        + b"\xce"
        + b"\x03\x00\x01"
        + len(body).to_bytes(4, "big")
        + body
        + b"\xce"
    )
    batch = message * 100
    conn = _open_connection()

    def receive_batch() -> None:
        conn.receive_data(batch, 0)
        conn.next_events()

    rate("ServerConnection publish receive (3 frames/message)", receive_batch, seconds / 10, per_call=100)

    # The same with only delivery_mode=2 (what `raftmq bench` sends): the header decodes to a shared object.
    persistent_header = encode_content_header(len(body), BasicProperties(delivery_mode=2))
    plain = message.replace(
        len(header_payload).to_bytes(4, "big") + header_payload,
        len(persistent_header).to_bytes(4, "big") + persistent_header,
    )
    plain_batch = plain * 100

    def receive_plain_batch() -> None:
        conn.receive_data(plain_batch, 0)
        conn.next_events()

    rate("ServerConnection publish receive (delivery_mode only)", receive_plain_batch, seconds / 10, per_call=100)


def _pamqp_reference(seconds: float, body: bytes, publish_payload: bytes) -> None:
    """The same work done by pamqp, for scale (pamqp is a general-purpose codec)."""
    try:
        from pamqp import body as pbody
        from pamqp import commands, frame, header
    except ImportError:
        return
    publish_frame = encode_method_frame(1, BasicPublish("amq.direct", "orders.created"))
    rate("pamqp: Basic.Publish frame unmarshal", lambda: frame.unmarshal(publish_frame), seconds)
    props = commands.Basic.Properties(
        content_type="application/json", delivery_mode=2, headers={"trace": "abc", "n": 1}
    )

    def pamqp_deliver() -> bytes:
        return b"".join(
            (
                frame.marshal(commands.Basic.Deliver("ctag-1", 42, False, "amq.direct", "orders.created"), 1),
                frame.marshal(header.ContentHeader(0, len(body), props), 1),
                frame.marshal(pbody.ContentBody(body), 1),
            )
        )

    rate("pamqp: Basic.Deliver+header+body marshal", pamqp_deliver, seconds)


if __name__ == "__main__":
    main()
