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
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from bench.client import Endpoint, probe

RABBITMQ_SBIN = Path("/usr/lib/rabbitmq/bin")
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


def free_port_run(count: int, attempts: int = 50) -> int:
    """A base port P such that P+1 .. P+count are all free now (the cluster runner puts node i on P+i)."""
    for _ in range(attempts):
        base = free_port()
        if base + count > 65535:
            continue
        if all(_port_free(base + offset) for offset in range(1, count + 1)):
            return base
    raise BrokerStartError(f"found no run of {count} free ports")


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@contextlib.contextmanager
def raftmq_cluster(nodes: int = 3, timeout_s: float = 120.0) -> Iterator[list[Endpoint]]:
    """A local raftmq cluster through the cluster runner (`raftmq cluster up --detach --no-haproxy`), stopped
    with `raftmq cluster down`. Whether its nodes replicate is up to raftmq; the bench does not check it."""
    workdir = Path(tempfile.mkdtemp(prefix="raftmq-bench-cluster-"))
    base_port = free_port_run(nodes)
    runner = [sys.executable, "-m", "node.cli", "cluster"]
    data = ["--data-dir", str(workdir)]
    up = [*runner, "up", "--detach", "--no-haproxy", "--nodes", str(nodes), "--base-port", str(base_port), *data]
    try:
        completed = subprocess.run(up, capture_output=True, text=True, timeout=timeout_s)
        if completed.returncode != 0:
            raise BrokerStartError(f"raftmq cluster up failed: {(completed.stdout + completed.stderr).strip()[-400:]}")
        yield [Endpoint("127.0.0.1", base_port + index) for index in range(1, nodes + 1)]
    finally:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run([*runner, "down", *data], capture_output=True, timeout=60)
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

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="raftmq-bench-rabbit-"))
        home = self.root / "home"
        home.mkdir()
        cookie = home / ".erlang.cookie"
        cookie.write_text(f"RAFTMQBENCH{os.getpid()}{time.monotonic_ns()}")
        cookie.chmod(0o400)
        (self.root / "enabled_plugins").write_text("[].\n")
        self.home = home
        self.epmd_port = free_port()
        self.tag = f"raftmqbench{os.getpid()}x{time.monotonic_ns() % 100000}"

    def env(self, node: str | None = None) -> dict[str, str]:
        env = dict(os.environ, HOME=str(self.home), ERL_EPMD_PORT=str(self.epmd_port))
        env["RABBITMQ_ENABLED_PLUGINS_FILE"] = str(self.root / "enabled_plugins")
        env["RABBITMQ_CONF_ENV_FILE"] = str(self.root / "no-env.conf")
        env["RABBITMQ_CONFIG_FILE"] = str(self.root / "no-config")
        env["RABBITMQ_ADVANCED_CONFIG_FILE"] = str(self.root / "no-advanced.config")
        if node is not None:
            env["RABBITMQ_NODENAME"] = node
        return env

    def ctl(self, node: str, *args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(RABBITMQ_SBIN / "rabbitmqctl"), "-n", node, *args],
            env=self.env(), capture_output=True, text=True, timeout=timeout_s,
        )

    def start_node(self, index: int) -> tuple[str, Endpoint, subprocess.Popen[bytes]]:
        node = f"{self.tag}n{index}@localhost"
        endpoint = Endpoint("127.0.0.1", free_port())
        node_dir = self.root / f"n{index}"
        node_dir.mkdir()
        env = self.env(node)
        env.update(
            RABBITMQ_NODE_PORT=str(endpoint.port), RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_DIST_PORT=str(free_port()), RABBITMQ_MNESIA_BASE=str(node_dir / "mnesia"),
            RABBITMQ_LOG_BASE=str(node_dir / "log"), RABBITMQ_PID_FILE=str(node_dir / "pid"),
        )
        with (node_dir / "stdout.log").open("wb") as log_file:
            process = subprocess.Popen(
                [str(RABBITMQ_SBIN / "rabbitmq-server")], env=env, stdout=log_file, stderr=subprocess.STDOUT,
                start_new_session=True, cwd=node_dir,
            )
        return node, endpoint, process

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


@contextlib.contextmanager
def rabbitmq_cluster(nodes: int = 1, timeout_s: float = START_TIMEOUT_S) -> Iterator[list[Endpoint]]:
    """Debian's RabbitMQ: `nodes` nodes on loopback, clustered when more than one; yields their endpoints."""
    if not rabbitmq_available():
        raise BrokerStartError("RabbitMQ is not installed (apt-get install -y rabbitmq-server)")
    environment = _RabbitEnvironment()
    started: list[tuple[str, Endpoint, subprocess.Popen[bytes]]] = []
    try:
        for index in range(nodes):
            started.append(environment.start_node(index))
        for index, (_, endpoint, process) in enumerate(started):
            wait_serving(endpoint, process, timeout_s, environment.root / f"n{index}" / "stdout.log")
        seed = started[0][0]
        for node, _, _ in started[1:]:
            _join(environment, node, seed)
        if nodes > 1:
            _check_cluster(environment, seed, nodes)
        yield [endpoint for _, endpoint, _ in started]
    finally:
        for node, _, process in reversed(started):
            environment.stop_node(node, process)
        environment.close()


def _join(environment: _RabbitEnvironment, node: str, seed: str) -> None:
    for args in (("stop_app",), ("join_cluster", seed), ("start_app",)):
        completed = environment.ctl(node, *args)
        if completed.returncode != 0:
            raise BrokerStartError(f"rabbitmqctl {' '.join(args)} on {node}: {completed.stderr.strip()[-400:]}")


def _check_cluster(environment: _RabbitEnvironment, seed: str, nodes: int) -> None:
    completed = environment.ctl(seed, "-q", "cluster_status", "--formatter", "json")
    try:
        running = json.loads(completed.stdout).get("running_nodes", [])
    except ValueError:
        running = []
    if len(running) != nodes:
        raise BrokerStartError(f"RabbitMQ cluster has {len(running)} running nodes, wanted {nodes}: {running}")
