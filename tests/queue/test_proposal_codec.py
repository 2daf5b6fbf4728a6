"""The queue log's proposal codec (cluster/queue): group ids, encode/decode of every command, `peek_proposal`, and
decode errors: garbage, corrupted, wrongly shaped or out-of-range input raises only `ProposalDecodeError`, and encode
refuses what decode would reject. `ReplicatedQueue` (dedup, replicas, snapshots) is tested in test_replicated.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Hashable
from typing import Any, get_args

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.queue import (
    AddCredit,
    Attach,
    Cancel,
    Declare,
    Detach,
    Discard,
    Enqueue,
    EnqueueMany,
    Expire,
    Get,
    MsgId,
    Proposal,
    ProposalDecodeError,
    Purge,
    QueueArgs,
    QueueCommand,
    QueuedMessage,
    Recover,
    Return,
    SetArgs,
    Settle,
    SettleDeadLettered,
    decode_proposal,
    encode_proposal,
    parse_queue_group_id,
    peek_proposal,
    queue_group_id,
)
from cluster.queue.ids import (
    AtMostOnceDeadLetterPublisher,
    ChannelPublisherId,
    ConsumerId,
    DeadLetterPublisher,
    GetterId,
)

from .helpers import FAST, cbor_values, identity, roundtrip

# --- strategies -----------------------------------------------------------------------------------------------

names = st.text(min_size=1, max_size=12)
small_ints = st.integers(min_value=0, max_value=2**40)
ids: st.SearchStrategy[Hashable] = st.one_of(  # the broker's typed ids (cluster/queue/ids.py) and other ids
    st.integers(min_value=-(2**63), max_value=2**63),
    st.text(max_size=8),
    st.builds(ConsumerId, names, small_ints, small_ints),
    st.builds(GetterId, names, small_ints, small_ints),
    st.builds(ChannelPublisherId, names, small_ints, small_ints, st.integers(min_value=0, max_value=65535)),
    st.builds(DeadLetterPublisher, names, names, st.none() | small_ints),
    st.builds(AtMostOnceDeadLetterPublisher, names, names),
    st.tuples(names, names),
)
msg_id_lists = st.lists(st.integers(min_value=1, max_value=2**40).map(MsgId), max_size=5).map(tuple)
messages = st.builds(
    QueuedMessage,
    payload=st.binary(max_size=16),
    size_bytes=st.integers(min_value=0, max_value=2**31),
    persistent=st.booleans(),
    priority=st.integers(min_value=0, max_value=255),
    ttl_ms=st.none() | st.integers(min_value=0, max_value=2**31),
)
now = small_ints
opt_int = st.none() | small_ints
commands: st.SearchStrategy[QueueCommand] = st.one_of(
    st.builds(Enqueue, messages, now, st.none() | ids, opt_int),
    st.builds(
        lambda pid, at, pairs: EnqueueMany(pid, at, tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)),
        st.none() | ids, now, st.lists(st.tuples(messages, small_ints), min_size=1, max_size=4),
    ),
    st.builds(
        lambda pid, at, msgs, first: EnqueueMany(pid, at, tuple(msgs), tuple(range(first, first + len(msgs)))),
        ids, now, st.lists(messages, min_size=1, max_size=4), small_ints,
    ),
    st.builds(Attach, ids, now, small_ints, opt_int, st.integers(-10, 10), st.booleans()),
    st.builds(Detach, ids, now),
    st.builds(AddCredit, ids, small_ints),
    st.builds(Settle, ids, msg_id_lists),
    st.builds(Return, ids, msg_id_lists, now),
    st.builds(Discard, ids, msg_id_lists, now),
    st.builds(Get, ids, st.booleans(), now),
    st.builds(Expire, now),
    st.just(Purge()),
    st.just(Purge(transient_only=True)),
    st.builds(Recover, st.integers(1, 2**40).map(MsgId), messages, small_ints, opt_int),
    st.builds(Cancel, ids, now),
    st.builds(Declare, now),
)
proposals = st.builds(Proposal, names, st.integers(min_value=0, max_value=2**64 - 1), commands)


# --- group ids ------------------------------------------------------------------------------------------------


def test_group_id_escapes_slash_and_percent() -> None:
    assert queue_group_id("/", "orders") == "q/%2F/orders"
    assert queue_group_id("a%b", "x/y") == "q/a%25b/x%2Fy"
    assert parse_queue_group_id("q/%2F/orders") == ("/", "orders", 0)


@given(st.text(max_size=20), st.text(max_size=20))
@FAST
def test_group_id_round_trips(vhost: str, name: str) -> None:
    group = queue_group_id(vhost, name)
    assert group.count("/") == 2
    assert parse_queue_group_id(group) == (vhost, name, 0)


@pytest.mark.parametrize("bad", ["", "q/", "q/a", "q/a/b/c", "x/a/b", "q/a%2fb/c", "meta"])
def test_parse_group_id_rejects_non_queue_groups(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_queue_group_id(bad)


# --- codec ----------------------------------------------------------------------------------------------------


@given(proposals)
@FAST
def test_every_command_round_trips(proposal: Proposal) -> None:
    assert roundtrip(proposal) == proposal


def test_codec_covers_every_command_type() -> None:
    message = QueuedMessage(b"body", 4, True, 3, 500)
    cid = ConsumerId("nodeA", 1712, 7)
    publisher = ChannelPublisherId("nodeA", 1712, 3, 1)
    examples: list[QueueCommand] = [
        Enqueue(message, 10, publisher, 42),
        Enqueue(message, 10),
        EnqueueMany(publisher, 10, (message, message, message), (43, 44, 45)),
        EnqueueMany(publisher, 10, (message, message), (50, 47)),
        Attach(cid, 11, prefetch=5, credit=9, priority=2, no_ack=True),
        Detach(cid, 12),
        AddCredit(cid, 3),
        Settle(cid, (MsgId(1), MsgId(2))),
        Return(cid, (MsgId(3),), 13),
        Discard(cid, (), 14),
        Get(GetterId("nodeA", 1712, 3), False, 15),
        Expire(16),
        Purge(),
        Recover(MsgId(9), message, 2, 99),
        SetArgs(QueueArgs(max_length=3, dead_letter_exchange="", dead_letter_strategy="at-least-once")),
        SettleDeadLettered((MsgId(4), MsgId(2))),
        Cancel(cid, 17),
        Declare(18),
        SetArgs(QueueArgs(auto_delete=True, expires_ms=5000), 19),
        SetArgs(QueueArgs(expires_ms=0)),
    ]
    assert {type(c) for c in examples} == set(get_args(QueueCommand))
    for number, command in enumerate(examples):
        decoded = roundtrip(Proposal("rabbit@host-1", number, command))
        assert decoded.command == command
        for field in ("consumer_id", "publisher_id"):  # typed ids come back as their types (cluster/queue/ids.py)
            if hasattr(command, field) and getattr(command, field) is not None:
                assert type(getattr(decoded.command, field)) is type(getattr(command, field))


def test_payload_codec_is_applied_both_ways() -> None:
    class Payload:
        def __init__(self, body: bytes) -> None:
            self.body = body

    proposal = Proposal("n", 1, Enqueue(QueuedMessage(Payload(b"hi"), 2, False), 0))
    data = encode_proposal(proposal, lambda p: {"b": p.body})
    decoded = decode_proposal(data, lambda v: Payload(v["b"]))
    assert isinstance(decoded.command, Enqueue)
    assert decoded.command.message.payload.body == b"hi"


def test_list_msg_ids_come_back_as_a_tuple() -> None:
    decoded = roundtrip(Proposal("n", 1, Settle(1, [MsgId(4), MsgId(5)])))
    assert decoded.command == Settle(1, (MsgId(4), MsgId(5)))


@pytest.mark.parametrize("origin,proposal_id", [("", 1), ("n", -1), ("n", 2**64)])
def test_encode_rejects_a_bad_header(origin: str, proposal_id: int) -> None:
    with pytest.raises(ValueError):
        encode_proposal(Proposal(origin, proposal_id, Purge()), identity)


@given(proposals)
@FAST
def test_peek_reads_the_header(proposal: Proposal) -> None:
    assert peek_proposal(encode_proposal(proposal, identity)) == (proposal.origin, proposal.proposal_id)


@pytest.mark.parametrize("origin", ["a", "x" * 23, "x" * 24, "ü" * 200, "n" * 70000])
@pytest.mark.parametrize("proposal_id", [0, 23, 24, 255, 256, 65536, 2**32, 2**64 - 1])
def test_peek_at_every_head_width(origin: str, proposal_id: int) -> None:
    data = encode_proposal(Proposal(origin, proposal_id, Expire(1)), identity)
    assert peek_proposal(data) == (origin, proposal_id)
    assert peek_proposal(memoryview(data)) == peek_proposal(bytearray(data)) == (origin, proposal_id)


def _decode_or_error(data: bytes) -> None:
    for reader in (lambda d: decode_proposal(d, identity), peek_proposal):
        with contextlib.suppress(ProposalDecodeError):
            reader(data)


@given(st.binary(max_size=64))
@settings(max_examples=300, deadline=None)
def test_garbage_bytes_raise_only_the_decode_error(data: bytes) -> None:
    _decode_or_error(data)


@given(st.lists(cbor_values, max_size=8), st.sampled_from(["enq", "att", "settle", "rec", "purge", "exp"]))
@settings(max_examples=300, deadline=None)
def test_well_formed_cbor_of_the_wrong_shape_raises_only_the_decode_error(
    fields: list[Any], kind: str
) -> None:
    _decode_or_error(cbor2.dumps(["node", 1, kind, *fields]))
    _decode_or_error(cbor2.dumps(fields))


@given(proposals, st.data())
@settings(max_examples=150, deadline=None)
def test_corrupted_proposals_raise_only_the_decode_error(proposal: Proposal, data: st.DataObject) -> None:
    encoded = bytearray(encode_proposal(proposal, identity))
    position = data.draw(st.integers(0, len(encoded) - 1))
    encoded[position] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(encoded)))
    _decode_or_error(bytes(encoded))
    _decode_or_error(bytes(encoded[:cut]))


def test_failing_payload_decoder_becomes_the_decode_error() -> None:
    data = encode_proposal(Proposal("n", 1, Enqueue(QueuedMessage(b"x", 1, False), 0)), identity)

    def broken(value: Any) -> Any:
        raise KeyError(value)

    with pytest.raises(ProposalDecodeError):
        decode_proposal(data, broken)


def test_tagged_and_deep_cbor_raise_only_the_decode_error() -> None:
    deep: list[Any] = []
    for _ in range(5000):
        deep = [deep]
    for value in (
        ["n", 1, "det", cbor2.CBORTag(1, "not-a-time"), 0],
        ["n", 1, "det", {"a": 1}, 0],
        ["n", 1, "det", 1.5, 0],
        ["n", True, "purge"],
        ["n", 1, "det", deep, 0],
    ):
        with pytest.raises(ProposalDecodeError):
            decode_proposal(cbor2.dumps(value), identity)


# --- hardening ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        Enqueue(QueuedMessage(b"x", -1, False), 0),
        Enqueue(QueuedMessage(b"x", 1, False, priority=256), 0),
        Enqueue(QueuedMessage(b"x", 1, False), -5),
        Enqueue(QueuedMessage(b"x", 1, False), 0, publisher_id=1.5, sequence=1),
        Attach(frozenset({1}), 0),
        Attach(("n", 1, 1), 0, prefetch=-1),
        AddCredit(1, -3),
        Settle(1, (MsgId(0),)),
        Recover(MsgId(1), QueuedMessage(b"x", 1, False), delivery_count=-1),
        Expire(2**64),
    ],
)
def test_encode_refuses_what_decode_would_reject(command: QueueCommand) -> None:
    with pytest.raises(ValueError):
        encode_proposal(Proposal("n", 1, command), identity)


@pytest.mark.parametrize(
    "raw,expected",
    [
        (["n", 1, 2], ConsumerId("n", 1, 2)),  # a typed id's wire form (cluster/queue/ids.py)
        (["n", "m"], ("n", "m")),
        ([], ()),
        (["n", ["x", [b"y", None]], True, -(2**63)], ("n", ("x", (b"y", None)), True, -(2**63))),
        ("plain", "plain"),
        (7, 7),
    ],
)
def test_ids_decode_flat_and_nested(raw: Any, expected: Hashable) -> None:
    row = ["n", 1, "det", raw, 0]
    command = decode_proposal(cbor2.dumps(row), identity).command
    assert isinstance(command, Detach) and command.consumer_id == expected
    assert type(command.consumer_id) is type(expected)


@pytest.mark.parametrize("raw", [["n", 2**64], ["n", -(2**63) - 1], ["n", 1.5], ["n", {"a": 1}], [[[[[[[[[1]]]]]]]]]])
def test_bad_ids_raise_the_decode_error(raw: Any) -> None:
    with pytest.raises(ProposalDecodeError):
        decode_proposal(cbor2.dumps(["n", 1, "det", raw, 0]), identity)


@pytest.mark.parametrize(
    "message",
    [[b"p", -1, True, 0, None], [b"p", 1, 1, 0, None], [b"p", 1, True, 256, None], [b"p", 1, True, 0, -5],
     [b"p", 1, True, 0], "not-a-message"],
)
def test_bad_enqueued_messages_raise_the_decode_error(message: Any) -> None:
    with pytest.raises(ProposalDecodeError):
        decode_proposal(cbor2.dumps(["n", 1, "enq", message, 0, None, None]), identity)


def test_decode_rejects_out_of_range_fields() -> None:
    good = ["n", 1, "att", ["n", 1, 1], 0, 0, None, 0, False]
    assert decode_proposal(cbor2.dumps(good), identity).command == Attach(("n", 1, 1), 0)
    for position, value in [(5, -1), (6, -2), (4, 2**64), (3, 2**70), (8, 1)]:
        bad = list(good)
        bad[position] = value
        with pytest.raises(ProposalDecodeError):
            decode_proposal(cbor2.dumps(bad), identity)
