"""At-least-once dead lettering in the machine: the holding area, its settle command, limits and snapshots."""

from __future__ import annotations

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.queue import (
    Attach,
    DeadLetter,
    Discard,
    Enqueue,
    Expire,
    MsgId,
    Purge,
    Queue,
    QueueArgs,
    QueueCommand,
    Rejected,
    Return,
    SetArgs,
    SettleDeadLettered,
)
from tests.queue.helpers import msg
from tests.queue.test_determinism import (
    Payload,
    commands,
    decode_id,
    encode_id,
    encode_payload,
    unique_recover_ids,
)

AT_LEAST_ONCE = QueueArgs(dead_letter_exchange="dlx", overflow="reject-publish", dead_letter_strategy="at-least-once")


def dead_letters(effects: list[object]) -> list[DeadLetter]:
    return [e for e in effects if isinstance(e, DeadLetter)]


def queue_with_rejected(count: int, args: QueueArgs = AT_LEAST_ONCE) -> tuple[Queue, list[DeadLetter]]:
    queue = Queue("q", args, hold_dead_letters=True)
    for index in range(count):
        queue.apply(Enqueue(msg(str(index)), 0))
    queue.apply(Attach("c", 0))
    ids = [MsgId(i) for i in range(count, 0, -1)]  # rejected newest first: hold order is not msg id order
    return queue, dead_letters(queue.apply(Discard("c", ids, 1)))


def test_rejected_messages_are_held_with_sequences_in_hold_order() -> None:
    queue, letters = queue_with_rejected(3)
    assert [(d.msg_id, d.held_seq, d.reason) for d in letters] == [(3, 1, "rejected"), (2, 2, "rejected"),
                                                                  (1, 3, "rejected")]
    assert queue.held_count == 3 and queue.ready_count == 0 and queue.unacked_count == 0
    assert queue.held_bytes == 30
    assert [(i, s) for i, s, *_ in queue.held_letters()] == [(3, 1), (2, 2), (1, 3)]
    assert queue.held_msg_id(2) == 2
    assert queue.held_letter(MsgId(2)) == (2, "rejected", msg("1")) and queue.held_letter(MsgId(9)) is None
    queue.apply(SettleDeadLettered([MsgId(2), MsgId(99)]))
    assert queue.held_count == 2 and queue.held_msg_id(2) is None
    queue.apply(SettleDeadLettered([MsgId(2)]))  # again: ignored
    assert [i for i, *_ in queue.held_letters()] == [3, 1]


def test_a_machine_not_made_to_hold_never_holds() -> None:
    queue = Queue("q", AT_LEAST_ONCE)  # a single node's queue: it dead-letters synchronously
    queue.apply(Enqueue(msg("a"), 0))
    queue.apply(Attach("c", 0))
    [letter] = dead_letters(queue.apply(Discard("c", [MsgId(1)], 1)))
    assert letter.held_seq is None and queue.held_count == 0


def test_other_overflow_modes_fall_back_to_at_most_once() -> None:
    for overflow in ("drop-head", "reject-publish-dlx"):
        args = QueueArgs(dead_letter_exchange="dlx", overflow=overflow, dead_letter_strategy="at-least-once")
        queue, letters = queue_with_rejected(2, args)
        assert [d.held_seq for d in letters] == [None, None]
        assert queue.held_count == 0


def test_expired_and_delivery_limit_losses_are_held_too() -> None:
    args = QueueArgs(dead_letter_exchange="dlx", overflow="reject-publish", dead_letter_strategy="at-least-once",
                     message_ttl_ms=10, delivery_limit=0)
    queue = Queue("q", args, hold_dead_letters=True)
    queue.apply(Enqueue(msg("a"), 0))
    queue.apply(Enqueue(msg("b"), 0))
    queue.apply(Attach("c", 0, credit=1))
    expired = dead_letters(queue.apply(Expire(20)))
    returned = dead_letters(queue.apply(Return("c", [MsgId(1)], 21)))
    assert [(d.msg_id, d.reason, d.held_seq) for d in expired + returned] == [(2, "expired", 1),
                                                                            (1, "delivery_limit", 2)]
    assert queue.held_count == 2


def test_held_messages_count_against_length_limits() -> None:
    args = QueueArgs(dead_letter_exchange="dlx", overflow="reject-publish", dead_letter_strategy="at-least-once",
                     max_length=2)
    queue, _ = queue_with_rejected(2, args)
    assert queue.apply(Enqueue(msg("x"), 2, "p", 1)) == [Rejected("p", 1, "maxlen")]
    queue.apply(SettleDeadLettered([MsgId(1)]))
    assert type(queue.apply(Enqueue(msg("x"), 2, "p", 1))[0]).__name__ == "Accepted"


def test_publishes_are_refused_past_the_held_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    import cluster.queue.machine as machine

    monkeypatch.setattr(machine, "DEAD_LETTER_HELD_MAX", 2)
    queue, _ = queue_with_rejected(2)
    assert queue.apply(Enqueue(msg("x"), 2, "p", 1)) == [Rejected("p", 1, "dead_letter_held")]


def test_purge_leaves_held_messages() -> None:
    queue, _ = queue_with_rejected(2)
    queue.apply(Enqueue(msg("x"), 2))
    queue.apply(Purge())
    assert queue.held_count == 2


def test_switching_the_strategy_off_releases_held_messages_at_most_once() -> None:
    queue, _ = queue_with_rejected(2)
    released = dead_letters(queue.apply(SetArgs(QueueArgs(dead_letter_exchange="dlx"))))
    assert [(d.msg_id, d.held_seq, d.reason) for d in released] == [(2, None, "rejected"), (1, None, "rejected")]
    assert queue.held_count == 0
    queue, _ = queue_with_rejected(1)
    assert [type(e).__name__ for e in queue.apply(SetArgs(QueueArgs()))] == ["Dropped"]


def test_snapshot_keeps_the_holding_area() -> None:
    queue, _ = queue_with_rejected(3)
    queue.apply(SettleDeadLettered([MsgId(2)]))
    restored = Queue.restore(cbor2.loads(cbor2.dumps(queue.snapshot())))
    assert restored.held_letters() == queue.held_letters()
    assert restored.held_bytes == queue.held_bytes
    queue.apply(Enqueue(msg("n"), 5))
    restored.apply(Enqueue(msg("n"), 5))
    assert restored.apply(Discard("c", [MsgId(4)], 6)) == queue.apply(Discard("c", [MsgId(4)], 6))
    assert restored.held_msg_id(4) == 4


def test_old_snapshots_without_holding_keys_restore() -> None:
    snap = Queue("q", AT_LEAST_ONCE, hold_dead_letters=True).snapshot()
    for key in ("held", "held_last_seq", "ttl_epoch"):
        del snap[key]
    del snap["args"]["dead_letter_strategy"]
    assert Queue.restore(snap).held_count == 0


# --- properties ------------------------------------------------------------------------------------------------

holding_args = st.builds(
    QueueArgs,
    message_ttl_ms=st.none() | st.integers(0, 80),
    max_length=st.none() | st.integers(0, 5),
    overflow=st.sampled_from(["drop-head", "reject-publish"]),
    dead_letter_exchange=st.none() | st.just("dlx"),
    delivery_limit=st.none() | st.integers(0, 2),
    dead_letter_strategy=st.sampled_from(["at-most-once", "at-least-once"]),
)
holding_scripts = st.lists(
    st.one_of(
        commands,
        st.builds(SetArgs, holding_args),
        st.builds(SettleDeadLettered, st.lists(st.integers(1, 30).map(MsgId), max_size=3)),
    ),
    max_size=50,
)


@settings(max_examples=120, deadline=None)
@given(args=holding_args, before=holding_scripts, after=holding_scripts)
def test_holding_survives_snapshots_and_counts_add_up(
    args: QueueArgs, before: list[QueueCommand], after: list[QueueCommand]
) -> None:
    original = Queue("q", args, hold_dead_letters=True)
    script = unique_recover_ids(before + after)
    before, after = script[: len(before)], script[len(before) :]
    held_seqs: list[int] = []
    for command in before:
        held_seqs += [d.held_seq for d in dead_letters(original.apply(command)) if d.held_seq is not None]
    wire = cbor2.dumps(original.snapshot(encode_payload, encode_id))
    restored = Queue.restore(cbor2.loads(wire), Payload, decode_id)
    assert restored.hold_dead_letters
    for command in after:
        effects = original.apply(command)
        assert restored.apply(command) == effects
        held_seqs += [d.held_seq for d in dead_letters(effects) if d.held_seq is not None]
    assert held_seqs == list(range(1, len(held_seqs) + 1))
    assert restored.held_letters() == original.held_letters()
    if not original.args.holds_dead_letters:
        assert original.held_count == 0
    assert original.held_bytes == sum(m.size_bytes for _, _, _, m, _ in original.held_letters())
