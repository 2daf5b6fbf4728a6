"""`Spill` (cluster/queue/paging.py): the newest ready messages leave the machine, highest id first."""

from __future__ import annotations

from cluster.queue import (
    Attach,
    Deliver,
    Enqueue,
    MemoryPressure,
    MsgId,
    PagedIn,
    PageInWanted,
    Queue,
    QueueArgs,
    QueuedMessage,
    Recover,
    Spill,
    SpilledOut,
)


def _message(n: int, ttl_ms: int | None = None) -> QueuedMessage:
    return QueuedMessage(b"m%d" % n, 2, False, 0, ttl_ms)


def _queue(count: int, args: QueueArgs | None = None) -> Queue:
    queue = Queue("q", args or QueueArgs(), page_limit=100)
    for n in range(count):
        queue.apply(Enqueue(_message(n), 0))
    queue.apply(MemoryPressure(0))
    return queue


def _spill(queue: Queue, count_max: int) -> list[tuple[MsgId, QueuedMessage, int]]:
    """What `Spill` withdrew, highest msg id first."""
    spilled = [e for e in queue.apply(Spill(count_max)) if isinstance(e, SpilledOut)]
    return [entry for effect in spilled for entry in reversed(effect.messages)]


def _wanted(effects: list[object]) -> tuple[MsgId, ...]:
    return next((e.msg_ids for e in effects if isinstance(e, PageInWanted)), ())


def test_withdraws_the_newest_fresh_and_returned_messages_in_descending_order() -> None:
    queue = _queue(6)  # ids 1..6 fresh
    for msg_id in (7, 9):  # paged in: recovered into the returned heap, one flagged
        queue.apply(Recover(MsgId(msg_id), _message(msg_id), 2, None, redelivered=msg_id == 9))
    taken = _spill(queue, 3)
    assert [(i, count) for i, _m, count in taken] == [(9, 2), (7, 2), (6, 0)]
    assert queue.ready_count == 5 and queue.ready_msg_ids() == [1, 2, 3, 4, 5]
    effects = queue.apply(Spill(100))
    spilled = [entry for e in effects if isinstance(e, SpilledOut) for entry in reversed(e.messages)]
    assert [i for i, *_ in spilled] == [5, 4, 3, 2, 1]
    assert queue.ready_count == 0 and queue.ready_bytes == 0
    assert _wanted(effects) == (1,), "nothing left in memory: the oldest spilled one is asked for (ceiling 1)"

    # they come back oldest first, with their delivery counts and flags
    queue.apply(Attach("c", 0))
    assert not _wanted(queue.apply(MemoryPressure(None))), "one request outstanding at most"
    counts = {7: 2, 9: 2}
    delivered: list[tuple[int, bool, int]] = []
    wanted = (MsgId(1),)
    while wanted:
        effects = queue.apply(PagedIn(tuple((i, _message(i), counts.get(i, 0)) for i in wanted)))
        delivered += [(d.msg_id, d.redelivered, d.delivery_count) for d in effects if isinstance(d, Deliver)]
        wanted = _wanted(effects)
    assert delivered == [(1, False, 0), (2, False, 0), (3, False, 0), (4, False, 0), (5, False, 0), (6, False, 0),
                         (7, False, 2), (9, True, 2)]


def test_stops_at_a_message_with_a_per_message_ttl() -> None:
    queue = _queue(3)
    queue.apply(Enqueue(_message(3, ttl_ms=60_000), 0))
    queue.apply(Enqueue(_message(4), 0))
    assert [i for i, *_ in _spill(queue, 10)] == [5]
    assert queue.ready_msg_ids() == [1, 2, 3, 4]


def test_a_queue_with_priorities_withdraws_nothing() -> None:
    queue = _queue(1, QueueArgs(max_priority=3))
    assert _spill(queue, 10) == [] and queue.ready_count == 1
