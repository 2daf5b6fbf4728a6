"""`SharedBarrier`: concurrent readers share metadata read barriers, each still seeing every write done before it asked.

What it is for: a read that must see every definition committed before it arrived (the management API's reads in
cluster mode, docs/management.md "Reads see every committed change") waits for a read barrier
(`MetadataStore.sync`: a `Barrier` command through the metadata log, applied here). One barrier per read would put
one log entry (and one fsync on each node) per request into the group; this shares them without weakening the
guarantee.

How it works: at most one barrier round runs at a time. A reader that arrives while none runs starts one at once;
a reader that arrives while one runs cannot use it (its barrier may sit in the log before the write the reader
must see) and joins the *next* round, which starts as soon as the running one ends; everyone who arrived meanwhile
shares that one. So under any load at most two rounds are alive (one running, one gathering), and a reader waits
for at most two rounds. Rounds run in a trio system task of their own, so a reader that gives up (its own timeout,
its client gone) never cuts a round short for the others. `wait()` is not bounded itself: the caller bounds it
(`trio.move_on_after`), and the `sync` function bounds each round (a failed or timed-out round answers False).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

log = logging.getLogger(__name__)


class _Round:
    __slots__ = ("done", "ok")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.ok = False


class SharedBarrier:
    """`await wait()` returns once a barrier started after the call has completed: its result (True: caught up).
    Create and use it inside one trio run."""

    def __init__(self, sync: Callable[[], Awaitable[bool]]) -> None:
        self._sync = sync
        self._running: _Round | None = None
        self._gathering: _Round | None = None
        self.rounds = 0  # rounds started (observability: reads per round = requests / rounds)

    async def wait(self) -> bool:
        mine = self._gathering
        if mine is None:
            mine = self._gathering = _Round()
        if self._running is None:
            self._start_gathered()
        await mine.done.wait()
        return mine.ok

    def _start_gathered(self) -> None:
        round_, self._gathering = self._gathering, None
        if round_ is not None:
            self._running = round_
            self.rounds += 1
            trio.lowlevel.spawn_system_task(self._run, round_, name="metadata read barrier")

    async def _run(self, round_: _Round) -> None:
        try:
            round_.ok = await self._sync()
        except Exception:  # (a system task must not raise: it would end the whole trio run)
            log.exception("metadata read barrier failed")
        finally:
            round_.done.set()
            self._running = None
        self._start_gathered()  # (not when cancelled: the run is ending)
