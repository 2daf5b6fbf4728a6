"""The compact Raft codec: flat Append layout, older layouts still decode, malformed input raises CodecError only;
and GroupImage's range truncation (same result as the full scan it replaced)."""

from __future__ import annotations

import contextlib
from typing import Any

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.raft.core.image import GroupImage, Record
from cluster.raft.core.multiraft import NodeBatch
from cluster.raft.core.types import (
    Append,
    AppendResp,
    Entry,
    EntryKind,
    GroupId,
    HardState,
    Heartbeat,
    Index,
    InstallSnapshot,
    Membership,
    NodeId,
    PreVoteResp,
    Ready,
    Snapshot,
    Term,
    Vote,
)
from cluster.raft.runtime import storage
from cluster.raft.runtime.codec import APPEND_FLAT_TAG, CodecError, decode_frame, encode_batch

N1, N2 = NodeId("n1"), NodeId("n2")
G = GroupId("q/%2F/a")


def _entries(first: int, count: int, term: int = 2) -> tuple[Entry, ...]:
    kinds = list(EntryKind)
    return tuple(Entry(Term(term), Index(first + i), bytes([i % 256]) * i, kinds[i % len(kinds)])
                 for i in range(count))


def _batch() -> NodeBatch:
    snapshot = Snapshot(Index(9), Term(2), Membership(frozenset({N1, N2}), frozenset({NodeId("n3")})), b"state")
    return NodeBatch(N1, N2, 5, (
        (G, Append(N1, N2, Term(2), Index(4), Term(1), _entries(5, 7), Index(3))),
        (G, Append(N1, N2, Term(2), Index(4), Term(1), (), Index(3))),
        (G, AppendResp(N2, N1, Term(2), Index(4), True, Index(2), Term(1))),
        (GroupId("g2"), Vote(N1, N2, Term(3), Index(7), Term(2), True)),
        (GroupId("g2"), PreVoteResp(N2, N1, Term(3), False, Index(2), Term(1))),
        (GroupId("g3"), Heartbeat(N1, N2, Term(1), Index(0), True)),
        (GroupId("g3"), InstallSnapshot(N1, N2, Term(2), snapshot)),
    ))


def test_every_message_kind_round_trips_and_append_is_flat() -> None:
    batch = _batch()
    data = encode_batch(batch)
    assert decode_frame(data) == batch
    append_plain = cbor2.loads(data)[3][0][1]
    assert append_plain[0] == APPEND_FLAT_TAG and not any(isinstance(item, list) for item in append_plain)


def test_the_older_nested_append_layout_still_decodes() -> None:
    entries = _entries(5, 3)
    nested = [4, "n1", "n2", 2, 4, 1, [[e.term, e.index, e.data, e.kind.value] for e in entries], 3]
    batch = decode_frame(cbor2.dumps(["n1", "n2", 0, [["g", nested]]]))
    assert isinstance(batch, NodeBatch)
    assert batch.messages == ((GroupId("g"), Append(N1, N2, Term(2), Index(4), Term(1), entries, Index(3))),)


BAD_FRAMES: list[Any] = [
    ["n1", "n2", 0, [["g", [APPEND_FLAT_TAG, "n1", "n2", 2, 4, 1, 3, 2, 5, 0]]]],  # entry row cut short
    ["n1", "n2", 0, [["g", [APPEND_FLAT_TAG, "n1", "n2", 2, 4, 1, 3, 2, 5, 0, "text"]]]],  # data not bytes
    ["n1", "n2", 0, [["g", [APPEND_FLAT_TAG, "n1", "n2", 2, 4, 1, 3, 2, 5, 9, b""]]]],  # unknown entry kind
    ["n1", "n2", 0, [["g", [APPEND_FLAT_TAG, "n1", "n2", 2, 4, 1, 3, True, 5, 0, b""]]]],  # bool term
    ["n1", "n2", 0, [["g", [APPEND_FLAT_TAG, "n1", "n2", 2, 4]]]],  # head cut short
    ["n1", "n2", 0, [["g", [4, "n1", "n2", 2, 4, 1, [[2, 5, b""]], 3]]]],  # nested entry of 3 fields
    ["n1", "n2", 0, [["g", [5, "n2", "n1", 2, 4, 1, 0, 0]]]],  # AppendResp: reject is an int
    ["n1", "n2", 0, [["g", [5, "n2", "n1", 2, 4]]]],  # wrong field count
    ["n1", "n2", 0, [["g", [99]]]],  # unknown tag
    ["n1", "n2", 0, [["g", [8, "n1", "n2", 1, [1, 1, ["n1"], [], b"", 7]]]]],  # snapshot of 6 fields
    ["n1", "n2", 0, [[7, [7, "n1", "n2", 1]]]],  # group not a str
    ["n1", "n2", 0, [["g"]]],  # item without a message
    ["n1", "n2", "0", []],  # incarnation not an int
    ["n1", "n2", 0],  # header cut short
]


@pytest.mark.parametrize("plain", BAD_FRAMES)
def test_malformed_batches_raise_codec_error_only(plain: Any) -> None:
    with pytest.raises(CodecError):
        decode_frame(cbor2.dumps(plain))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes_never_raise_anything_but_codec_error(data: bytes) -> None:
    with contextlib.suppress(CodecError):
        decode_frame(data)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 60), min_size=1, max_size=4))
def test_data_mutations_raise_codec_error_or_decode(cuts: list[int]) -> None:
    data = bytearray(encode_batch(_batch()))
    for cut in cuts:
        data[cut % len(data)] ^= 0x5A
    with contextlib.suppress(CodecError):
        decode_frame(bytes(data))


def test_storage_records_round_trip_and_older_records_load() -> None:
    ready = Ready(HardState(Term(2), N1, Index(3)), None, _entries(5, 4), (), ())
    records = storage._decode(G, storage._encode_ready(G, ready))
    assert [r.kind for r in records] == ["entries", "hs"]
    assert records[0].entries == ready.entries and records[1].hard_state == ready.hard_state
    old = cbor2.dumps(["r", None, [[e.term, e.index, e.data, e.kind.value] for e in ready.entries], [2, "n1", 3]])
    assert storage._decode(G, old) == records


def _scan_reference(image: dict[Index, Entry], record: Record) -> dict[Index, Entry]:
    first = record.entries[0].index
    kept = {index: entry for index, entry in image.items() if index < first}
    kept.update((entry.index, entry) for entry in record.entries)
    return kept


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.integers(1, 6), st.integers(1, 3)), max_size=30),
       st.integers(0, 30))
def test_image_range_truncation_matches_a_full_scan(appends: list[tuple[int, int, int]], compact_at: int) -> None:
    image = GroupImage.empty(Membership(frozenset({N1})))
    reference: dict[Index, Entry] = {}
    for step, (first, count, term) in enumerate(appends):
        record = Record(G, "entries", entries=_entries(first, count, term))
        reference = _scan_reference(reference, record)
        image.apply(record)
        if step == compact_at:
            image.apply(Record(G, "compact", snapshot=Snapshot(Index(first), Term(term), image.snapshot.membership)))
            reference = {index: entry for index, entry in reference.items() if index > first}
        assert image.entries == reference
        assert list(image.entries) == sorted(image.entries)


def test_make_entry_builds_an_ordinary_frozen_entry() -> None:
    from dataclasses import FrozenInstanceError

    from cluster.raft.core.types import make_entry

    for kind in EntryKind:
        made = make_entry(Term(4), Index(9), b"data", kind)
        built = Entry(Term(4), Index(9), b"data", kind)
        assert made == built and hash(made) == hash(built) and repr(made) == repr(built)
        with pytest.raises(FrozenInstanceError):
            made.term = Term(5)  # type: ignore[misc]
