"""Fixtures for the integration tier: a real broker process and real client libraries.

By default one `raftmq node` process serves the whole session (`amqp_target`); tests that restart or signal the
node use a private one (`own_node`). With RAFTMQ_TEST_TARGET=host:port the suite runs against that broker
instead (RabbitMQ, to check the tests encode RabbitMQ's behaviour) and node-control tests are skipped.
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

from tests.integration.nodeproc import NodeProcess, external_target


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    node: NodeProcess | None  # None when the target is an external broker

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
def amqp_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    external = external_target()
    if external is not None:
        yield Target(external[0], external[1], None)
        return
    node = NodeProcess(tmp_path_factory.mktemp("raftmq-node")).start()
    try:
        yield Target(node.host, node.port, node)
    finally:
        code = node.stop()
        assert code == 0, f"shared node exited with {code}:\n{node.log_tail()}"


@pytest.fixture
def own_node(tmp_path: Path) -> Iterator[Target]:
    """A private node process for tests that restart or signal it."""
    if external_target() is not None:
        pytest.skip("needs control of the node process (RAFTMQ_TEST_TARGET is set)")
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


def _signal_alarm(node: NodeProcess) -> Callable[[bool], None]:
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
