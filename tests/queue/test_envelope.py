"""The one owner of a queue log entry's bytes: `cluster.queue.envelope` (pure, no processes)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.queue import Enqueue, MsgId, Proposal, QueuedMessage, Settle, encode_proposal
from cluster.queue.envelope import (
    FRAME_BYTES,
    Envelope,
    EnvelopeCodec,
    frame_snapshot,
    open_snapshot,
)


def _same(value: Any) -> Any:
    return value


def _codec(origin: str) -> EnvelopeCodec:
    return EnvelopeCodec(origin, _same, _same)


SETTLE = Settle(("a", 1, 1), (MsgId(1), MsgId(2)))
ENQUEUE = Enqueue(QueuedMessage(b"body", 4, True), 10, ("a", 1, 7, 1), 3)


@pytest.mark.parametrize("incarnation", [0, 1, 0x5EED, 2**63 - 1, 2**64 - 1])
def test_envelopes_round_trip_and_incarnation_0_is_the_plain_proposal(incarnation: int) -> None:
    envelope = Envelope(incarnation, "a", 42, ENQUEUE)
    data = _codec("b").encode(envelope)
    assert _codec("c").decode(data) == envelope
    plain = encode_proposal(Proposal("a", 42, ENQUEUE), _same)
    assert data == plain if incarnation == 0 else data[FRAME_BYTES:] == plain  # the bytes logs already hold


def test_an_incarnation_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError):
        _codec("a").encode(Envelope(2**64, "a", 1, SETTLE))
    with pytest.raises(ValueError):
        _codec("a").encode(Envelope(-1, "a", 1, SETTLE))


def test_a_batch_skips_and_counts_other_incarnations_and_undecodable_entries() -> None:
    writer, reader = _codec("a"), _codec("b")
    mine = Envelope(9, "a", 1, SETTLE)
    entries = [writer.encode(Envelope(5, "a", 2, SETTLE)),  # an earlier declaration of the queue
               writer.encode(mine),
               writer.encode(Envelope(0, "a", 3, SETTLE)),  # plain: incarnation 0
               b"\xff" + (9).to_bytes(8, "big") + b"not cbor",
               writer.encode(Envelope(9, "c", 1, ENQUEUE))]
    read = reader.read_batch(entries, 9)
    assert read.envelopes == [mine, Envelope(9, "c", 1, ENQUEUE)]
    assert (read.stale, read.undecodable) == (2, 1)


def test_a_node_reads_its_own_entries_back_as_the_objects_it_encoded_once() -> None:
    codec = _codec("a")
    envelope = Envelope(3, "a", 1, ENQUEUE)
    data = codec.encode(envelope)
    assert codec.read_batch([data], 3).envelopes[0] is envelope  # decode once
    again = codec.read_batch([data], 3).envelopes[0]  # a retried copy of it commits: decoded
    assert again == envelope and again is not envelope
    other = _codec("b")
    assert other.read_batch([data], 3).envelopes[0] is not envelope  # another node decodes


def test_a_proposal_reframed_for_the_queues_next_incarnation_reads_back_there() -> None:
    codec = _codec("a")
    envelope = Envelope(5, "a", 7, SETTLE)
    data = codec.encode(envelope)
    moved = codec.reframed(data, 9)
    assert codec.reframed(moved, 9) is moved
    assert codec.read_batch([data], 9).stale == 1
    assert codec.read_batch([moved], 9).envelopes == [Envelope(9, "a", 7, SETTLE)]
    assert _codec("b").decode(codec.reframed(moved, 0)) == Envelope(0, "a", 7, SETTLE)


def test_snapshots_carry_their_incarnation() -> None:
    assert frame_snapshot(0, b"state") == b"state" and open_snapshot(b"state") == (0, b"state")
    assert open_snapshot(frame_snapshot(12, b"state")) == (12, b"state")
    assert open_snapshot(frame_snapshot(12, b"")) == (12, b"")


@given(st.lists(st.binary(max_size=40), max_size=8), st.integers(0, 2**64 - 1))
@settings(max_examples=300, deadline=None)
def test_reading_arbitrary_bytes_never_raises(entries: list[bytes], incarnation: int) -> None:
    read = _codec("a").read_batch(entries, incarnation)
    assert len(read.envelopes) + read.stale + read.undecodable == len(entries)
