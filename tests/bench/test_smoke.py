"""Smoke: short workloads through a real `raftmq node` and a real RabbitMQ, with the real load-generator processes.

The raftmq tests skip when the node cannot start or serve the workload's setup yet (it is built in parallel); (b)
runs on a real 3-node `raftmq cluster up` (about 20 s, mostly start and stop). The
RabbitMQ one (about 30 s, mostly RabbitMQ starting and stopping) runs only with RAFTMQ_TEST_RABBITMQ=1 and
Debian's rabbitmq-server installed. Figures are never asserted on: only that messages went through, were confirmed
and delivered, and that the CLI writes its results.
"""

from __future__ import annotations

import contextlib
import dataclasses
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
    # (a) first times the first message on new queues ("a/new-q", --new-queue-trials, 5 by default), then flows.
    new_queue, measurement = data["measurements"]
    if measurement["error"] and "setup" in measurement["error"]:
        pytest.skip(f"raftmq node cannot serve workload (a) yet: {measurement['error']}")
    assert status == 0
    assert (measurement["broker"], measurement["label"]) == ("raftmq", "a")
    assert measurement["confirmed_msgs"] > 0
    assert measurement["confirm_p99_ms"] is not None
    assert (new_queue["label"], new_queue["kind"], new_queue["error"]) == ("a/new-q", "new-queue", None)
    assert new_queue["latency_samples"] == 5
    assert json_path.with_suffix(".png").exists()


def test_new_queue_trials_and_fixed_rates_of_a(raftmq_endpoint: Endpoint) -> None:
    """(a) with new-queue trials and a fixed rate: every trial gets its confirm and delivery, the paced run has
    end-to-end and confirm latency and deliveries."""
    settings = dataclasses.replace(SHORT, rates_for=("a",), latency_rates_msgs_per_s=(500,), new_queue_trials=3)
    found = run_workload("a", "raftmq", raftmq_endpoint, settings)
    assert [m.label for m in found] == ["a/new-q", "a", "a@500/s"]
    new_queue, _, paced = found
    assert new_queue.error is None and new_queue.is_new_queue
    assert new_queue.latency_samples == 3
    assert None not in (new_queue.declare_ok_p50_ms, new_queue.confirm_p99_ms, new_queue.latency_p99_ms)
    assert_messages_went_through(paced)
    assert paced.target_rate_msgs_per_s == 500.0
    assert paced.confirm_p50_ms is not None


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


def test_new_quorum_queues_and_a_fixed_rate_on_a_3_node_raftmq_cluster() -> None:
    """(b)'s new-queue trials (round-robin over the nodes) and (b) at a fixed rate on a real 3-node cluster."""
    settings = dataclasses.replace(SHORT, rates_for=("b",), latency_rates_msgs_per_s=(300,), new_queue_trials=3)
    with contextlib.ExitStack() as stack:
        try:
            cluster = stack.enter_context(raftmq_cluster(3))
        except BrokerStartError as error:
            pytest.skip(f"raftmq cluster cannot start: {error}")
        found = run_quorum_workload("raftmq", cluster, settings, labels=())
    assert [m.label for m in found] == ["b/new-q", "b@300/s"]
    new_queue, paced = found
    assert new_queue.error is None and new_queue.latency_samples == 3
    assert new_queue.note is not None and "rmq1, rmq2, rmq3" in new_queue.note
    assert_messages_went_through(paced)
    assert paced.target_rate_msgs_per_s == 300.0


@pytest.mark.rabbitmq
@pytest.mark.slow
@pytest.mark.skipif(not rabbitmq_available(), reason="Debian's rabbitmq-server is not installed")
@pytest.mark.skipif(os.environ.get("RAFTMQ_TEST_RABBITMQ") != "1", reason="set RAFTMQ_TEST_RABBITMQ=1 (about 30 s)")
def test_workload_a_runs_against_a_private_rabbitmq_node() -> None:
    with rabbitmq_cluster(1) as cluster:
        [measurement] = run_workload("a", "rabbitmq", cluster.endpoints[0], SHORT)
    assert_messages_went_through(measurement)
