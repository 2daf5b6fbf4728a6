"""A deterministic simulator for mirrored queues: the pure mirror core over a fake network, clock and disk.

`MirrorSim` holds one `Replica` per live node, the controller's `PartitionState`, a FIFO network of replica
messages (an isolated node's links drop everything) and a clock advanced by hand. A crash keeps only what the
replica flushed (`Replica.crash_image`): with `flush="unsynced"` that loses the page cache. Operations are small
steps (publish, poll, deliver, round, advance, crash, restart, isolate, heal, flush) so that a scenario script can
place a crash between a request and its reply; `run_random` drives the same steps from a seeded RNG.

Checkers (`check`): no confirmed message lost (it must be on the leader at its offset at the end, unless every copy
on every replica of the ISR that committed it was destroyed by crashes: then it is listed as `destroyed`, beyond
the fault model); no
divergence below the HW (every pair of replicas compared at every offset below the leader's HW, and a consumer
that reads everything below the leader's HW never sees two messages at one offset); the HW never goes backwards
on a leader within its epoch (checked after every step).
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

from cluster.mirror_queues.core import controller as ctl
from cluster.mirror_queues.core.replica import DurableImage, Replica
from cluster.mirror_queues.core.types import (
    Confirmed,
    Effect,
    IsrChanged,
    Message,
    Nacked,
    Send,
    Settings,
    Truncated,
)


@dataclass(slots=True)
class MirrorResult:
    lost: list[str] = field(default_factory=list)
    diverged: list[str] = field(default_factory=list)
    hw_regressions: list[str] = field(default_factory=list)
    destroyed: list[str] = field(default_factory=list)  # confirmed, but every copy was lost in crashes
    confirmed: int = 0
    unavailable: int = 0  # publishes refused because no replica could lead
    unclean_elections: int = 0
    trace: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.diverged or self.hw_regressions)

    def summary(self) -> str:
        parts = [f"lost: {', '.join(self.lost)}" if self.lost else "",
                 f"diverged: {'; '.join(self.diverged)}" if self.diverged else "",
                 f"HW regressed: {'; '.join(self.hw_regressions)}" if self.hw_regressions else ""]
        verdict = "PASS" if self.ok else "FAIL"
        return " | ".join([verdict, *[p for p in parts if p]]) + (
            f" (confirmed {self.confirmed}, unavailable {self.unavailable}, unclean elections "
            f"{self.unclean_elections}, destroyed {len(self.destroyed)})")


class MirrorSim:
    def __init__(self, replicas: tuple[str, ...], settings: Settings) -> None:
        self.settings = settings
        self.names = replicas
        self.now_ms = 0
        self.nodes: dict[str, Replica] = {r: Replica(r, settings) for r in replicas}
        self.images: dict[str, DurableImage] = {}
        self.state = ctl.initial(replicas)
        self.net: deque[tuple[str, str, Message]] = deque()
        self.isolated: set[str] = set()
        self.confirmed: dict[str, int] = {}
        self.nacked: dict[str, str] = {}
        self.destroyed: set[str] = set()
        self.committers: dict[str, frozenset[str]] = {}  # the ISR that a confirmed message was committed by
        self.reads: list[str] = []  # what consumers of the leader saw, by offset
        self.hw_seen: dict[tuple[str, int], int] = {}
        self.result = MirrorResult()
        self._notify(None)

    # --- plumbing ----------------------------------------------------------------------------------------------

    def log(self, line: str) -> None:
        self.result.trace.append(f"[{self.now_ms:>6}] {line}")

    def live(self) -> frozenset[str]:
        return frozenset(self.nodes)

    def _held(self, name: str) -> set[str]:
        if name in self.nodes:
            return {rec.msg for rec in self.nodes[name].log}
        return {rec.msg for rec in self.images[name].log} if name in self.images else set()

    def log_ends(self) -> dict[str, tuple[int, int]]:
        return {name: (r.latest_epoch(), r.leo) for name, r in self.nodes.items()}

    def leader(self) -> Replica | None:
        name = self.state.leader
        if name is None or name not in self.nodes or self.nodes[name].role != "leader":
            return None
        return self.nodes[name]

    def _apply(self, node: str, effects: list[Effect]) -> None:
        for e in effects:
            if isinstance(e, Send):
                if node not in self.isolated and e.dst not in self.isolated:
                    self.net.append((node, e.dst, e.message))
            elif isinstance(e, Confirmed):
                self.confirmed[e.msg] = e.offset
                self.committers[e.msg] = frozenset(self.nodes[node].isr)
                self.log(f"{node}: confirmed {e.msg} at offset {e.offset}")
            elif isinstance(e, Nacked):
                self.nacked[e.msg] = e.reason
                self.log(f"{node}: nacked {e.msg} ({e.reason})")
            elif isinstance(e, IsrChanged):
                before = self.state
                self.state = ctl.alter_isr(self.state, e, self.settings)
                if self.state is not before:
                    self.log(f"controller: ISR {sorted(self.state.isr)} ELR {sorted(self.state.elr)}")
            elif isinstance(e, Truncated):
                self.log(f"{e.replica}: truncated {e.from_leo} -> {e.to_leo} by {e.how}")
        self._observe()

    def _set_state(self, new: ctl.PartitionState) -> None:
        old = self.state
        self.state = new
        self._notify(old)

    def _notify(self, old: ctl.PartitionState | None) -> None:
        new = self.state
        if old is not None and (new.leader, new.epoch) == (old.leader, old.epoch):
            leader = self.leader()
            if new.isr != old.isr and leader is not None:
                self._apply(leader.name, leader.update_isr(new.isr, self.now_ms))
            return
        if new.leader is None:
            self.log("controller: no replica can lead (unavailable)")
            return
        self.log(f"controller: {new.leader} leads epoch {new.epoch}, ISR {sorted(new.isr)}")
        if new.leader in self.nodes:
            self._apply(new.leader, self.nodes[new.leader].become_leader(new.epoch, new.isr, self.now_ms))
        for name, replica in self.nodes.items():
            if name != new.leader:
                self._apply(name, replica.become_follower(new.leader, new.epoch))

    def _observe(self) -> None:
        leader = self.leader()
        if leader is None:
            return
        key = (leader.name, leader.epoch)
        seen = self.hw_seen.get(key, leader.hw)
        if leader.hw < seen:
            self.result.hw_regressions.append(f"{leader.name} epoch {leader.epoch}: HW {seen} -> {leader.hw}")
        self.hw_seen[key] = max(seen, leader.hw)
        for record in leader.log[len(self.reads):leader.hw]:  # a consumer reads what the HW makes visible
            self.reads.append(record.msg)
            self.committers.setdefault(record.msg, frozenset(leader.isr))
        for o in range(min(len(self.reads), leader.hw)):
            if leader.log[o].msg != self.reads[o]:
                if self.reads[o] not in self.destroyed:
                    self.result.diverged.append(f"offset {o}: a consumer read {self.reads[o]}, later "
                                                f"{leader.log[o].msg} from {leader.name}")
                self.reads[o] = leader.log[o].msg

    # --- steps -------------------------------------------------------------------------------------------------

    def publish(self, msg: str) -> None:
        leader = self.leader()
        if leader is None:
            self.nacked[msg] = "unavailable"
            self.result.unavailable += 1
            self.log(f"publish {msg}: no leader, nacked")
            return
        self._apply(leader.name, leader.publish(msg))

    def poll(self, node: str) -> None:
        if node in self.nodes:
            self._apply(node, self.nodes[node].poll())

    def deliver(self, limit: int | None = None) -> None:
        """Deliver in-flight messages in order (those sent meanwhile too), at most `limit` of them."""
        n = 0
        while self.net and (limit is None or n < limit):
            src, dst, msg = self.net.popleft()
            n += 1
            if dst in self.nodes and src not in self.isolated and dst not in self.isolated:
                self._apply(dst, self.nodes[dst].handle(msg, self.now_ms))

    def round(self, node: str) -> None:
        """One request of `node` to its leader and the reply, delivered."""
        self.poll(node)
        self.deliver()

    def rounds(self, count: int = 1) -> None:
        for _ in range(count):
            for name in self.names:
                self.round(name)

    def advance(self, ms: int) -> None:
        self.now_ms += ms
        for name in list(self.nodes):
            self._apply(name, self.nodes[name].tick(self.now_ms))

    def flush(self, node: str) -> None:
        if node in self.nodes:
            self.nodes[node].flush()

    def isolate(self, node: str) -> None:
        self.isolated.add(node)
        self.log(f"isolate {node}")

    def heal(self, node: str | None = None) -> None:
        self.isolated = set() if node is None else self.isolated - {node}

    def crash(self, node: str) -> None:
        replica = self.nodes.pop(node)
        self.images[node] = replica.crash_image()
        self.net = deque(m for m in self.net if node not in (m[0], m[1]))
        self.log(f"crash {node} (LEO {replica.leo}, flushed {replica.flushed}, HW checkpoint "
                 f"{replica.hw_checkpoint})")
        dropped = {rec.msg for rec in replica.log[replica.flushed:]}
        for msg in dropped & (self.confirmed.keys() | set(self.reads)):
            others = self.committers[msg] - {node}
            if not any(msg in self._held(r) for r in others):
                self.destroyed.add(msg)
                self.log(f"{msg}: every replica that committed it has now lost it (beyond the fault model)")
        self._set_state(ctl.broker_down(self.state, node, self.live(), self.settings, self.log_ends()))

    def restart(self, node: str) -> None:
        image = self.images.pop(node)
        self.nodes[node] = Replica.recover(node, self.settings, image, self.now_ms)
        self.log(f"restart {node} (LEO {self.nodes[node].leo}, HW {self.nodes[node].hw})")
        before = self.state
        self._set_state(ctl.broker_up(self.state, node, self.live(), self.settings.flush == "unsynced",
                                      self.settings, self.log_ends()))
        if self.state.leader is not None and self.state.leader != node and self.nodes[node].role == "none":
            self._apply(node, self.nodes[node].become_follower(self.state.leader, self.state.epoch))
        if (self.state.isr, self.state.unclean) != (before.isr, before.unclean):
            self.log(f"controller: ISR {sorted(self.state.isr)} ELR {sorted(self.state.elr)} unclean "
                     f"{sorted(self.state.unclean)}")

    def transfer(self, node: str) -> None:
        self.log(f"move leadership to {node}")
        self._set_state(ctl.transfer(self.state, node, self.live()))

    def settle(self, max_rounds: int = 40) -> None:
        """Heal the network, restart every crashed replica and replicate until the followers caught up."""
        self.heal()
        for name in self.names:
            if name not in self.nodes:
                self.restart(name)
        for _ in range(max_rounds):
            self.rounds()
            self.advance(1)
            leader = self.leader()
            if leader is None:
                return
            if all(r.leo == leader.leo and not r.truncating for r in self.nodes.values()) and leader.hw == leader.leo:
                return

    # --- checkers ----------------------------------------------------------------------------------------------

    def lost_now(self) -> list[str]:
        """Confirmed messages the current leader does not hold at their offset (none while nobody leads)."""
        leader = self.leader()
        if leader is None:
            return []
        lost = []
        for msg, offset in sorted(self.confirmed.items(), key=lambda kv: kv[1]):
            if msg in self.destroyed:
                continue
            if offset >= leader.leo or leader.log[offset].msg != msg:
                have = leader.log[offset].msg if offset < leader.leo else "nothing"
                lost.append(f"{msg} (offset {offset}; leader {leader.name} has {have})")
        return lost

    def divergence(self) -> list[str]:
        leader = self.leader()
        if leader is None:
            return []
        found = []
        names = sorted(self.nodes)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                la, lb = self.nodes[a].log, self.nodes[b].log
                for o in range(min(leader.hw, len(la), len(lb))):
                    if la[o].msg != lb[o].msg:
                        found.append(f"offset {o}: {a} has {la[o].msg}, {b} has {lb[o].msg}")
        return found

    def isr_divergence(self) -> list[str]:
        """During the run: a live ISR member that differs from the leader below the leader's HW."""
        leader = self.leader()
        if leader is None:
            return []
        found = []
        for name in sorted(leader.isr - {leader.name}):
            log = self.nodes[name].log if name in self.nodes else []
            for o in range(min(leader.hw, len(log))):
                if log[o].msg != leader.log[o].msg:
                    found.append(f"offset {o}: {leader.name} has {leader.log[o].msg}, {name} has {log[o].msg}")
        return found

    def check(self) -> MirrorResult:
        self.settle()
        r = self.result
        r.lost = self.lost_now()
        r.diverged = [*self.divergence(), *r.diverged]  # replicas first, then what consumers read
        r.destroyed = sorted(self.destroyed)
        r.confirmed = len(self.confirmed)
        r.unclean_elections = self.state.unclean_elections
        return r


def run_random(seed: int, settings: Settings, steps: int = 150,
               replicas: tuple[str, ...] = ("a", "b", "c")) -> MirrorResult:
    """Random publishes, fetches, time, crashes, restarts, isolations and flushes. After every step: no confirmed
    message missing from the leader, no ISR member differing from it below its HW, the HW not moved back; after
    the final settle, every pair of replicas compared below the HW."""
    rng = random.Random(seed)
    sim = MirrorSim(replicas, settings)
    sim.log(f"seed {seed}")
    counter = 0
    for _ in range(steps):
        op = rng.random()
        name = rng.choice(replicas)
        if op < 0.30:
            counter += 1
            sim.publish(f"m{counter}")
        elif op < 0.55:
            sim.poll(name)
        elif op < 0.70:
            sim.deliver(rng.randint(1, 4))
        elif op < 0.80:
            sim.advance(rng.choice((100, 1_000, 3_000, 6_000)))
        elif op < 0.86:
            if name in sim.nodes and len(sim.nodes) > 1:
                sim.crash(name)
        elif op < 0.92:
            if name not in sim.nodes:
                sim.restart(name)
        elif op < 0.96:
            if name in sim.isolated:
                sim.heal(name)
            else:
                sim.isolate(name)
        else:
            sim.flush(name)
        lost = sim.lost_now()
        diverged = sim.isr_divergence()
        if lost or diverged:
            sim.result.trace.append(f"after this step: lost {lost}, diverged {diverged}")
            result = sim.check()
            result.lost = sorted(set(result.lost) | set(lost))
            result.diverged = sorted(set(result.diverged) | set(diverged))
            return result
    return sim.check()
