"""The replicated queue envelope: group ids, the proposal codec, dedup of retried proposals, snapshots.

Replica tests run scripted command sequences (hypothesis) through encode/decode and `ReplicatedQueue.apply`, with
retried proposals inserted, and compare against a plain `Queue` fed each command exactly once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Hashable
from typing import Any, get_args

import cbor2
import pytest
from hypothesis import HealthCheck, given, settings
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
    Queue,
    QueueArgs,
    QueueCommand,
    QueuedMessage,
    QueueEffect,
    Recover,
    ReplicatedQueue,
    Return,
    SetArgs,
    Settle,
    SettleDeadLettered,
    SnapshotDecodeError,
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

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def identity(value: Any) -> Any:
    return value


def roundtrip(proposal: Proposal) -> Proposal:
    return decode_proposal(encode_proposal(proposal, identity), identity)


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


cbor_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4) | st.binary(max_size=4),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=3), children, max_size=3)
    ),
    max_leaves=12,
)


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


# --- dedup ----------------------------------------------------------------------------------------------------


def enqueue(body: bytes, now_ms: int = 0) -> Enqueue:
    return Enqueue(QueuedMessage(body, len(body), False), now_ms)


def test_a_retried_proposal_is_skipped_after_a_higher_id() -> None:
    replica = ReplicatedQueue("q", QueueArgs())
    assert replica.apply(Proposal("a", 1, enqueue(b"one"))) is not None
    assert replica.apply(Proposal("a", 2, enqueue(b"two"))) is not None
    assert replica.apply(Proposal("b", 1, enqueue(b"other origin"))) is not None
    assert replica.apply(Proposal("a", 1, enqueue(b"one"))) is None
    assert replica.queue.ready_count == 3
    assert (replica.applied_count, replica.skipped_count) == (3, 1)


def test_ids_may_arrive_out_of_order() -> None:
    replica = ReplicatedQueue("q")
    assert replica.apply(Proposal("a", 5001, enqueue(b"late id first"))) is not None
    assert replica.apply(Proposal("a", 100, enqueue(b"early id"))) is not None
    assert replica.seen("a", 100) and replica.seen("a", 5001) and not replica.seen("a", 101)


def test_window_forgets_old_ids_and_skips_anything_older() -> None:
    replica = ReplicatedQueue("q", window=3)
    for proposal_id in (10, 20, 30, 40):
        assert replica.apply(Proposal("a", proposal_id, Expire(0))) == []
    assert replica.apply(Proposal("a", 10, Expire(0))) is None  # forgotten, but <= floor: still skipped
    assert replica.apply(Proposal("a", 5, Expire(0))) is None  # never seen, older than the floor: skipped
    assert replica.apply(Proposal("a", 15, Expire(0))) == []  # above the floor, not seen: applied
    assert replica.apply(Proposal("a", 15, Expire(0))) is None


def test_origins_are_bounded_least_recently_applied_first() -> None:
    replica = ReplicatedQueue("q", origins_max=2)
    replica.apply(Proposal("a", 1, Expire(0)))
    replica.apply(Proposal("b", 1, Expire(0)))
    replica.apply(Proposal("a", 2, Expire(0)))  # b is now the least recently applied
    replica.apply(Proposal("c", 1, Expire(0)))
    assert replica.seen("a", 1) and replica.seen("c", 1)
    assert not replica.seen("b", 1)
    assert replica.apply(Proposal("b", 1, Expire(0))) == []  # forgotten origin: applied again


def test_bad_window_is_refused() -> None:
    with pytest.raises(ValueError):
        ReplicatedQueue("q", window=0)


# --- replicas -------------------------------------------------------------------------------------------------

CONSUMERS = [ConsumerId("nodeA", 1712, 1), ConsumerId("nodeB", 99, 1), ConsumerId("nodeA", 1712, 2)]
PUBLISHERS = [ChannelPublisherId("nodeA", 1712, 1, 1), ChannelPublisherId("nodeB", 99, 4, 2)]
SCENARIO_ARGS = [
    QueueArgs(),
    QueueArgs(max_length=3, overflow="reject-publish", dead_letter_exchange="dlx"),
    QueueArgs(message_ttl_ms=50, max_priority=5, delivery_limit=1),
    QueueArgs(single_active_consumer=True, max_length=4),
]


@st.composite
def scenario_commands(draw: st.DrawFn) -> list[QueueCommand]:
    consumers = st.sampled_from(CONSUMERS)
    msg_ids = st.lists(st.integers(1, 12).map(MsgId), max_size=3).map(tuple)
    step = st.integers(0, 30)
    clock = 0
    out: list[QueueCommand] = [
        Recover(MsgId(n), QueuedMessage(b"r%d" % n, 2, True), 1)
        for n in range(1, draw(st.integers(0, 2)) + 1)
    ]
    for _ in range(draw(st.integers(1, 40))):
        clock += draw(step)
        kind = draw(st.integers(0, 9))
        cid = draw(consumers)
        if kind <= 2:
            message = QueuedMessage(draw(st.binary(min_size=1, max_size=3)), 3, True, draw(st.integers(0, 6)))
            publisher = draw(st.none() | st.sampled_from(PUBLISHERS))
            sequence = draw(st.integers(1, 6)) if publisher is not None else None
            out.append(Enqueue(message, clock, publisher, sequence))
        elif kind == 3:
            out.append(Attach(cid, clock, draw(st.integers(0, 2)), draw(st.none() | st.integers(0, 3))))
        elif kind == 4:
            others: list[QueueCommand] = [Detach(cid, clock), AddCredit(cid, 2), Expire(clock), Purge()]
            out.append(draw(st.sampled_from(others)))
        elif kind <= 6:
            out.append(Settle(cid, draw(msg_ids)))
        elif kind == 7:
            ids_taken = draw(msg_ids)
            out.append(
                Return(cid, ids_taken, clock) if draw(st.booleans()) else Discard(cid, ids_taken, clock)
            )
        else:
            out.append(Get(GetterId(cid.node, cid.boot, cid.n), draw(st.booleans()), clock))
    return out


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[QueueArgs, list[Proposal], list[Proposal]]:
    """(args, the proposals once each, the log: with retries of earlier proposals inserted)."""
    args = draw(st.sampled_from(SCENARIO_ARGS))
    counters = {"nodeA": 0, "nodeB": 0}
    unique: list[Proposal] = []
    log: list[Proposal] = []
    for command in draw(scenario_commands()):
        origin = draw(st.sampled_from(sorted(counters)))
        counters[origin] += draw(st.integers(1, 3))  # one counter across many queues: gaps are normal
        proposal = Proposal(origin, counters[origin], command)
        unique.append(proposal)
        log.append(proposal)
        if draw(st.integers(0, 3)) == 0:
            log.append(draw(st.sampled_from(unique)))  # a retry that committed twice
    return args, unique, log


def apply_all(replica: ReplicatedQueue, log: list[Proposal]) -> list[list[QueueEffect] | None]:
    return [replica.apply(roundtrip(proposal)) for proposal in log]


def state(replica: ReplicatedQueue) -> bytes:
    return replica.snapshot(identity)


@given(scenarios())
@FAST
def test_replicas_fed_the_same_log_agree_and_skip_exactly_the_retries(
    scenario: tuple[QueueArgs, list[Proposal], list[Proposal]],
) -> None:
    args, unique, log = scenario
    first, second = ReplicatedQueue("q", args), ReplicatedQueue("q", args)
    effects_first = apply_all(first, log)
    assert apply_all(second, log) == effects_first
    assert state(first) == state(second)

    plain = Queue("q", args, hold_dead_letters=True)  # as ReplicatedQueue makes its machine
    expected = [plain.apply(p.command) for p in unique]
    assert [e for e in effects_first if e is not None] == expected
    assert first.skipped_count == len(log) - len(unique)
    assert plain.snapshot() == first.queue.snapshot()


@given(scenarios(), st.data())
@FAST
def test_snapshot_restore_midway_changes_nothing(
    scenario: tuple[QueueArgs, list[Proposal], list[Proposal]], data: st.DataObject
) -> None:
    args, _, log = scenario
    cut = data.draw(st.integers(0, len(log)))
    straight = ReplicatedQueue("q", args, window=3)
    effects_straight = apply_all(straight, log)

    before = ReplicatedQueue("q", args, window=3)
    effects_before = apply_all(before, log[:cut])
    restored = ReplicatedQueue.restore(before.snapshot(identity), identity)
    assert state(restored) == state(before)
    assert restored.args == args and restored.window == 3
    effects_after = apply_all(restored, log[cut:])
    assert effects_before + effects_after == effects_straight
    assert state(restored) == state(straight)


def test_snapshot_keeps_tuple_ids_and_payload_codec() -> None:
    replica = ReplicatedQueue("q", QueueArgs(max_priority=3), window=7, origins_max=5)
    cid = ("nodeA", 1712, 7)
    replica.apply(Proposal("nodeA", 1, Attach(cid, 0, prefetch=1)))
    replica.apply(Proposal("nodeA", 2, Enqueue(QueuedMessage([b"a"], 1, True), 0, ("nodeA", 1712, 1, 1), 1)))
    replica.apply(Proposal("nodeA", 3, Enqueue(QueuedMessage([b"b"], 1, True), 0)))
    data = replica.snapshot(lambda p: {"parts": p})
    restored = ReplicatedQueue.restore(data, lambda v: v["parts"])
    assert restored.queue.unacked_msg_ids(cid) == [MsgId(1)]
    assert (restored.window, restored.origins_max) == (7, 5)
    assert restored.apply(Proposal("nodeA", 2, Purge())) is None
    effects = restored.apply(Proposal("nodeA", 4, Settle(cid, (MsgId(1),))))
    assert effects is not None and effects[0].message.payload == [b"b"]  # type: ignore[union-attr]
    duplicate = restored.apply(
        Proposal("nodeA", 5, Enqueue(QueuedMessage([b"a"], 1, True), 0, ("nodeA", 1712, 1, 1), 1))
    )
    assert duplicate is not None and type(duplicate[0]).__name__ == "Duplicate"


@given(st.binary(max_size=64))
@settings(max_examples=150, deadline=None)
def test_garbage_snapshots_raise_only_the_snapshot_error(data: bytes) -> None:
    with contextlib.suppress(SnapshotDecodeError):
        ReplicatedQueue.restore(data, identity)


@given(st.dictionaries(st.sampled_from(["version", "window", "origins", "queue", "applied"]), cbor_values))
@settings(max_examples=150, deadline=None)
def test_wrong_shaped_snapshots_raise_only_the_snapshot_error(value: dict[str, Any]) -> None:
    value.setdefault("version", 1)
    with pytest.raises(SnapshotDecodeError):
        ReplicatedQueue.restore(cbor2.dumps(value), identity)


# --- hardening ------------------------------------------------------------------------------------------------


class NaiveDedup:
    """Reference for one origin's dedup: the last `window` applied ids in a list, and the highest one forgotten."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.applied: list[int] = []
        self.floor = -1

    def apply(self, proposal_id: int) -> bool:
        if proposal_id <= self.floor or proposal_id in self.applied:
            return False
        self.applied.append(proposal_id)
        if len(self.applied) > self.window:
            self.floor = max(self.floor, self.applied.pop(0))
        return True


@given(
    st.integers(1, 6),
    st.lists(st.integers(0, 40) | st.just(2**64 - 1), max_size=80),
    st.integers(0, 80),
)
@settings(max_examples=200, deadline=None)
def test_dedup_window_matches_a_naive_reference(window: int, proposal_ids: list[int], cut: int) -> None:
    reference = NaiveDedup(window)
    replica = ReplicatedQueue("q", window=window)
    for position, proposal_id in enumerate(proposal_ids):
        if position == cut:
            replica = ReplicatedQueue.restore(replica.snapshot(identity), identity)
        applied = replica.apply(Proposal("a", proposal_id, Purge())) is not None
        assert applied == reference.apply(proposal_id)


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


def test_snapshot_of_consecutive_ids_is_small() -> None:
    replica = ReplicatedQueue("q")
    for proposal_id in range(1, 10_001):
        replica.apply(Proposal("nodeA", proposal_id, Expire(proposal_id)))
    assert len(replica.snapshot(identity)) < 1000  # the 4096 remembered ids are one run
    restored = ReplicatedQueue.restore(replica.snapshot(identity), identity)
    assert restored.seen("nodeA", 1) and restored.seen("nodeA", 10_000) and not restored.seen("nodeA", 10_001)


@pytest.mark.parametrize(
    "origins",
    [
        [["a", -2, []]],
        [["a", -1, [[5, -1]]]],
        [["a", -1, [[1, 5000]]]],  # more ids than the window
        [[1, -1, []]],
        [["a", -1, []], ["b", -1, []], ["c", -1, []]],  # more origins than origins_max
    ],
)
def test_restore_rejects_bad_dedup_tables(origins: list[Any]) -> None:
    state = cbor2.loads(ReplicatedQueue("q", window=4096, origins_max=2).snapshot(identity))
    state["origins"] = origins
    with pytest.raises(SnapshotDecodeError):
        ReplicatedQueue.restore(cbor2.dumps(state), identity)


def test_window_lookup_ignores_byte_matches_across_two_ids() -> None:
    replica = ReplicatedQueue("q")
    replica.apply(Proposal("a", 2**56, Purge()))
    replica.apply(Proposal("a", 1, Purge()))
    # little endian, the bytes of 2**56 then 1 contain those of 257 at an unaligned offset
    assert not replica.seen("a", 257)
    assert replica.seen("a", 1) and replica.seen("a", 2**56)
    assert replica.apply(Proposal("a", 257, Purge())) is not None
