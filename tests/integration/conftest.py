"""Fixtures for the integration tier: a real broker and real client libraries, in two modes.

Every test that takes `amqp_target` (or `conn`/`ch`, built on it) runs twice: `[single]` against one `raftmq
node` process that serves the whole session, and `[cluster]` against a 3-node cluster behind a real HAProxy
(tests/integration/clusterproc.py, put together as `raftmq cluster up` does), clients connecting through HAProxy.
Tests that restart or signal the broker take `own_node`, also in both modes: a private node in single mode; in
cluster mode the session's cluster, whose every node the test restarts, kills or signals (the fixture starts any
stopped node again afterwards, so later tests find the cluster whole). With RAFTMQ_TEST_TARGET=host:port the suite
runs once, `[external]`, against that broker (RabbitMQ, to check the tests encode RabbitMQ's behaviour) and
node-control tests are skipped.

`CLUSTER_XFAIL` below names the tests whose cluster parametrisation fails on a known broker bug: they run there as
xfail(strict=False) with the bug as the reason; delete an entry when its bug is fixed.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pika
import pytest

from tests.integration.clusterproc import ClusterProcess
from tests.integration.nodeproc import NodeProcess, external_target

MODES = ("external",) if external_target() is not None else ("single", "cluster")

# Test ids (file::name, or file::name[params] for one parametrisation, the mode left out) whose cluster-mode run
# fails on a known broker bug -> the bug. Applied as xfail(strict=False) to the [cluster] parametrisation only.
CLUSTER_XFAIL: dict[str, str] = {}
XFAIL_TIMEOUT_S = 120  # a known bug that hangs a test costs this much, not the suite's timeout


def _mode(item: pytest.Item) -> str | None:
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return None
    for name in ("amqp_target", "own_node"):
        if name in callspec.params:
            return str(callspec.params[name])
    return None


def cluster_xfail_reason(item: pytest.Item) -> str | None:
    base = f"{item.path.name}::{getattr(item, 'originalname', item.name)}"
    callspec = getattr(item, "callspec", None)
    rest = [part for part in (callspec.id.split("-") if callspec else []) if part not in MODES]
    keys = [f"{base}[{'-'.join(rest)}]"] if rest else []
    return next((CLUSTER_XFAIL[key] for key in [*keys, base] if key in CLUSTER_XFAIL), None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents and _mode(item) == "cluster":
            reason = cluster_xfail_reason(item)
            if reason is not None:
                item.add_marker(pytest.mark.xfail(strict=False, reason=f"cluster mode: {reason}"))
                item.add_marker(pytest.mark.timeout(XFAIL_TIMEOUT_S), append=False)


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    node: NodeProcess | ClusterProcess | None  # None when the target is an external broker
    mode: str = "single"

    def params(self, user: str = "guest", password: str = "guest", vhost: str = "/",
               **kwargs: object) -> pika.ConnectionParameters:
        return pika.ConnectionParameters(
            host=self.host, port=self.port, virtual_host=vhost,
            credentials=pika.PlainCredentials(user, password), connection_attempts=1,
            blocked_connection_timeout=None, **kwargs,  # type: ignore[arg-type]
        )

    def url(self, user: str = "guest", password: str = "guest", vhost: str = "/") -> str:
        quoted = vhost.replace("/", "%2F")
        return f"amqp://{user}:{password}@{self.host}:{self.port}/{quoted}"


@pytest.fixture(scope="session")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterProcess]:
    """The session's 3-node cluster behind HAProxy (started the first time a cluster-mode test needs it)."""
    cluster = ClusterProcess(tmp_path_factory.mktemp("raftmq-cluster"))
    try:
        yield cluster.start()
    finally:
        code = cluster.shutdown()
        assert code == 0, f"a cluster node exited with {code}:\n{cluster.log_tail()}"


@pytest.fixture(scope="session", params=MODES)
def amqp_target(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    external = external_target()
    if external is not None:
        yield Target(external[0], external[1], None, "external")
        return
    if request.param == "cluster":
        cluster: ClusterProcess = request.getfixturevalue("shared_cluster")
        yield Target(cluster.host, cluster.port, cluster, "cluster")
        return
    node = NodeProcess(tmp_path_factory.mktemp("raftmq-node")).start()
    try:
        yield Target(node.host, node.port, node)
    finally:
        code = node.stop()
        assert code == 0, f"shared node exited with {code}:\n{node.log_tail()}"


@pytest.fixture(params=MODES)
def own_node(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    """A broker the test may restart, kill or signal: a private node process, or the session's cluster (every
    node of it; started whole again afterwards)."""
    if external_target() is not None:
        pytest.skip("needs control of the node process (RAFTMQ_TEST_TARGET is set)")
    if request.param == "cluster":
        cluster: ClusterProcess = request.getfixturevalue("shared_cluster")
        try:
            yield Target(cluster.host, cluster.port, cluster, "cluster")
        finally:
            cluster.start()
        return
    node = NodeProcess(tmp_path / "node").start()
    try:
        yield Target(node.host, node.port, node)
    finally:
        node.stop(signal.SIGKILL)


@pytest.fixture
def uid() -> str:
    """A unique suffix: tests never collide, even on a long-lived external broker."""
    return uuid.uuid4().hex[:10]


@pytest.fixture
def conn(amqp_target: Target) -> Iterator[pika.BlockingConnection]:
    connection = pika.BlockingConnection(amqp_target.params())
    try:
        yield connection
    finally:
        if connection.is_open:
            connection.close()


@pytest.fixture
def ch(conn: pika.BlockingConnection) -> pika.adapters.blocking_connection.BlockingChannel:
    return conn.channel()


@dataclass
class AlarmControl:
    """Force a resource alarm on and off: SIGUSR1 for a raftmq node, rabbitmqctl for RabbitMQ."""

    set_alarm: Callable[[bool], None]


def _signal_alarm(node: NodeProcess | ClusterProcess) -> Callable[[bool], None]:
    """SIGUSR1 toggles a forced memory alarm. A cluster signals every node: the client's node is whichever HAProxy
    picked, and in RabbitMQ an alarm on any node blocks publishers on every node."""
    if isinstance(node, ClusterProcess):
        return node.set_memory_alarm
    state = {"on": False}

    def set_alarm(on: bool) -> None:
        if state["on"] != on:
            node.send_signal(signal.SIGUSR1)
            state["on"] = on

    return set_alarm


def _rabbitmqctl_alarm(command: str) -> Callable[[bool], None]:
    def set_alarm(on: bool) -> None:
        watermark = "0.000001" if on else "0.4"
        subprocess.run([*shlex.split(command), "set_vm_memory_high_watermark", watermark], check=True,
                       capture_output=True, timeout=60)

    return set_alarm


@pytest.fixture
def alarm_control(amqp_target: Target) -> Iterator[AlarmControl]:
    if amqp_target.node is not None:
        control = AlarmControl(_signal_alarm(amqp_target.node))
    elif os.environ.get("RAFTMQ_TEST_RABBITMQCTL"):
        control = AlarmControl(_rabbitmqctl_alarm(os.environ["RAFTMQ_TEST_RABBITMQCTL"]))
    else:
        pytest.skip("no way to force an alarm on this target (set RAFTMQ_TEST_RABBITMQCTL)")
    try:
        yield control
    finally:
        control.set_alarm(False)
