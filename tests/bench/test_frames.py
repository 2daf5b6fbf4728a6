"""The benchmark client's frame encoder and parser, checked against pamqp (an independent AMQP codec)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pamqp import commands, frame, header

from bench import frames


def unmarshal_all(data: bytes) -> list[tuple[int, Any]]:
    """Every frame in `data` as (channel, pamqp object)."""
    found = []
    while data:
        consumed, channel, parsed = frame.unmarshal(data)
        found.append((channel, parsed))
        data = data[consumed:]
    return found


def test_queue_declare_matches_pamqp() -> None:
    [(channel, parsed)] = unmarshal_all(frames.queue_declare(3, "bench-q", True, {"x-queue-type": "quorum"}))
    assert channel == 3
    assert isinstance(parsed, commands.Queue.Declare)
    assert (parsed.queue, parsed.durable, parsed.passive, parsed.exclusive, parsed.auto_delete) == (
        "bench-q", True, False, False, False
    )
    assert parsed.arguments == {"x-queue-type": "quorum"}


def test_table_value_types_match_pamqp() -> None:
    [(_, parsed)] = unmarshal_all(frames.queue_declare(1, "q", False, {"s": "text", "n": -7, "flag": True}))
    assert parsed.arguments == {"s": "text", "n": -7, "flag": True}


def test_publish_blob_is_three_frames_pamqp_reads() -> None:
    body = frames.stamped_body(123_456_789, 100)
    blob = frames.publish_prefix(2, "ex", "rk", 100, frames.PERSISTENT) + body + frames.FRAME_END
    (c1, publish), (c2, content), (c3, body_frame) = unmarshal_all(blob)
    assert (c1, c2, c3) == (2, 2, 2)
    assert isinstance(publish, commands.Basic.Publish)
    assert (publish.exchange, publish.routing_key, publish.mandatory) == ("ex", "rk", False)
    assert isinstance(content, header.ContentHeader)
    assert content.body_size == 100
    assert content.properties.delivery_mode == 2
    assert body_frame.value == body
    assert body_frame.value[:8] == (123_456_789).to_bytes(8, "big")  # the stamp: big-endian ns


@pytest.mark.parametrize(
    ("encoded", "expected_type"),
    [
        (frames.connection_start_ok("guest", "guest"), commands.Connection.StartOk),
        (frames.connection_tune_ok(2047, 131072, 0), commands.Connection.TuneOk),
        (frames.connection_open("/"), commands.Connection.Open),
        (frames.connection_close(), commands.Connection.Close),
        (frames.channel_open(1), commands.Channel.Open),
        (frames.confirm_select(1), commands.Confirm.Select),
        (frames.exchange_declare(1, "fan", "fanout", True), commands.Exchange.Declare),
        (frames.exchange_delete(1, "fan"), commands.Exchange.Delete),
        (frames.queue_bind(1, "q", "fan", ""), commands.Queue.Bind),
        (frames.queue_purge(1, "q"), commands.Queue.Purge),
        (frames.queue_delete(1, "q"), commands.Queue.Delete),
        (frames.basic_qos(1, 500), commands.Basic.Qos),
        (frames.basic_consume(1, "q", "tag"), commands.Basic.Consume),
    ],
)
def test_every_client_method_is_valid_for_pamqp(encoded: bytes, expected_type: type) -> None:
    [(_, parsed)] = unmarshal_all(encoded)
    assert isinstance(parsed, expected_type)


def test_start_ok_carries_plain_credentials() -> None:
    [(_, parsed)] = unmarshal_all(frames.connection_start_ok("user", "secret"))
    assert parsed.mechanism == "PLAIN"
    assert parsed.response == "\x00user\x00secret"


def test_qos_and_consume_fields() -> None:
    [(_, qos)] = unmarshal_all(frames.basic_qos(1, 500))
    assert (qos.prefetch_count, qos.global_) == (500, False)
    [(_, consume)] = unmarshal_all(frames.basic_consume(4, "queue-x", "ctag"))
    assert (consume.queue, consume.consumer_tag, consume.no_ack, consume.exclusive) == ("queue-x", "ctag", False, False)


@given(st.integers(min_value=0, max_value=2**63 - 1), st.booleans())  # pamqp reads longlong as signed
def test_ack_round_trips_through_pamqp(tag: int, multiple: bool) -> None:
    encoded = frames.basic_ack(5, tag, multiple)
    [(_, parsed)] = unmarshal_all(encoded)
    assert (parsed.delivery_tag, parsed.multiple) == (tag, multiple)
    [decoded] = _split(frame.marshal(commands.Basic.Ack(delivery_tag=tag, multiple=multiple), 5))
    assert frames.parse_ack(decoded.payload) == (tag, multiple)


def test_nack_from_pamqp_is_parsed() -> None:
    [decoded] = _split(frame.marshal(commands.Basic.Nack(delivery_tag=77, multiple=True, requeue=False), 1))
    assert decoded.method_id == frames.BASIC_NACK
    assert frames.parse_ack(decoded.payload) == (77, True)


@given(
    st.text(max_size=60),
    st.integers(min_value=1, max_value=2**63 - 1),
    st.from_regex(r"[A-Za-z0-9_.:-]{0,40}", fullmatch=True),
    st.text(max_size=40),
)
def test_deliver_tag_is_parsed_whatever_the_strings(consumer_tag: str, tag: int, exchange: str, key: str) -> None:
    method = commands.Basic.Deliver(consumer_tag=consumer_tag, delivery_tag=tag, exchange=exchange, routing_key=key)
    [decoded] = _split(frame.marshal(method, 9))
    assert decoded.channel == 9
    assert decoded.method_id == frames.BASIC_DELIVER
    assert frames.parse_deliver_tag(decoded.payload) == tag


def test_close_and_tune_and_declare_ok_are_parsed() -> None:
    close = frame.marshal(commands.Channel.Close(reply_code=404, reply_text="NOT_FOUND - no queue", class_id=50, method_id=10), 2)
    [decoded] = _split(close)
    assert frames.parse_close(decoded.payload) == (404, "NOT_FOUND - no queue")
    [tune] = _split(frame.marshal(commands.Connection.Tune(channel_max=100, frame_max=4096, heartbeat=30), 0))
    assert frames.parse_tune(tune.payload) == (100, 4096, 30)
    [ok] = _split(frame.marshal(commands.Queue.DeclareOk(queue="q1", message_count=5, consumer_count=2), 1))
    assert frames.parse_queue_declare_ok(ok.payload) == ("q1", 5, 2)


def _split(data: bytes) -> list[frames.Frame]:
    buffer = frames.FrameBuffer()
    buffer.feed(data)
    return buffer.frames()


@given(st.data())
def test_frame_buffer_is_incremental(data: st.DataObject) -> None:
    stream = b"".join(frames.basic_ack(1, tag, False) for tag in range(1, 6)) + frames.method_frame(2, 60, 80, b"x" * 9)
    cuts = sorted(data.draw(st.lists(st.integers(min_value=0, max_value=len(stream)), max_size=6)))
    buffer = frames.FrameBuffer()
    collected: list[frames.Frame] = []
    previous = 0
    for cut in [*cuts, len(stream)]:
        buffer.feed(stream[previous:cut])
        collected += buffer.frames()
        previous = cut
    assert [f.channel for f in collected] == [1, 1, 1, 1, 1, 2]
    assert [frames.parse_ack(f.payload)[0] for f in collected[:5]] == [1, 2, 3, 4, 5]


def test_bad_frame_end_is_a_protocol_error() -> None:
    buffer = frames.FrameBuffer()
    buffer.feed(frames.basic_ack(1, 1, False)[:-1] + b"\x00")
    with pytest.raises(frames.ProtocolError):
        buffer.frames()


def test_bodies_must_fit_the_timestamp() -> None:
    with pytest.raises(ValueError):
        frames.stamped_body(1, 7)
    with pytest.raises(ValueError):
        frames.encode_shortstr("x" * 256)
