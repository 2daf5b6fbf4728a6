"""SetArgs (policies change a queue's arguments at one point of its log): limits, TTLs, codec, snapshots.

Properties: scripts mixing SetArgs into every other command stay deterministic, survive snapshot/restore
unchanged, and never leave a due message behind an Expire (the ready store's compact TTL column assumes one TTL;
SetArgs moves older messages out of it).
"""

from __future__ import annotations

from typing import Any

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.queue import (
    Attach,
    DeadLetter,
    Dropped,
    Enqueue,
    Expire,
    Proposal,
    ProposalDecodeError,
    Queue,
    QueueArgs,
    QueueCommand,
    Rejected,
    Return,
    SetArgs,
    decode_proposal,
    encode_proposal,
)
from tests.queue.helpers import msg
from tests.queue.test_determinism import (
    all_args,
    commands,
    encode_id,
    encode_payload,
    restore_and_replay,
    unique_recover_ids,
)

set_args_commands = st.builds(SetArgs, all_args)
scripts = st.lists(st.one_of(commands, set_args_commands), max_size=50)


def identity(value: Any) -> Any:
    return value


def expiry_of_ready(queue: Queue) -> list[int | None]:
    return [entry.expiry_ms for entry in queue._ready.iter_in_order()]


# --- machine ---------------------------------------------------------------------------------------------------


def test_lower_max_length_under_drop_head_drops_heads_at_once() -> None:
    queue = Queue("q")
    for index in range(5):
        queue.apply(Enqueue(msg(str(index)), 0))
    effects = queue.apply(SetArgs(QueueArgs(max_length=2)))
    assert [e.msg_id for e in effects if isinstance(e, Dropped)] == [1, 2, 3]
    assert {e.reason for e in effects if isinstance(e, Dropped)} == {"maxlen"}
    assert queue.ready_msg_ids() == [4, 5]


def test_lower_max_length_bytes_with_dlx_dead_letters_heads() -> None:
    queue = Queue("q")
    for index in range(4):
        queue.apply(Enqueue(msg(str(index), size_bytes=10), 0))
    effects = queue.apply(SetArgs(QueueArgs(max_length_bytes=25, dead_letter_exchange="dlx")))
    assert [(e.msg_id, e.reason) for e in effects if isinstance(e, DeadLetter)] == [(1, "maxlen"), (2, "maxlen")]
    assert queue.ready_bytes == 20


def test_reject_publish_keeps_messages_and_refuses_publishes_until_under_limit() -> None:
    queue = Queue("q")
    for index in range(3):
        queue.apply(Enqueue(msg(str(index)), 0))
    assert queue.apply(SetArgs(QueueArgs(max_length=1, overflow="reject-publish"))) == []
    assert queue.ready_count == 3
    assert queue.apply(Enqueue(msg("x"), 0, "p", 1)) == [Rejected("p", 1, "maxlen")]
    queue.apply(Attach("c", 0, prefetch=0))
    queue.apply(SetArgs(QueueArgs(max_length=1, overflow="reject-publish")))
    assert queue.ready_count == 0


def test_new_ttl_applies_to_later_messages_only() -> None:
    queue = Queue("q", QueueArgs(message_ttl_ms=1000))
    queue.apply(Enqueue(msg("old"), 0))  # expires at 1000
    queue.apply(Enqueue(msg("untimed"), 0))
    queue.apply(SetArgs(QueueArgs(message_ttl_ms=10)))
    queue.apply(Enqueue(msg("new"), 100))  # expires at 110
    assert expiry_of_ready(queue) == [1000, 1000, 110]
    effects = queue.apply(Expire(200))
    assert [e.msg_id for e in effects if isinstance(e, Dropped)] == [3]
    assert queue.next_expiry_ms() == 1000
    effects = queue.apply(Expire(1000))
    assert [e.msg_id for e in effects if isinstance(e, Dropped)] == [1, 2]


def test_removing_ttl_keeps_existing_expiries() -> None:
    queue = Queue("q", QueueArgs(message_ttl_ms=50))
    queue.apply(Enqueue(msg("a"), 0))
    queue.apply(SetArgs(QueueArgs()))
    queue.apply(Enqueue(msg("b"), 0))
    assert expiry_of_ready(queue) == [50, None]
    assert [e.msg_id for e in queue.apply(Expire(60)) if isinstance(e, Dropped)] == [1]
    assert queue.ready_msg_ids() == [2]


def test_declared_priority_and_single_active_consumer_are_kept() -> None:
    queue = Queue("q", QueueArgs(max_priority=3, single_active_consumer=True))
    queue.apply(SetArgs(QueueArgs(max_length=7)))
    assert queue.args == QueueArgs(max_priority=3, single_active_consumer=True, max_length=7)


def test_unacked_message_returned_after_ttl_change_still_expires() -> None:
    queue = Queue("q", QueueArgs(message_ttl_ms=100))
    queue.apply(Enqueue(msg("a", ttl_ms=80), 0))  # its own shorter TTL: tracked in the old store's expiry heap
    queue.apply(Attach("c", 0, credit=1))
    queue.apply(SetArgs(QueueArgs(message_ttl_ms=5)))
    queue.apply(Return("c", [1], 60))
    assert queue.ready_msg_ids() == [1]
    assert queue.next_expiry_ms() == 80
    assert [e.msg_id for e in queue.apply(Expire(80)) if isinstance(e, Dropped)] == [1]


# --- properties ------------------------------------------------------------------------------------------------


@settings(max_examples=120, deadline=None)
@given(args=all_args, script=scripts)
def test_set_args_scripts_are_deterministic_and_expire_everything_due(
    args: QueueArgs, script: list[QueueCommand]
) -> None:
    first, second = Queue("q", args), Queue("q", args)
    for command in unique_recover_ids(script):
        assert first.apply(command) == second.apply(command)
        if isinstance(command, Expire):
            now_ms = first.now_ms
            assert all(e is None or e > now_ms for e in expiry_of_ready(first))
    assert first.snapshot(encode_payload, encode_id) == second.snapshot(encode_payload, encode_id)


@settings(max_examples=120, deadline=None)
@given(args=all_args, before=scripts, after=scripts)
def test_restore_after_set_args_behaves_identically(
    args: QueueArgs, before: list[QueueCommand], after: list[QueueCommand]
) -> None:
    original, restored = restore_and_replay(args, before, after)
    assert restored.next_expiry_ms() == original.next_expiry_ms()


# --- codec -----------------------------------------------------------------------------------------------------

codec_args = st.builds(
    QueueArgs,
    message_ttl_ms=st.none() | st.integers(0, 2**40),
    max_length=st.none() | st.integers(0, 2**40),
    max_length_bytes=st.none() | st.integers(0, 2**63),
    overflow=st.sampled_from(["drop-head", "reject-publish", "reject-publish-dlx"]),
    dead_letter_exchange=st.none() | st.text(max_size=10),
    dead_letter_routing_key=st.none() | st.text(max_size=10),
    max_priority=st.none() | st.integers(0, 255),
    single_active_consumer=st.booleans(),
    delivery_limit=st.none() | st.integers(0, 100),
    dead_letter_strategy=st.sampled_from(["at-most-once", "at-least-once"]),
)


@settings(max_examples=100, deadline=None)
@given(args=codec_args)
def test_set_args_round_trips(args: QueueArgs) -> None:
    proposal = Proposal("n1", 7, SetArgs(args))
    assert decode_proposal(encode_proposal(proposal, identity), identity) == proposal


GOOD_ROW = [None, None, None, "drop-head", None, None, None, False, None, "at-most-once"]


@pytest.mark.parametrize(
    ("index", "value"),
    [
        (0, -1),
        (1, "5"),
        (2, 2**64),
        (3, "drop-tail"),
        (4, 5),
        (5, b"rk"),
        (6, 256),
        (7, 0),
        (8, 1.5),
        (9, "exactly-once"),
    ],
)
def test_bad_set_args_fields_are_decode_errors(index: int, value: Any) -> None:
    row = list(GOOD_ROW)
    row[index] = value
    with pytest.raises(ProposalDecodeError):
        decode_proposal(cbor2.dumps(["n1", 1, "args", row]), identity)


@pytest.mark.parametrize("body", [[], [GOOD_ROW, 1], [GOOD_ROW[:9]], ["x"], [{"a": 1}]])
def test_bad_set_args_shapes_are_decode_errors(body: list[Any]) -> None:
    with pytest.raises(ProposalDecodeError):
        decode_proposal(cbor2.dumps(["n1", 1, "args", *body]), identity)


def test_set_args_encode_refuses_what_decode_would() -> None:
    class Odd:
        pass

    bad = QueueArgs(dead_letter_exchange=Odd())  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        encode_proposal(Proposal("n1", 1, SetArgs(bad)), identity)
