"""The simulator sweep: determinism, the CI sweep, regression seeds, and broken variants that must be caught."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.sim.__main__ import main
from chaos.sim.sim_types import SimConfig
from chaos.sim.simulator import run_seed
from chaos.sim.sweep import sweep
from cluster.raft.core.raft import BrokenVariant

CI_SEEDS = range(0, 150)
MULTIGROUP_SEEDS = range(1000, 1010)
MEMBERSHIP_SEEDS = range(5000, 5040)
REGRESSIONS = sorted((Path(__file__).parent / "regressions").glob("seed-*.txt"))
# A nemesis-heavy profile (5 nodes, one entry per append, leaders isolated as they are elected, no pre-vote):
# figure 8's interleaving is rare under the default mix, common here.
FIGURE8_PROFILE = (
    ("node_count", 5),
    ("msg_size_bytes_max", 1),
    ("leader_fault_rate", 0.1),
    ("new_leader_isolate_rate", 0.5),
    ("pre_vote", False),
    ("check_quorum", False),
    ("partition_rate", 0.08),
    ("propose_rate", 0.7),
)


def test_a_seed_replays_exactly() -> None:
    first = run_seed(SimConfig(seed=42, trace=True))
    second = run_seed(SimConfig(seed=42, trace=True))
    assert first.trace == second.trace and first.stats == second.stats
    assert run_seed(SimConfig(seed=43, trace=True)).trace != first.trace


def test_command_line_replays_a_seed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--seed", "5", "--chaos-ticks", "100"]) == 0
    out = capsys.readouterr().out
    assert "seed=5 ok=True" in out and "deliver" in out


def test_ci_sweep_every_checker_passes() -> None:
    failures = sweep(CI_SEEDS)
    assert not failures, [(result.seed, result.violation) for result in failures]


def test_multigroup_sweep_every_checker_passes() -> None:
    failures = sweep(MULTIGROUP_SEEDS, groups=8)
    assert not failures, [(result.seed, result.violation) for result in failures]


@pytest.mark.parametrize("path", REGRESSIONS, ids=[path.stem for path in REGRESSIONS])
def test_regression_seed(path: Path) -> None:
    fields = dict(
        (key.strip(), int(value))
        for key, value in (line.split("=") for line in path.read_text().splitlines() if "=" in line and line[0] != "#")
    )
    result = run_seed(SimConfig(seed=fields["seed"], groups=fields.get("groups", 1),
                                chaos_ticks=fields.get("chaos_ticks", 300), nodes=fields.get("nodes"),
                                membership=bool(fields.get("membership", 0))))
    assert result.ok, result.violation


def test_truncate_on_every_append_is_caught_within_60_seeds() -> None:
    failures = sweep(range(0, 60), broken=BrokenVariant.TRUNCATE_ON_APPEND, stop_at_first=True)
    assert failures, "the checkers missed a follower dropping entries it had acknowledged"


def test_committing_an_old_terms_entry_is_caught_within_150_seeds() -> None:
    failures = []
    for seed in range(0, 150):
        result = run_seed(SimConfig(seed=seed, chaos_ticks=600, broken=BrokenVariant.COMMIT_OLD_TERM,
                                    profile_overrides=FIGURE8_PROFILE))
        if not result.ok:
            failures.append(result)
            break
    assert failures, "the checkers missed figure 8: an old term's entry committed by counting replicas"
    assert failures[0].violation is not None


def test_membership_sweep_every_checker_passes() -> None:
    """Random single-server changes (add learner, promote, remove) under every other fault, checkers on."""
    results = [run_seed(SimConfig(seed=seed, membership=True)) for seed in MEMBERSHIP_SEEDS]
    assert [(result.seed, result.violation) for result in results if not result.ok] == []
    for op in ("conf_add_learner", "conf_promote", "conf_remove"):
        assert sum(result.stats.get(op, 0) for result in results) > 0, op
