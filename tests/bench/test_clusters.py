"""Workload (b)'s cluster logic without brokers: the RabbitMQ cluster plan (names, ports, dirs, shared cookie and
epmd), the join sequence and its failure reports (with a fake rabbitmqctl), placement parsing for raftmq and
RabbitMQ, the client layouts, the raftmq port plan and waiting for a queue's placement."""

from __future__ import annotations

import itertools
import json
import subprocess
from pathlib import Path

import pytest

from bench.brokers import BrokerStartError, RabbitCluster, form_cluster
from bench.client import Endpoint
from bench.clusters import (
    ClusterNode,
    Placement,
    join_steps,
    leader_layout,
    plan_rabbit_nodes,
    rabbit_node_env,
    rabbit_placement,
    raftmq_group_id,
    raftmq_leader_from_logs,
    raftmq_placement_from_status,
    raftmq_ports_free,
    running_nodes,
    spread_layout,
)
from bench.quorum import PlacementError, leader_moved, wait_placement

NODES = tuple(ClusterNode(f"rmq{i}", Endpoint("127.0.0.1", 5000 + i)) for i in (1, 2, 3))


class FakeCtl:
    """Records rabbitmqctl calls; answers from a table (node, first arg) -> (returncode, stdout, stderr)."""

    def __init__(self, answers: dict[tuple[str, str], tuple[int, str, str]] | None = None) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.answers = answers or {}

    def __call__(self, node: str, *args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
        self.calls.append((node, *args))
        key = (node, next(arg for arg in args if arg != "-q"))
        code, out, err = self.answers.get(key, (0, "", ""))
        return subprocess.CompletedProcess([node, *args], code, out, err)


# --- RabbitMQ plan ------------------------------------------------------------------------------------------


def test_rabbit_nodes_get_unique_names_ports_and_directories(tmp_path: Path) -> None:
    ports = itertools.chain([6000, 6000, 6001], itertools.count(6002))  # a repeated free port is skipped
    plans = plan_rabbit_nodes(tmp_path, "tag", 3, lambda: next(ports))
    assert [plan.name for plan in plans] == ["tagn0@localhost", "tagn1@localhost", "tagn2@localhost"]
    all_ports = [port for plan in plans for port in (plan.amqp_port, plan.dist_port)]
    assert len(set(all_ports)) == 6
    assert len({plan.directory for plan in plans}) == 3
    assert all(plan.directory.parent == tmp_path for plan in plans)
    assert plans[0].endpoint == Endpoint("127.0.0.1", plans[0].amqp_port)


def test_rabbit_node_env_keeps_the_shared_cookie_and_epmd_and_sets_its_own_node(tmp_path: Path) -> None:
    shared = {"HOME": "/cluster/home", "ERL_EPMD_PORT": "4400", "RABBITMQ_NODENAME": "stale@elsewhere"}
    plans = plan_rabbit_nodes(tmp_path, "t", 2, iter(range(7000, 7100)).__next__)
    envs = [rabbit_node_env(shared, plan) for plan in plans]
    for env, plan in zip(envs, plans, strict=True):
        assert env["HOME"] == "/cluster/home" and env["ERL_EPMD_PORT"] == "4400"
        assert env["RABBITMQ_NODENAME"] == plan.name
        assert env["RABBITMQ_NODE_PORT"] == str(plan.amqp_port)
        assert env["RABBITMQ_DIST_PORT"] == str(plan.dist_port)
        assert env["RABBITMQ_MNESIA_BASE"].startswith(str(plan.directory))
        assert env["RABBITMQ_LOG_BASE"].startswith(str(plan.directory))
    assert shared["RABBITMQ_NODENAME"] == "stale@elsewhere"  # the shared base is not modified


def test_form_cluster_joins_every_other_node_to_the_first_then_checks_the_members() -> None:
    names = ["a@localhost", "b@localhost", "c@localhost"]
    ctl = FakeCtl({("a@localhost", "cluster_status"): (0, json.dumps({"running_nodes": names[::-1]}), "")})
    form_cluster(ctl, names)
    joins = [(node, *args) for node in names[1:] for args in join_steps("a@localhost")]
    assert ctl.calls[:-1] == joins
    assert ctl.calls[-1][:3] == ("a@localhost", "-q", "cluster_status")


def test_form_cluster_of_one_node_runs_nothing() -> None:
    ctl = FakeCtl()
    form_cluster(ctl, ["solo@localhost"])
    assert ctl.calls == []


def test_form_cluster_reports_the_failed_step() -> None:
    ctl = FakeCtl({("b@localhost", "join_cluster"): (69, "", "Error: unable to connect to node a@localhost")})
    with pytest.raises(BrokerStartError, match=r"join_cluster a@localhost on b@localhost.*unable to connect"):
        form_cluster(ctl, ["a@localhost", "b@localhost"])
    assert ("b@localhost", "start_app") not in ctl.calls


def test_form_cluster_fails_when_a_node_is_not_running() -> None:
    status = json.dumps({"running_nodes": ["a@localhost"]})
    ctl = FakeCtl({("a@localhost", "cluster_status"): (0, status, "")})
    with pytest.raises(BrokerStartError, match="runs"):
        form_cluster(ctl, ["a@localhost", "b@localhost"])


def test_running_nodes_tolerates_garbage() -> None:
    assert running_nodes("not json") == []
    assert running_nodes("[1, 2]") == []
    assert running_nodes(json.dumps({"running_nodes": "x"})) == []
    assert running_nodes(json.dumps({"running_nodes": ["a@h"]})) == ["a@h"]


# --- placement ----------------------------------------------------------------------------------------------


def test_rabbit_placement_from_list_queues_json() -> None:
    rows = [{"name": "other", "leader": "x@h", "members": ["x@h"]},
            {"name": "q", "leader": "b@h", "members": ["a@h", "b@h", "c@h"]}]
    assert rabbit_placement(json.dumps(rows), "q") == Placement("b@h", ("a@h", "b@h", "c@h"))
    assert rabbit_placement(json.dumps(rows), "missing") is None
    assert rabbit_placement(json.dumps([{"name": "q", "leader": "", "members": []}]), "q") is None
    assert rabbit_placement("Error: timeout", "q") is None


def test_rabbit_cluster_asks_the_first_node_for_placement() -> None:
    rows = json.dumps([{"name": "q", "leader": "b@h", "members": ["a@h", "b@h"]}])
    ctl = FakeCtl({("a@h", "list_queues"): (0, rows, "")})
    nodes = (ClusterNode("a@h", Endpoint("127.0.0.1", 1)), ClusterNode("b@h", Endpoint("127.0.0.1", 2)))
    cluster = RabbitCluster(nodes, ctl)
    assert cluster.placement("q") == Placement("b@h", ("a@h", "b@h"))
    assert cluster.endpoints == [Endpoint("127.0.0.1", 1), Endpoint("127.0.0.1", 2)]


def test_raftmq_placement_from_cluster_status() -> None:
    status = {"running": True, "queues": [
        {"name": "q", "vhost": "other", "leader": "rmq1", "members": ["rmq1"]},
        {"name": "q", "vhost": "/", "type": "quorum", "leader": "rmq3", "members": ["rmq1", "rmq2", "rmq3"]},
    ]}
    assert raftmq_placement_from_status(json.dumps(status), "q") == Placement("rmq3", ("rmq1", "rmq2", "rmq3"))
    assert raftmq_placement_from_status(json.dumps({"queues": []}), "q") is None
    assert raftmq_placement_from_status("", "q") is None


def test_raftmq_group_id_escapes_slash_and_percent() -> None:
    assert raftmq_group_id("/", "bench-b") == "q/%2F/bench-b"
    assert raftmq_group_id("v/h", "a%b") == "q/v%2Fh/a%25b"


def test_raftmq_leader_from_logs_takes_each_nodes_last_view_and_the_majority() -> None:
    line = "2026-11-22 INFO raftmq.cluster: cluster: queue {group}: leader {leader}\n"
    group = raftmq_group_id("/", "q")
    logs = {
        "rmq1": line.format(group=group, leader="rmq1") + line.format(group=group, leader="rmq2"),
        "rmq2": line.format(group=group, leader="rmq2"),
        "rmq3": line.format(group=group, leader="rmq1") + line.format(group="q/%2F/other", leader="rmq3"),
    }
    assert raftmq_leader_from_logs(logs, "q") == "rmq2"
    assert raftmq_leader_from_logs(logs, "q", agree_min=2) == "rmq2"
    assert raftmq_leader_from_logs(logs, "q", agree_min=3) is None  # rmq3 still names rmq1
    assert raftmq_leader_from_logs({"rmq1": line.format(group=group, leader="None")}, "q") is None
    assert raftmq_leader_from_logs({}, "q") is None


def test_raftmq_ports_free_checks_derived_ports_and_collisions() -> None:
    assert raftmq_ports_free(4000, 3, lambda port: True)
    assert not raftmq_ports_free(4000, 3, lambda port: port != 24002)  # node 2's Raft port is taken
    assert not raftmq_ports_free(65533, 3, lambda port: True)  # node 3 would be on 65536
    # a node's derived port landing on another node's port: 10000 apart with offsets of 10000
    assert not raftmq_ports_free(0, 10_001, lambda port: True)


# --- layouts ------------------------------------------------------------------------------------------------


def test_spread_layout_puts_publisher_and_consumer_on_the_two_followers() -> None:
    clients = spread_layout(NODES, Placement("rmq2", ("rmq1", "rmq2", "rmq3")))
    assert (clients.publisher.name, clients.consumer.name) == ("rmq1", "rmq3")
    assert "publisher on rmq1 (follower)" in clients.description
    assert "consumer on rmq3 (follower)" in clients.description
    assert "leader rmq2, 3 replicas" in clients.description


def test_spread_layout_with_two_nodes_uses_the_leader_for_the_consumer() -> None:
    clients = spread_layout(NODES[:2], Placement("rmq1", ("rmq1", "rmq2")))
    assert (clients.publisher.name, clients.consumer.name) == ("rmq2", "rmq1")


def test_leader_layout_and_an_unknown_leader() -> None:
    clients = leader_layout(NODES, Placement("rmq3", ("rmq1", "rmq2", "rmq3")))
    assert (clients.publisher.name, clients.consumer.name) == ("rmq3", "rmq3")
    with pytest.raises(ValueError, match="not one of"):
        leader_layout(NODES, Placement("elsewhere", ()))


# --- waiting for placement -----------------------------------------------------------------------------------


class ScriptedCluster:
    def __init__(self, answers: list[Placement | None]) -> None:
        self.answers = answers
        self.asked = 0

    @property
    def nodes(self) -> tuple[ClusterNode, ...]:
        return NODES

    def placement(self, queue: str) -> Placement | None:
        self.asked += 1
        return self.answers[min(self.asked, len(self.answers)) - 1]


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def sleep(self, seconds: float) -> None:
        self.now_s += seconds

    def __call__(self) -> float:
        return self.now_s


def test_wait_placement_waits_for_all_replicas() -> None:
    full = Placement("rmq1", ("rmq1", "rmq2", "rmq3"))
    cluster = ScriptedCluster([None, Placement("rmq1", ("rmq1",)), full])
    clock = FakeClock()
    assert wait_placement(cluster, "q", 3, timeout_s=10, sleep=clock.sleep, clock=clock) == full
    assert cluster.asked == 3


def test_wait_placement_refuses_too_few_replicas_and_no_leader() -> None:
    clock = FakeClock()
    with pytest.raises(PlacementError, match="1 replicas"):
        wait_placement(ScriptedCluster([Placement("rmq1", ("rmq1",))]), "q", 3, 5, clock.sleep, clock)
    with pytest.raises(PlacementError, match="no leader"):
        wait_placement(ScriptedCluster([None]), "q", 3, 5, clock.sleep, clock)


def test_wait_placement_accepts_a_leader_with_unknown_members_at_the_deadline() -> None:
    clock = FakeClock()
    leader_only = Placement("rmq2", ())
    assert wait_placement(ScriptedCluster([leader_only]), "q", 3, 5, clock.sleep, clock) == leader_only


def test_leader_moved_notes_an_election_during_the_run() -> None:
    before = Placement("rmq1", ("rmq1", "rmq2", "rmq3"))
    assert leader_moved(before, before) == ""
    assert leader_moved(before, Placement("rmq3", before.members)) == "; LEADER MOVED to rmq3 during the run"
    assert "unknown" in leader_moved(before, None)
