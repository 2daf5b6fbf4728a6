"""The publish/deliver hot paths: the inline receive loop behaves exactly as the general per-frame path, and the
property caches hand the publisher's own bytes to deliveries without changing what anyone observes."""

from __future__ import annotations

import struct
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from node.amqp import properties as props_module
from node.amqp.codec import decode_publish, encode_content_frames, encode_deliver_frames, encode_method_frame
from node.amqp.connection import ConnectionLimits, ServerConnection
from node.amqp.events import ContentReceived
from node.amqp.fieldtable import encode_shortstr
from node.amqp.methods import BasicAck, BasicDeliver, BasicPublish, ChannelClose, ChannelOpen
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

    def _receive_open(self, buf: bytes, now_ms: int) -> None:  # no fused publishes either
        frames: list[Any] = []
        error, _ = self._framer.parse_frames(buf, 0, frames)
        self._receive_frames(frames, error, now_ms)

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
    st.tuples(st.sampled_from([0, 1, 2, 3]), st.sampled_from(["triple", "triple-mixed"]), st.integers(0, 4)),
    st.tuples(st.sampled_from([1, 2]), st.sampled_from(["bad-end", "too-big", "triple-bad-end", "triple-too-big"])),
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
    if kind.startswith("triple"):  # a whole publish: what the fused receive path takes in one step
        size = item[2] if len(item) > 2 else 3
        header = _frame(2, channel, encode_content_header(size, HEADER_PROPS))
        body = _frame(3, channel if kind != "triple-mixed" else 1 + channel % 3, b"t" * size)
        if kind == "triple-bad-end":
            body = body[:-1] + b"\x00"
        elif kind == "triple-too-big":
            body = _frame(3, channel, b"t" * (LIMITS.frame_max + 1))
        return encode_method_frame(channel, BasicPublish("", "q")) + header + body
    if kind == "bad-end":
        return _frame(1, channel, b"\x00\x3c\x00\x28\x00\x00\x01q\x00")[:-1] + b"\xcd"
    if kind == "too-big":
        return _frame(3, channel, b"x" * (LIMITS.frame_max + 1))
    payload = encode_content_header(item[2], HEADER_PROPS)
    if kind == "header-big":
        payload = encode_content_header(5000, HEADER_PROPS)
    elif kind == "header-class":
        payload = b"\x00\x32" + payload[2:]
    elif kind == "header-bad":
        payload = payload[:-1]
    return _frame(2, channel, payload)


@settings(max_examples=500, deadline=None)
@given(st.lists(frames, max_size=25), st.integers(1, 3))
@example([(1, "publish"), (1, "header", 5), (2, "publish"), (1, "body", 3), (2, "header", 0), (1, "body", 2)], 2)
@example([(1, "publish"), (1, "header", 5), (1, "body", 6), (2, "publish")], 1)
@example([(2, "publish"), (2, "header-big", 0), (2, "publish"), (1, "bad-publish"), (2, "ack")], 1)
@example([(1, "publish"), (1, "header-class", 1), (1, "publish")], 1)
@example([(3, "publish"), (1, "body", 1), (1, "publish"), (1, "ack")], 3)
@example([(1, "triple", 3), (1, "triple", 3), (2, "triple", 3), (1, "triple", 2), (1, "triple", 2)], 1)
@example([(1, "triple", 3), (1, "triple", 3), (1, "triple-bad-end", 3)], 1)
@example([(1, "triple", 3), (1, "ack"), (1, "triple", 3), (1, "close"), (1, "triple", 3), (2, "triple", 1)], 1)
@example([(2, "triple", 3), (2, "triple-too-big", 3), (2, "triple", 3)], 2)
@example([(1, "triple", 3), (1, "publish"), (1, "triple", 3)], 1)
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

    def connection_limit_reached(self, vhost: str) -> int | None:
        return None


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


def test_repeated_publishes_take_the_fused_path(monkeypatch: Any) -> None:
    conn = _open(ServerConnection(_Users(), LIMITS))
    triple = _encode((1, "triple", 3))
    conn.receive_data(triple, 0)  # the first header is decoded (and remembered) on the general path
    general_calls = 0
    real = ServerConnection._receive_frames_open

    def counting(self: ServerConnection, frames: list[Any], now_ms: int) -> None:
        nonlocal general_calls
        general_calls += 1
        real(self, frames, now_ms)

    monkeypatch.setattr(ServerConnection, "_receive_frames_open", counting)
    data = triple * 3
    cut = len(data) - len(triple) + 5  # inside the last publish's method frame
    conn.receive_data(data[:cut], 0)
    conn.receive_data(data[cut:], 0)  # the split frame waits in the framer, then its publish is taken whole
    events = conn.next_events()
    assert general_calls == 0
    assert [type(e) for e in events] == [ContentReceived] * 4
    assert all(e.body == b"ttt" and e.properties is events[0].properties for e in events)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 3), st.sampled_from(["c1", "c2"]), st.sampled_from(["", "ex"]),
       st.lists(st.tuples(st.integers(1, 2**40), st.booleans(), st.integers(0, 40), st.sampled_from([64, 4096]),
                          st.booleans()), min_size=1, max_size=12))
def test_a_remembered_delivery_skeleton_writes_the_same_bytes(
        channel: int, ctag: str, exchange: str, deliveries: list[tuple[int, bool, int, int, bool]]) -> None:
    shared = decode_content_header(encode_content_header(1, HEADER_PROPS))[2]
    for tag, redelivered, size, frame_max, other_props in deliveries:
        props = BasicProperties(delivery_mode=1) if other_props else shared
        body = b"m" * size
        fast = encode_deliver_frames(channel, ctag, tag, redelivered, exchange, "rk", props, body, frame_max)
        generic = encode_content_frames(channel, BasicDeliver(ctag, tag, redelivered, exchange, "rk"), props, body,
                                        frame_max)
        assert fast == generic
