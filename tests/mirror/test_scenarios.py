"""The five seed scenarios in the mirror simulator: each FAILS under its unsafe setting, naming the lost or
diverged messages, and PASSES under the safe defaults (leader-epoch truncation, ELR, when-synced)."""

from __future__ import annotations

import pytest

from chaos.sim.mirror_scenarios import SCENARIOS, main, run_scenario


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario_passes_with_the_safe_defaults(name: str) -> None:
    result = run_scenario(name)
    assert result.ok, result.summary() + "\n" + "\n".join(result.trace)
    assert not result.destroyed
    assert result.unclean_elections == 0


def test_hw_truncation_loss_under_hw() -> None:
    result = run_scenario("hw-truncation-loss", unsafe=True)
    assert result.lost == ["m1 (offset 1; leader B has m2)"]
    assert result.diverged == ["offset 1: A has m1, B has m2", "offset 1: a consumer read m1, later m2 from B"]


def test_hw_truncation_loss_is_also_fixed_by_kip101_alone() -> None:
    assert run_scenario("hw-truncation-loss", truncation="leader-epoch-v0").ok


def test_double_crash_divergence_under_hw() -> None:
    result = run_scenario("double-crash-divergence", unsafe=True)
    assert result.diverged == ["offset 1: A has m1, B has m2", "offset 1: a consumer read m1, later m2 from B"]
    assert result.lost == ["m1 (offset 1; leader B has m2)"]


def test_double_crash_with_leader_epochs_but_no_elr_loses_without_diverging() -> None:
    """KIP-101's own limit: B, back first without m1, leads; A truncates m1 away (no divergence, but loss)."""
    result = run_scenario("double-crash-divergence", eligible_leader_replicas=False)
    assert result.diverged == ["offset 1: a consumer read m1, later m2 from B"]  # no replica differs
    assert result.lost == ["m1 (offset 1; leader B has m2)"]


def test_double_crash_safe_waits_for_the_longest_log() -> None:
    result = run_scenario("double-crash-divergence")
    assert result.unavailable == 1  # m2 was refused while only the unclean B was back


def test_fast_failover_divergence_under_kip101_v0() -> None:
    result = run_scenario("fast-failover-divergence", unsafe=True)
    assert result.diverged == ["offset 1: A has m1, B has m2"]
    assert result.lost == []


def test_fast_failover_is_harmless_under_hw_truncation() -> None:
    """hw truncation drops the uncommitted tails when each replica steps down, so nothing diverges here."""
    assert run_scenario("fast-failover-divergence", truncation="hw").ok


@pytest.mark.parametrize("truncation", ["leader-epoch", "hw"])
def test_unclean_election_loses_with_always(truncation: str) -> None:
    result = run_scenario("unclean-election-loss", unsafe=True, truncation=truncation)
    assert result.lost == ["m1 (offset 1; leader B has m3)", "m2 (offset 2; leader B has nothing)"]
    assert result.diverged == ["offset 1: a consumer read m1, later m3 from B"]
    assert result.unclean_elections == 1


def test_unclean_election_when_synced_is_unavailable_and_loses_nothing() -> None:
    result = run_scenario("unclean-election-loss")
    assert result.ok
    assert result.unavailable == 1


@pytest.mark.parametrize("truncation", ["leader-epoch", "hw"])
def test_last_replica_unsynced_without_elr(truncation: str) -> None:
    result = run_scenario("last-replica-unsynced", unsafe=True, truncation=truncation)
    assert result.lost == [f"m{i} (offset {i}; leader A has nothing)" for i in range(3)]


def test_the_cli_prints_every_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 * len(SCENARIOS)
    assert sum(line.split(": ", 2)[2].startswith("PASS") for line in out) == len(SCENARIOS)
