"""Brokers for the link tests: a `raftmq node` process and, when Debian's rabbitmq-server is installed, a private
RabbitMQ 3.10 node (bench/brokers.py starts it: own cookie, epmd port and directory; the shovel plugin enabled)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.brokers import BrokerStartError, RabbitCluster, rabbitmq_available, rabbitmq_cluster
from tests.integration.nodeproc import NodeProcess


@dataclass(frozen=True)
class Broker:
    kind: str  # "raftmq" or "rabbitmq"
    host: str
    port: int
    rabbit: RabbitCluster | None = None  # rabbitmqctl for the RabbitMQ node

    def uri(self, user: str = "guest", password: str = "guest", vhost: str = "/", query: str = "") -> str:
        quoted = vhost.replace("%", "%25").replace("/", "%2F")
        return f"amqp://{user}:{password}@{self.host}:{self.port}/{quoted}" + (f"?{query}" if query else "")


@pytest.fixture(scope="session")
def raftmq_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    node = NodeProcess(tmp_path_factory.mktemp("link-raftmq")).start()
    try:
        yield Broker("raftmq", node.host, node.port)
    finally:
        node.stop()


@pytest.fixture(scope="session")
def rabbitmq_broker() -> Iterator[Broker]:
    if not rabbitmq_available():
        pytest.skip("Debian's rabbitmq-server is not installed")
    try:
        with rabbitmq_cluster(1, plugins=("rabbitmq_shovel", "rabbitmq_federation")) as cluster:
            endpoint = cluster.endpoints[0]
            yield Broker("rabbitmq", endpoint.host, endpoint.port, cluster)
    except BrokerStartError as exc:
        pytest.skip(f"RabbitMQ did not start: {exc}")


@pytest.fixture(params=["raftmq", "rabbitmq"])
def broker(request: pytest.FixtureRequest) -> Broker:
    found: Broker = request.getfixturevalue(f"{request.param}_broker")
    return found


@pytest.fixture
def private_node(tmp_path: Path) -> Iterator[NodeProcess]:
    node = NodeProcess(tmp_path / "node").start()
    try:
        yield node
    finally:
        node.stop()
