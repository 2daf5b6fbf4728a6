"""Paging decided by the queue machine (cluster/queue/paging.py): its rules one by one, and a property test that a
paging machine, with a storage that answers every `PageInWanted` at once, hands out exactly what a machine without
paging does (same messages, order, flags and counts), whatever the commands and the memory pressure."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.queue import (
    Accepted,
    Attach,
    Deliver,
    Detach,
    Enqueue,
    EnqueueMany,
    Get,
    GetOk,
    MemoryPressure,
    MsgId,
    PagedDropped,
    PagedIn,
    PagedOut,
    PageInWanted,
    Purge,
    Purged,
    Queue,
    QueueArgs,
    QueuedMessage,
    RecoverPaged,
    Return,
    SetArgs,
    Settle,
    Spill,
    SpilledOut,
)

LIMIT = 4


def _message(n: int, ttl_ms: int | None = None, persistent: bool = True) -> QueuedMessage:
    return QueuedMessage(b"m%d" % n, 2, persistent, 0, ttl_ms)


def _of(effects: list[Any], kind: type) -> list[Any]:
    return [e for e in effects if type(e) is kind]


class Storage:
    """Plays the broker: keeps what the machine pages out and answers each request at once."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self.disk: dict[int, tuple[QueuedMessage, int]] = {}
        self.reads = 0

    def apply(self, command: Any) -> list[Any]:
        seen: list[Any] = []
        todo = [command]
        while todo:
            effects = self.queue.apply(todo.pop())
            seen += effects
            for effect in effects:
                if type(effect) is PagedOut and not effect.held:
                    self.disk[effect.msg_id] = (effect.message, 0)
                elif type(effect) is SpilledOut:
                    self.disk.update((i, (m, count)) for i, m, count in effect.messages)
                elif type(effect) is PageInWanted:
                    self.reads += 1
                    todo.append(PagedIn(tuple((i, *self.disk.pop(i)) for i in effect.msg_ids)))
        return seen


def test_an_enqueue_past_the_limit_joins_the_tail_and_every_later_one_too() -> None:
    queue = Queue("q", page_limit=LIMIT)
    for n in range(LIMIT):
        assert _of(queue.apply(Enqueue(_message(n), 0)), Accepted)
    assert [(e.msg_id, e.held) for e in queue.apply(Enqueue(_message(4), 0))] == [(5, False)]
    assert _of(queue.apply(Enqueue(_message(5, ttl_ms=1000), 0)), PagedOut)[0].held, "held: it has an expiry"
    assert queue.ready_count == LIMIT and queue.paged_count == 2 and queue.paged_held_count == 1


def test_a_message_with_an_expiry_never_starts_a_tail() -> None:
    queue = Queue("q", page_limit=LIMIT)
    for n in range(LIMIT + 2):
        assert _of(queue.apply(Enqueue(_message(n, ttl_ms=1000), 0)), Accepted)
    assert queue.paged_count == 0


@pytest.mark.parametrize("args", [QueueArgs(max_length=100), QueueArgs(max_length_bytes=10_000),
                                  QueueArgs(max_priority=2), QueueArgs(message_ttl_ms=60_000)],
                         ids=["max-length", "max-length-bytes", "max-priority", "message-ttl"])
def test_queues_whose_rules_count_what_the_machine_holds_never_page(args: QueueArgs) -> None:
    queue = Queue("q", args, page_limit=LIMIT)
    assert not queue.may_page
    for n in range(LIMIT * 2):
        assert not _of(queue.apply(Enqueue(_message(n), 0)), PagedOut)
    assert queue.ready_count == LIMIT * 2


def test_without_a_page_limit_nothing_pages() -> None:
    queue = Queue("q")
    effects = queue.apply(EnqueueMany("p", 0, tuple(_message(n) for n in range(LIMIT * 2)), tuple(range(LIMIT * 2))))
    assert len(_of(effects, Accepted)) == LIMIT * 2 and queue.paged_count == 0


def test_a_tail_outlives_a_policy_that_forbids_paging_and_paging_follows_the_arguments_after() -> None:
    queue = Queue("q", page_limit=LIMIT)
    storage = Storage(queue)
    for n in range(LIMIT + 1):
        storage.apply(Enqueue(_message(n), 0))
    storage.apply(SetArgs(QueueArgs(max_length=100)))
    assert _of(storage.apply(Enqueue(_message(9), 0)), PagedOut), "while a tail exists, every message joins it"
    storage.apply(Attach("c", 0, no_ack=True))
    assert queue.paged_count == 0 and not queue.may_page
    for n in range(LIMIT * 2):
        storage.apply(Enqueue(_message(n), 0))
    storage.apply(SetArgs(QueueArgs()))
    assert queue.may_page


def test_one_request_at_a_time_in_order_and_unflagged() -> None:
    queue = Queue("q", page_limit=LIMIT)
    for n in range(20):
        queue.apply(Enqueue(_message(n), 0))
    effects = queue.apply(Attach("c", 0, prefetch=3))
    assert [d.msg_id for d in _of(effects, Deliver)] == [1, 2, 3]
    assert [e.msg_ids for e in _of(effects, PageInWanted)] == [(5, 6, 7)], "under half: the room up to the limit"
    effects = queue.apply(Settle("c", [MsgId(1)]))
    assert [d.msg_id for d in _of(effects, Deliver)] == [4] and not _of(effects, PageInWanted), "one at most"
    effects = queue.apply(PagedIn(tuple((MsgId(i), _message(i - 1), 0) for i in (5, 6, 7))))
    assert not _of(effects, Deliver) and queue.ready_msg_ids() == [5, 6, 7] and queue.paged_count == 13
    effects = queue.apply(Settle("c", [MsgId(2)]))
    assert [(d.msg_id, d.redelivered) for d in _of(effects, Deliver)] == [(5, False)]


def test_an_unreadable_message_is_skipped() -> None:
    queue = Queue("q", page_limit=LIMIT)
    for n in range(LIMIT + 2):
        queue.apply(Enqueue(_message(n), 0))
    wanted = _of(queue.apply(Attach("c", 0, no_ack=True)), PageInWanted)[0]
    assert wanted.msg_ids == (5, 6)
    effects = queue.apply(PagedIn(((MsgId(6), _message(5), 0),)))
    assert [d.msg_id for d in _of(effects, Deliver)] == [6] and queue.paged_count == 0


def test_purge_drops_the_tail_and_names_what_is_on_disk() -> None:
    queue = Queue("q", page_limit=LIMIT)
    for n in range(LIMIT + 2):
        queue.apply(Enqueue(_message(n), 0))
    queue.apply(Enqueue(_message(6, ttl_ms=1000, persistent=False), 0))  # held, transient: nothing on disk
    queue.apply(Enqueue(_message(7, ttl_ms=1000), 0))  # held, persistent: its record is on disk
    effects = queue.apply(Purge())
    assert effects == [Purged(LIMIT + 4), PagedDropped((MsgId(5), MsgId(6), MsgId(8)))]
    assert queue.paged_count == 0 and _of(queue.apply(Enqueue(_message(9), 0)), Accepted)


def test_recovered_messages_page_in_flagged_and_their_ids_are_not_handed_out_again() -> None:
    queue = Queue("q", page_limit=LIMIT)
    assert [e.msg_ids for e in _of(queue.apply(RecoverPaged([3, 4, 9])), PageInWanted)] == [(3, 4, 9)]
    assert queue.paged_count == 3
    assert _of(queue.apply(Enqueue(_message(0), 0)), PagedOut)[0].msg_id == 10
    queue.apply(Attach("c", 0, no_ack=True))
    effects = queue.apply(PagedIn(tuple((MsgId(i), _message(i), 1) for i in (3, 4, 9))))
    assert [(d.msg_id, d.redelivered) for d in _of(effects, Deliver)] == [(3, True), (4, True), (9, True)]
    assert [e.msg_ids for e in _of(effects, PageInWanted)] == [(10,)]
    effects = queue.apply(PagedIn(((MsgId(10), _message(0), 0),)))
    assert [(d.msg_id, d.redelivered) for d in _of(effects, Deliver)] == [(10, False)] and queue.paged_count == 0


def test_memory_pressure_lowers_the_ceiling_and_spills_down_to_the_floor() -> None:
    queue = Queue("q", page_limit=LIMIT)
    storage = Storage(queue)
    for n in range(LIMIT):
        storage.apply(Enqueue(_message(n), 0))
    storage.apply(MemoryPressure(1))
    spilled = _of(storage.apply(Spill(100)), SpilledOut)
    assert [i for i, *_ in spilled[0].messages] == [2, 3, 4] and queue.ready_msg_ids() == [1]
    storage.apply(Attach("c", 0, prefetch=1))
    assert queue.ready_count <= 1, "page-in up to the floor"
    storage.apply(MemoryPressure(None))
    assert queue.ready_msg_ids() == [2, 3, 4] and queue.paged_count == 0


def test_a_machine_with_a_tail_is_not_snapshotted() -> None:
    queue = Queue("q", page_limit=1)
    queue.apply(Enqueue(_message(0), 0))
    queue.apply(Enqueue(_message(1), 0))
    with pytest.raises(ValueError, match="paged tail"):
        queue.snapshot()


# --- the property: paging changes nothing a client sees -------------------------------------------------------

_ops = st.lists(st.one_of(
    st.tuples(st.just("publish"), st.integers(1, 6)),
    st.tuples(st.just("batch"), st.integers(1, 6)),
    st.tuples(st.just("attach"), st.sampled_from(["a", "b"]), st.integers(0, 5)),
    st.tuples(st.just("detach"), st.sampled_from(["a", "b"])),
    st.tuples(st.just("settle"), st.sampled_from(["a", "b"]), st.integers(1, 4)),
    st.tuples(st.just("return"), st.sampled_from(["a", "b"]), st.integers(1, 4)),
    st.tuples(st.just("get"), st.booleans()),
    st.tuples(st.just("pressure"), st.sampled_from([None, 1, 2])),
    st.tuples(st.just("spill"), st.integers(1, 8)),
    st.tuples(st.just("purge")),
), max_size=60)


def _seen(effects: list[Any]) -> list[tuple[Any, ...]]:
    """What a client could tell apart: deliveries, gets (not the remaining count, the tail is not counted) and
    purge counts."""
    out: list[tuple[Any, ...]] = []
    for e in effects:
        if type(e) is Deliver:
            out.append(("deliver", e.consumer_id, e.msg_id, e.message.payload, e.redelivered, e.delivery_count))
        elif type(e) is GetOk:
            out.append(("get", e.msg_id, e.message.payload, e.redelivered, e.delivery_count))
        elif type(e) is Purged:
            out.append(("purged", e.count))
    return out


@settings(max_examples=60, deadline=None)
@given(_ops)
def test_a_paging_machine_hands_out_what_a_plain_one_does(ops: list[tuple[Any, ...]]) -> None:
    plain = Queue("q")
    paging = Storage(Queue("q", page_limit=LIMIT))
    unacked: dict[str, list[MsgId]] = {"a": [], "b": []}
    number = 0
    for op in ops:
        kind = op[0]
        if kind == "publish" or kind == "batch":
            messages = tuple(_message(number + n) for n in range(op[1]))
            number += op[1]
            commands: list[Any] = ([EnqueueMany("p", 0, messages, tuple(range(number - op[1], number)))]
                                   if kind == "batch" else [Enqueue(m, 0) for m in messages])
        elif kind == "attach":
            commands = [Attach(op[1], 0, prefetch=op[2])]
        elif kind == "detach":
            commands = [Detach(op[1], 0)]
            unacked[op[1]].clear()
        elif kind in ("settle", "return"):
            taken, unacked[op[1]][:op[2]] = unacked[op[1]][:op[2]], []
            commands = [Settle(op[1], taken) if kind == "settle" else Return(op[1], taken, 0)]
        elif kind == "get":
            commands = [Get("g", True, 0) if op[1] else Get("a", False, 0)]
        elif kind == "pressure":
            commands = [MemoryPressure(op[1])]
        elif kind == "spill":
            commands = [Spill(op[1])]
        else:
            commands = [Purge()]
        for command in commands:
            expected = _seen(plain.apply(command))
            got = _seen(paging.apply(command))
            assert got == expected, (command, ops)
            for item in expected:
                if item[0] == "deliver":
                    unacked[item[1]].append(item[2])
                elif item[0] == "get" and command.consumer_id == "a":
                    unacked["a"].append(item[1])
        machine = paging.queue
        assert machine.ready_count + machine.paged_count == plain.ready_count
