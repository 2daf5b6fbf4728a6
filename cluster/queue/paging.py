"""Paging (a mixin of cluster/queue/machine.py): which messages of a long queue wait outside the machine, and
when they come back. The machine decides; the broker only writes, reads and forgets (node/broker/paging.py).

What it is for: a long queue must not hold its whole backlog in memory. A machine made with `page_limit` N > 0 (a
single node's queues; never a replicated one) keeps at most N ready messages; past that, messages wait in its
*tail*, in order, and the machine holds only their ids (`PageTail`: runs of consecutive ids, a few bytes per run).

The rules:
- May page: `page_limit` > 0 and none of x-max-length, x-max-length-bytes, x-max-priority or x-message-ttl (their
  rules count what the machine holds). An `Enqueue` that finds N ready messages, or any `Enqueue` while a tail
  exists (so the order holds, whatever the arguments became since), joins the tail: `PagedOut(..., held=False)`
  and the broker writes the message to disk and drops it. A message with an expiry never starts a tail; one that
  meets a tail is *held*: the machine keeps it in the tail in memory, in its place (`PagedOut(..., held=True)`),
  and it expires once back among the ready ones.
- Page-in: after every command, a machine with a tail, no request outstanding and fewer than half its ceiling
  ready asks for the next batch (`PageInWanted(msg_ids)`, at most `PAGE_IN_BATCH_MAX` and the room up to the
  ceiling, the ids it must have read: held ones come back by themselves). The ceiling is N, or the floor under
  memory pressure. The broker answers with `PagedIn`; the messages take their places by msg id, delivered
  unflagged, or flagged when they came from recovery (`RecoverPaged`) or were flagged when spilled. A tail that
  runs empty is gone.
- Memory pressure (`MemoryPressure(floor)`, then `Spill(max_messages)` as often as the broker likes): a machine
  that may page moves its newest ready messages above the floor (never unacked ones; it stops at one with an
  expiry) to the FRONT of its tail, `SpilledOut`, keeping their delivery count and redelivered flag. They are
  older than every other tail message, so they page in first (the oldest of them first). Not while a page-in is
  outstanding: its ids sit between the machine's and the front's.
- `Purge` drops the tail too (`PagedDropped` names the messages with a record on disk); `Purge(transient_only)`
  leaves it. A machine with a tail is not snapshotted (a single node's machines never are).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, Final, cast

from cluster.queue.ready import READY, REDELIVERED, Entry, ReadyStore
from cluster.queue.types import (
    MemoryPressure,
    MsgId,
    PagedDropped,
    PagedIn,
    PagedOut,
    PageInWanted,
    QueueArgs,
    QueuedMessage,
    QueueEffect,
    RecoverPaged,
    Spill,
    SpilledOut,
)

PAGE_IN_BATCH_MAX: Final = 1024  # messages one PageInWanted asks for (one read in the broker's worker thread)
RUNS_COMPACT_MIN: Final = 4096  # used-up runs are dropped from the columns once this many and half of them
NEVER: Final = 1 << 62  # `_page_out_at` of a machine that may not page

_Effects = list[QueueEffect]


class PageTail:
    """The messages of a paging machine that are not among its ready ones, in delivery order: the front (spilled
    under memory pressure), then runs of consecutive ids (recovered ones first), then the asked-for batch."""

    __slots__ = ("ends", "front", "held", "next_id", "pending", "pending_redelivered", "recovered_through", "run",
                 "size", "starts")

    def __init__(self) -> None:
        self.front: list[tuple[MsgId, bool]] = []  # (msg id, redelivered), newest first: pages in from the end
        self.starts = array("q")  # runs [start, end) of ids, ascending
        self.ends = array("q")
        self.run = 0  # the first run not used up
        self.next_id = 0  # its next id
        self.size = 0  # ids in the runs not yet asked for
        self.recovered_through = 0  # ids up to this one came from recovery: they page in flagged redelivered
        self.held: dict[MsgId, Entry] = {}  # tail messages kept in memory (they have an expiry)
        self.pending: tuple[MsgId, ...] = ()  # the outstanding request's ids (held ones included), in order
        self.pending_redelivered: frozenset[MsgId] = frozenset()

    @property
    def count(self) -> int:
        return len(self.front) + self.size + len(self.pending)

    def append(self, msg_id: int) -> None:
        ends = self.ends
        if self.run < len(ends) and ends[-1] == msg_id:
            ends[-1] = msg_id + 1
        else:
            if self.run == len(ends):  # every run used up: start the columns afresh
                del self.starts[:], ends[:]
                self.run, self.next_id = 0, msg_id
            self.starts.append(msg_id)
            ends.append(msg_id + 1)
        self.size += 1

    def take(self, count: int) -> tuple[tuple[MsgId, ...], frozenset[MsgId]]:
        """The next up to `count` ids (the front first) and those of them to deliver flagged redelivered."""
        front = self.front
        if front:
            taken: list[MsgId] = []
            flagged: list[MsgId] = []
            while front and len(taken) < count:
                msg_id, redelivered = front.pop()
                taken.append(msg_id)
                if redelivered:
                    flagged.append(msg_id)
            return tuple(taken), frozenset(flagged)
        ids = self._take_runs(count)
        through = self.recovered_through
        recovered = frozenset(i for i in ids if i <= through) if ids and ids[0] <= through else frozenset()
        return cast(tuple[MsgId, ...], tuple(ids)), cast(frozenset[MsgId], recovered)

    def _take_runs(self, count: int) -> list[int]:
        ids: list[int] = []
        starts, ends = self.starts, self.ends
        run, next_id = self.run, self.next_id
        while len(ids) < count and run < len(ends):
            end = min(ends[run], next_id + count - len(ids))
            ids.extend(range(next_id, end))
            next_id = end
            if next_id == ends[run]:
                run += 1
                if run < len(ends):
                    next_id = starts[run]
        self.size -= len(ids)
        if run >= RUNS_COMPACT_MIN and run * 2 >= len(ends):
            del starts[:run], ends[:run]
            run = 0
        self.run, self.next_id = run, next_id
        return ids

    def ids(self) -> list[MsgId]:
        """Every id of the tail (O(n); for a purge)."""
        ids: list[int] = [*self.pending, *(msg_id for msg_id, _ in self.front)]
        starts, ends = self.starts, self.ends
        for run in range(self.run, len(ends)):
            ids.extend(range(self.next_id if run == self.run else starts[run], ends[run]))
        return cast(list[MsgId], ids)


class QueuePaging:
    """Paging of `Queue` (see the module docstring); `Queue` holds the attributes."""

    if not TYPE_CHECKING:  # (slots at run time; mypy is told the attributes below, which `Queue` slots)
        __slots__ = ()

    args: QueueArgs
    _ready: ReadyStore
    _next_msg_id: int
    _page_limit: int
    _page_floor: int | None
    _page_out_at: int  # an Enqueue finding this many ready messages may join the tail (0: a tail exists)
    _tail: PageTail | None

    # (the machine's helpers these commands use)
    def _expire_due(self, out: _Effects) -> None:
        raise NotImplementedError

    def _deliver(self, out: _Effects) -> None:
        raise NotImplementedError

    def _init_paging(self, page_limit: int) -> None:
        if page_limit < 0:
            raise ValueError("page_limit must be >= 0")
        self._page_limit = page_limit  # 0: never pages
        self._page_floor = None  # the page-in ceiling under memory pressure
        self._tail = None
        self._set_page_out_at()

    def _paging_handlers(self) -> dict[type, Callable[[Any, _Effects], None]]:
        return {PagedIn: self._paged_in, RecoverPaged: self._recover_paged, MemoryPressure: self._memory_pressure,
                Spill: self._spill}

    # --- queries --------------------------------------------------------------------------------------------

    @property
    def page_limit(self) -> int:
        """Ready messages the machine holds before new ones join its tail (0: it never pages)."""
        return self._page_limit

    @property
    def paged_count(self) -> int:
        """Messages in the tail (ready, but not in the machine; asked-for and held ones included)."""
        tail = self._tail
        return tail.count if tail is not None else 0

    @property
    def paged_held_count(self) -> int:
        """Tail messages kept in memory (they have an expiry)."""
        tail = self._tail
        return len(tail.held) if tail is not None else 0

    @property
    def may_page(self) -> bool:
        """Whether a tail may start (a page limit, and no argument whose rules count what the machine holds)."""
        args = self.args
        return bool(self._page_limit and args.max_length is None and args.max_length_bytes is None
                    and args.max_priority is None and args.message_ttl_ms is None)

    # --- the rules (called by the machine) ------------------------------------------------------------------

    def _set_page_out_at(self) -> None:
        """After the tail or the arguments changed."""
        self._page_out_at = 0 if self._tail is not None else self._page_limit if self.may_page else NEVER

    def _page_out(self, msg_id: MsgId, message: QueuedMessage, expiry_ms: int | None, publisher_id: Hashable | None,
                  sequence: int | None, out: _Effects) -> None:
        """An accepted message joins the tail (the caller checked the rule)."""
        tail = self._tail
        if tail is None:
            tail = self._tail = PageTail()
            self._page_out_at = 0
        held = expiry_ms is not None
        if held:
            tail.held[msg_id] = Entry(msg_id, message, 0, expiry_ms, READY)
        tail.append(msg_id)
        out.append(PagedOut(publisher_id, sequence, msg_id, message, held))

    def _page_in(self, out: _Effects) -> None:
        """After every command of a machine with a tail: ask for the next batch if it ran low (see the header)."""
        tail = self._tail
        assert tail is not None
        while not tail.pending:
            if not tail.count:
                self._tail = None
                self._set_page_out_at()
                return
            floor = self._page_floor
            ceiling = max(1, self._page_limit if floor is None else floor)
            ready = self._ready.count
            if ready >= max(ceiling // 2, 1):
                return
            ids, redelivered = tail.take(min(PAGE_IN_BATCH_MAX, ceiling - ready))
            held = tail.held
            on_disk = tuple(msg_id for msg_id in ids if msg_id not in held) if held else ids
            if on_disk:
                tail.pending, tail.pending_redelivered = ids, redelivered
                out.append(PageInWanted(on_disk))
                return
            self._bring_in(tail, ids, redelivered, {}, out)  # (all held: nothing to read)

    def _bring_in(self, tail: PageTail, ids: Sequence[MsgId], redelivered: frozenset[MsgId],
                  read: dict[MsgId, tuple[QueuedMessage, int]], out: _Effects) -> None:
        """Tail messages take their places among the ready ones, by msg id, one by one as `Recover` does."""
        held = tail.held
        ready = self._ready
        for msg_id in ids:
            entry = held.pop(msg_id, None) if held else None
            if entry is None:
                found = read.get(msg_id)
                if found is None:
                    continue  # the broker could not read it: it cannot come back
                entry = Entry(msg_id, found[0], found[1], None, READY | REDELIVERED if msg_id in redelivered else READY)
            ready.push_returned(entry)
            self._expire_due(out)
            self._deliver(out)

    def _purge_tail(self, out: _Effects) -> int:
        """`Purge`: the tail is dropped; returns how many messages it had."""
        tail = self._tail
        if tail is None:
            return 0
        self._tail = None
        self._set_page_out_at()
        held = tail.held
        on_disk = [msg_id for msg_id in tail.ids() if msg_id not in held or held[msg_id].message.persistent]
        if on_disk:
            out.append(PagedDropped(tuple(on_disk)))
        return tail.count

    # --- commands -------------------------------------------------------------------------------------------

    def _paged_in(self, command: PagedIn, out: _Effects) -> None:
        tail = self._tail
        if tail is None or not tail.pending:
            return
        ids, redelivered = tail.pending, tail.pending_redelivered
        tail.pending, tail.pending_redelivered = (), frozenset()
        read = {msg_id: (message, delivery_count) for msg_id, message, delivery_count in command.messages}
        self._bring_in(tail, ids, redelivered, read, out)

    def _recover_paged(self, command: RecoverPaged, out: _Effects) -> None:
        msg_ids = command.msg_ids
        if not len(msg_ids):
            return
        tail = self._tail
        if tail is None:
            tail = self._tail = PageTail()
            self._page_out_at = 0
        append = tail.append
        for msg_id in msg_ids:
            append(msg_id)
        last = msg_ids[-1]
        tail.recovered_through = max(tail.recovered_through, last)
        if last >= self._next_msg_id:
            self._next_msg_id = last + 1

    def _memory_pressure(self, command: MemoryPressure, out: _Effects) -> None:
        self._page_floor = command.floor

    def _spill(self, command: Spill, out: _Effects) -> None:
        floor = self._page_floor
        tail = self._tail
        if floor is None or not self.may_page or (tail is not None and tail.pending):
            return
        count = min(command.max_messages, self._ready.count - floor)
        taken = self._ready.withdraw_newest(count) if count > 0 else []
        if not taken:
            return
        if tail is None:
            tail = self._tail = PageTail()
            self._page_out_at = 0
        tail.front.extend((entry.msg_id, entry.redelivered) for entry in taken)  # newest first: older than the last
        out.append(SpilledOut(tuple((entry.msg_id, entry.message, entry.delivery_count) for entry in reversed(taken))))
