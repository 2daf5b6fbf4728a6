"""Scenario files, random schedules, target selection and the nemesis (on a fake cluster and our fault proxy)."""

from __future__ import annotations

import random

import pytest
import requests

from chaos.faultproxy.background import FaultProxyThread
from chaos.history import Fault, Publish
from chaos.mirror_run import parse_mirror
from chaos.nemesis import pick_targets
from chaos.scenario import (
    Nemesis,
    ScenarioError,
    Step,
    bundled_scenarios,
    load_scenario,
    parse_scenario,
    parse_step,
    random_scenario,
)
from chaos.workload import Recorder


class FakeCluster:
    def __init__(self, count: int = 5, leader: str | None = "n2") -> None:
        self.names = [f"n{i}" for i in range(1, count + 1)]
        self.leader = leader
        self.calls: list[tuple[str, str]] = []

    def nodes(self) -> list[str]:
        return list(self.names)

    def pid(self, node: str) -> int | None:
        return 100

    def url(self, node: str) -> str:
        return f"amqp://{node}"

    def kill(self, node: str) -> None:
        self.calls.append(("kill", node))

    def pause(self, node: str) -> None:
        self.calls.append(("pause", node))

    def resume(self, node: str) -> None:
        self.calls.append(("resume", node))

    def restart(self, node: str) -> None:
        self.calls.append(("restart", node))

    def leader_of(self, queue: str) -> str | None:
        return self.leader


class FakePartitioner:
    def __init__(self) -> None:
        self.blocked: set[frozenset[str]] | None = None

    def partition(self, blocked: set[frozenset[str]]) -> None:
        self.blocked = blocked

    def heal(self) -> None:
        self.blocked = None


def test_every_bundled_scenario_loads() -> None:
    names = bundled_scenarios()
    assert {"kill-9-loop", "kill-during-flush", "minority-pause", "rolling-restarts", "random-partitions",
            "latency-toxic"} <= set(names)
    for name in names:
        scenario = load_scenario(name)
        if scenario.mirror is not None:  # a mirrored-queue scenario: steps of its own (chaos/mirror_run.py)
            assert parse_mirror(scenario.mirror).steps
            continue
        assert scenario.steps and scenario.workload_config(("amqp://x",)).urls == ("amqp://x",)
    assert load_scenario("random-partitions").needs() == {"netns"}
    assert load_scenario("latency-toxic").needs() == {"toxiproxy"}
    assert load_scenario("kill-9-loop").workload_config(("u",)).queue_arguments == {"x-queue-type": "quorum"}


@pytest.mark.parametrize("text", [
    '[[steps]]\naction = "explode"',
    '[[steps]]\naction = "kill"\ntargte = "random"',
    '[[steps]]\naction = "partition"\nshape = "triangle"',
    '[[steps]]\naction = "toxic-add"',
    'loop = 100000\n[[steps]]\naction = "heal"',
])
def test_bad_scenarios_are_refused(text: str) -> None:
    with pytest.raises(ScenarioError):
        parse_scenario(text)


def test_bad_workload_option_is_refused() -> None:
    scenario = parse_scenario('[workload]\npublishrs = 3\n[[steps]]\naction = "heal"')
    with pytest.raises(ScenarioError):
        scenario.workload_config(("u",))
    with pytest.raises(ScenarioError):
        load_scenario("no-such-scenario")


def test_random_schedules_replay_from_their_seed_and_undo_every_fault() -> None:
    faults = ("kill", "pause", "partition")
    assert random_scenario(7, 6, 5, faults) == random_scenario(7, 6, 5, faults)
    assert random_scenario(7, 6, 5, faults).steps != random_scenario(8, 6, 5, faults).steps
    for seed in range(20):
        actions = [step.action for step in random_scenario(seed, 4, 5, faults).steps]
        assert actions.count("kill") == sum(1 for s in random_scenario(seed, 4, 5, faults).steps
                                            if s.action == "restart" and s.target == "down")
        assert actions.count("pause") == actions.count("resume")
        assert actions.count("partition") == actions.count("heal")


def test_targets() -> None:
    cluster = FakeCluster(5)
    rng = random.Random(1)
    assert pick_targets(cluster, "leader-of-queue", rng, "q") == ["n2"]
    assert len(pick_targets(FakeCluster(5, leader=None), "leader-of-queue", rng, "q")) == 1
    assert len(pick_targets(cluster, "minority", rng)) == 2
    assert len(pick_targets(cluster, "majority", rng)) == 3
    assert pick_targets(cluster, "all", rng) == cluster.names
    assert pick_targets(cluster, "n4", rng) == ["n4"]
    followers = {pick_targets(cluster, "follower-of-queue", random.Random(seed), "q")[0] for seed in range(30)}
    assert followers == {"n1", "n3", "n4", "n5"}
    with pytest.raises(ValueError):
        pick_targets(cluster, "n9", rng)


def test_nemesis_applies_steps_records_them_and_heals_everything() -> None:
    cluster, partitioner, recorder = FakeCluster(5), FakePartitioner(), Recorder()
    nemesis = Nemesis(cluster, recorder, random.Random(3), "q", partitioner)
    nemesis.apply(Step("kill", target="leader-of-queue"))
    nemesis.apply(Step("pause", target="n4"))
    nemesis.apply(Step("partition", shape="isolate"))
    assert cluster.calls == [("kill", "n2"), ("pause", "n4")]
    assert partitioner.blocked is not None and len(partitioner.blocked) == 4
    nemesis.heal_all()
    assert cluster.calls[2:] == [("resume", "n4"), ("restart", "n2")]
    assert partitioner.blocked is None
    kinds = [r.kind for r in recorder.records() if isinstance(r, Fault)]
    assert kinds == ["kill", "pause", "partition", "resume", "up", "heal"]


def test_isolate_partition_cuts_off_its_target_and_waits_count_more_confirms() -> None:
    cluster, partitioner, recorder = FakeCluster(3), FakePartitioner(), Recorder()
    nemesis = Nemesis(cluster, recorder, random.Random(0), "q", partitioner)
    nemesis.apply(parse_step({"action": "partition", "shape": "isolate", "target": "leader-of-queue"}))
    assert partitioner.blocked == {frozenset(("n2", "n1")), frozenset(("n2", "n3"))}
    for sequence in range(5):
        recorder.add(Publish("p", sequence, f"p-{sequence}", "q", "confirmed", 0.0, 1.0))
    nemesis.apply(Step("wait", confirmed=5, seconds=1.0))  # already there
    with pytest.raises(ScenarioError, match="fewer than 6"):
        nemesis.apply(parse_step({"action": "wait", "more_confirmed": 1, "seconds": 0.05}))


def test_partition_without_namespaces_is_a_clear_error() -> None:
    nemesis = Nemesis(FakeCluster(3), Recorder(), random.Random(0))
    with pytest.raises(ScenarioError, match="namespaces"):
        nemesis.apply(Step("partition"))
    with pytest.raises(ScenarioError, match="Toxiproxy"):
        nemesis.apply(Step("toxic-add", proxy="amqp", toxic={"type": "latency"}))


def test_toxic_steps_drive_a_toxiproxy_api() -> None:
    with FaultProxyThread() as fault_proxy:
        base = f"http://127.0.0.1:{fault_proxy.api_port}"
        assert requests.post(f"{base}/proxies", json={"name": "amqp", "upstream": "127.0.0.1:9"}).status_code == 201
        nemesis = Nemesis(FakeCluster(1), Recorder(), random.Random(0), toxiproxy_url=base)
        nemesis.apply(Step("toxic-add", proxy="amqp", toxic={"type": "latency", "attributes": {"latency": 50}}))
        toxics = requests.get(f"{base}/proxies/amqp/toxics").json()
        assert [t["name"] for t in toxics] == ["latency_downstream"]
        nemesis.heal_all()
        assert requests.get(f"{base}/proxies/amqp/toxics").json() == []


def test_node_settings_become_node_options_and_test_unsafe_ones_expect_loss() -> None:
    scenario = parse_scenario('[node_settings]\ntest_fsync_delay_ms = 20\ntest_unsafe_confirm_before_fsync = false\n'
                              '[[steps]]\naction = "heal"')
    assert scenario.node_args() == ("--test-fsync-delay-ms", "20", "--test-unsafe-confirm-before-fsync", "false")
    assert not scenario.expect_loss
    assert parse_scenario('[node_settings]\ntest_unsafe_confirm_before_commit = true').expect_loss
    with pytest.raises(ScenarioError, match="node setting"):
        parse_scenario('[node_settings]\n"--evil x" = 1')
    with pytest.raises(ScenarioError, match="node setting"):
        parse_scenario('[node_settings]\nlisten_address = ["a", "b"]')


def test_a_scenario_with_node_settings_is_refused_against_a_running_cluster() -> None:
    import argparse

    from chaos.cli import check_capabilities

    scenario = load_scenario("qq-unsafe-confirm-before-commit")
    args = argparse.Namespace(cluster_dir="/tmp/somewhere", urls=None, fault_proxy=False, toxiproxy=None,
                              netns=False)
    with pytest.raises(ScenarioError, match="node settings"):
        check_capabilities(args, scenario)
    check_capabilities(argparse.Namespace(**{**vars(args), "cluster_dir": None}), scenario)


def test_comma_separated_targets_name_several_nodes() -> None:
    cluster = FakeCluster(3)
    assert pick_targets(cluster, "n3,n2", random.Random(0)) == ["n2", "n3"]
    with pytest.raises(ValueError):
        pick_targets(cluster, "n2,n9", random.Random(0))


class FakeClusterRestartingTogether(FakeCluster):
    def restart_many(self, nodes: list[str]) -> None:
        self.calls.append(("restart_many", ",".join(nodes)))


def test_restart_of_several_nodes_starts_them_together_when_the_cluster_can() -> None:
    together, recorder = FakeClusterRestartingTogether(3), Recorder()
    nemesis = Nemesis(together, recorder, random.Random(0), "q")
    nemesis.apply(parse_step({"action": "kill", "target": "n2,n3"}))
    nemesis.apply(parse_step({"action": "restart", "target": "down"}))
    assert together.calls == [("kill", "n2"), ("kill", "n3"), ("restart_many", "n2,n3")]
    assert [(r.kind, r.target) for r in recorder.records() if isinstance(r, Fault) and r.kind == "up"] == [
        ("up", "n2"), ("up", "n3")]
    one_by_one = FakeCluster(3)
    Nemesis(one_by_one, Recorder(), random.Random(0)).apply(Step("restart", target="n1,n3"))
    assert one_by_one.calls == [("restart", "n1"), ("restart", "n3")]


def test_wait_for_a_queue_leader() -> None:
    recorder = Recorder()
    Nemesis(FakeCluster(3, leader="n3"), recorder, random.Random(0), "q").apply(
        parse_step({"action": "wait", "queue_leader": True, "seconds": 1}))
    assert [(r.kind, r.target) for r in recorder.records() if isinstance(r, Fault)] == [("leader", "n3")]
    with pytest.raises(ScenarioError, match="no leader"):
        Nemesis(FakeCluster(3, leader=None), Recorder(), random.Random(0), "q").apply(
            Step("wait", queue_leader=True, seconds=0.05))
