"""Smoke: a 2-second workload (a) through a real `raftmq node`, with the real load-generator processes.

Skips when the node cannot start or serve the workload's setup yet (it is built in parallel). Figures are never
asserted on: only that messages went through, were confirmed and were delivered.
"""

from __future__ import annotations

import contextlib

import pytest

from bench.brokers import BrokerStartError, raftmq_node
from bench.workloads import RunSettings, run_workload


def test_workload_a_runs_against_a_raftmq_node() -> None:
    with contextlib.ExitStack() as stack:
        try:
            endpoint = stack.enter_context(raftmq_node(timeout_s=30.0))
        except BrokerStartError as error:
            pytest.skip(f"raftmq node cannot start or serve yet: {error}")
        [measurement] = run_workload("a", "raftmq", endpoint, RunSettings(duration_s=2.0, warmup_s=0.5))
    if measurement.error and "setup" in measurement.error:
        pytest.skip(f"raftmq node cannot serve workload (a) yet: {measurement.error}")
    assert measurement.error is None
    assert measurement.confirmed_msgs > 0
    assert measurement.delivered_msgs > 0
    assert measurement.nacked_msgs == 0
    assert measurement.latency_samples > 0
