"""Short versions of the 3-node quorum-queue scenarios (chaos/scenarios/qq-*.toml) against a real cluster.

One cluster of three `raftmq node` processes (cluster mode, started the way `raftmq cluster up` starts them) serves
the process-fault scenarios in turn, each on its own quorum queue: kill -9 of the queue leader's node and restart,
kill -9 of a follower's node, SIGSTOP of the leader's node and SIGCONT. Publishers (confirms) are on every node,
consumers (manual acks) on other nodes than their publisher. Every run must lose nothing confirmed, deliver
nothing unexpected, flag every redelivery, undo no settled ack and keep each publisher's order for first
deliveries. The partition scenario needs network namespaces (root, ip, nft) and its own cluster inside them.
The full scenarios run with `raftmq chaos run qq-leader-kill` etc.; docs/chaos.md has the numbers of a full run.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from chaos import netns
from chaos.history import Fault
from chaos.nemesis import LocalCluster
from chaos.report import report_json, report_text
from chaos.run import Environment, RunOutcome, run_scenario, spawned_environment
from chaos.scenario import Scenario, Step, load_scenario

MESSAGES_PER_PUBLISHER = 60
MORE_CONFIRMED_MAX = 40
FAULT_SECONDS_MAX = 3.0


def shortened(name: str) -> Scenario:
    """The bundled scenario, one round, fewer messages, shorter waits (same faults, same targets)."""
    scenario = load_scenario(name)
    steps = tuple(
        replace(step, more_confirmed=min(step.more_confirmed, MORE_CONFIRMED_MAX),
                seconds=step.seconds if step.more_confirmed else min(step.seconds, FAULT_SECONDS_MAX))
        if step.action == "wait" else step
        for step in scenario.steps)
    workload = {**scenario.workload, "messages_per_publisher": MESSAGES_PER_PUBLISHER, "drain_idle_s": 0.5}
    return replace(scenario, loop=1, steps=steps, workload=workload, publish_timeout_s=60.0)


class LeaderSpy:
    """The cluster, remembering every leader it reported (so a test can tell a leader target from a fallback)."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.leaders_reported: list[str | None] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self.cluster, name)

    def leader_of(self, queue: str) -> str | None:
        leader = self.cluster.leader_of(queue)
        self.leaders_reported.append(leader)
        return leader


@pytest.fixture(scope="module")
def cluster_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Environment]:
    with spawned_environment(3, data_dir=tmp_path_factory.mktemp("qq-cluster")) as env:
        yield env


def run_checked(scenario: Scenario, env: Environment) -> RunOutcome:
    outcome = run_scenario(scenario, env)
    print(report_text(report_json(scenario.name, outcome.result, outcome.records, {"drained": outcome.drained})))
    result = outcome.result
    assert outcome.drained and outcome.published_all
    assert result.lost == () and result.unexpected == ()
    assert result.unflagged_redeliveries == () and result.redelivered_after_settled_ack == ()
    assert result.order_violations == ()
    assert outcome.valid
    assert result.confirmed >= MORE_CONFIRMED_MAX
    return outcome


def faults_of(outcome: RunOutcome, kind: str) -> list[Fault]:
    return [r for r in outcome.records if isinstance(r, Fault) and r.kind == kind]


def test_kill_9_of_the_leader_loses_nothing_confirmed(cluster_env: Environment) -> None:
    assert isinstance(cluster_env.cluster, LocalCluster)
    spy = LeaderSpy(cluster_env.cluster)
    outcome = run_checked(shortened("qq-leader-kill"), replace(cluster_env, cluster=spy))  # type: ignore[arg-type]
    [kill] = faults_of(outcome, "kill")
    assert spy.leaders_reported[0] == kill.target  # the leader was found, not a random node
    assert [f.target for f in faults_of(outcome, "up")] == [kill.target]


def test_kill_9_of_a_follower_loses_nothing_confirmed(cluster_env: Environment) -> None:
    assert isinstance(cluster_env.cluster, LocalCluster)
    spy = LeaderSpy(cluster_env.cluster)
    outcome = run_checked(shortened("qq-follower-kill"), replace(cluster_env, cluster=spy))  # type: ignore[arg-type]
    [kill] = faults_of(outcome, "kill")
    assert spy.leaders_reported[0] is not None and kill.target != spy.leaders_reported[0]


def test_pause_of_the_leader_loses_nothing_confirmed(cluster_env: Environment) -> None:
    outcome = run_checked(shortened("qq-leader-pause"), cluster_env)
    assert [f.kind for f in outcome.records if isinstance(f, Fault) and f.kind in ("pause", "resume")] == [
        "pause", "resume"]


@pytest.mark.skipif(netns.available() is not None, reason=f"network namespaces: {netns.available()}")
def test_partition_isolating_the_leader_loses_nothing_confirmed(tmp_path: Path) -> None:
    with spawned_environment(3, use_netns=True, data_dir=tmp_path / "nodes") as env:
        assert isinstance(env.cluster, LocalCluster)
        spy = LeaderSpy(env.cluster)
        outcome = run_checked(shortened("qq-leader-partition"), replace(env, cluster=spy))  # type: ignore[arg-type]
    [partition] = faults_of(outcome, "partition")
    leader = spy.leaders_reported[0]
    assert leader is not None and partition.detail.count(leader) == 2  # cut off from both others


def test_shortened_keeps_the_faults() -> None:
    full, short = load_scenario("qq-leader-kill"), shortened("qq-leader-kill")
    assert [s.action for s in full.steps] == [s.action for s in short.steps] and short.loop == 1
    assert all(s.more_confirmed <= MORE_CONFIRMED_MAX for s in short.steps)
    assert Step("wait", seconds=3.0) in short.steps
