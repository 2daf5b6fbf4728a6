"""The publish/deliver hot paths: the inline receive loop behaves exactly as the general per-frame path, and the
property caches hand the publisher's own bytes to deliveries without changing what anyone observes."""

from __future__ import annotations

import struct
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from node.amqp import properties as props_module
from node.amqp.codec import decode_publish, encode_deliver_frames, encode_method_frame
from node.amqp.connection import ConnectionLimits, ServerConnection
from node.amqp.events import ContentReceived
from node.amqp.fieldtable import encode_shortstr
from node.amqp.methods import BasicAck, BasicPublish, ChannelClose, ChannelOpen
from node.amqp.properties import (
    BasicProperties,
    decode_content_header,
    encode_content_header,
    encode_properties,
)

from .pamqp_client import Session

LIMITS = ConnectionLimits(frame_max=4096, max_message_size=1000)


class GeneralPathConnection(ServerConnection):
    """The reference: every frame through `_handle_frame`, as before the inline hot path existed."""

    def _receive_frames_open(self, frames: list[Any], now_ms: int) -> None:
        for frame_type, channel, payload in frames:
            if self.closed:
                return
            self._handle_frame(frame_type, channel, payload, now_ms)


def _frame(frame_type: int, channel: int, payload: bytes) -> bytes:
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + b"\xce"


def _open(conn: ServerConnection) -> ServerConnection:
    session = Session(LIMITS)
    session.conn = conn
    session.handshake(frame_max=LIMITS.frame_max)
    for channel in (1, 2):
        conn.receive_data(encode_method_frame(channel, ChannelOpen()), 0)
    conn.next_events()
    conn.data_to_send()
    return conn


HEADER_PROPS = BasicProperties(delivery_mode=2, content_type="text/plain")

frames = st.one_of(
    st.tuples(st.sampled_from([1, 2, 3]), st.sampled_from(["publish", "bad-publish", "ack", "close"])),
    st.tuples(st.sampled_from([1, 2, 3]), st.sampled_from(["header", "header-big", "header-class", "header-bad"]),
              st.integers(0, 40)),
    st.tuples(st.sampled_from([1, 2, 3]), st.just("body"), st.integers(0, 30)),
)


def _encode(item: tuple[Any, ...]) -> bytes:
    channel, kind = item[0], item[1]
    if kind == "publish":
        return encode_method_frame(channel, BasicPublish("", "q"))
    if kind == "bad-publish":
        return _frame(1, channel, b"\x00\x3c\x00\x28\x00\x00\x05ab")  # exchange runs past the payload
    if kind == "ack":
        return encode_method_frame(channel, BasicAck(1))
    if kind == "close":
        return encode_method_frame(channel, ChannelClose(200, "bye"))
    if kind == "body":
        return _frame(3, channel, b"b" * item[2])
    payload = encode_content_header(item[2], HEADER_PROPS)
    if kind == "header-big":
        payload = encode_content_header(5000, HEADER_PROPS)
    elif kind == "header-class":
        payload = b"\x00\x32" + payload[2:]
    elif kind == "header-bad":
        payload = payload[:-1]
    return _frame(2, channel, payload)


@settings(max_examples=300, deadline=None)
@given(st.lists(frames, max_size=25), st.integers(1, 3))
@example([(1, "publish"), (1, "header", 5), (2, "publish"), (1, "body", 3), (2, "header", 0), (1, "body", 2)], 2)
@example([(1, "publish"), (1, "header", 5), (1, "body", 6), (2, "publish")], 1)
@example([(2, "publish"), (2, "header-big", 0), (2, "publish"), (1, "bad-publish"), (2, "ack")], 1)
@example([(1, "publish"), (1, "header-class", 1), (1, "publish")], 1)
@example([(3, "publish"), (1, "body", 1), (1, "publish"), (1, "ack")], 3)
def test_the_inline_receive_path_matches_the_general_one(script: list[tuple[Any, ...]], reads: int) -> None:
    data = b"".join(_encode(item) for item in script)
    fast, reference = _open(ServerConnection(_Users(), LIMITS)), _open(GeneralPathConnection(_Users(), LIMITS))
    size = max(1, len(data) // reads)
    for start in range(0, len(data), size):
        for conn in (fast, reference):
            conn.receive_data(data[start : start + size], 0)
    events = fast.next_events()
    assert events == reference.next_events()
    assert fast.data_to_send() == reference.data_to_send()
    assert fast.state is reference.state


class _Users:
    def authenticate(self, mechanism: str, response: bytes) -> str | None:
        return "guest"

    def vhost_access(self, username: str, vhost: str) -> bool:
        return True


def test_a_repeated_header_without_headers_decodes_to_one_shared_object() -> None:
    payload = encode_content_header(10, HEADER_PROPS)
    first = decode_content_header(payload)[2]
    assert decode_content_header(encode_content_header(99, HEADER_PROPS))[2] is first
    assert first == HEADER_PROPS


def test_deliveries_reuse_the_publishers_property_bytes_verbatim() -> None:
    # A long-int (l) header value: our own encoder would write it as the smallest int type (b).
    entry = encode_shortstr("n") + b"l" + struct.pack(">q", 7)
    table = struct.pack(">I", len(entry)) + entry
    prop_list = table + b"\x02"
    header = struct.pack(">HHQH", 60, 0, 3, (1 << 13) | (1 << 12)) + prop_list
    props = decode_content_header(header)[2]
    assert props == BasicProperties(headers={"n": 7}, delivery_mode=2)
    assert encode_properties(props) == ((1 << 13) | (1 << 12), prop_list)
    frames = encode_deliver_frames(1, "ctag", 1, False, "", "q", props, b"abc", 4096)
    assert prop_list in frames
    equal_copy = BasicProperties(headers={"n": 7}, delivery_mode=2)
    assert encode_properties(equal_copy)[1] != prop_list  # a different object is encoded afresh


def test_the_caches_are_bounded(monkeypatch: Any) -> None:
    monkeypatch.setattr(props_module, "_ENCODED_MAX", 8)
    monkeypatch.setattr(props_module, "_DECODED_MAX", 8)
    for n in range(50):
        decode_content_header(encode_content_header(1, BasicProperties(message_id=str(n))))
    assert len(props_module._encoded) <= 8 and len(props_module._decoded) <= 8


def test_deliver_frames_are_the_same_with_a_cold_and_a_warm_cache() -> None:
    args = (3, "ctag-é", 77, True, "amq.direct", "key", HEADER_PROPS, b"x" * 9000, 4096)
    cold = encode_deliver_frames(*args)
    assert encode_deliver_frames(*args) == cold
    assert cold.startswith(encode_method_frame(3, _deliver(args)))


def _deliver(args: tuple[Any, ...]) -> Any:
    from node.amqp.methods import BasicDeliver

    return BasicDeliver(args[1], args[2], args[3], args[4], args[5])


def test_a_shared_publish_method_is_an_equal_value() -> None:
    payload = encode_method_frame(1, BasicPublish("x", "rk", True))[7:-1]
    session = Session()
    session.handshake()
    session.open_channel(1)
    for _ in range(2):
        session.conn.receive_data(encode_method_frame(1, BasicPublish("x", "rk", True)), 0)
        session.conn.receive_data(_frame(2, 1, encode_content_header(0, HEADER_PROPS)), 0)
    events = [e for e in session.conn.next_events() if isinstance(e, ContentReceived)]
    assert [e.method for e in events] == [decode_publish(payload)] * 2
