"""LeaseOwnership: which shovels and federation links this cluster node may run, by leases committed in the
metadata group (trio).

What it is for: the shovel and federation managers ask `owner(vhost, name)` (one callable per component,
`owner_for`) every reconcile and run what is answered with this node's name. This object answers this node only
while it holds the key's lease (cluster/metadata/leases.py) at a generation this process claimed, its node lease
is valid by its own clock, and the rendezvous choice (`preferred`, the same on every node that sees the same nodes
up) is this node. The rule and its timing are in docs/shovel.md, "Where a shovel runs".

How it works: `owner()` only reads the replica and remembers that the key is wanted; the decisions are taken by
`run()`'s loop, one metadata command at a time: claim a wanted key this node is preferred for when the lease rule
allows it (free, or its holder's node lease expired `margin_ms` ago by this node's wall clock); release a key this
node holds and should not run (not wanted any more, or another node is preferred) once its copy has stopped (the
component's `busy` check says its task finished, connections closed; without one, `stop_guard_ms` after it was
last answered "run"), and at once a key an earlier process of this node held. A second task renews this node's lease every `renew_every_ms` while it holds any. A claim or renewal
counts from the monotonic time read before it was sent: the node runs its keys until that + `lease_ms` -
`stop_guard_ms`, so a node cut off from the metadata majority stops them before anyone may take them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio

from cluster.metadata import leases as ls

log = logging.getLogger("raftmq.ownership")
LOOP_S = 0.25


@dataclass(frozen=True, slots=True)
class LeaseTiming:
    lease_ms: int = 10_000  # a claim or renewal keeps the node's leases for this long (from its sending)
    renew_every_ms: int = 2000
    stop_guard_ms: int = 5000  # the holder stops this long before its lease ends (a reconcile poll + a runner's
    # close); without a `busy` check, a key no longer run here is released this long after it was last run
    margin_ms: int = 1500  # for the clock difference between nodes: a lease is taken this long after it ended


class LeaseOwnership:
    def __init__(self, node: str, state: Callable[[], Any], apply: Callable[[Any, float], Awaitable[Any]],
                 preferred: Callable[[str, str], str | None], timing: LeaseTiming | None = None) -> None:
        self.node = node
        self.state = state  # the metadata replica (cluster.metadata.model.MetadataState)
        self.apply = apply  # (command, timeout_s) -> Outcome, raising on timeout or failure
        self.preferred = preferred
        self.timing = timing or LeaseTiming()
        self.on_change: list[Callable[[], None]] = []  # called after a claim (the managers' poke)
        # component -> (vhost, name) -> whether a copy still exists here (its task has not finished closing): a
        # lease is released only once that is False (components without one: `stop_guard_ms` after the last run)
        self.busy: dict[str, Callable[[str, str], bool]] = {}
        self._generations: dict[ls.LeaseKey, int] = {}  # what this process claimed
        self._asked: dict[ls.LeaseKey, float] = {}  # key -> when a manager last asked (monotonic s)
        self._ran: dict[ls.LeaseKey, float] = {}  # key -> when it was last answered "run here"
        self._valid_until = 0.0  # monotonic s: the node lease by this node's clock (send time + lease_ms)
        self._wake = trio.Event()

    # ------------------------------------------------------------ the managers' side
    def owner_for(self, component: str) -> Callable[[str, str], str | None]:
        return lambda vhost, name: self.owner(component, vhost, name)

    def owner(self, component: str, vhost: str, name: str) -> str | None:
        """This node when it may run the key now; else the holder (or the preferred node) for display."""
        key = (component, vhost, name)
        now = time.monotonic()
        first = key not in self._asked
        self._asked[key] = now
        record = self.state().leases.get(key)
        preferred = self.preferred(vhost, name)
        if self._runs(key, record, preferred, now):
            self._ran[key] = now
            return self.node
        if first:
            self._wake.set()
        if record is not None and record.holder and record.holder != self.node:
            return str(record.holder)
        return preferred if preferred != self.node else None

    def status(self) -> dict[str, Any]:
        return {"node": self.node, "lease_valid_for_ms": max(0, int((self._valid_until - time.monotonic()) * 1000)),
                "held": sorted(list(k) for k in self._generations)}

    def _runs(self, key: ls.LeaseKey, record: ls.LeaseRecord | None, preferred: str | None, now: float) -> bool:
        return (record is not None and record.holder == self.node and self._generations.get(key) == record.generation
                and preferred == self.node and now < self._valid_until - self.timing.stop_guard_ms / 1000)

    # ------------------------------------------------------------ the loops
    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._renew_loop)
            task_status.started()
            while True:
                try:
                    await self._step()
                except Exception:
                    log.exception("ownership: step failed")
                with trio.move_on_after(LOOP_S):
                    await self._wake.wait()
                self._wake = trio.Event()

    async def _step(self) -> None:
        t = self.timing
        now = time.monotonic()
        forget = t.stop_guard_ms / 1000
        self._asked = {k: at for k, at in self._asked.items() if now - at <= forget}
        state = self.state()
        for key, record in list(state.leases.items()):
            if record.holder != self.node:
                self._generations.pop(key, None)
                continue
            wanted_here = key in self._asked and self.preferred(key[1], key[2]) == self.node
            if self._generations.get(key) != record.generation:  # an earlier process of this node held it
                await (self._claim(key, record.generation + 1) if wanted_here else self._release(key, record))
            elif not wanted_here and self._stopped(key, now):
                await self._release(key, record)
        for key in list(self._asked):
            record = state.leases.get(key)
            if record is not None and record.holder == self.node:
                continue
            if self.preferred(key[1], key[2]) != self.node:
                continue
            if ls.claim_refusal(state.leases, state.node_leases, key, self.node, int(time.time() * 1000),
                                t.margin_ms):
                continue
            await self._claim(key, (record.generation if record is not None else 0) + 1)

    def _stopped(self, key: ls.LeaseKey, now: float) -> bool:
        """Whether this node's copy of `key` has certainly stopped (so the lease may be released)."""
        busy = self.busy.get(key[0])
        if busy is None:
            return now - self._ran.get(key, 0.0) > self.timing.stop_guard_ms / 1000
        return now - self._ran.get(key, 0.0) > LOOP_S and not busy(key[1], key[2])

    async def _claim(self, key: ls.LeaseKey, generation: int) -> None:
        sent = time.monotonic()
        command = ls.ClaimLease(*key, node=self.node, generation=generation, now_ms=int(time.time() * 1000),
                                lease_ms=self.timing.lease_ms, margin_ms=self.timing.margin_ms)
        outcome = await self._send(command)
        if outcome is None or outcome.refused:
            log.info("%s: claim of %s refused: %s", self.node, key, outcome.refused if outcome else "no outcome")
            return
        self._generations[key] = generation
        self._valid_until = max(self._valid_until, sent + self.timing.lease_ms / 1000)
        log.info("%s: claimed %s (generation %d)", self.node, key, generation)
        for callback in self.on_change:
            callback()

    async def _release(self, key: ls.LeaseKey, record: ls.LeaseRecord) -> None:
        self._generations.pop(key, None)  # never run it again on this claim, whatever the outcome
        self._ran.pop(key, None)
        outcome = await self._send(ls.ReleaseLease(*key, node=self.node, generation=record.generation))
        log.info("%s: released %s (generation %d): %s", self.node, key, record.generation,
                 "done" if outcome is not None and not outcome.refused else outcome)

    async def _renew_loop(self) -> None:
        while True:
            await trio.sleep(self.timing.renew_every_ms / 1000)
            if not self._generations:
                continue
            sent = time.monotonic()
            outcome = await self._send(ls.RenewNodeLease(self.node, int(time.time() * 1000), self.timing.lease_ms))
            if outcome is not None and not outcome.refused:
                self._valid_until = max(self._valid_until, sent + self.timing.lease_ms / 1000)

    async def _send(self, command: Any) -> Any:
        try:
            return await self.apply(command, self.timing.lease_ms / 2000)
        except Exception as exc:  # no leader, timeout: the lease runs out by itself if this goes on
            log.warning("%s: %s not committed: %s", self.node, type(command).__name__, exc)
            return None
