"""`Queue.withdraw_newest_ready` (cluster/queue): the newest ready messages leave the machine, highest id first."""

from __future__ import annotations

from cluster.queue import Enqueue, MsgId, Queue, QueueArgs, QueuedMessage, Recover


def _message(n: int, ttl_ms: int | None = None) -> QueuedMessage:
    return QueuedMessage(b"m%d" % n, 2, False, 0, ttl_ms)


def _queue(count: int) -> Queue:
    queue = Queue("q", QueueArgs())
    for n in range(count):
        queue.apply(Enqueue(_message(n), 0))
    return queue


def test_withdraws_the_newest_fresh_and_returned_messages_in_descending_order() -> None:
    queue = _queue(6)  # ids 1..6 fresh
    for msg_id in (7, 9):  # paged in: recovered into the returned heap, one flagged
        queue.apply(Recover(MsgId(msg_id), _message(msg_id), 2, None, redelivered=msg_id == 9))
    taken = queue.withdraw_newest_ready(3)
    assert [(i, count, flag) for i, _m, count, flag in taken] == [(9, 2, True), (7, 2, False), (6, 0, False)]
    assert queue.ready_count == 5 and queue.ready_msg_ids() == [1, 2, 3, 4, 5]
    assert [i for i, *_ in queue.withdraw_newest_ready(100)] == [5, 4, 3, 2, 1]
    assert queue.ready_count == 0 and queue.ready_bytes == 0


def test_stops_at_a_message_with_a_per_message_ttl() -> None:
    queue = _queue(3)
    queue.apply(Enqueue(_message(3, ttl_ms=60_000), 0))
    queue.apply(Enqueue(_message(4), 0))
    assert [i for i, *_ in queue.withdraw_newest_ready(10)] == [5]
    assert queue.ready_msg_ids() == [1, 2, 3, 4]


def test_a_queue_with_priorities_withdraws_nothing() -> None:
    queue = Queue("q", QueueArgs(max_priority=3))
    queue.apply(Enqueue(_message(0), 0))
    assert queue.withdraw_newest_ready(10) == [] and queue.ready_count == 1
