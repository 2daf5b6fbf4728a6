"""Clusters under test for workload (b): their nodes, where a quorum queue's leader and replicas are, and the
plan of a private 3-node RabbitMQ cluster on loopback.

A cluster handle (`QueueCluster`) names its nodes (name + AMQP endpoint) and answers `placement(queue)`: the
queue's leader node and members, or None while unknown. raftmq's leader comes from the nodes' "cluster: queue
<group>: leader <node>" log lines (the Raft leader each node knows; a majority of nodes must agree), its members
from `raftmq cluster status --json` (the management API; its `leader` column falls back to the *planned* leader
of the metadata while Raft has not elected one, so it is not used for the leader); RabbitMQ's answer from
`rabbitmqctl list_queues name leader members --formatter json`. The parsers
here are pure (text in, placement out) so they are unit-tested without brokers; `bench.brokers` runs the commands.

The RabbitMQ plan (`plan_rabbit_nodes`, `rabbit_node_env`, `join_steps`, `running_nodes`) is what
`bench.brokers.rabbitmq_cluster` executes: every node a distinct RABBITMQ_NODENAME, AMQP port, distribution port
and data/log dir; one Erlang cookie (HOME) and epmd port shared by the cluster's nodes; nodes 2.. join node 1 with
stop_app / join_cluster / start_app; the cluster counts only when `cluster_status` lists every node as running.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import quote

from bench.client import Endpoint

LEADER_LINE = re.compile(r"cluster: queue (\S+): leader (\S+)")
RAFTMQ_PORT_OFFSETS = (10_000, 20_000, 21_000, 22_000)  # a raftmq node's management, Raft, metadata and mirror ports


@dataclass(frozen=True, slots=True)
class ClusterNode:
    name: str
    endpoint: Endpoint


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a replicated queue lives: its leader's node name and every member's."""

    leader: str
    members: tuple[str, ...]


class QueueCluster(Protocol):
    @property
    def nodes(self) -> tuple[ClusterNode, ...]: ...

    def placement(self, queue: str) -> Placement | None: ...


# --- raftmq ---------------------------------------------------------------------------------------------------


def raftmq_group_id(vhost: str, queue: str) -> str:
    """docs/cluster.md: "q/" + vhost + "/" + name, with "/" and "%" percent-escaped in both parts."""
    return "q/" + quote(vhost, safe="") + "/" + quote(queue, safe="")


def raftmq_placement_from_status(status_json: str, queue: str, vhost: str = "/") -> Placement | None:
    """The queue's placement from `raftmq cluster status --json` output; None when absent or leaderless."""
    try:
        report = json.loads(status_json)
    except ValueError:
        return None
    queues = report.get("queues") if isinstance(report, dict) else None
    for row in queues if isinstance(queues, list) else []:
        if isinstance(row, dict) and row.get("name") == queue and row.get("vhost", "/") == vhost:
            leader, members = row.get("leader"), row.get("members")
            if isinstance(leader, str) and leader and isinstance(members, list):
                return Placement(leader, tuple(str(member) for member in members))
    return None


def raftmq_leader_from_logs(logs: Mapping[str, str], queue: str, vhost: str = "/", agree_min: int = 1) -> str | None:
    """The leader most nodes last logged for the queue's group (a node's last line is its current view), if at
    least `agree_min` nodes name it."""
    group = raftmq_group_id(vhost, queue)
    views: list[str] = []
    for text in logs.values():
        found = [leader for logged_group, leader in LEADER_LINE.findall(text) if logged_group == group]
        if found and found[-1] != "None":
            views.append(found[-1])
    if not views:
        return None
    leader, agreeing = Counter(views).most_common(1)[0]
    return leader if agreeing >= agree_min else None


def raftmq_ports_free(base_port: int, count: int, binds: Callable[[int], bool]) -> bool:
    """True when nodes base+1..base+count and each one's derived ports (+offsets, or -offsets past 65535, as
    `raftmq cluster up` plans them) can all be bound and no node's port is another node's derived port."""
    ports: list[int] = []
    for index in range(1, count + 1):
        port = base_port + index
        ports.append(port)
        ports += [port + offset if port + offset <= 65535 else port - offset for offset in RAFTMQ_PORT_OFFSETS]
    if len(set(ports)) != len(ports) or not all(0 < port <= 65535 for port in ports):
        return False
    return all(binds(port) for port in ports)


# --- RabbitMQ -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RabbitNodePlan:
    """One RabbitMQ node of a private loopback cluster."""

    name: str  # RABBITMQ_NODENAME, e.g. raftmqbench123x45n0@localhost
    amqp_port: int
    dist_port: int
    directory: Path  # mnesia, logs, pid file, stdout

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint("127.0.0.1", self.amqp_port)


def plan_rabbit_nodes(root: Path, tag: str, count: int, free_port: Callable[[], int]) -> list[RabbitNodePlan]:
    """`count` nodes with unique names, ports (no port used twice) and directories under `root`."""
    used: set[int] = set()

    def fresh_port() -> int:
        for _ in range(100):
            port = free_port()
            if port not in used:
                used.add(port)
                return port
        raise RuntimeError("no distinct free port found")

    return [
        RabbitNodePlan(f"{tag}n{index}@localhost", fresh_port(), fresh_port(), root / f"n{index}")
        for index in range(count)
    ]


def rabbit_node_env(base: Mapping[str, str], plan: RabbitNodePlan) -> dict[str, str]:
    """The environment of one node: the cluster's shared `base` (HOME with the cookie, epmd port, no config or
    plugins) plus this node's name, ports and directories."""
    env = dict(base)
    env.update(
        RABBITMQ_NODENAME=plan.name, RABBITMQ_NODE_PORT=str(plan.amqp_port), RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
        RABBITMQ_DIST_PORT=str(plan.dist_port), RABBITMQ_MNESIA_BASE=str(plan.directory / "mnesia"),
        RABBITMQ_LOG_BASE=str(plan.directory / "log"), RABBITMQ_PID_FILE=str(plan.directory / "pid"),
    )
    return env


def join_steps(seed: str) -> list[tuple[str, ...]]:
    """rabbitmqctl commands (in order) that make a freshly started node join the seed node's cluster."""
    return [("stop_app",), ("join_cluster", seed), ("start_app",)]


def running_nodes(cluster_status_json: str) -> list[str]:
    """`rabbitmqctl cluster_status --formatter json` -> the running node names ([] when unreadable)."""
    try:
        status = json.loads(cluster_status_json)
    except ValueError:
        return []
    running = status.get("running_nodes", []) if isinstance(status, dict) else []
    return [str(node) for node in running] if isinstance(running, list) else []


def rabbit_placement(list_queues_json: str, queue: str) -> Placement | None:
    """`rabbitmqctl list_queues name leader members --formatter json` -> the queue's placement, or None."""
    try:
        rows = json.loads(list_queues_json)
    except ValueError:
        return None
    for row in rows if isinstance(rows, list) else []:
        if isinstance(row, dict) and row.get("name") == queue:
            leader, members = row.get("leader"), row.get("members")
            if isinstance(leader, str) and leader and isinstance(members, list):
                return Placement(leader, tuple(str(member) for member in members))
    return None


# --- layouts ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClientNodes:
    """Which node the publisher and the consumer connect to, and why."""

    publisher: ClusterNode
    consumer: ClusterNode
    description: str


def spread_layout(nodes: Sequence[ClusterNode], placement: Placement) -> ClientNodes:
    """Publisher and consumer on two different nodes that are not the leader (every node then works: the leader
    replicates, one follower takes the publishes, the other serves the consumer), or the leader for the consumer
    when there are only two nodes."""
    followers = [node for node in nodes if node.name != placement.leader]
    leader = _node(nodes, placement.leader)
    if not followers:
        raise ValueError("a spread layout needs at least two nodes")
    consumer = followers[1] if len(followers) > 1 else leader
    return ClientNodes(followers[0], consumer, _describe(followers[0], consumer, placement))


def leader_layout(nodes: Sequence[ClusterNode], placement: Placement) -> ClientNodes:
    leader = _node(nodes, placement.leader)
    return ClientNodes(leader, leader, _describe(leader, leader, placement))


def _node(nodes: Sequence[ClusterNode], name: str) -> ClusterNode:
    for node in nodes:
        if node.name == name:
            return node
    raise ValueError(f"leader {name!r} is not one of the cluster's nodes {[node.name for node in nodes]}")


def _describe(publisher: ClusterNode, consumer: ClusterNode, placement: Placement) -> str:
    def role(node: ClusterNode) -> str:
        return "leader" if node.name == placement.leader else "follower"

    return (f"publisher on {publisher.name} ({role(publisher)}), consumer on {consumer.name} ({role(consumer)});"
            f" leader {placement.leader}, {len(placement.members)} replicas")
