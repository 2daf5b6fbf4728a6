"""Codec tests: generic vs hand-written fast paths vs pamqp, byte for byte; hypothesis round trips."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import body as pbody
from pamqp import commands, frame, header

from node.amqp import codec
from node.amqp.fieldtable import DecodeError, decode_table, encode_table
from node.amqp.methods import (
    METHOD_CLASSES,
    BasicAck,
    BasicDeliver,
    BasicNack,
    BasicPublish,
    BasicReject,
    Method,
)
from node.amqp.properties import BasicProperties, decode_content_header, encode_content_header

from .strategies import field_tables, methods, names, properties

_PAMQP_RENAMES = {"type": "exchange_type"}


def pamqp_class(cls: type[Method]) -> Any:
    klass, name = cls.NAME.split(".")
    return getattr(getattr(commands, klass, None), name, None)


def to_pamqp(method: Method) -> Any:
    kwargs = {}
    for f in dataclasses.fields(method):  # type: ignore[arg-type]
        value = getattr(method, f.name)
        kwargs[_PAMQP_RENAMES.get(f.name, f.name)] = value.decode() if isinstance(value, bytes) else value
    return pamqp_class(type(method))(**kwargs)


PAMQP_METHODS = [cls for cls in METHOD_CLASSES if pamqp_class(cls) is not None]
# pamqp writes "0" into these reserved short strings; we write "" (both are legal): compare decoding only.
RESERVED_DIFFER = {"Connection.Open", "Connection.OpenOk", "Channel.Open", "Channel.OpenOk", "Basic.GetEmpty"}


@settings(max_examples=250, deadline=None)
@given(
    method=st.one_of([methods(cls, pamqp_compatible=True) for cls in PAMQP_METHODS]),
    channel=st.integers(0, 65535),
)
def test_every_method_matches_pamqp(method: Method, channel: int) -> None:
    cls = type(method)
    theirs = frame.marshal(to_pamqp(method), channel)
    ours = codec.encode_method_frame(channel, method)
    if cls.NAME not in RESERVED_DIFFER:
        assert ours == theirs
    assert codec.decode_method(theirs[7:-1]) == method
    consumed, _, decoded = frame.unmarshal(ours)
    assert consumed == len(ours) and type(decoded) is pamqp_class(cls)


@pytest.mark.parametrize("cls", PAMQP_METHODS, ids=lambda c: c.NAME)
def test_every_pamqp_method_default_matches(cls: type[Method]) -> None:
    method = cls()
    if cls.NAME not in RESERVED_DIFFER:
        assert codec.encode_method_frame(1, method) == frame.marshal(to_pamqp(method), 1)


@settings(max_examples=250, deadline=None)
@given(method=st.one_of([methods(cls) for cls in METHOD_CLASSES]))
def test_every_method_round_trips(method: Method) -> None:
    payload = codec.encode_method(method)
    assert codec.decode_method(payload) == method
    assert codec.decode_method_generic(payload) == method


@settings(max_examples=200, deadline=None)
@given(method=st.one_of(methods(BasicPublish), methods(BasicAck), methods(BasicNack), methods(BasicReject)))
def test_fast_decoders_agree_with_generic(method: Method) -> None:
    payload = codec.encode_method(method)
    assert codec.decode_method(payload) == codec.decode_method_generic(payload) == method


def test_fast_paths_reject_bad_lengths() -> None:
    for payload in (
        b"\x00\x3c\x00\x28\x00\x00\x01a",
        b"\x00\x3c\x00\x50\x00",
        b"\x00\x3c\x00\x78" + b"\x00" * 10,
    ):
        with pytest.raises(DecodeError):
            codec.decode_method(payload)


@settings(max_examples=100, deadline=None)
@given(table=field_tables())
def test_field_table_round_trip(table: dict[str, Any]) -> None:
    encoded = encode_table(table)
    decoded, offset = decode_table(encoded, 0)
    assert offset == len(encoded)
    assert decoded == table


@settings(max_examples=100, deadline=None)
@given(table=field_tables(pamqp_compatible=True))
def test_field_table_matches_pamqp(table: dict[str, Any]) -> None:
    from pamqp import decode, encode

    assert encode_table(table) == encode.field_table(table)
    assert decode.field_table(encode_table(table))[1] == table


def test_every_field_value_type_decodes() -> None:
    def entry(key: str, tag: bytes, raw: bytes) -> bytes:
        return bytes([len(key)]) + key.encode() + tag + raw

    body = b"".join(
        [
            entry("t", b"t", b"\x01"),
            entry("b", b"b", b"\xff"),
            entry("B", b"B", b"\xff"),
            entry("U", b"U", b"\xff\xfe"),
            entry("u", b"u", b"\xff\xfe"),
            entry("I", b"I", b"\xff\xff\xff\xfe"),
            entry("i", b"i", b"\xff\xff\xff\xfe"),
            entry("L", b"L", b"\xff" * 7 + b"\xfe"),
            entry("l", b"l", b"\x00" * 7 + b"\x05"),
            entry("f", b"f", b"\x3f\xc0\x00\x00"),
            entry("d", b"d", b"\x3f\xf8" + b"\x00" * 6),
            entry("D", b"D", b"\x02\x00\x00\x01\x3b"),
            entry("s", b"s", b"\xff\xfe"),
            entry("S", b"S", b"\x00\x00\x00\x02hi"),
            entry("S2", b"S", b"\x00\x00\x00\x02\xff\xfe"),
            entry("A", b"A", b"\x00\x00\x00\x03b\x01V"),
            entry("T", b"T", b"\x00\x00\x00\x00\x00\x00\x00\x3c"),
            entry("F", b"F", b"\x00\x00\x00\x00"),
            entry("V", b"V", b""),
            entry("x", b"x", b"\x00\x00\x00\x02\x00\x01"),
        ]
    )
    table, _ = decode_table(len(body).to_bytes(4, "big") + body, 0)
    assert table == {
        "t": True,
        "b": -1,
        "B": 255,
        "U": -2,
        "u": 65534,
        "I": -2,
        "i": 4294967294,
        "L": -2,
        "l": 5,
        "f": 1.5,
        "d": 1.5,
        "D": decimal.Decimal("3.15"),
        "s": -2,
        "S": "hi",
        "S2": b"\xff\xfe",
        "A": [1, None],
        "T": datetime.datetime(1970, 1, 1, 0, 1, tzinfo=datetime.UTC),
        "F": {},
        "V": None,
        "x": bytearray(b"\x00\x01"),
    }


def test_hostile_tables_raise_decode_error() -> None:
    nested = b"F" * 1
    deep = b""
    for _ in range(100):
        deep = b"\x01kF" + len(deep).to_bytes(4, "big") + deep
    for raw in (b"\x00\x00\x00\x05\x01k?\x00\x00", b"\x00\x00\x00\x10\x01k", deep[3:] + nested[:0]):
        with pytest.raises(DecodeError):
            codec.decode_method(b"\x00\x32\x00\x0a\x00\x00\x01q\x00" + raw)


# ------------------------------------------------------------------ content header, body, deliver, ack
def pamqp_normal(props: BasicProperties) -> BasicProperties:
    """pamqp leaves out falsy properties ("" , 0, {}); we send whatever is not None. Compare on common ground."""
    values = {f.name: getattr(props, f.name) or None for f in dataclasses.fields(props)}
    if values["delivery_mode"] is not None:
        values["delivery_mode"] = 1 + values["delivery_mode"] % 2  # pamqp accepts only 1 and 2
    values["cluster_id"] = None  # pamqp refuses a non-empty (deprecated) cluster_id
    if values["timestamp"] is not None:
        values["timestamp"] = min(values["timestamp"], 2**33)
    return BasicProperties(**values)


def pamqp_properties(props: BasicProperties) -> commands.Basic.Properties:
    values = {f.name: getattr(props, f.name) for f in dataclasses.fields(props)}
    values["message_type"] = values.pop("type")
    if values["timestamp"] is not None:
        values["timestamp"] = datetime.datetime.fromtimestamp(values["timestamp"], tz=datetime.UTC)
    if values["cluster_id"] is None:
        values["cluster_id"] = ""
    return commands.Basic.Properties(**values)


@settings(max_examples=100, deadline=None)
@given(props=properties(pamqp_compatible=True), body_size=st.integers(0, 2**40))
def test_content_header_matches_pamqp(props: BasicProperties, body_size: int) -> None:
    props = pamqp_normal(props)
    ours = encode_content_header(body_size, props)
    theirs = header.ContentHeader(0, body_size, pamqp_properties(props)).marshal()
    assert ours == theirs
    assert decode_content_header(theirs) == (60, body_size, props)


@settings(max_examples=100, deadline=None)
@given(props=properties())
def test_content_header_round_trip(props: BasicProperties) -> None:
    assert decode_content_header(encode_content_header(7, props)) == (60, 7, props)


@settings(max_examples=60, deadline=None)
@given(
    channel=st.integers(1, 65535),
    ctag=st.text(max_size=30),
    tag=st.integers(0, 2**63 - 1),
    redelivered=st.booleans(),
    exchange=names,
    rkey=st.text(max_size=30),
    props=properties(pamqp_compatible=True),
    body=st.binary(max_size=20000),
    frame_max=st.sampled_from([4096, 8192, 131072]),
)
def test_deliver_fast_path_matches_generic_and_pamqp(
    channel: int,
    ctag: str,
    tag: int,
    redelivered: bool,
    exchange: str,
    rkey: str,
    props: BasicProperties,
    body: bytes,
    frame_max: int,
) -> None:
    ctag, exchange, rkey = (s.encode()[:255].decode("utf-8", "ignore") for s in (ctag, exchange, rkey))
    props = pamqp_normal(props)
    fast = codec.encode_deliver_frames(
        channel, ctag, tag, redelivered, exchange, rkey, props, body, frame_max
    )
    generic = codec.encode_content_frames(
        channel, BasicDeliver(ctag, tag, redelivered, exchange, rkey), props, body, frame_max
    )
    assert fast == generic
    expected = frame.marshal(commands.Basic.Deliver(ctag, tag, redelivered, exchange, rkey), channel)
    expected += frame.marshal(header.ContentHeader(0, len(body), pamqp_properties(props)), channel)
    chunk = frame_max - 8
    for start in range(0, len(body), chunk):
        expected += frame.marshal(pbody.ContentBody(body[start : start + chunk]), channel)
    assert fast == expected


@settings(max_examples=200, deadline=None)
@given(
    channel=st.integers(0, 65535),
    tag=st.integers(0, 2**63 - 1),
    multiple=st.booleans(),
    requeue=st.booleans(),
)
def test_ack_and_nack_frames_match_pamqp(channel: int, tag: int, multiple: bool, requeue: bool) -> None:
    assert codec.encode_ack_frame(channel, tag, multiple) == frame.marshal(
        commands.Basic.Ack(tag, multiple), channel
    )
    assert codec.encode_ack_frame(channel, tag, multiple) == codec.encode_method_frame(
        channel, BasicAck(tag, multiple)
    )
    assert codec.encode_nack_frame(channel, tag, multiple, requeue) == frame.marshal(
        commands.Basic.Nack(tag, multiple, requeue), channel
    )


@settings(max_examples=100, deadline=None)
@given(exchange=names, rkey=st.text(max_size=40), mandatory=st.booleans(), immediate=st.booleans())
def test_publish_decode_of_pamqp_bytes(exchange: str, rkey: str, mandatory: bool, immediate: bool) -> None:
    exchange, rkey = (s.encode()[:255].decode("utf-8", "ignore") for s in (exchange, rkey))
    raw = frame.marshal(commands.Basic.Publish(0, exchange, rkey, mandatory, immediate), 1)
    assert codec.decode_publish(raw[7:-1]) == BasicPublish(exchange, rkey, mandatory, immediate)


def test_non_utf8_names_round_trip_byte_for_byte() -> None:
    payload = b"\x00\x3c\x00\x28\x00\x00\x02\xff\xfe\x01\x80\x00"
    method = codec.decode_method(payload)
    assert codec.encode_method(method) == payload


def test_body_split_and_empty_body() -> None:
    assert codec.encode_body_frames(1, b"", 4096) == b""
    frames = codec.encode_body_frames(1, b"a" * 10000, 4096)
    assert frames.count(b"\xce") == 3
    assert len(frames) == 10000 + 3 * 8
