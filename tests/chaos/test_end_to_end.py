"""End to end on one real raftmq node: kill -9 mid-stream, restart, drain, check.

The first test is a real test of the node's fsync-before-confirm discipline (durable queue, persistent messages):
nothing confirmed may be lost. The second shows the checker can fail: transient messages on a non-durable queue
are confirmed without being written, so a kill -9 genuinely loses confirmed messages and the checker must say so.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.checker import CheckResult, check
from chaos.history import Publish, split
from chaos.nemesis import LocalCluster
from chaos.workload import Workload, WorkloadConfig


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def one_node(tmp_path: Path) -> Iterator[LocalCluster]:
    cluster = LocalCluster.spawn(tmp_path / "cluster", 1, free_port() - 1)
    try:
        yield cluster
    finally:
        cluster.stop_all()


def kill_restart_run(cluster: LocalCluster, durable: bool, consumers: int) -> CheckResult:
    config = WorkloadConfig(urls=(cluster.url("rmq1"),), queues=("chaos-e2e",), publishers=2,
                            consumers_per_queue=consumers,
                            messages_per_publisher=200, durable=durable, persistent=durable, drain_timeout_s=30, drain_idle_s=0.5)
    workload = Workload(config)
    workload.start()
    deadline = time.monotonic() + 30
    while sum(1 for r in workload.records() if isinstance(r, Publish) and r.outcome == "confirmed") < 100:
        assert time.monotonic() < deadline, "workload made no progress"
        time.sleep(0.02)
    workload.recorder.fault("kill", "rmq1")
    cluster.kill("rmq1")
    time.sleep(0.2)
    cluster.restart("rmq1")
    workload.recorder.fault("restart", "rmq1")
    assert workload.wait_published(timeout_s=60)
    assert workload.drain()
    publishes, deliveries, _ = split(workload.records())
    return check(publishes, deliveries)


def test_kill_9_mid_stream_loses_nothing_confirmed(one_node: LocalCluster) -> None:
    result = kill_restart_run(one_node, durable=True, consumers=1)
    assert result.attempted == 400 and result.confirmed >= 200
    assert result.lost == () and result.unexpected == ()
    assert result.valid


def test_checker_catches_confirmed_transient_messages_lost_by_kill_9(one_node: LocalCluster) -> None:
    # No consumer until the drain, so the messages confirmed before the kill are certainly still queued.
    result = kill_restart_run(one_node, durable=False, consumers=0)
    assert result.confirmed >= 200
    assert result.unexpected == ()
    assert len(result.lost) >= 100 and not result.valid
