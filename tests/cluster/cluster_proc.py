"""Start, kill and restart a cluster of real `raftmq node` processes on loopback for the cluster tests.

Each node is `python -m node.cli node` with its own data directory and log file under the test's tmp dir, the
cluster secret in the environment (never argv), and ports chosen here: AMQP ports below 11000 whose derived ports
(+10000 management, +20000 Raft, +21000 metadata) all bind now and stay below Linux's ephemeral range, so a node
killed and restarted in a test finds its ports free again. `raft_via` lets a test route each node's Raft
connection to a peer through another port (a fault proxy). `ClusterProcs.stop_all()` kills whatever is left.

Shared by the real-process tests: `supervised(procs)` (print the logs if the body fails, kill every node at the end),
the `cluster` fixture (three started nodes, supervised; a test module imports `cluster_fixture`), `ConsumingThread`
(a consumer on its own thread, each delivery handled by a subclass), and the client helpers every such test uses:
pika `connect`/`channel`, `ready_count`/`queue_known` (passive declare) and `api_queue_rows`/`api_queue` (a node's
own replica's view through its management API).
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pika
import pytest
import requests
from pika.adapters.blocking_connection import BlockingChannel

from deploy.portshard import owned

REPO_ROOT = Path(__file__).resolve().parents[2]
SECRET = "cluster-test-secret-0123456789abcdef"
START_TIMEOUT_S = 60.0
PORT_LINE = re.compile(rb"listening on port (\d+)")
LEADER_LINE = re.compile(rb"cluster: queue (\S+): leader (\S+)")
AMQP_PORT_LOW, AMQP_PORT_HIGH = 3000, 11000
PORT_OFFSETS = (0, 10_000, 20_000, 21_000, 22_000)  # amqp, management, raft, metadata, mirror


def _binds(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_amqp_ports(n: int, rng: random.Random | None = None) -> list[int]:
    rng = rng or random.Random()
    ports: list[int] = []
    while len(ports) < n:
        port = rng.randrange(AMQP_PORT_LOW, AMQP_PORT_HIGH)
        taken = {p + offset for p in ports for offset in PORT_OFFSETS}  # no node's port is another's derived one
        if all(port + offset not in taken and owned(port + offset) and _binds(port + offset) for offset in PORT_OFFSETS):
            ports.append(port)
    return ports


def free_port(avoid: Iterable[int] = ()) -> int:
    """A free port below the ephemeral range (for proxies), none of `avoid` (ports planned but not bound yet)."""
    rng = random.Random()
    avoided = set(avoid)
    while True:
        port = rng.randrange(12000, 19000)
        if port not in avoided and owned(port) and _binds(port):
            return port


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.1) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@dataclass
class ClusterNode:
    name: str
    port: int
    workdir: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.workdir / "node.log"

    @property
    def raft_port(self) -> int:
        return self.port + 20_000

    def log_text(self) -> bytes:
        try:
            return self.log_path.read_bytes()
        except OSError:
            return b""

    def log_tail(self, size_bytes: int = 3000) -> str:
        return self.log_text()[-size_bytes:].decode(errors="replace")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class ClusterProcs:
    """n nodes named n1..nN; `start_all()` starts them together (the metadata group needs a majority)."""

    root: Path
    size: int = 3
    extra: dict[str, str] = field(default_factory=dict)  # more settings, as RAFTMQ_* variables
    raft_via: dict[tuple[str, str], int] = field(default_factory=dict)  # (node, peer) -> port it dials for peer
    secrets: dict[str, str] = field(default_factory=dict)  # node -> another secret than SECRET
    nodes: list[ClusterNode] = field(default_factory=list)

    def __post_init__(self) -> None:
        ports = free_amqp_ports(self.size)
        self.nodes = [ClusterNode(f"n{i + 1}", port, self.root / f"n{i + 1}") for i, port in enumerate(ports)]

    def node(self, name: str) -> ClusterNode:
        return next(n for n in self.nodes if n.name == name)

    def cluster_nodes(self, viewer: ClusterNode) -> str:
        entries = []
        for n in self.nodes:
            via = self.raft_via.get((viewer.name, n.name))
            entries.append(f"{n.name}=127.0.0.1:{n.port}" + (f":{via}" if via else ""))
        return ",".join(entries)

    def spawn(self, node: ClusterNode) -> None:
        node.workdir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAFTMQ_")}
        env.update({
            "RAFTMQ_NODE_NAME": node.name,
            "RAFTMQ_CLUSTER_NODES": self.cluster_nodes(node),
            "RAFTMQ_CLUSTER_SECRET": self.secrets.get(node.name, SECRET),
            "RAFTMQ_DATA_DIR": str(node.workdir / "data"),
            "RAFTMQ_LISTEN_ADDRESS": "127.0.0.1",
            "RAFTMQ_HEARTBEAT_S": "10",
            "RAFTMQ_SHUTDOWN_TIMEOUT_MS": "1000",
            "RAFTMQ_NODE_DOWN_AFTER_MS": "2000",
            "RAFTMQ_BROKER_TICK_MS": "50",
        })
        env.update(self.extra)
        with node.log_path.open("ab") as log_file:
            log_file.write(f"---- start {time.time():.3f}\n".encode())
            node.process = subprocess.Popen([sys.executable, "-m", "node.cli", "node"], cwd=REPO_ROOT, env=env,
                                            stdout=log_file, stderr=log_file)

    def wait_ready(self, node: ClusterNode, since_bytes: int = 0) -> None:
        def ready() -> bool:
            if node.process is None or node.process.poll() is not None:
                raise AssertionError(f"{node.name} exited:\n{node.log_tail()}")
            return bool(PORT_LINE.search(node.log_text()[since_bytes:]))

        wait_until(ready, START_TIMEOUT_S, f"{node.name} to listen")

    def start_all(self, attempts: int = 3) -> ClusterProcs:
        """Start every node and wait until each listens. A port taken by another process between choosing it and
        binding it (other suites or benches on this machine) is retried with fresh ports and empty data dirs."""
        for attempt in range(1, attempts + 1):
            for node in self.nodes:
                self.spawn(node)
            try:
                for node in self.nodes:
                    self.wait_ready(node)
                return self
            except AssertionError:
                if attempt == attempts or not any(b"in use" in n.log_text() for n in self.nodes):  # EADDRINUSE
                    raise
                self.stop_all()
                for node, port in zip(self.nodes, free_amqp_ports(self.size), strict=True):
                    node.port = port
                    shutil.rmtree(node.workdir / "data", ignore_errors=True)  # it remembers the old ports
                    with node.log_path.open("ab") as log_file:
                        log_file.write(b"---- a port was taken: starting again on fresh ports\n")
        raise AssertionError("unreachable")

    def kill(self, name: str) -> None:
        node = self.node(name)
        if node.process is not None and node.process.poll() is None:
            node.process.send_signal(signal.SIGKILL)
            node.process.wait()
        node.process = None

    def restart(self, name: str) -> None:
        node = self.node(name)
        self.kill(name)
        offset = len(node.log_text())
        self.spawn(node)
        self.wait_ready(node, offset)

    def stop_all(self) -> None:
        for node in self.nodes:
            if node.process is not None and node.process.poll() is None:
                node.process.send_signal(signal.SIGKILL)
                node.process.wait()
            node.process = None

    def leader_seen_by(self, name: str, queue_group: str) -> str | None:
        """The last leader `name` logged for the queue group ("q/<vhost>/<queue>" as in docs/cluster.md)."""
        found = [m for m in LEADER_LINE.findall(self.node(name).log_text()) if m[0].decode() == queue_group]
        if not found:
            return None
        leader = found[-1][1].decode()
        return None if leader == "None" else leader

    def agreed_leader(self, names: Iterable[str], queue_group: str) -> str | None:
        seen = {self.leader_seen_by(n, queue_group) for n in names}
        return seen.pop() if len(seen) == 1 else None

    def logs(self) -> str:
        return "\n".join(f"===== {n.name}\n{n.log_tail(6000)}" for n in self.nodes)


@contextlib.contextmanager
def supervised(procs: ClusterProcs) -> Iterator[ClusterProcs]:
    """Prints every node's log tail if the body fails; kills every node at the end either way."""
    try:
        yield procs
    except BaseException:
        print(procs.logs())
        raise
    finally:
        procs.stop_all()


@pytest.fixture(name="cluster")
def cluster_fixture(tmp_path: Path) -> Iterator[ClusterProcs]:
    """Three started nodes (`supervised`). Import `cluster_fixture` to use it; tests take it as `cluster`."""
    with supervised(ClusterProcs(tmp_path)) as procs:
        yield procs.start_all()


def connect(port: int) -> pika.BlockingConnection:
    params = pika.ConnectionParameters("127.0.0.1", port, heartbeat=30, blocked_connection_timeout=60,
                                       connection_attempts=3, retry_delay=0.5)
    return pika.BlockingConnection(params)


@contextlib.contextmanager
def channel(port: int) -> Iterator[BlockingChannel]:
    """A channel on a fresh connection to the node, closed (errors ignored) at the end."""
    conn = connect(port)
    try:
        yield conn.channel()
    finally:
        with contextlib.suppress(Exception):
            conn.close()


def ready_count(port: int, queue: str) -> int:
    """The queue's ready count by passive declare (raises ChannelClosedByBroker if the node has no such queue)."""
    with channel(port) as ch:
        return int(ch.queue_declare(queue, passive=True).method.message_count)


def queue_known(port: int, queue: str) -> bool:
    try:
        ready_count(port, queue)
        return True
    except pika.exceptions.ChannelClosedByBroker:
        return False


def management_up(port: int) -> bool:
    """Whether the node of AMQP port `port` answers its management API (it starts listening after AMQP)."""
    try:
        return requests.get(f"http://127.0.0.1:{port + 10_000}/api/overview", auth=("guest", "guest"),
                            timeout=5).status_code == 200
    except requests.ConnectionError:
        return False


def raft_links_up(port: int) -> bool:
    """Whether the node of AMQP port `port` holds a Raft connection to every other node (/api/nodes `running`)."""
    try:
        reply = requests.get(f"http://127.0.0.1:{port + 10_000}/api/nodes", auth=("guest", "guest"), timeout=5)
    except requests.ConnectionError:
        return False
    return reply.status_code == 200 and all(row["running"] for row in reply.json())


def api_queue_rows(port: int, timeout_s: float = 10) -> list[dict[str, Any]]:
    """The node's /api/queues rows (its own replica's view); raises on an HTTP error."""
    reply = requests.get(f"http://127.0.0.1:{port + 10_000}/api/queues", auth=("guest", "guest"), timeout=timeout_s)
    reply.raise_for_status()
    rows: list[dict[str, Any]] = reply.json()
    return rows


def api_queue(port: int, queue: str) -> dict[str, Any]:
    """The queue's /api/queues row on the node (raises StopIteration if the node does not list it)."""
    return next(row for row in api_queue_rows(port) if row["name"] == queue)


class ConsumingThread(threading.Thread):
    """Consumes `queue` on one node (manual acks, `prefetch_count`) until `stop` is set; a subclass settles each
    delivery in `handle`. An error ends the thread and is kept in `error` for the test to report."""

    def __init__(self, port: int, queue: str, prefetch_count: int) -> None:
        super().__init__(daemon=True)
        self.port, self.queue, self.prefetch_count = port, queue, prefetch_count
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def handle(self, ch: BlockingChannel, delivery_tag: int, body: bytes) -> None:
        raise NotImplementedError

    def run(self) -> None:
        try:
            conn = connect(self.port)
            ch = conn.channel()
            ch.basic_qos(prefetch_count=self.prefetch_count)

            def on_message(ch: BlockingChannel, method: Any, props: Any, body: bytes) -> None:
                self.handle(ch, method.delivery_tag, body)

            ch.basic_consume(self.queue, on_message)
            while not self.stop.is_set():
                conn.process_data_events(time_limit=0.1)
            conn.close()
        except BaseException as exc:  # reported by the test
            self.error = exc
