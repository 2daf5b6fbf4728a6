"""The seed's mirrored-queue failure scenarios, scripted step by step over `MirrorSim`.

Each scenario has a base setting (replicas, `min_insync`, flush policy) and an unsafe variant: the old
truncation or election rule under which it loses or diverges. `run_scenario(name)` runs it with the safe
defaults (`leader-epoch` truncation with KIP-279's rounds, eligible leader replicas, `when-synced`), and
`run_scenario(name, unsafe=True)` with the variant; the result names the lost and diverged messages.
`python -m chaos.sim.mirror_scenarios [NAME] [--unsafe] [--trace]` prints the verdicts.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from chaos.sim.mirror_sim import MirrorResult, MirrorSim
from cluster.mirror_queues.core.types import Settings


def _commit_first(sim: MirrorSim, follower: str) -> None:
    sim.publish("m0")
    sim.round(follower)
    sim.round(follower)  # the leader's HW passes m0 and the follower learns it


def hw_truncation_loss(sim: MirrorSim) -> None:
    """Seed §3.3 / KIP-101 case 1: B restarts and truncates to its stale HW checkpoint, then A dies."""
    _commit_first(sim, "B")
    sim.advance(1_000)  # both checkpoint HW 1
    sim.publish("m1")
    sim.round("B")  # B has m1, still believes HW 1
    sim.poll("B")
    sim.deliver(1)  # A takes B's fetch at 2: HW 2, m1 confirmed; the reply is in flight
    sim.crash("B")  # the reply is lost; B's HW checkpoint is still 1
    sim.advance(1_000)  # A checkpoints HW 2
    sim.restart("B")
    sim.poll("B")
    sim.deliver(1)  # B's first request after the restart reaches A ...
    sim.crash("A")  # ... and A dies before its reply: B leads epoch 1 with what it kept
    sim.publish("m2")
    sim.restart("A")


def double_crash_divergence(sim: MirrorSim) -> None:
    """Seed §3.4 / KIP-101 case 2: both crash; B kept m1 unflushed and comes back first, then A."""
    _commit_first(sim, "B")
    sim.flush("A")
    sim.flush("B")
    sim.advance(1_000)
    sim.publish("m1")
    sim.round("B")
    sim.round("B")  # m1 confirmed; B has it in its page cache only
    sim.flush("A")
    sim.crash("B")  # B loses m1
    sim.advance(1_000)  # A checkpoints HW 2
    sim.crash("A")  # nobody can lead
    sim.restart("B")
    sim.publish("m2")
    sim.restart("A")


def fast_failover_divergence(sim: MirrorSim) -> None:
    """KIP-279 / KAFKA-6361: leadership moves A -> B -> A before A or B truncates; each wrote its own offset 1."""
    _commit_first(sim, "B")
    sim.publish("m1")  # on A only
    sim.transfer("B")  # epoch 1: A is a follower but has not asked where to truncate yet
    sim.publish("m2")  # on B only, at offset 1
    sim.transfer("A")  # epoch 2: A leads again with its epoch-0 m1 at offset 1
    sim.publish("m3")


def unclean_election_loss(sim: MirrorSim) -> None:
    """The ISR shrinks to A, which confirms alone; A dies; B (out of sync) is promoted or the queue waits."""
    _commit_first(sim, "B")
    sim.isolate("B")
    sim.publish("m1")
    sim.publish("m2")
    sim.advance(11_000)  # B leaves the ISR; the HW moves with A alone: m1, m2 confirmed
    sim.crash("A")
    sim.heal("B")
    sim.publish("m3")
    sim.restart("A")


def last_replica_unsynced(sim: MirrorSim) -> None:
    """KIP-966: ISR {A,B,C}, min 2; C then B drop out; A, alone, crashes losing its unflushed log."""
    sim.publish("m0")
    sim.publish("m1")
    sim.rounds(2)
    sim.isolate("C")
    for _ in range(3):
        sim.advance(4_000)
        sim.round("B")  # B keeps up; C leaves the ISR
    sim.publish("m2")
    sim.round("B")
    sim.round("B")  # m2 confirmed by A and B
    sim.isolate("B")
    sim.advance(11_000)  # B leaves too: the ISR is {A}, below min_insync
    sim.publish("m3")  # refused: not enough replicas
    sim.crash("A")  # A never flushed: its log is gone
    sim.heal()
    sim.restart("A")


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    source: str
    replicas: tuple[str, ...]
    script: Callable[[MirrorSim], None]
    base: dict[str, Any] = field(default_factory=dict)
    unsafe: dict[str, Any] = field(default_factory=dict)


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("hw-truncation-loss", "seed §3.3, KIP-101 case 1", ("A", "B"), hw_truncation_loss,
             {"hw_checkpoint_interval_ms": 1_000}, {"truncation": "hw"}),
    Scenario("double-crash-divergence", "seed §3.4, KIP-101 case 2", ("A", "B"), double_crash_divergence,
             {"hw_checkpoint_interval_ms": 1_000, "flush": "unsynced"},
             {"truncation": "hw", "eligible_leader_replicas": False}),
    Scenario("fast-failover-divergence", "KIP-279, KAFKA-6361", ("A", "B"), fast_failover_divergence,
             {}, {"truncation": "leader-epoch-v0"}),
    Scenario("unclean-election-loss", "Jepsen Kafka 2013, ha-promote-on-failure", ("A", "B"),
             unclean_election_loss, {}, {"promote_on_failure": "always"}),
    Scenario("last-replica-unsynced", "KIP-966", ("A", "B", "C"), last_replica_unsynced,
             {"min_insync": 2, "flush": "unsynced"}, {"eligible_leader_replicas": False}),
)}


def settings_for(name: str, unsafe: bool = False, **overrides: Any) -> Settings:
    scenario = SCENARIOS[name]
    settings = replace(Settings(), **scenario.base)
    if unsafe:
        settings = replace(settings, **scenario.unsafe)
    return replace(settings, **overrides)


def run_scenario(name: str, unsafe: bool = False, **overrides: Any) -> MirrorResult:
    scenario = SCENARIOS[name]
    settings = settings_for(name, unsafe, **overrides)
    sim = MirrorSim(scenario.replicas, settings)
    sim.log(f"{name} ({scenario.source}): {settings}")
    scenario.script(sim)
    return sim.check()


def main(argv: list[str]) -> int:
    names = [a for a in argv if not a.startswith("--")] or list(SCENARIOS)
    for name in names:
        for unsafe in ((True,) if "--unsafe" in argv else (False, True)):
            result = run_scenario(name, unsafe)
            label = "unsafe" if unsafe else "safe"
            print(f"{name} [{label}: {SCENARIOS[name].unsafe if unsafe else 'defaults'}]: {result.summary()}")
            if "--trace" in argv:
                print("\n".join("    " + line for line in result.trace))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
