"""Fast elections on refused connections (`MultiRaft.peer_refused`, `RaftCore.leader_refused`) under the simulator.

With `refusals` the simulator tells the live nodes, 0..2 ticks after a crash (each on its own delay), that the crashed
node refuses connections, so the groups it led elect at once; and it reports live nodes refusing too (the isolated
side of a partition as a fault proxy closing its listener would, and spurious refusals of a connected peer). Every
checker (election safety, log matching, committed entries kept, leader completeness, state machine safety) must hold
and the groups must recover after healing, as without refusals.
"""

from __future__ import annotations

from chaos.sim.sim_types import SimConfig
from chaos.sim.simulator import Simulation, run_seed
from cluster.raft.core.raft import BrokenVariant
from cluster.raft.core.types import GroupId, Role

SWEEP_SEEDS = range(0, 40)


def test_refusal_sweep_every_checker_passes_and_fast_elections_happen() -> None:
    totals = {"refused_campaigns": 0, "false_refusals": 0}
    failures = []
    for seed in SWEEP_SEEDS:
        result = run_seed(SimConfig(seed=seed, groups=2, refusals=True))
        if not result.ok:
            failures.append((seed, result.violation))
        for key in totals:
            totals[key] += result.stats[key]
    assert not failures, failures
    assert totals["refused_campaigns"] > 0 and totals["false_refusals"] > 0, totals


def test_refusals_with_membership_changes_keep_every_checker() -> None:
    failures = [(seed, result.violation) for seed in range(0, 15)
                if not (result := run_seed(SimConfig(seed=seed, refusals=True, membership=True))).ok]
    assert not failures, failures


def test_checkers_still_catch_a_broken_core_with_refusals() -> None:
    caught = any(not run_seed(SimConfig(seed=seed, refusals=True, broken=BrokenVariant.TRUNCATE_ON_APPEND)).ok
                 for seed in range(0, 60))
    assert caught, "the checkers missed a follower dropping entries it had acknowledged"


def test_a_crashed_leader_is_replaced_before_the_election_timeout() -> None:
    """A quiet 3-node group (no fault but the crash): after the leader's crash and the refusals, a survivor leads
    before any election timeout (10..19 ticks) could have fired, mostly in the next term (a split vote is possible,
    when the two survivors learn of the refusal far enough apart: then the ordinary timeout elects)."""
    overrides = (("network", (0.0, 0.0, 1)), ("crash_rate", 0.0), ("partition_rate", 0.0), ("leader_fault_rate", 0.0),
                 ("new_leader_isolate_rate", 0.0), ("transfer_rate", 0.0), ("pre_vote", True), ("check_quorum", True),
                 ("sync_delay_ticks_max", 0))
    fast = one_term = 0
    for seed in range(20):
        sim = Simulation(SimConfig(seed=seed, nodes=3, refusals=True, profile_overrides=overrides))
        group = GroupId("g0")
        tick = 0
        while not sim._leaders(group):
            sim._tick(tick, chaos=False)
            tick += 1
        for _ in range(5):  # a few heartbeats: every follower hears the leader (its lease is on)
            sim._tick(tick, chaos=False)
            tick += 1
        (leader, core), = sim._leaders(group)
        term = core.term
        sim._crash(leader)
        crashed_at = tick
        while not sim._leaders(group):
            sim._tick(tick, chaos=False)
            tick += 1
            assert tick - crashed_at < 100
        fast += tick - crashed_at < 10
        (new, new_core), = sim._leaders(group)
        one_term += new_core.term == term + 1
        assert new.id != leader.id and new_core.term > term and new_core.role is Role.LEADER
        sim._heal()
        assert sim._run_liveness() is None
    assert fast >= 18 and one_term >= 18, (fast, one_term)
