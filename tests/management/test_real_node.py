"""The management API and `raftmq ctl` on a real `raftmq node` process (single node), with pika as the client.

Runs once the runtime starts `serve_management` (node/runtime); until then it is skipped with that reason.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from node import ctl
from tests.integration.nodeproc import NodeProcess
from tests.management.helpers import management_wired

MANAGEMENT_WAIT_S = 30.0
pytestmark = pytest.mark.skipif(not management_wired(), reason="node/runtime does not start serve_management yet")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_accepts(port: int, node: NodeProcess) -> None:
    deadline = time.monotonic() + MANAGEMENT_WAIT_S
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"management port {port} never opened:\n{node.log_tail()}")


@pytest.fixture(name="node")
def node_fixture(tmp_path: Path) -> Iterator[tuple[NodeProcess, int]]:
    """One started node and its management port (open). Other modules import `node_fixture`; tests take `node`."""
    management_port = _free_port()
    proc = NodeProcess(tmp_path, extra_args=("--management-port", str(management_port))).start()
    try:
        _wait_accepts(management_port, proc)
        yield proc, management_port
    finally:
        proc.stop()


def run_ctl(port: int, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    code = ctl.main(["--node", f"127.0.0.1:{port}", *argv])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_ctl_sees_what_a_pika_client_did_and_adds_a_user_it_can_log_in_with(
        node: tuple[NodeProcess, int], capsys: pytest.CaptureFixture[str]) -> None:
    proc, mport = node
    params = pika.ConnectionParameters("127.0.0.1", proc.port, credentials=pika.PlainCredentials("guest", "guest"))
    with pika.BlockingConnection(params) as conn:
        ch = conn.channel()
        ch.queue_declare("mgmt-q", durable=True, arguments={"x-queue-type": "quorum"})
        ch.confirm_delivery()
        for n in range(3):
            ch.basic_publish("", "mgmt-q", f"m{n}".encode())
        code, out = run_ctl(mport, capsys, "--json", "list_queues")
        assert code == 0, out
        rows = {r["name"]: r for r in json.loads(out)}
        assert rows["mgmt-q"]["messages_ready"] == 3 and rows["mgmt-q"]["type"] == "quorum"
        code, out = run_ctl(mport, capsys, "--json", "list_connections")
        assert code == 0 and len(json.loads(out)) == 1
    code, out = run_ctl(mport, capsys, "add_user", "mgmt-ops", "pw", "--tags", "administrator")
    assert code == 0, out
    code, out = run_ctl(mport, capsys, "set_permissions", "mgmt-ops", ".*", ".*", ".*")
    assert code == 0, out
    other = pika.ConnectionParameters("127.0.0.1", proc.port, credentials=pika.PlainCredentials("mgmt-ops", "pw"))
    with pika.BlockingConnection(other) as conn:
        assert conn.channel().queue_declare("mgmt-q", passive=True).method.message_count == 3
    code, out = run_ctl(mport, capsys, "--user", "mgmt-ops", "--password", "pw", "cluster_status")
    assert code == 0 and "Cluster status of node" in out
    code, out = run_ctl(mport, capsys, "join_cluster", "elsewhere")
    assert code == ctl.EXIT_UNAVAILABLE and "not in a cluster" in out


def test_users_added_over_http_survive_a_restart(node: tuple[NodeProcess, int],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    proc, mport = node
    assert run_ctl(mport, capsys, "add_user", "keeper", "pw2", "--tags", "administrator")[0] == 0
    proc.restart()
    _wait_accepts(mport, proc)
    code, out = run_ctl(mport, capsys, "--user", "keeper", "--password", "pw2", "--json", "list_users")
    assert code == 0, out
    assert "keeper" in [u["name"] for u in json.loads(out)]
