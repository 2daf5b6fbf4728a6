"""Starting and stopping the brokers under test: a raftmq node, and Debian's RabbitMQ as one node or a 3-node cluster.

Every broker runs in its own temporary directory, in its own session (so a Ctrl-C in the terminal reaches only the
benchmark, which then stops them in order), on free ports picked at start. RabbitMQ nodes get unique node names,
their own Erlang cookie (HOME points into the temp dir) and their own epmd port, so they never meet the RabbitMQ
that integration tests or the Debian service run. Each broker is a context manager: leaving it, by return or by
exception, stops the processes (rabbitmqctl stop, then SIGTERM/SIGKILL of the process group), kills our epmd and
removes the directory. A broker that does not serve AMQP within its start timeout raises `BrokerStartError`.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from bench.client import Endpoint, probe
from bench.clusters import (
    ClusterNode,
    Placement,
    RabbitNodePlan,
    join_steps,
    plan_rabbit_nodes,
    rabbit_node_env,
    rabbit_placement,
    raftmq_leader_from_logs,
    raftmq_placement_from_status,
    raftmq_ports_free,
    running_nodes,
)
from deploy.portshard import owned

RABBITMQ_SBIN = Path("/usr/lib/rabbitmq/bin")
REPO_ROOT = Path(__file__).resolve().parents[1]  # `python -m node.cli` runs from here
START_TIMEOUT_S = 90.0


class BrokerStartError(Exception):
    """The broker did not come up (or a cluster did not form)."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_serving(endpoint: Endpoint, process: subprocess.Popen[bytes] | None, timeout_s: float, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise BrokerStartError(f"broker exited with {process.returncode}; see {log}: {_tail(log)}")
        if probe(endpoint, timeout_s=2.0):
            return
        time.sleep(0.3)
    raise BrokerStartError(f"broker at {endpoint.address} not serving after {timeout_s:.0f}s; {_tail(log)}")


def _tail(path: Path, lines: int = 8) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def stop_process_group(process: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    """SIGTERM the process's session, then SIGKILL what is left after `timeout_s`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if process.poll() is not None:
            break
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # stragglers in the group
    process.wait()


# --- raftmq ---------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def raftmq_node(timeout_s: float = 30.0, extra_args: tuple[str, ...] = ()) -> Iterator[Endpoint]:
    """One `raftmq node` on a free port with a temporary data dir."""
    workdir = Path(tempfile.mkdtemp(prefix="raftmq-bench-node-"))
    endpoint = Endpoint("127.0.0.1", free_port())
    log = workdir / "node.log"
    command = [
        sys.executable, "-m", "node.cli", "node", "--port", str(endpoint.port),
        "--data-dir", str(workdir / "data"), *extra_args,
    ]
    with log.open("wb") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_serving(endpoint, process, timeout_s, log)
        yield endpoint
    finally:
        stop_process_group(process)
        shutil.rmtree(workdir, ignore_errors=True)


RAFTMQ_CLUSTER_BASE_PORTS = (3000, 9000)  # below the ephemeral range; derived ports (+10000..+22000) stay < 32768


def free_port_run(count: int, attempts: int = 200) -> int:
    """A base port P such that nodes P+1 .. P+count and all their derived ports are free now (the cluster runner
    puts node i on P+i, and its management, Raft, metadata and mirror ports 10000, 20000, 21000 and 22000 above)."""
    low, high = RAFTMQ_CLUSTER_BASE_PORTS
    for _ in range(attempts):
        base = random.randrange(low, high)
        if raftmq_ports_free(base, count, lambda port: owned(port) and _port_free(port)):
            return base
    raise BrokerStartError(f"found no run of {count} free node ports (with their derived ports)")


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class RaftmqCluster:
    """A running `raftmq cluster up` cluster: its nodes (rmq1..), their pids, and queue placement."""

    def __init__(self, workdir: Path, nodes: tuple[ClusterNode, ...]) -> None:
        self.workdir = workdir
        self._nodes = nodes

    @property
    def nodes(self) -> tuple[ClusterNode, ...]:
        return self._nodes

    def pids(self) -> dict[str, int]:
        """Node name -> process id, from the runner's cluster.json."""
        try:
            state = json.loads((self.workdir / "cluster.json").read_text())
            return {str(node["name"]): int(node["pid"]) for node in state["nodes"]}
        except (OSError, ValueError, KeyError, TypeError):
            return {}

    def placement(self, queue: str) -> Placement | None:
        """Leader: what a majority of nodes logged as the queue group's Raft leader; members: the management API."""
        logs = {node.name: _read_text(self.workdir / f"{node.name}.log") for node in self._nodes}
        leader = raftmq_leader_from_logs(logs, queue, agree_min=len(self._nodes) // 2 + 1)
        if leader is None:
            return None
        try:
            status = subprocess.run([*_RUNNER, "status", "--json", "--data-dir", str(self.workdir)],
                                    capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
        except (OSError, subprocess.TimeoutExpired):
            return Placement(leader, ())  # members unknown
        listed = raftmq_placement_from_status(status.stdout, queue)
        return Placement(leader, () if listed is None else listed.members)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


_RUNNER = [sys.executable, "-m", "node.cli", "cluster"]


@contextlib.contextmanager
def raftmq_cluster(nodes: int = 3, timeout_s: float = 120.0, base_port: int | None = None) -> Iterator[RaftmqCluster]:
    """A local raftmq cluster through the cluster runner (`raftmq cluster up --detach --no-haproxy`), stopped
    with `raftmq cluster down` (and its directory removed) however the block ends. `base_port`: node i on
    base_port + i (default: a free run picked at random)."""
    workdir = Path(tempfile.mkdtemp(prefix="raftmq-bench-cluster-"))
    base_port = free_port_run(nodes) if base_port is None else base_port
    data = ["--data-dir", str(workdir)]
    up = [*_RUNNER, "up", "--detach", "--no-haproxy", "--nodes", str(nodes), "--base-port", str(base_port), *data]
    try:
        try:
            completed = subprocess.run(up, capture_output=True, text=True, timeout=timeout_s, cwd=REPO_ROOT)
        except subprocess.TimeoutExpired as error:
            raise BrokerStartError(f"raftmq cluster up did not finish within {timeout_s:.0f}s") from error
        if completed.returncode != 0:
            raise BrokerStartError(f"raftmq cluster up failed: {(completed.stdout + completed.stderr).strip()[-400:]}")
        members = tuple(ClusterNode(f"rmq{index}", Endpoint("127.0.0.1", base_port + index))
                        for index in range(1, nodes + 1))
        yield RaftmqCluster(workdir, members)
    finally:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run([*_RUNNER, "down", *data], capture_output=True, timeout=60, cwd=REPO_ROOT)
        shutil.rmtree(workdir, ignore_errors=True)


# --- RabbitMQ -----------------------------------------------------------------------------------------------


def rabbitmq_available() -> bool:
    return (RABBITMQ_SBIN / "rabbitmq-server").exists()


def rabbitmq_version() -> str | None:
    try:
        output = subprocess.run(
            ["dpkg-query", "-W", "-f=${Version}", "rabbitmq-server"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return output.stdout.strip() or None


class _RabbitEnvironment:
    """A temp dir with the cookie, the plugin list and the epmd port shared by the nodes of one cluster."""

    def __init__(self, plugins: tuple[str, ...] = ()) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="raftmq-bench-rabbit-"))
        home = self.root / "home"
        home.mkdir()
        cookie = home / ".erlang.cookie"
        cookie.write_text(f"RAFTMQBENCH{os.getpid()}{time.monotonic_ns()}")
        cookie.chmod(0o400)
        (self.root / "enabled_plugins").write_text(f"[{','.join(plugins)}].\n")
        self.home = home
        self.epmd_port = free_port()
        self.tag = f"raftmqbench{os.getpid()}x{time.monotonic_ns() % 100000}"

    def env(self) -> dict[str, str]:
        """What every node and rabbitmqctl of this cluster share: HOME (the cookie), epmd port, no config/plugins."""
        env = dict(os.environ, HOME=str(self.home), ERL_EPMD_PORT=str(self.epmd_port))
        env["RABBITMQ_ENABLED_PLUGINS_FILE"] = str(self.root / "enabled_plugins")
        env["RABBITMQ_CONF_ENV_FILE"] = str(self.root / "no-env.conf")
        env["RABBITMQ_CONFIG_FILE"] = str(self.root / "no-config")
        env["RABBITMQ_ADVANCED_CONFIG_FILE"] = str(self.root / "no-advanced.config")
        return env

    def ctl(self, node: str, *args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(RABBITMQ_SBIN / "rabbitmqctl"), "-n", node, *args],
            env=self.env(), capture_output=True, text=True, timeout=timeout_s,
        )

    def start_node(self, plan: RabbitNodePlan) -> subprocess.Popen[bytes]:
        plan.directory.mkdir()
        with (plan.directory / "stdout.log").open("wb") as log_file:
            return subprocess.Popen(
                [str(RABBITMQ_SBIN / "rabbitmq-server")], env=rabbit_node_env(self.env(), plan), stdout=log_file,
                stderr=subprocess.STDOUT, start_new_session=True, cwd=plan.directory,
            )

    def stop_node(self, node: str, process: subprocess.Popen[bytes]) -> None:
        if process.poll() is None:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                self.ctl(node, "stop", timeout_s=30.0)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=15.0)
        stop_process_group(process)

    def close(self) -> None:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(["epmd", "-port", str(self.epmd_port), "-kill"], capture_output=True, timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)


Ctl = Callable[..., subprocess.CompletedProcess[str]]  # ctl(node, *args) -> rabbitmqctl's result


class RabbitCluster:
    """A running private RabbitMQ cluster: its nodes, quorum queue placement (rabbitmqctl list_queues), and kill -9
    of one node (for `raftmq bench failover --broker rabbitmq`)."""

    def __init__(self, nodes: tuple[ClusterNode, ...], ctl: Ctl,
                 processes: dict[str, subprocess.Popen[bytes]] | None = None) -> None:
        self._nodes = nodes
        self._ctl = ctl
        self._processes = processes or {}

    def kill(self, node: str) -> None:
        """SIGKILL the node's whole session (rabbitmq-server, beam.smp and its helpers) and reap it."""
        process = self._processes[node]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    @property
    def nodes(self) -> tuple[ClusterNode, ...]:
        return self._nodes

    def ctl(self, *args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
        """rabbitmqctl on the first node (e.g. `ctl("set_parameter", "shovel", name, json)`)."""
        return self._ctl(self._nodes[0].name, *args, timeout_s=timeout_s)

    @property
    def endpoints(self) -> list[Endpoint]:
        return [node.endpoint for node in self._nodes]

    def placement(self, queue: str) -> Placement | None:
        listed = self._ctl(self._nodes[0].name, "-q", "list_queues", "name", "leader", "members", "--formatter", "json")
        return rabbit_placement(listed.stdout, queue)


@contextlib.contextmanager
def rabbitmq_cluster(nodes: int = 1, timeout_s: float = START_TIMEOUT_S,
                     plugins: tuple[str, ...] = ()) -> Iterator[RabbitCluster]:
    """Debian's RabbitMQ: `nodes` nodes on loopback, clustered when more than one (checked with cluster_status);
    `plugins` (e.g. "rabbitmq_shovel") enabled from the start."""
    if not rabbitmq_available():
        raise BrokerStartError("RabbitMQ is not installed (apt-get install -y rabbitmq-server)")
    environment = _RabbitEnvironment(plugins)
    plans = plan_rabbit_nodes(environment.root, environment.tag, nodes, free_port)
    started: list[tuple[RabbitNodePlan, subprocess.Popen[bytes]]] = []
    try:
        for plan in plans:
            started.append((plan, environment.start_node(plan)))
        for plan, process in started:
            wait_serving(plan.endpoint, process, timeout_s, plan.directory / "stdout.log")
        form_cluster(environment.ctl, [plan.name for plan in plans])
        yield RabbitCluster(tuple(ClusterNode(plan.name, plan.endpoint) for plan in plans), environment.ctl,
                            {plan.name: process for plan, process in started})
    finally:
        for plan, process in reversed(started):
            environment.stop_node(plan.name, process)
        environment.close()


def form_cluster(ctl: Ctl, names: list[str]) -> None:
    """Join every node after the first to the first, then check that all of them run; `BrokerStartError` naming
    the failed step otherwise. One node is a cluster already."""
    if len(names) < 2:
        return
    seed = names[0]
    for node in names[1:]:
        for args in join_steps(seed):
            completed = ctl(node, *args)
            if completed.returncode != 0:
                raise BrokerStartError(f"rabbitmqctl {' '.join(args)} on {node}: {completed.stderr.strip()[-400:]}")
    running = running_nodes(ctl(seed, "-q", "cluster_status", "--formatter", "json").stdout)
    if sorted(running) != sorted(names):
        raise BrokerStartError(f"RabbitMQ cluster runs {running}, wanted {names}")
