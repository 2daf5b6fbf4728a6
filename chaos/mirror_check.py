"""The checker of the real-process mirrored-queue scenarios: lost confirmed messages and divergence below the HW.

What it is for: after a mirrored-queue chaos run (chaos/mirror_run.py) every replica's log has been read (from its
files, with the unflushed tail a live process still holds) and the leader's HW is known; this says whether a
message the client saw confirmed is missing, and whether two replicas hold different messages at an offset below
the HW (what a consumer may read), naming them the way the simulator's checker does (chaos/sim/mirror_sim.py).

How it works: pure functions over plain values. `lost`: a confirmed message (msg -> offset, from the publisher's
`PublishResult`) that the leader does not hold at that offset below its HW: `m1@1 (leader b has m2 there)`.
`diverged`: every pair of replicas compared at every offset below the HW that both hold:
`offset 1: a has m1, b has m2`; a replica that holds less than the HW is reported as short (`c holds 1 of 3`).
No clocks, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cluster.mirror_queues.core.types import Record


@dataclass(frozen=True, slots=True)
class MirrorCheck:
    lost: tuple[str, ...] = ()
    diverged: tuple[str, ...] = ()
    short: tuple[str, ...] = ()
    leader: str = ""
    hw: int = 0
    problems: tuple[str, ...] = ()  # the run itself could not be carried out or settled
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def valid(self) -> bool:
        return not (self.lost or self.diverged or self.short or self.problems)

    def summary(self) -> dict[str, Any]:
        return {"valid": self.valid, "leader": self.leader, "hw": self.hw, "lost": list(self.lost),
                "diverged": list(self.diverged), "short": list(self.short), "problems": list(self.problems),
                **self.counts}


def lost_messages(confirmed: Mapping[str, int], leader: str, leader_log: Sequence[Record], hw: int) -> list[str]:
    lost = []
    for msg, offset in sorted(confirmed.items(), key=lambda item: (item[1], item[0])):
        held = leader_log[offset].msg if offset < len(leader_log) else None
        if held != msg or offset >= hw:
            where = f"leader {leader} has {held} there" if held is not None else f"leader {leader} has nothing there"
            if held == msg:
                where = f"above the HW {hw}"
            lost.append(f"{msg}@{offset} ({where})")
    return lost


def divergence(logs: Mapping[str, Sequence[Record]], hw: int) -> tuple[list[str], list[str]]:
    """(differences below `hw` between every pair of replicas, replicas holding fewer than `hw` records)."""
    names = sorted(logs)
    diverged = []
    for offset in range(hw):
        held = {name: logs[name][offset].msg for name in names if offset < len(logs[name])}
        if len(set(held.values())) > 1:
            diverged.append(f"offset {offset}: " + ", ".join(f"{name} has {msg}" for name, msg in held.items()))
    short = [f"{name} holds {len(logs[name])} of {hw}" for name in names if len(logs[name]) < hw]
    return diverged, short


def check_mirror(confirmed: Mapping[str, int], logs: Mapping[str, Sequence[Record]], leader: str, hw: int,
                 problems: Sequence[str] = (), counts: Mapping[str, int] | None = None) -> MirrorCheck:
    leader_log = logs.get(leader, ())
    lost = lost_messages(confirmed, leader, leader_log, hw) if leader else [
        f"{msg}@{offset} (no leader)" for msg, offset in sorted(confirmed.items(), key=lambda item: item[1])]
    diverged, short = divergence(logs, hw)
    return MirrorCheck(tuple(lost), tuple(diverged), tuple(short), leader, hw, tuple(problems), dict(counts or {}))
