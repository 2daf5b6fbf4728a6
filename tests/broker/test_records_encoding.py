"""records.encode_record: the hand-rolled per-message encoder writes exactly cbor2's bytes, and records decode back."""

from __future__ import annotations

import datetime
import decimal
from typing import Any

import cbor2
from hypothesis import given, settings
from hypothesis import strategies as st

from node.broker import records
from node.broker.records import (
    MessageRecord,
    MessageRemovedRecord,
    QueueRecord,
    TailMessageRecord,
    encode_record,
    from_cbor,
    to_cbor,
)

names = st.text(max_size=40)
ids = st.integers(min_value=0, max_value=2**70)
property_values = st.one_of(
    st.none(), st.text(max_size=20), st.integers(-(2**70), 2**70), st.booleans(), st.binary(max_size=20),
    st.dictionaries(st.text(max_size=8), st.one_of(st.integers(), st.text(max_size=8)), max_size=3),
)
properties = st.dictionaries(st.sampled_from(["delivery_mode", "content_type", "priority", "headers", "x"]),
                             property_values, max_size=4)


def _same_as_cbor2(record: Any) -> None:
    assert encode_record(record) == cbor2.dumps(to_cbor(record))


@settings(max_examples=300, deadline=None)
@given(names, names, ids, names, names, properties, st.binary(max_size=300), st.integers(0, 2**40))
def test_message_record_bytes_match_cbor2(vhost: str, queue: str, msg_id: int, exchange: str, routing_key: str,
                                          props: dict[str, Any], body: bytes, delivery_count: int) -> None:
    for cls in (MessageRecord, TailMessageRecord):
        record = cls(vhost, queue, msg_id, exchange, routing_key, props, body, delivery_count)
        _same_as_cbor2(record)
        _same_as_cbor2(record)  # second time from the caches
        back = from_cbor(cbor2.loads(encode_record(record)))
        assert back == MessageRecord(vhost, queue, msg_id, exchange, routing_key, props, body, delivery_count)


@settings(max_examples=300, deadline=None)
@given(names, names, st.integers(min_value=-(2**70), max_value=2**70))
def test_removed_record_bytes_match_cbor2(vhost: str, queue: str, msg_id: int) -> None:
    _same_as_cbor2(MessageRemovedRecord(vhost, queue, msg_id))


def test_boundaries_of_the_cbor_heads() -> None:
    for value in (0, 23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**64 - 1, 2**64, -1, -(2**64) - 5):
        _same_as_cbor2(MessageRemovedRecord("/", "q", value))
    for size in (0, 23, 24, 255, 256, 65535, 65536):
        _same_as_cbor2(MessageRecord("/", "q" * size, 1, "", "k" * size, {}, b"x" * size))


def test_other_values_go_through_cbor2() -> None:
    exotic = {"headers": {"d": decimal.Decimal("1.5"), "t": datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)}}
    _same_as_cbor2(MessageRecord("/", "q", 1, "", "q", exotic, b"body"))
    _same_as_cbor2(MessageRecord("/", "q", 1, "", "q", {}, bytearray(b"body")))  # type: ignore[arg-type]
    _same_as_cbor2(QueueRecord("/", "q", arguments={"x-max-length": 3}))


def test_shared_properties_dict_is_encoded_once_and_caches_are_bounded(monkeypatch: Any) -> None:
    monkeypatch.setattr(records, "ENCODE_CACHE_ENTRIES_MAX", 8)
    shared = {"delivery_mode": 2}
    for msg_id in range(50):
        _same_as_cbor2(MessageRecord("/", f"q{msg_id}", msg_id, "", f"k{msg_id}", shared, b""))
        _same_as_cbor2(MessageRecord("/", "q", msg_id, "", "q", {"delivery_mode": msg_id}, b""))
    assert len(records._prefixes) <= 8 and len(records._texts) <= 8 and len(records._shared_properties) <= 8


def test_message_records_are_values() -> None:
    a = MessageRemovedRecord("/", "q", 1)
    assert a == MessageRemovedRecord("/", "q", 1) and hash(a) == hash(MessageRemovedRecord("/", "q", 1))
    assert {a} == {MessageRemovedRecord("/", "q", 1)}
