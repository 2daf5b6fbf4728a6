"""Per-vhost limits (`max-connections`, `max-queues`), set through the management API as `raftmq ctl
set_vhost_limits` does, against a real node and a real cluster: the refusal carries RabbitMQ 3.10's code and text,
and nothing else is disturbed (the refused client's other channels, other vhosts, existing queues).

Each test makes its own vhost, so the session's broker is left as it was. In cluster mode the limit is set on one
node and the test waits until every node's `/api/vhost-limits` shows it (mirrored from the metadata group);
`max-queues` counts the cluster's queues, `max-connections` the connections of the node a client reaches, so the
connection test talks to one node's AMQP port directly (docs/configuration.md, "Limits")."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pika
import pika.exceptions
import pytest
import requests

from tests.integration.clusterproc import ClusterProcess
from tests.integration.conftest import Target
from tests.integration.helpers import expect_channel_error
from tests.integration.nodeproc import REPO_ROOT, NodeProcess

MANAGEMENT_LINE = re.compile(rb"management API on port (\d+)")
WAIT_S = 30.0


def management_ports(target: Target, starts: int = 1) -> list[int]:
    """Each node's management port (a single node's from its log: the line of its `starts`-th start)."""
    if isinstance(target.node, ClusterProcess):
        return [n.plan.management_port for n in target.node.nodes]
    if isinstance(target.node, NodeProcess):
        deadline = time.monotonic() + WAIT_S  # the node logs the line once the API listens, after AMQP's
        while len(found := MANAGEMENT_LINE.findall(target.node.log_path.read_bytes())) < starts:
            assert time.monotonic() < deadline, target.node.log_tail()
            time.sleep(0.05)
        return [int(found[-1])]
    pytest.skip("needs the broker's management API")


def amqp_ports(target: Target) -> list[int]:
    """Each node's own AMQP port (not HAProxy's)."""
    if isinstance(target.node, ClusterProcess):
        return [n.plan.port for n in target.node.nodes]
    return [target.port]


def api(port: int, method: str, path: str, body: Any = None) -> requests.Response:
    return requests.request(method, f"http://127.0.0.1:{port}{path}", json=body, auth=("guest", "guest"),
                            timeout=30)


def wait_all(ports: list[int], what: str, check: Any) -> None:
    deadline = time.monotonic() + WAIT_S
    for port in ports:
        while not check(port):
            assert time.monotonic() < deadline, f"{what} not seen on the node with management port {port}"
            time.sleep(0.1)


def limits_on(port: int, vhost: str) -> dict[str, Any] | None:
    try:
        rows = api(port, "GET", f"/api/vhost-limits/{quote(vhost)}").json()
    except requests.ConnectionError:  # (a node not serving yet)
        return None
    return dict(rows[0]["value"]) if rows else {}


def quote(name: str) -> str:
    return requests.utils.quote(name, safe="")


def ctl(port: int, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "node.cli", "ctl", "--node", f"127.0.0.1:{port}", *args],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)


def make_vhost(target: Target, name: str) -> str:
    """A fresh vhost where guest may do anything, known to every node."""
    ports = management_ports(target)
    assert api(ports[0], "PUT", f"/api/vhosts/{quote(name)}").status_code in (201, 204)
    reply = api(ports[0], "PUT", f"/api/permissions/{quote(name)}/guest",
                {"configure": ".*", "write": ".*", "read": ".*"})
    assert reply.status_code in (201, 204), reply.text
    wait_all(ports, "the vhost's permissions",
             lambda p: api(p, "GET", f"/api/permissions/{quote(name)}/guest").status_code == 200)
    return name


@pytest.fixture
def vhost(amqp_target: Target, uid: str) -> Iterator[str]:
    yield make_vhost(amqp_target, f"limits-{uid}")


def set_limits(target: Target, vhost: str, limits: dict[str, int]) -> None:
    """`raftmq ctl set_vhost_limits` on the first node, then wait until every node enforces them."""
    ports = management_ports(target)
    done = ctl(ports[0], "set_vhost_limits", "-p", vhost, json.dumps(limits))
    assert done.returncode == 0, done.stderr
    wait_all(ports, f"limits {limits}", lambda p: limits_on(p, vhost) == limits)


def test_max_queues_refuses_new_queues_only(amqp_target: Target, vhost: str) -> None:
    set_limits(amqp_target, vhost, {"max-queues": 2})
    connection = pika.BlockingConnection(amqp_target.params(vhost=vhost))
    try:
        ch = connection.channel()
        ch.queue_declare("q1", durable=True)
        ch.queue_declare("q2", durable=True)
        error = expect_channel_error(406, lambda: connection.channel().queue_declare("q3", durable=True))
        assert error.reply_text == (f"PRECONDITION_FAILED - cannot declare queue 'q3': queue limit in vhost "
                                    f"'{vhost}' (2) is reached")
        error = expect_channel_error(406, lambda: connection.channel().queue_declare("", exclusive=True))
        assert "queue limit in vhost" in error.reply_text
        ch.queue_declare("q1", durable=True)  # an existing queue: not a new one, so not refused
        ch.basic_publish("", "q2", b"kept")  # the first channel is untouched by the others' errors
        assert ch.queue_declare("q2", passive=True).method.message_count == 1

        ch.queue_delete("q1")
        ch.queue_declare("q3", durable=True)  # room again
        ctl_done = ctl(management_ports(amqp_target)[0], "clear_vhost_limits", "-p", vhost)
        assert ctl_done.returncode == 0, ctl_done.stderr
        wait_all(management_ports(amqp_target), "no limits", lambda p: limits_on(p, vhost) == {})
        ch.queue_declare("q4", durable=True)
        for name in ("q2", "q3", "q4"):
            ch.queue_delete(name)
    finally:
        connection.close()


def test_max_queues_zero_and_negative(amqp_target: Target, vhost: str) -> None:
    set_limits(amqp_target, vhost, {"max-queues": 0})
    connection = pika.BlockingConnection(amqp_target.params(vhost=vhost))
    try:
        expect_channel_error(406, lambda: connection.channel().queue_declare("z1"))
        set_limits(amqp_target, vhost, {"max-queues": -1})  # negative: no limit
        ch = connection.channel()
        ch.queue_declare("z1")
        ch.queue_delete("z1")
    finally:
        connection.close()


def test_max_connections_refuses_with_530_and_others_stay(amqp_target: Target, vhost: str) -> None:
    set_limits(amqp_target, vhost, {"max-connections": 2})
    port = amqp_ports(amqp_target)[0]
    params = pika.ConnectionParameters("127.0.0.1", port, vhost, pika.PlainCredentials("guest", "guest"),
                                       connection_attempts=1)
    first, second = pika.BlockingConnection(params), pika.BlockingConnection(params)
    try:
        with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
            pika.BlockingConnection(params)
        assert "(530)" in str(info.value)
        assert (f"NOT_ALLOWED - access to vhost '{vhost}' refused for user 'guest': connection limit (2) is reached"
                in str(info.value))
        # the two open connections still work, and other vhosts are not limited
        ch = first.channel()
        ch.queue_declare("c1", exclusive=True)
        ch.basic_publish("", "c1", b"x")
        assert ch.queue_declare("c1", passive=True).method.message_count == 1
        other = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", port, "/", pika.PlainCredentials("guest", "guest"), connection_attempts=1))
        other.close()
        second.close()
        third = pika.BlockingConnection(params)  # a slot is free again
        third.close()
    finally:
        for conn in (first, second):
            if conn.is_open:
                conn.close()


def test_max_connections_zero_refuses_all(amqp_target: Target, vhost: str) -> None:
    set_limits(amqp_target, vhost, {"max-connections": 0})
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
        pika.BlockingConnection(amqp_target.params(vhost=vhost))
    assert "connection limit (0) is reached" in str(info.value)
    set_limits(amqp_target, vhost, {"max-connections": 5, "max-queues": 10})
    pika.BlockingConnection(amqp_target.params(vhost=vhost)).close()


def test_vhost_limits_api(amqp_target: Target, vhost: str) -> None:
    port = management_ports(amqp_target)[0]
    path = f"/api/vhost-limits/{quote(vhost)}"
    assert api(port, "PUT", f"{path}/max-queues", {"value": 7}).status_code == 201
    assert api(port, "PUT", f"{path}/max-queues", {"value": 8}).status_code == 204
    assert api(port, "PUT", f"{path}/max-connections", {"value": 3}).status_code == 201
    assert api(port, "GET", path).json() == [{"vhost": vhost, "value": {"max-queues": 8, "max-connections": 3}}]
    assert {"vhost": vhost, "value": {"max-queues": 8, "max-connections": 3}} in api(
        port, "GET", "/api/vhost-limits").json()
    assert api(port, "PUT", f"{path}/max-channels", {"value": 1}).status_code == 400
    assert api(port, "PUT", f"{path}/max-queues", {"value": "many"}).status_code == 400
    assert api(port, "PUT", "/api/vhost-limits/no-such-vhost/max-queues", {"value": 1}).status_code == 400
    assert api(port, "DELETE", f"{path}/max-queues").status_code == 204
    assert api(port, "DELETE", f"{path}/max-queues").status_code == 404
    assert api(port, "GET", path).json() == [{"vhost": vhost, "value": {"max-connections": 3}}]
    listed = ctl(port, "list_vhost_limits", "--json")
    assert listed.returncode == 0, listed.stderr
    assert ctl(port, "set_vhost_limits", "-p", vhost, "not json").returncode == 64
    assert ctl(port, "clear_vhost_limits", "-p", vhost).returncode == 0
    assert api(port, "GET", path).json() == []


def test_limits_survive_a_restart(own_node: Target, uid: str) -> None:
    """Stored with the vhost: the definitions store of a single node, the metadata group of a cluster."""
    vhost = make_vhost(own_node, f"limits-{uid}")
    set_limits(own_node, vhost, {"max-queues": 1, "max-connections": 4})
    assert own_node.node is not None
    own_node.node.restart()
    ports = management_ports(own_node, starts=2)
    wait_all(ports, "limits after the restart", lambda p: limits_on(p, vhost) == {"max-queues": 1,
                                                                                  "max-connections": 4})
    connection = pika.BlockingConnection(own_node.params(vhost=vhost))
    try:
        connection.channel().queue_declare("only", durable=True)
        error = expect_channel_error(406, lambda: connection.channel().queue_declare("second", durable=True))
        assert "queue limit in vhost" in error.reply_text
    finally:
        connection.close()
