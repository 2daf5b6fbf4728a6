"""The replicated queue: dedup of retried proposals, replicas fed the same log, snapshots.

Replica tests run scripted command sequences (hypothesis) through encode/decode and `ReplicatedQueue.apply`, with
retried proposals inserted, and compare against a plain `Queue` fed each command exactly once. Group ids and the
proposal codec are tested in test_proposal_codec.py.
"""

from __future__ import annotations

import contextlib
from typing import Any

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.queue import (
    AddCredit,
    Attach,
    Detach,
    Discard,
    Enqueue,
    Expire,
    Get,
    MsgId,
    Proposal,
    Purge,
    Queue,
    QueueArgs,
    QueueCommand,
    QueuedMessage,
    QueueEffect,
    Recover,
    ReplicatedQueue,
    Return,
    Settle,
    SnapshotDecodeError,
)
from cluster.queue.ids import (
    ChannelPublisherId,
    ConsumerId,
    GetterId,
)

from .helpers import FAST, cbor_values, identity, roundtrip

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
