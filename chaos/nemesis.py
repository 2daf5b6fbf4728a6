"""Process faults against real nodes: the `Cluster` protocol, a local implementation, and target selection.

How it works: `Cluster` is what the nemesis needs from a deployment — node names, pids, kill -9, SIGSTOP/SIGCONT,
restart, and the leader of a queue when the deployment knows it. `LocalCluster` implements it over the state file
`raftmq cluster up` writes (<data-dir>/cluster.json, deploy/runner.py) — restart starts the same `raftmq node`
command again on the same address and data directory — and can also spawn its own nodes (tests), writing the same
state file and, with `clustered`, the same per-node cluster configs (`deploy.node_plan.write_node_configs`: every node
named in cluster_nodes, one secret), so spawned nodes form one cluster with quorum queues. The leader of a queue
comes from the nodes' management API (`/api/queues`, as `raftmq cluster status` reads it): every live, unpaused
node is asked and the leader most of them name wins (a partitioned old leader may still believe it leads).
`pick_targets` turns a target spec (leader-of-queue, follower-of-queue, random, minority, majority, all, a node
name, a comma-separated list of names) into node names with a seeded random.Random, so a schedule replays exactly.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import time
from collections import Counter
from dataclasses import asdict, replace
from pathlib import Path
from typing import Protocol

from chaos.netns import NetLab
from deploy.healthcheck import answers_amqp
from deploy.node_plan import PROMETHEUS_PORT_OFFSET, NodePlan, offset_port, plan_ports, write_node_configs
from deploy.node_plan import node_command as runner_node_command
from deploy.runner import NodeProcess, pid_alive, queues_from_management

STATE_FILE_NAME = "cluster.json"
READY_TIMEOUT_S = 30.0
STOP_GRACE_S = 10.0
MANAGEMENT_TIMEOUT_S = 2.0


class Cluster(Protocol):
    def nodes(self) -> list[str]: ...
    def pid(self, node: str) -> int | None: ...
    def url(self, node: str) -> str: ...
    def kill(self, node: str) -> None: ...
    def pause(self, node: str) -> None: ...
    def resume(self, node: str) -> None: ...
    def restart(self, node: str) -> None: ...
    def leader_of(self, queue: str) -> str | None: ...


NodeSpec = NodeProcess
"""One node as deploy/runner.py records it in cluster.json."""


def node_command(spec: NodeSpec, extra_args: tuple[str, ...] = ()) -> list[str]:
    """The command deploy/runner.py starts a node with (the same function, so a restart is the same node)."""
    return runner_node_command(spec.name, spec.host, spec.port, spec.data_dir, extra_args)


def node_plan(spec: NodeSpec) -> NodePlan:
    """The node as deploy/runner.py plans it (its other ports derived from the AMQP port the same way)."""
    ports = plan_ports(spec.port)
    return NodePlan(spec.name, spec.host, spec.port, ports["management"], ports["raft"], ports["metadata"],
                    prometheus_port=offset_port(spec.port, PROMETHEUS_PORT_OFFSET))


class LocalCluster:
    """Nodes on this machine, from cluster.json or spawned here; signals go straight to their pids."""

    def __init__(self, data_dir: Path, specs: list[NodeSpec], extra_args: tuple[str, ...] = (),
                 prefixes: dict[str, list[str]] | None = None,
                 node_args: dict[str, tuple[str, ...]] | None = None) -> None:
        self.data_dir = data_dir
        self._specs = {spec.name: spec for spec in specs}
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        self._extra_args = extra_args
        self._prefixes = prefixes or {}
        self._node_args = node_args or {}  # one node's own `raftmq node` options, after extra_args
        self._other_state: dict[str, object] = {"haproxy_pid": None, "haproxy_port": None,
                                                "haproxy_config": None, "haproxy_log": None}
        self._from_runner = False
        self._paused: set[str] = set()

    @classmethod
    def from_state_file(cls, data_dir: Path) -> LocalCluster:
        raw = json.loads((data_dir / STATE_FILE_NAME).read_text())
        cluster = cls(data_dir, [NodeSpec(**node) for node in raw.pop("nodes")])
        cluster._other_state = raw  # HAProxy and anything else the runner records is kept on rewrite
        cluster._from_runner = True
        return cluster

    @classmethod
    def spawn(cls, data_dir: Path, count: int, base_port: int, extra_args: tuple[str, ...] = (),
              netlab: NetLab | None = None, clustered: bool = False, prefix: str = "rmq",
              node_args: dict[str, tuple[str, ...]] | None = None) -> LocalCluster:
        """Start `count` nodes on 127.0.0.1:base_port+i (i from 1), or each in its namespace of `netlab` on its
        own address and base_port, and wait until they answer AMQP. `clustered`: one cluster (cluster mode).
        Nodes are named `prefix`1..N (several clusters side by side need distinct names: a cluster's name, which
        federation's loop check compares, is made of its nodes' names). `node_args`: a node's own options."""
        names = [f"{prefix}{i}" for i in range(1, count + 1)]
        hosts = {name: netlab.address(name) if netlab else "127.0.0.1" for name in names}
        prefixes = {name: netlab.exec_argv(name, []) for name in names} if netlab else {}
        specs = [NodeSpec(name, hosts[name], base_port if netlab else base_port + i, 0, str(data_dir / name),
                          str(data_dir / f"{name}.log")) for i, name in enumerate(names, start=1)]
        if clustered:
            data_dir.mkdir(parents=True, exist_ok=True)
            plans = [node_plan(spec) for spec in specs]
            write_node_configs(data_dir, plans, cluster=True)
            specs = [replace(spec, management_port=plan.management_port) for spec, plan in zip(specs, plans,
                                                                                                strict=True)]
        cluster = cls(data_dir, specs, extra_args, prefixes, node_args)
        cluster._from_runner = clustered
        try:
            for spec in specs:
                cluster._start(spec.name)
            cluster.wait_ready(cluster.nodes())
        except BaseException:
            cluster.stop_all()
            raise
        return cluster

    def nodes(self) -> list[str]:
        return sorted(self._specs)

    def haproxy_url(self) -> str | None:
        """The HAProxy in front of the nodes, when `raftmq cluster up` started one."""
        port = self._other_state.get("haproxy_port")
        return f"amqp://guest:guest@127.0.0.1:{port}/%2F" if isinstance(port, int) else None

    def spec(self, node: str) -> NodeSpec:
        return self._specs[node]

    def pid(self, node: str) -> int | None:
        pid = self._specs[node].pid
        return pid if pid_alive(pid) else None

    def url(self, node: str) -> str:
        spec = self._specs[node]
        return f"amqp://guest:guest@{spec.host}:{spec.port}/%2F"

    def management_address(self, node: str) -> tuple[str, int]:
        spec = self._specs[node]
        return spec.host, spec.management_port or plan_ports(spec.port)["management"]

    def leader_of(self, queue: str) -> str | None:
        """A one-node deployment's only node leads everything; in a cluster the leader most live, unpaused nodes
        name for the queue in their /api/queues; None when none names one (or the nodes are not clustered)."""
        if len(self._specs) == 1:
            return self.nodes()[0]
        if not self._from_runner:
            return None
        votes = Counter(leader for node in self.nodes() if (leader := self.leader_seen_by(node, queue)))
        return votes.most_common(1)[0][0] if votes else None

    def leader_seen_by(self, node: str, queue: str) -> str | None:
        if node in self._paused or self.pid(node) is None:
            return None
        rows = queues_from_management(*self.management_address(node), timeout_s=MANAGEMENT_TIMEOUT_S) or []
        for row in rows:
            if row.get("name") == queue and row.get("leader") in self._specs:
                return str(row["leader"])
        return None

    def kill(self, node: str) -> None:
        self._signal(node, signal.SIGKILL)
        self._reap(node, wait_s=5.0)
        self._paused.discard(node)

    def pause(self, node: str) -> None:
        self._signal(node, signal.SIGSTOP)
        self._paused.add(node)

    def resume(self, node: str) -> None:
        self._signal(node, signal.SIGCONT)
        self._paused.discard(node)

    def restart(self, node: str) -> None:
        """Kill -9 if still running, then start the same command again and wait until it answers AMQP."""
        if self.pid(node) is not None:
            self.kill(node)
        self._start(node)
        self.wait_ready([node])

    def restart_many(self, nodes: list[str]) -> None:
        """Restart several nodes at once: kill -9 those still running, start them all, then wait until each answers
        AMQP (a node of a cluster that has lost its majority may only answer once the others are back too)."""
        for node in nodes:
            if self.pid(node) is not None:
                self.kill(node)
        for node in nodes:
            self._start(node)
        self.wait_ready(nodes)

    def stop_all(self) -> None:
        """SIGCONT (a paused node cannot exit), SIGTERM, then SIGKILL after a grace period."""
        live = [name for name in self.nodes() if self.pid(name) is not None]
        for name in live:
            self._signal(name, signal.SIGCONT)
            self._signal(name, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline and any(self.pid(name) for name in live):
            for name in live:
                self._reap(name, wait_s=0.0)
            time.sleep(0.05)
        for name in live:
            if self.pid(name) is not None:
                self.kill(name)

    def wait_ready(self, nodes: list[str], timeout_s: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        for node in nodes:
            spec = self._specs[node]
            while not answers_amqp(spec.host, spec.port, timeout_s=1.0):
                if time.monotonic() > deadline or self.pid(node) is None:
                    raise RuntimeError(f"node {node} did not come up; see {spec.log}:\n{log_tail(spec.log)}")
                time.sleep(0.05)

    def _start(self, node: str) -> None:
        spec = self._specs[node]
        Path(spec.data_dir).mkdir(parents=True, exist_ok=True)
        with open(spec.log, "ab") as log:
            argv = [*self._prefixes.get(node, []),
                    *node_command(spec, self._extra_args + self._node_args.get(node, ()))]
            child = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        self._children[node] = child
        self._specs[node] = replace(spec, pid=child.pid)
        self._save_state()

    def _save_state(self) -> None:
        state = {"nodes": [asdict(spec) for spec in self._specs.values()], **self._other_state}
        self.data_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.data_dir / (STATE_FILE_NAME + ".chaos.tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.data_dir / STATE_FILE_NAME)

    def _signal(self, node: str, signum: signal.Signals) -> None:
        pid = self.pid(node)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def _reap(self, node: str, wait_s: float) -> None:
        child = self._children.get(node)
        if child is None:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=wait_s) if wait_s > 0 else child.poll()


LOG_TAIL_BYTES = 2000


def log_tail(path: str) -> str:
    """The end of a node's log (for error messages), or why it cannot be read."""
    try:
        with open(path, "rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - LOG_TAIL_BYTES))
            return log.read().decode(errors="replace")
    except OSError as error:
        return f"(log unreadable: {error})"


TARGET_KINDS = ("leader-of-queue", "follower-of-queue", "random", "minority", "majority", "all")


def pick_targets(cluster: Cluster, target: str, rng: random.Random, queue: str | None = None) -> list[str]:
    """Node names for a target spec; a name that is not a kind must be a node name."""
    nodes = cluster.nodes()
    shuffled = rng.sample(nodes, len(nodes))
    if target == "leader-of-queue":
        leader = cluster.leader_of(queue) if queue else None
        return [leader] if leader else shuffled[:1]
    if target == "follower-of-queue":
        leader = cluster.leader_of(queue) if queue else None
        return [node for node in shuffled if node != leader][:1]
    if target == "random":
        return shuffled[:1]
    if target == "minority":
        return sorted(shuffled[:max(1, (len(nodes) - 1) // 2)])
    if target == "majority":
        return sorted(shuffled[:len(nodes) // 2 + 1])
    if target == "all":
        return nodes
    if target in nodes:
        return [target]
    named = [name.strip() for name in target.split(",")]
    if len(named) > 1 and all(name in nodes for name in named):
        return sorted(set(named))
    raise ValueError(f"unknown target {target!r}: expected one of {TARGET_KINDS}, a node in {nodes} "
                     "or a comma-separated list of them")
