"""Smoke: short workloads through a real `raftmq node` and a real RabbitMQ, with the real load-generator processes.

The raftmq tests skip when the node cannot start or serve the workload's setup yet (it is built in parallel); (b)
runs on a real 3-node `raftmq cluster up` (about 20 s, mostly start and stop). The
RabbitMQ one (about 30 s, mostly RabbitMQ starting and stopping) runs only with RAFTMQ_TEST_RABBITMQ=1 and
Debian's rabbitmq-server installed. Figures are never asserted on: only that messages went through, were confirmed
and delivered, and that the CLI writes its results.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import cli
from bench.brokers import BrokerStartError, rabbitmq_available, rabbitmq_cluster, raftmq_cluster, raftmq_node
from bench.client import Endpoint
from bench.quorum import run_quorum_workload
from bench.workloads import Measurement, RunSettings, run_workload

SHORT = RunSettings(duration_s=2.0, warmup_s=0.5)


@pytest.fixture(scope="module")
def raftmq_endpoint() -> Iterator[Endpoint]:
    with contextlib.ExitStack() as stack:
        try:
            endpoint = stack.enter_context(raftmq_node(timeout_s=30.0))
        except BrokerStartError as error:
            pytest.skip(f"raftmq node cannot start or serve yet: {error}")
        yield endpoint


def assert_messages_went_through(measurement: Measurement) -> None:
    assert measurement.error is None
    assert measurement.confirmed_msgs > 0
    assert measurement.delivered_msgs > 0
    assert measurement.nacked_msgs == 0
    assert measurement.latency_samples > 0


def test_workload_a_runs_against_a_raftmq_node(raftmq_endpoint: Endpoint) -> None:
    [measurement] = run_workload("a", "raftmq", raftmq_endpoint, SHORT)
    if measurement.error and "setup" in measurement.error:
        pytest.skip(f"raftmq node cannot serve workload (a) yet: {measurement.error}")
    assert_messages_went_through(measurement)


def test_cli_measures_a_target_and_writes_json_and_png(raftmq_endpoint: Endpoint, tmp_path: Path) -> None:
    argv = ["--target", raftmq_endpoint.address, "--target-name", "raftmq", "--workloads", "a",
            "--duration", "1", "--warmup", "0.5", "--output", str(tmp_path)]
    status = cli.main(argv)
    [json_path] = tmp_path.glob("bench-*.json")
    data = json.loads(json_path.read_text())
    [measurement] = data["measurements"]
    if measurement["error"] and "setup" in measurement["error"]:
        pytest.skip(f"raftmq node cannot serve workload (a) yet: {measurement['error']}")
    assert status == 0
    assert (measurement["broker"], measurement["label"]) == ("raftmq", "a")
    assert measurement["confirmed_msgs"] > 0
    assert json_path.with_suffix(".png").exists()


def test_workload_b_runs_on_a_3_node_raftmq_cluster_with_clients_on_two_followers() -> None:
    """(b) for real: a 3-replica quorum queue, publisher and consumer on the two nodes that are not its leader."""
    with contextlib.ExitStack() as stack:
        try:
            cluster = stack.enter_context(raftmq_cluster(3))
        except BrokerStartError as error:
            pytest.skip(f"raftmq cluster cannot start: {error}")
        [measurement] = run_quorum_workload("raftmq", cluster, SHORT, labels=("b",))
    assert_messages_went_through(measurement)
    assert (measurement.label, measurement.workload) == ("b", "b")
    assert measurement.note is not None
    assert "(follower), consumer on" in measurement.note and "3 replicas" in measurement.note


@pytest.mark.rabbitmq
@pytest.mark.slow
@pytest.mark.skipif(not rabbitmq_available(), reason="Debian's rabbitmq-server is not installed")
@pytest.mark.skipif(os.environ.get("RAFTMQ_TEST_RABBITMQ") != "1", reason="set RAFTMQ_TEST_RABBITMQ=1 (about 30 s)")
def test_workload_a_runs_against_a_private_rabbitmq_node() -> None:
    with rabbitmq_cluster(1) as cluster:
        [measurement] = run_workload("a", "rabbitmq", cluster.endpoints[0], SHORT)
    assert_messages_went_through(measurement)
