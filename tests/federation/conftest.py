"""Fixtures of the federation tests: the private RabbitMQ 3.10 of the link tests (interop), and a 3-node raftmq
cluster with a single-node upstream beside it (the cluster tests), with `link_runners` to see which node runs a link."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.cluster_proc import ClusterProcs, supervised
from tests.federation.test_exchange_single import Node, _start
from tests.link.conftest import rabbitmq_broker
from tests.shovel.helpers import ctl_call

__all__ = ["cluster_and_upstream", "link_runners", "rabbitmq_broker"]


@pytest.fixture
def cluster_and_upstream(tmp_path: Path) -> Iterator[tuple[ClusterProcs, Node]]:
    up = _start(tmp_path / "up", "upstream")
    try:
        with supervised(ClusterProcs(tmp_path / "cluster")) as procs:
            procs.start_all()
            yield procs, up
    finally:
        up[0].stop()


def link_runners(procs: ClusterProcs, alive: list[str], link_type: str) -> list[str] | None:
    """The nodes that run a running link of `link_type` ("exchange" | "queue"); None while a node does not answer."""
    found = []
    for name in alive:
        code, rows = ctl_call(procs.node(name).port + 10_000, "federation_status")
        if code != 0:
            return None
        found += [name for r in rows if r["status"] == "running" and r["type"] == link_type]
    return found
