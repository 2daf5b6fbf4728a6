"""Issue 6, done when: `raftmq cluster up` from nothing, pika through a real HAProxy publishing to a quorum queue
with confirms, a node killed (the queue's leader), the client reconnecting through HAProxy and carrying on, and
nothing confirmed lost. Also `cluster status --json` naming the queue's leader and members, and `cluster restart`
bringing the killed node back and then restarting every node in turn (still nothing confirmed lost).

Real processes on loopback; ports are picked below the ephemeral range so outgoing connections cannot take them.
No timing is asserted: waits are bounded retries with generous deadlines.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from deploy import node_plan, runner
from deploy.portshard import owned
from tests.management.helpers import management_wired

pytestmark = [
    pytest.mark.skipif(shutil.which("haproxy") is None and not Path("/usr/sbin/haproxy").exists(),
                       reason="HAProxy is not installed (apt-get install haproxy)"),
    pytest.mark.skipif(not management_wired(), reason="node/runtime does not start serve_management yet "
                       "(cluster status reads queue leaders from it)"),
]

NODES = 3
QUEUE = "deploy-quorum"
RETRY_DEADLINE_S = 90.0
CLUSTER_CLI = [sys.executable, "-m", "node.cli", "cluster"]


def _free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_layout() -> tuple[int, int]:
    """(base port, HAProxy port) with every port the plan needs free, all below the ephemeral range."""
    rng = random.Random(os.getpid())
    for _ in range(200):
        base = rng.randrange(2000, 12000)
        haproxy = base + NODES + 1
        ports = [p for n in node_plan.plan_nodes(NODES, base, False, 5672)
                 for p in (n.port, n.management_port, n.raft_port, n.metadata_port)]
        if all(owned(p) and _free(p) for p in [*ports, haproxy]):
            return base, haproxy
    raise RuntimeError("no free port layout")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    base, haproxy_port = _free_layout()
    data_dir = tmp_path / "data"
    up = [*CLUSTER_CLI, "up", "--nodes", str(NODES), "--base-port", str(base), "--haproxy-port",
          str(haproxy_port), "--detach", "--data-dir", str(data_dir)]
    result = subprocess.run(up, capture_output=True, text=True, timeout=180)
    try:
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"amqp://guest:guest@127.0.0.1:{haproxy_port}/" in result.stdout
        yield data_dir, haproxy_port
    finally:
        subprocess.run([*CLUSTER_CLI, "down", "--data-dir", str(data_dir)], capture_output=True, timeout=120)


def _connect(port: int) -> pika.BlockingConnection:
    """A connection through HAProxy, retried until a live node takes it."""
    deadline = time.monotonic() + RETRY_DEADLINE_S
    while True:
        try:
            params = pika.ConnectionParameters("127.0.0.1", port, connection_attempts=1, socket_timeout=5,
                                               blocked_connection_timeout=30)
            return pika.BlockingConnection(params)
        except pika.exceptions.AMQPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _publish_confirmed(port: int, ids: range, confirmed: list[str]) -> None:
    """Publish each id with confirms; on any failure reconnect through HAProxy and go on with the next id (an
    unconfirmed id may or may not have been enqueued; only confirmed ones must survive)."""
    deadline = time.monotonic() + RETRY_DEADLINE_S
    todo = list(ids)
    conn: pika.BlockingConnection | None = None
    while todo:
        try:
            if conn is None or conn.is_closed:
                conn = _connect(port)
                channel = conn.channel()
                channel.confirm_delivery()
            msg_id = f"m{todo[0]}"
            channel.basic_publish("", QUEUE, msg_id.encode(), pika.BasicProperties(delivery_mode=2),
                                  mandatory=True)
            confirmed.append(msg_id)
            todo.pop(0)
        except pika.exceptions.AMQPError:
            assert time.monotonic() < deadline, f"could not publish for {RETRY_DEADLINE_S} s"
            todo.pop(0)  # outcome unknown: not counted as confirmed
            conn = _close_quietly(conn)
            time.sleep(0.2)
    _close_quietly(conn)


def _close_quietly(conn: pika.BlockingConnection | None) -> None:
    try:
        if conn is not None and conn.is_open:
            conn.close()
    except pika.exceptions.AMQPError:
        pass
    return None


def _drain(port: int) -> list[str]:
    deadline = time.monotonic() + RETRY_DEADLINE_S
    while True:
        try:
            conn = _connect(port)
            try:
                channel = conn.channel()
                seen: list[str] = []
                while True:
                    method, _, body = channel.basic_get(QUEUE, auto_ack=False)
                    if method is None:
                        return seen
                    seen.append(body.decode())
            finally:
                _close_quietly(conn)
        except pika.exceptions.AMQPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _status(data_dir: Path) -> dict[str, object]:
    out = subprocess.run([*CLUSTER_CLI, "status", "--json", "--data-dir", str(data_dir)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    report: dict[str, object] = json.loads(out.stdout)
    return report


def _queue_entry(data_dir: Path) -> dict[str, object]:
    deadline = time.monotonic() + RETRY_DEADLINE_S
    while True:
        queues = _status(data_dir)["queues"]
        found = [q for q in queues if q["name"] == QUEUE and q["leader"]]  # type: ignore[union-attr,index]
        if found:
            return found[0]  # type: ignore[no-any-return]
        assert time.monotonic() < deadline, f"no leader for {QUEUE} in cluster status"
        time.sleep(0.5)


def test_publish_through_haproxy_survives_killing_the_leader(cluster: tuple[Path, int]) -> None:
    data_dir, port = cluster
    conn = _connect(port)
    conn.channel().queue_declare(QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
    conn.close()
    entry = _queue_entry(data_dir)
    assert entry["type"] == "quorum" and sorted(entry["members"]) == ["rmq1", "rmq2", "rmq3"]  # type: ignore[arg-type]
    confirmed: list[str] = []
    _publish_confirmed(port, range(0, 30), confirmed)
    assert len(confirmed) == 30  # nothing was killed yet
    state = runner.load_state(data_dir)
    assert state is not None
    leader = next(n for n in state.nodes if n.name == entry["leader"])
    os.kill(leader.pid, signal.SIGKILL)
    _publish_confirmed(port, range(30, 80), confirmed)
    assert len(confirmed) > 30  # the client carried on through HAProxy after the kill
    report = _status(data_dir)
    states = {n["name"]: n["state"] for n in report["nodes"]}  # type: ignore[attr-defined,index]
    assert states[leader.name] == "stopped" and list(states.values()).count("ready") == NODES - 1
    # The killed node comes back as the same member; then a rolling restart of every node, one at a time.
    for names in ([leader.name], []):
        result = subprocess.run([*CLUSTER_CLI, "restart", *names, "--data-dir", str(data_dir)], capture_output=True,
                                text=True, timeout=600)
        assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("sees every node running") == NODES
    states = {n["name"]: n["state"] for n in _status(data_dir)["nodes"]}  # type: ignore[attr-defined,index]
    assert set(states.values()) == {"ready"}
    delivered = _drain(port)
    missing = set(confirmed) - set(delivered)
    assert not missing, f"confirmed but lost: {sorted(missing)}"
