"""Core behaviour of the queue machine: delivery, prefetch, credit, settle, return, get, purge, detach."""

from __future__ import annotations

import dataclasses

import pytest

from cluster.queue import (
    Accepted,
    AddCredit,
    Attach,
    Deliver,
    Detach,
    Enqueue,
    Get,
    GetEmpty,
    GetOk,
    MsgId,
    Purge,
    Purged,
    Queue,
    QueueArgs,
    Return,
    Settle,
)
from tests.queue.helpers import bodies, delivered, msg


def fill(queue: Queue, count: int, now_ms: int = 0) -> list[MsgId]:
    ids = []
    for i in range(count):
        (accepted, *_) = queue.apply(Enqueue(msg(f"m{i}"), now_ms))
        assert isinstance(accepted, Accepted)
        ids.append(accepted.msg_id)
    return ids


def test_enqueue_without_consumers_stays_ready() -> None:
    queue = Queue("q")
    ids = fill(queue, 3)
    assert ids == [1, 2, 3]
    assert queue.ready_count == 3
    assert queue.ready_bytes == 30
    assert queue.ready_msg_ids() == [1, 2, 3]


def test_attach_delivers_backlog_in_fifo_order() -> None:
    queue = Queue("q")
    fill(queue, 3)
    effects = queue.apply(Attach("c", 0))
    assert bodies(effects) == [b"m0", b"m1", b"m2"]
    assert queue.ready_count == 0
    assert queue.unacked_count == 3
    assert queue.consumer_count == 1


def test_round_robin_between_equal_consumers() -> None:
    queue = Queue("q")
    queue.apply(Attach("a", 0))
    queue.apply(Attach("b", 0))
    out = []
    for i in range(4):
        out += delivered(queue.apply(Enqueue(msg(f"m{i}"), 0)))
    assert out == [("a", 1), ("b", 2), ("a", 3), ("b", 4)]


def test_prefetch_caps_unacked_and_settle_frees_room() -> None:
    queue = Queue("q")
    fill(queue, 5)
    assert delivered(queue.apply(Attach("c", 0, prefetch=2))) == [("c", 1), ("c", 2)]
    assert queue.apply(Settle("c", [MsgId(1)])) and queue.unacked_count == 2
    assert queue.unacked_msg_ids("c") == [2, 3]
    assert delivered(queue.apply(Settle("c", [MsgId(2), MsgId(3)]))) == [("c", 4), ("c", 5)]


def test_prefetch_full_consumer_is_skipped_for_the_other() -> None:
    queue = Queue("q")
    queue.apply(Attach("a", 0, prefetch=1))
    queue.apply(Attach("b", 0))
    out = []
    for i in range(4):
        out += delivered(queue.apply(Enqueue(msg(f"m{i}"), 0)))
    assert out == [("a", 1), ("b", 2), ("b", 3), ("b", 4)]


def test_credit_limits_deliveries_until_granted() -> None:
    queue = Queue("q")
    fill(queue, 4)
    assert delivered(queue.apply(Attach("c", 0, credit=1))) == [("c", 1)]
    assert delivered(queue.apply(Settle("c", [MsgId(1)]))) == []
    assert delivered(queue.apply(AddCredit("c", 2))) == [("c", 2), ("c", 3)]
    assert queue.ready_count == 1


def test_add_credit_ignored_for_unlimited_or_unknown() -> None:
    queue = Queue("q")
    queue.apply(Attach("c", 0))
    assert queue.apply(AddCredit("c", 5)) == []
    assert queue.apply(AddCredit("nobody", 5)) == []


def test_no_ack_consumer_settles_on_delivery() -> None:
    queue = Queue("q")
    fill(queue, 3)
    effects = queue.apply(Attach("c", 0, prefetch=1, no_ack=True))
    assert len(delivered(effects)) == 3
    assert queue.unacked_count == 0


def test_returned_message_goes_back_ahead_of_newer_and_is_redelivered() -> None:
    queue = Queue("q")
    fill(queue, 3)
    queue.apply(Attach("c", 0, prefetch=1))
    effects = queue.apply(Return("c", [MsgId(1)], 0))
    (deliver,) = [e for e in effects if isinstance(e, Deliver)]
    assert deliver.msg_id == 1
    assert deliver.redelivered is True
    assert deliver.delivery_count == 1


def test_return_to_head_while_newer_are_ready() -> None:
    queue = Queue("q")
    fill(queue, 4)
    queue.apply(Attach("c", 0, prefetch=2))
    queue.apply(Detach("c", 0))
    assert queue.ready_msg_ids() == [1, 2, 3, 4]
    assert queue.unacked_count == 0
    assert queue.consumer_count == 0


def test_detach_requeues_and_other_consumer_gets_redelivered() -> None:
    queue = Queue("q")
    fill(queue, 2)
    queue.apply(Attach("a", 0))
    queue.apply(Attach("b", 0))
    effects = queue.apply(Detach("a", 0))
    deliveries = [e for e in effects if isinstance(e, Deliver)]
    assert [(d.consumer_id, d.msg_id, d.redelivered) for d in deliveries] == [("b", 1, True), ("b", 2, True)]


def test_get_takes_head_and_tracks_unacked() -> None:
    queue = Queue("q")
    fill(queue, 2)
    (ok,) = queue.apply(Get("ch1", no_ack=False, now_ms=0))
    assert isinstance(ok, GetOk)
    assert (ok.msg_id, ok.remaining, ok.redelivered) == (1, 1, False)
    assert queue.unacked_count == 1
    assert queue.consumer_count == 0
    queue.apply(Return("ch1", [MsgId(1)], 0))
    (again,) = queue.apply(Get("ch1", no_ack=True, now_ms=0))
    assert isinstance(again, GetOk)
    assert (again.msg_id, again.redelivered, again.delivery_count) == (1, True, 1)
    queue.apply(Get("ch1", no_ack=True, now_ms=0))
    assert queue.apply(Get("ch1", no_ack=True, now_ms=0)) == [GetEmpty("ch1")]
    assert queue.unacked_count == 0


def test_settle_of_get_holder_forgets_it() -> None:
    queue = Queue("q")
    fill(queue, 1)
    queue.apply(Get("ch", no_ack=False, now_ms=0))
    queue.apply(Settle("ch", [MsgId(1)]))
    assert queue.unacked_msg_ids("ch") == []
    assert queue.snapshot()["consumers"] == []


def test_purge_removes_ready_only() -> None:
    queue = Queue("q")
    fill(queue, 3)
    queue.apply(Get("g", no_ack=False, now_ms=0))
    assert queue.apply(Purge()) == [Purged(2)]
    assert queue.ready_count == 0
    assert queue.ready_bytes == 0
    assert queue.unacked_count == 1


def test_purge_transient_only_keeps_persistent_messages_in_order() -> None:
    queue = Queue("q")
    for i in range(6):
        queue.apply(Enqueue(dataclasses.replace(msg(f"m{i}"), persistent=i % 2 == 0), 0))
    queue.apply(Get("g", no_ack=False, now_ms=0))  # m0 is unacked: it stays
    assert queue.apply(Purge(transient_only=True)) == []
    assert (queue.ready_count, queue.unacked_count) == (2, 1)
    got: list[bytes] = []
    for _ in range(3):
        got += [e.message.payload for e in queue.apply(Get("h", no_ack=True, now_ms=1)) if isinstance(e, GetOk)]
    assert got == [b"m2", b"m4"]


def test_settle_unknown_ids_is_idempotent() -> None:
    queue = Queue("q")
    fill(queue, 1)
    queue.apply(Attach("c", 0))
    queue.apply(Settle("c", [MsgId(1)]))
    assert queue.apply(Settle("c", [MsgId(1), MsgId(99)])) == []
    assert queue.apply(Settle("ghost", [MsgId(1)])) == []
    assert queue.unacked_count == 0


def test_reattach_updates_limits_and_keeps_unacked() -> None:
    queue = Queue("q")
    fill(queue, 3)
    queue.apply(Attach("c", 0, prefetch=1))
    assert delivered(queue.apply(Attach("c", 0, prefetch=3))) == [("c", 2), ("c", 3)]
    assert queue.unacked_msg_ids("c") == [1, 2, 3]
    assert queue.consumer_count == 1


def test_unknown_command_raises() -> None:
    with pytest.raises(TypeError):
        Queue("q").apply("enqueue")  # type: ignore[arg-type]


def test_args_are_validated() -> None:
    with pytest.raises(ValueError):
        QueueArgs(overflow="drop-tail")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        QueueArgs(max_priority=256)
    with pytest.raises(ValueError):
        QueueArgs(max_length=-1)
