"""Shovels between raftmq and RabbitMQ 3.10 on real processes: a raftmq shovel from a RabbitMQ queue to raftmq and
back, RabbitMQ's own shovel plugin moving messages to and from raftmq, and both refusing the same invalid
definitions. Skipped when Debian's rabbitmq-server is not installed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.nodeproc import NodeProcess
from tests.link.conftest import Broker
from tests.shovel.helpers import count, ctl_call, drain, publish, start_node, uri, wait_until


@pytest.fixture
def raftmq(tmp_path: Path) -> Iterator[tuple[NodeProcess, int]]:
    node, mport = start_node(tmp_path / "raftmq")
    try:
        yield node, mport
    finally:
        node.stop()


def _rabbit_set(rabbit: Broker, name: str, value: dict[str, object]) -> tuple[int, str]:
    assert rabbit.rabbit is not None
    done = rabbit.rabbit.ctl("set_parameter", "shovel", name, json.dumps(value))
    return done.returncode, done.stdout + done.stderr


def test_raftmq_shovel_from_rabbitmq_to_raftmq_and_back(raftmq: tuple[NodeProcess, int],
                                                         rabbitmq_broker: Broker) -> None:
    node, mport = raftmq
    rabbit = rabbitmq_broker
    publish(rabbit.port, "rq-src", 200)
    there = {"src-uri": uri(rabbit.port), "src-queue": "rq-src", "dest-uri": uri(node.port), "dest-queue": "in"}
    assert ctl_call(mport, "set_parameter", "shovel", "from-rabbit", json.dumps(there))[0] == 0
    wait_until(lambda: count(node.port, "in") == 200, 60, "200 messages shovelled from RabbitMQ into raftmq")
    assert count(rabbit.port, "rq-src") == 0
    back = {"src-uri": uri(node.port), "src-queue": "in", "dest-uri": uri(rabbit.port), "dest-queue": "rq-back",
            "dest-add-timestamp-header": True}
    assert ctl_call(mport, "set_parameter", "shovel", "to-rabbit", json.dumps(back))[0] == 0
    wait_until(lambda: count(rabbit.port, "rq-back") == 200, 60, "200 messages shovelled back into RabbitMQ")
    messages = drain(rabbit.port, "rq-back")
    assert sorted(b for b, _ in messages) == sorted(f"m{n}".encode() for n in range(200))
    assert all("x-shovelled-timestamp" in headers for _, headers in messages)
    for name in ("from-rabbit", "to-rabbit"):
        assert ctl_call(mport, "clear_parameter", "shovel", name)[0] == 0


def test_rabbitmq_shovel_plugin_moves_to_and_from_raftmq(raftmq: tuple[NodeProcess, int],
                                                         rabbitmq_broker: Broker) -> None:
    node, _ = raftmq
    rabbit = rabbitmq_broker
    publish(rabbit.port, "plugin-src", 150)
    code, out = _rabbit_set(rabbit, "to-raftmq", {"src-uri": "amqp://", "src-queue": "plugin-src",
                                                  "dest-uri": uri(node.port), "dest-queue": "plugin-in"})
    assert code == 0, out
    wait_until(lambda: count(node.port, "plugin-in") == 150, 90, "RabbitMQ's shovel filled the raftmq queue")
    code, out = _rabbit_set(rabbit, "from-raftmq", {"src-uri": uri(node.port), "src-queue": "plugin-in",
                                                    "dest-uri": "amqp://", "dest-queue": "plugin-back",
                                                    "dest-add-forward-headers": True})
    assert code == 0, out
    wait_until(lambda: count(rabbit.port, "plugin-back") == 150, 90, "RabbitMQ's shovel emptied the raftmq queue")
    assert count(node.port, "plugin-in") == 0
    messages = drain(rabbit.port, "plugin-back")
    assert sorted(b for b, _ in messages) == sorted(f"m{n}".encode() for n in range(150))
    assert rabbit.rabbit is not None
    for name in ("to-raftmq", "from-raftmq"):
        rabbit.rabbit.ctl("clear_parameter", "shovel", name)


@pytest.mark.parametrize("value", [
    {"src-queue": "a", "src-exchange": "x"},
    {"src-queue": "a", "dest-queue": "b", "dest-exchange": "x"},
    {"src-queue": "a", "ack-mode": "no-ack", "src-delete-after": 3},
    {"dest-queue": "b"},
])
def test_raftmq_refuses_what_rabbitmq_refuses(raftmq: tuple[NodeProcess, int], rabbitmq_broker: Broker,
                                              value: dict[str, object]) -> None:
    node, mport = raftmq
    full = {"src-uri": uri(node.port), "dest-uri": uri(node.port), **value}
    rabbit_code, rabbit_out = _rabbit_set(rabbitmq_broker, "invalid", full)
    code, out = ctl_call(mport, "set_parameter", "shovel", "invalid", json.dumps(full))
    assert rabbit_code != 0 and code == 65, (rabbit_out, out)
    print(f"RabbitMQ: {rabbit_out.strip()!r}\nraftmq: {str(out).strip()!r}")
