"""Start, signal and stop a 3-node raftmq cluster behind a real HAProxy: the integration tests' cluster mode.

It is put together as `raftmq cluster up` does it (deploy/runner.py): one config file per node, written by
`deploy.node_plan.node_config_text` (management port, `cluster_nodes` naming every member, the cluster secret
generated into <workdir>/cluster_secret), each node started with `deploy.node_plan.node_command`, and HAProxy on the
config `deploy.topology.haproxy_cfg` renders (AMQP health checks, leastconn). Two differences, both for tests: each
node's config also holds `nodeproc.TEST_CONFIG_TOML` (the test users and vhosts, SIGUSR1/SIGUSR2 alarms), and the
ports are picked free on loopback (AMQP ports below 11000 whose derived ports bind, as tests/cluster does), so
sessions on one machine do not collide. Clients connect to HAProxy (`host`, `port`); `start()` returns once every
node answers AMQP, HAProxy passes a handshake, and every test user can open its vhost on every node (the users
reach a node through the replicated metadata, not at once).

`ClusterProcess` offers what `nodeproc.NodeProcess` offers to the tests (`send_signal`, `stop`, `wait_exit`,
`start`, `restart`, `log_tail`), applied to every node: a signal goes to every node, `stop` stops them all, and an
exit code is 0 only when every node exited 0. HAProxy keeps its port across node restarts. `set_memory_alarm`
forces the alarm on or off on every node and checks each node's log for the result (SIGUSR1 only toggles it).
With `tls=True` it is put together as `raftmq cluster up --tls`: certificates in <workdir>/tls
(`node_plan.ensure_test_pki`), an amqps listener per node (`node_plan.tls_settings`) and an HAProxy amqps frontend on
`tls_port` passing TLS through to them (no PROXY protocol here, as for the plain frontend).
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pika
import pika.exceptions

from deploy import node_plan, runner
from deploy import topology as topo
from deploy.healthcheck import answers_amqp
from tests.cluster.cluster_proc import free_amqp_ports, free_port
from tests.integration.nodeproc import (
    LIMITED_USER,
    PRIVATE_USER,
    PRIVATE_VHOST,
    REPO_ROOT,
    STOP_TIMEOUT_S,
    TEST_CONFIG_TOML,
)

ALARM_LINE = re.compile(rb"alarm memory (set|cleared)")
ALARM_TIMEOUT_S = 10.0
START_TIMEOUT_S = 90.0  # three nodes on a loaded 2-core machine, then the users' replication


@dataclass
class _Node:
    plan: node_plan.NodePlan
    data_dir: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None = None


@dataclass
class ClusterProcess:
    """`size` cluster nodes (rmq1..) and an HAProxy in front; `start()` blocks until the cluster serves."""

    workdir: Path
    size: int = 3
    extra_config: str = ""  # more top-level TOML settings for every node
    config_toml: str = TEST_CONFIG_TOML  # the test settings and users, after the cluster settings
    host: str = "127.0.0.1"
    port: int = 0  # HAProxy's
    nodes: list[_Node] = field(default_factory=list)
    haproxy: subprocess.Popen[bytes] | None = None
    tls: bool = False  # amqps on every node and through HAProxy (`tls_port`)
    tls_port: int = 0  # HAProxy's amqps frontend

    @property
    def tls_dir(self) -> Path:
        return self.workdir / node_plan.TLS_DIR_NAME

    @property
    def haproxy_log(self) -> Path:
        return self.workdir / "haproxy.log"

    def _plan(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        plans = []
        for i, amqp_port in enumerate(free_amqp_ports(self.size), start=1):
            ports = node_plan.plan_ports(amqp_port)
            plans.append(node_plan.NodePlan(f"rmq{i}", "127.0.0.1", amqp_port, ports["management"], ports["raft"],
                                         ports["metadata"]))
        taken = {p for plan in plans for p in (plan.port, plan.management_port, plan.raft_port, plan.metadata_port)}
        if self.tls:
            for index, plan in enumerate(plans):
                tls_port = free_port(avoid=taken)
                taken.add(tls_port)
                plans[index] = dataclasses.replace(plan, tls_port=tls_port)
            node_plan.ensure_test_pki(self.workdir, plans)
        secret = node_plan.cluster_secret(self.workdir)
        for plan in plans:
            data_dir = self.workdir / plan.name
            config = (node_plan.node_config_text(plan, plans, secret, self.tls_dir if self.tls else None)
                      + self.extra_config + self.config_toml)
            node_plan.write_private(node_plan.node_config_path(plan.name, str(data_dir)), config)
            self.nodes.append(_Node(plan, data_dir, self.workdir / f"{plan.name}.log"))
        self.port = free_port(avoid=taken)  # HAProxy's: none of the nodes' planned ports
        if self.tls:
            self.tls_port = free_port(avoid={*taken, self.port})

    def _spawn(self, node: _Node) -> None:
        node.data_dir.mkdir(parents=True, exist_ok=True)
        command = node_plan.node_command(node.plan.name, node.plan.host, node.plan.port, str(node.data_dir))
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAFTMQ_")}
        with node.log_path.open("ab") as log:
            log.write(f"---- start {time.time():.3f}\n".encode())
            node.process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=log, stderr=log,
                                            stdin=subprocess.DEVNULL)

    def _start_haproxy(self) -> None:
        servers = [(n.plan.name, n.plan.host, n.plan.port) for n in self.nodes]
        tls = None
        if self.tls:
            tls = topo.TlsFrontend(self.tls_port, tuple((n.plan.name, n.plan.host, n.plan.tls_port) for n in self.nodes),
                                   str(self.tls_dir / "ca.pem"))
        cfg = topo.haproxy_cfg(topo.load(), servers, self.port, maxconn=runner._local_maxconn(), tls=tls)
        cfg_path = self.workdir / "haproxy.cfg"
        cfg_path.write_text(cfg.replace(f"bind *:{self.port}", f"bind 127.0.0.1:{self.port}"))
        with self.haproxy_log.open("ab") as log:
            self.haproxy = subprocess.Popen([runner.ensure_haproxy(), "-db", "-f", str(cfg_path)], stdout=log,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def start(self) -> ClusterProcess:
        """Start every node that is not running (and HAProxy), then wait until the cluster serves every test user."""
        if not self.nodes:
            self._plan()
        for node in self.nodes:
            if node.process is None or node.process.poll() is not None:
                self._spawn(node)
        if self.haproxy is None or self.haproxy.poll() is not None:
            self._start_haproxy()
        self._wait_serving()
        return self

    def _wait_serving(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        pending = list(self.nodes)
        while pending:
            self._check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster nodes not ready in {START_TIMEOUT_S} s: "
                                   f"{[n.plan.name for n in pending]}\n{self.log_tail()}")
            pending = [n for n in pending if not self._serves_test_users(n.plan.host, n.plan.port)]
            if pending:
                time.sleep(0.2)
        while not answers_amqp(self.host, self.port, timeout_s=1.0):
            self._check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"HAProxy does not serve port {self.port}:\n{self.log_tail()}")
            time.sleep(0.1)
        while self.tls and not answers_amqp(self.host, self.tls_port, timeout_s=1.0,
                                            tls_ca_file=str(self.tls_dir / "ca.pem")):
            self._check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"HAProxy does not serve amqps on port {self.tls_port}:\n{self.log_tail()}")
            time.sleep(0.1)

    @staticmethod
    def _serves_test_users(host: str, port: int) -> bool:
        if not answers_amqp(host, port, timeout_s=1.0):
            return False
        logins = [("guest", "guest", "/"), (*LIMITED_USER, "/"), (*PRIVATE_USER, PRIVATE_VHOST)]
        for user, password, vhost in logins:
            params = pika.ConnectionParameters(host, port, vhost, pika.PlainCredentials(user, password),
                                               connection_attempts=1, socket_timeout=5)
            try:
                pika.BlockingConnection(params).close()
            except pika.exceptions.AMQPError:
                return False
        return True

    def _check_alive(self) -> None:
        for node in self.nodes:
            if node.process is not None and node.process.poll() is not None:
                raise RuntimeError(f"{node.plan.name} exited with {node.process.returncode}:\n{self.log_tail()}")
        if self.haproxy is not None and self.haproxy.poll() is not None:
            raise RuntimeError(f"HAProxy exited with {self.haproxy.returncode}:\n{self.log_tail()}")

    def log_tail(self, size_bytes: int = 3000) -> str:
        parts = []
        for path in [n.log_path for n in self.nodes] + [self.haproxy_log]:
            try:
                text = path.read_bytes()[-size_bytes:].decode(errors="replace")
            except OSError:
                text = ""
            parts.append(f"===== {path.name}\n{text}")
        return "\n".join(parts)

    def send_signal(self, signum: int) -> None:
        """Signal every node."""
        for node in self.nodes:
            if node.process is not None:
                node.process.send_signal(signum)

    @staticmethod
    def _memory_alarm(node: _Node) -> bool:
        """The node's memory alarm as its log of this life last said (off when it said nothing)."""
        try:
            life = node.log_path.read_bytes().rsplit(b"---- start ", 1)[-1]
        except OSError:
            return False
        found = ALARM_LINE.findall(life)
        return bool(found) and found[-1] == b"set"

    def set_memory_alarm(self, on: bool) -> None:
        """Force the memory alarm on or off on every node. SIGUSR1 toggles it, and a node may merge two signals or
        have it set otherwise, so each node is signalled only while its log says the other state."""
        deadline = time.monotonic() + ALARM_TIMEOUT_S
        signalled: dict[str, float] = {}
        while True:
            wrong = [n for n in self.nodes if n.process is not None and self._memory_alarm(n) != on]
            if not wrong:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"memory alarm not {'set' if on else 'cleared'} on "
                                   f"{[n.plan.name for n in wrong]}:\n{self.log_tail()}")
            for node in wrong:
                if time.monotonic() - signalled.get(node.plan.name, -60.0) > 2.0:  # its answer is not due yet
                    assert node.process is not None
                    node.process.send_signal(signal.SIGUSR1)
                    signalled[node.plan.name] = time.monotonic()
            time.sleep(0.05)

    def _wait_nodes(self, timeout_s: float) -> int:
        code = 0
        deadline = time.monotonic() + timeout_s
        for node in self.nodes:
            if node.process is None:
                continue
            try:
                node.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                node.process.kill()
                node.process.wait()
            code = code or node.process.returncode
            node.process = None
        return code

    def stop(self, signum: int = signal.SIGTERM) -> int:
        """Signal every node and wait for all to exit (killing those that hang); HAProxy keeps running. Returns 0
        when every node exited 0, else the first other exit code."""
        for node in self.nodes:
            if node.process is not None and node.process.poll() is None:
                node.process.send_signal(signum)
        return self._wait_nodes(STOP_TIMEOUT_S)

    def wait_exit(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """Wait for every node to exit on its own; returns 0 when all exited 0."""
        deadline = time.monotonic() + timeout_s
        for node in self.nodes:
            if node.process is not None:
                node.process.wait(max(0.1, deadline - time.monotonic()))
        return self._wait_nodes(0.1)

    def restart(self) -> ClusterProcess:
        """Stop every node gracefully and start them again on the same ports and data directories."""
        self.stop()
        return self.start()

    def shutdown(self, signum: int = signal.SIGTERM) -> int:
        """Stop every node, then HAProxy."""
        code = self.stop(signum)
        if self.haproxy is not None:
            self.haproxy.terminate()
            try:
                self.haproxy.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.haproxy.kill()
                self.haproxy.wait()
            self.haproxy = None
        return code
