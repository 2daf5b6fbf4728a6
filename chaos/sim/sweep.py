"""Run many seeds and collect the failing ones (the CI sweep and the long offline sweeps use this)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from chaos.sim.queue_sim import run_queue_seed
from chaos.sim.sim_types import SimConfig, SimResult
from chaos.sim.simulator import run_seed
from cluster.raft.core.raft import BrokenVariant


def sweep(
    seeds: Iterable[int],
    groups: int = 1,
    chaos_ticks: int = 300,
    broken: BrokenVariant | None = None,
    stop_at_first: bool = False,
    progress: Callable[[str], None] | None = None,
    membership: bool = False,
    bootstrap: bool = False,
    queue: bool = False,
    refusals: bool = False,
) -> list[SimResult]:
    """`queue`: the group replicates a queue (queue_sim.py) instead of opaque entries."""
    failures: list[SimResult] = []
    run = run_queue_seed if queue else run_seed
    for seed in seeds:
        result = run(SimConfig(seed=seed, groups=groups, chaos_ticks=chaos_ticks, broken=broken,
                               membership=membership, bootstrap=bootstrap, refusals=refusals))
        if not result.ok:
            failures.append(result)
            if progress:
                progress(f"seed {seed} FAILED: {result.violation}")
            if stop_at_first:
                break
    return failures
