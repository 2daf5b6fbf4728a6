"""Bounded internals: lazy-removal garbage and the expiry heap stay proportional to the live messages."""

from __future__ import annotations

import pytest

from cluster.queue import Attach, Deliver, Duplicate, Enqueue, Expire, MsgId, Queue, QueueArgs, Settle
from cluster.queue.consumers import Consumer
from cluster.queue.ready import GARBAGE_REBUILD_MIN, ID_COLUMN_COMPACT_MIN
from tests.queue.helpers import msg


def test_expiring_from_the_middle_compacts_the_level() -> None:
    queue = Queue("q")
    total = 4 * GARBAGE_REBUILD_MIN
    for index in range(total):
        queue.apply(Enqueue(msg(f"m{index}", ttl_ms=10 if index % 4 else None), 0))
    queue.apply(Expire(10))
    assert queue.ready_count == GARBAGE_REBUILD_MIN
    assert queue.ready_msg_ids() == list(range(1, total + 1, 4))
    level = queue._ready._levels[0]
    assert len(level.fresh) + len(level.returned) <= 2 * queue.ready_count + GARBAGE_REBUILD_MIN + 1
    effects = queue.apply(Attach("c", 10))
    assert [e.msg_id for e in effects if isinstance(e, Deliver)] == list(range(1, total + 1, 4))


def test_expiry_heap_does_not_keep_settled_messages() -> None:
    queue = Queue("q", QueueArgs(message_ttl_ms=1_000_000))
    queue.apply(Attach("c", 0))
    for index in range(5 * GARBAGE_REBUILD_MIN):
        (_, deliver) = queue.apply(Enqueue(msg(), index))
        assert isinstance(deliver, Deliver)
        queue.apply(Settle("c", [deliver.msg_id]))
        # Checked at push time, when the ready count was one higher.
        assert len(queue._ready.expiry_heap) <= 2 * (queue.ready_count + 1) + GARBAGE_REBUILD_MIN + 1
    assert queue.next_expiry_ms() is None


def test_many_publishers_evict_in_constant_time_order() -> None:
    queue = Queue("q", publishers_max=100)
    for index in range(1000):
        queue.apply(Enqueue(msg(), 0, f"p{index}", 1))
    publishers = queue.snapshot()["publishers"]
    assert len(publishers) == 100
    assert publishers[0] == ["p900", 1]
    assert queue.apply(Enqueue(msg(), 0, "p999", 1)) == [Duplicate("p999", 1)]
    assert queue.ready_msg_ids()[-1] == MsgId(1000)


def test_compact_backlog_keeps_ids_through_column_compaction() -> None:
    queue = Queue("q")
    total = 3 * ID_COLUMN_COMPACT_MIN
    for index in range(total):
        queue.apply(Enqueue(msg(f"m{index}"), 0))
    queue.apply(Attach("c", 0, prefetch=7))
    seen: list[int] = []
    while queue.unacked_count:
        held = queue.unacked_msg_ids("c")
        seen.append(held[0])
        queue.apply(Settle("c", held[:1]))
        if len(seen) % 5 == 0:
            queue.apply(Enqueue(msg("late"), 0))
    assert seen[:total] == list(range(1, total + 1))
    assert seen == sorted(seen)
    assert queue.ready_count == 0
    assert len(queue._ready._levels[0].fresh_ids) == 0


def test_choosing_a_consumer_is_not_a_scan_of_all_consumers(monkeypatch: pytest.MonkeyPatch) -> None:
    consumers = 2000
    queue = Queue("q")
    for index in range(consumers):
        queue.apply(Attach(index, 0, prefetch=1))
    for _ in range(consumers):
        queue.apply(Enqueue(msg(), 0))
    assert queue.unacked_count == consumers  # everyone is full now
    calls = 0
    original = Consumer.has_capacity

    def counting(self: Consumer) -> bool:
        nonlocal calls
        calls += 1
        return original(self)

    monkeypatch.setattr(Consumer, "has_capacity", counting)
    for _ in range(500):
        queue.apply(Enqueue(msg(), 0))  # nobody has room: must not look at 2000 consumers each time
    for index in range(0, consumers, 4):
        queue.apply(Settle(index, [MsgId(index + 1)]))  # a quarter get room back, one by one
    assert calls <= 10 * (500 + consumers // 4)
    assert queue.unacked_count == consumers
