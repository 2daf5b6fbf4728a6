"""The simulator's value types (chaos/sim/simulator.py): a run's `SimConfig` and `SimResult`, one simulated
`SimNode` (its disk, MultiRaft, pending Ready, inbox, queued proposals and applied state), and the per-seed
`FaultProfile` drawn from the run's one `random.Random`.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from chaos.sim.checkers import AppliedState
from chaos.sim.disk import SimDisk
from cluster.raft.core.multiraft import MultiRaft, NodeBatch, NodeReady
from cluster.raft.core.raft import BrokenVariant
from cluster.raft.core.types import GroupId, NodeId


@dataclass(frozen=True, slots=True)
class SimConfig:
    seed: int
    groups: int = 1
    nodes: int | None = None  # None: the seed picks 3 or 5
    chaos_ticks: int = 300
    liveness_ticks_max: int = 500
    broken: BrokenVariant | None = None  # reachable from tests only (not from the command line)
    quiesce: bool = True
    trace: bool = False
    profile_overrides: tuple[tuple[str, Any], ...] = ()  # pin some of the seed-drawn fault profile
    membership: bool = False  # a nemesis that adds learners, promotes and removes members (opt-in: keeps old seeds)
    # Groups bootstrapped with a named first leader (raft.bootstrap_state; opt-in: keeps old seeds). The leader and
    # how it starts ("up", "down": crashed right after its bootstrap state was durable, "isolated": cut off from
    # every other node) are drawn from the seed unless given here.
    bootstrap: bool = False
    bootstrap_start: str | None = None
    # Test-only broken host: a restarted named leader bootstraps again and leads term 1 a second time (the checkers
    # must catch it; the real host never does: a restarted node loads its stored state).
    bootstrap_again_on_restart: bool = False
    # The transport's refusal detection: a crashed node is reported `peer_refused` to the live ones, and partitions
    # sometimes report live nodes refusing (false positives), opt-in: keeps old seeds.
    refusals: bool = False


@dataclass(slots=True)
class SimResult:
    seed: int
    ok: bool
    violation: str | None
    ticks: int
    stats: dict[str, int]
    trace: list[str]
    profile: str


@dataclass(slots=True)
class SimNode:
    id: NodeId
    disk: SimDisk
    mr: MultiRaft | None = None
    incarnation: int = 0
    pending: tuple[NodeReady, int] | None = None
    inbox: deque[NodeBatch] = field(default_factory=deque)
    proposals: deque[tuple[GroupId, bytes]] = field(default_factory=deque)
    applied: dict[GroupId, AppliedState] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FaultProfile:
    """The per-seed fault mix, drawn once from the seed."""

    node_count: int
    network: tuple[float, float, int]  # loss rate, duplicate rate, max delay ticks
    crash_rate: float
    partition_rate: float
    msg_size_bytes_max: int
    inflight_msgs_max: int
    compact_every: int  # 0: never
    sync_delay_ticks_max: int
    propose_rate: float
    transfer_rate: float
    pre_vote: bool
    check_quorum: bool
    leader_fault_rate: float  # a nemesis that crashes or isolates a current leader
    new_leader_isolate_rate: float  # a nemesis that isolates a leader the moment it is elected
    membership_rate: float = 0.0  # single-server changes per tick (drawn only when SimConfig.membership)

    @staticmethod
    def draw(rng: random.Random, node_count: int | None) -> FaultProfile:
        return FaultProfile(
            node_count=node_count or rng.choice([3, 3, 5]),
            network=(rng.choice([0.0, 0.01, 0.05, 0.15]), rng.choice([0.0, 0.02, 0.1]), rng.choice([1, 2, 4, 8])),
            crash_rate=rng.choice([0.0, 0.005, 0.02, 0.05, 0.1]),
            partition_rate=rng.choice([0.0, 0.01, 0.03, 0.08]),
            msg_size_bytes_max=rng.choice([1, 64, 1024]),
            inflight_msgs_max=rng.choice([1, 4, 64]),
            compact_every=rng.choice([0, 5, 30]),
            sync_delay_ticks_max=rng.choice([0, 1, 3]),
            propose_rate=rng.choice([0.1, 0.3, 0.7]),
            transfer_rate=rng.choice([0.0, 0.01]),
            pre_vote=rng.random() < 0.7,
            check_quorum=rng.random() < 0.7,
            leader_fault_rate=rng.choice([0.0, 0.02, 0.05]),
            new_leader_isolate_rate=rng.choice([0.0, 0.0, 0.3]),
        )
