"""The simulator driving the replicated queue (chaos/sim/queue_sim.py): the real queue machine, dedup, proposal
tracking and incarnation framing over the simulated Raft cluster, with its queue checkers (the same entries and
decisions everywhere, no redelivery after an ack, no confirmed message lost, no dead-letter copy twice)."""

from __future__ import annotations

import pytest

from chaos.sim.__main__ import main
from chaos.sim.checkers import SafetyViolation
from chaos.sim.queue_sim import QueueSimulation, run_queue_seed
from chaos.sim.sim_types import SimConfig
from chaos.sim.sweep import sweep
from cluster.queue import DeadLetter, MsgId, QueuedMessage, QueueExpired, QueueUnused

QUEUE_CI_SEEDS = range(0, 30)


class _ConfirmOnSend(QueueSimulation):
    confirm_early = True  # a publisher confirmed before its Enqueue is applied: what crashes and leader loss lose


class _CopiesUnnumbered(QueueSimulation):
    """Dead-letter copies sent without the machine's sequence: the target cannot tell a second sender's copy."""

    def copy_sequence(self, effect: DeadLetter) -> int | None:
        return None


def test_a_queue_seed_replays_exactly() -> None:
    first = run_queue_seed(SimConfig(seed=7, trace=True))
    second = run_queue_seed(SimConfig(seed=7, trace=True))
    assert first.trace == second.trace and first.stats == second.stats


def test_queue_ci_sweep_every_checker_passes_and_exercises_confirms_acks_and_retries() -> None:
    results = [run_queue_seed(SimConfig(seed=seed)) for seed in QUEUE_CI_SEEDS]
    assert all(r.ok for r in results), [(r.seed, r.violation) for r in results if not r.ok]
    totals = {key: sum(r.stats[key] for r in results) for key in results[0].stats}
    assert totals["confirmed"] > 500 and totals["settled"] > 500, totals
    assert totals["skipped_retries"] > 0, totals  # retried proposals committed twice and were deduplicated
    assert totals["crashes"] > 0 and totals["partitions"] > 0, totals
    assert totals["cancels"] > 0 and totals["unused"] > 0 and totals["expired"] > 0, totals  # the usage rules ran
    assert totals["dead_lettered"] > 0 and totals["copies"] > 0, totals  # rejects were dead-lettered and copied
    assert totals["copies_deduplicated"] > 0, totals  # a second sender's copy was a Duplicate at the target


def test_replicas_deciding_differently_is_caught() -> None:
    sim = QueueSimulation(SimConfig(seed=1))
    first, second = list(sim.nodes.values())[:2]
    sim._check_decisions(first, 7, [QueueUnused()])
    sim._check_decisions(second, 7, [QueueUnused()])  # the same decision at the same index: fine
    with pytest.raises(SafetyViolation, match="decision divergence"):
        sim._check_decisions(second, 8, [])
        sim._check_decisions(first, 8, [QueueExpired()])


def test_replicas_numbering_dead_letters_differently_is_caught() -> None:
    sim = QueueSimulation(SimConfig(seed=1))
    first, second = list(sim.nodes.values())[:2]
    letter = DeadLetter(QueuedMessage(b"m", 1, True), "rejected", 0, MsgId(3), seq=4)
    sim._check_decisions(first, 7, [letter])
    sim._check_decisions(second, 7, [letter])
    with pytest.raises(SafetyViolation, match="decision divergence"):
        sim._check_decisions(first, 8, [letter])
        sim._check_decisions(second, 8, [DeadLetter(QueuedMessage(b"m", 1, True), "rejected", 0, MsgId(3), seq=5)])


def test_dead_letter_copies_without_the_machines_sequence_are_caught_as_copied_twice() -> None:
    violations = [_CopiesUnnumbered(SimConfig(seed=seed)).run().violation for seed in range(6, 10)]
    assert any(v is not None and v.startswith("dead letter copied twice") for v in violations), violations


def test_the_sweep_command_runs_queue_seeds() -> None:
    assert sweep(range(100, 102), queue=True) == []


def test_confirming_before_the_apply_is_caught_as_loss() -> None:
    violations = [_ConfirmOnSend(SimConfig(seed=seed)).run().violation for seed in range(0, 3)]
    assert any(v is not None and v.startswith("confirmed message lost") for v in violations), violations


def test_command_line_runs_a_queue_seed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--queue", "--seed", "2", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "seed=2 ok=True" in out and "'confirmed'" in out
