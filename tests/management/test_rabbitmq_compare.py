"""raftmq's management API beside RabbitMQ 3.10's, on the same requests: status codes and error bodies must match,
and a definitions file exported by either imports into the other. RabbitMQ runs privately (bench/brokers.py: own
cookie, epmd port and directories) with the management plugin on a free port. Skipped when Debian's
rabbitmq-server is not installed."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from bench.brokers import BrokerStartError, rabbitmq_available, rabbitmq_cluster
from tests.integration.nodeproc import NodeProcess

WAIT_S = 60.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_http(port: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            requests.get(f"http://127.0.0.1:{port}/api/overview", auth=("guest", "guest"), timeout=5)
            return
        except requests.ConnectionError:
            assert time.monotonic() < deadline, f"no management API on port {port}"
            time.sleep(0.2)


@pytest.fixture(scope="module")
def rabbitmq_port() -> Iterator[int]:
    if not rabbitmq_available():
        pytest.skip("Debian's rabbitmq-server is not installed")
    port = _free_port()
    saved = os.environ.get("RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS")
    os.environ["RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"] = (
        f'-rabbitmq_management tcp_config [{{port,{port}}},{{ip,"127.0.0.1"}}]')
    try:
        with rabbitmq_cluster(1, plugins=("rabbitmq_management",)):
            _wait_http(port)
            yield port
    except BrokerStartError as exc:
        pytest.skip(f"RabbitMQ did not start: {exc}")
    finally:
        if saved is None:
            os.environ.pop("RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS", None)
        else:
            os.environ["RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"] = saved


@pytest.fixture(scope="module")
def raftmq_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    port = _free_port()
    node = NodeProcess(tmp_path_factory.mktemp("mgmt-compare"), extra_args=("--management-port", str(port))).start()
    try:
        _wait_http(port)
        yield port
    finally:
        node.stop()


def call(port: int, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    reply = requests.request(method, f"http://127.0.0.1:{port}{path}", auth=("guest", "guest"), timeout=30,
                             data=None if body is None else json.dumps(body),
                             headers={"content-type": "application/json"})
    try:
        return reply.status_code, reply.json() if reply.content else None
    except ValueError:
        return reply.status_code, reply.text


# (method, path, body) in order; every answer's status and JSON body must be the same from both brokers.
SCRIPT: list[tuple[str, str, Any]] = [
    ("PUT", "/api/queues/%2F/cmp-q", {"durable": True}),
    ("PUT", "/api/queues/%2F/cmp-q", {"durable": True}),
    ("PUT", "/api/queues/%2F/cmp-q", {"durable": False}),
    ("PUT", "/api/queues/%2F/cmp-q2", {"auto_delete": "maybe"}),
    ("PUT", "/api/queues/cmp-no-vhost/q", {}),
    ("PUT", "/api/exchanges/%2F/cmp-x", {"type": "topic", "durable": True}),
    ("PUT", "/api/exchanges/%2F/cmp-x", {"type": "topic", "durable": True}),
    ("POST", "/api/bindings/%2F/e/cmp-x/q/cmp-q", {"routing_key": "a.*"}),
    ("GET", "/api/bindings/%2F/e/cmp-x/q/cmp-q", None),
    ("GET", "/api/bindings/%2F/e/cmp-x/q/cmp-q/a.%252A", None),
    ("POST", "/api/exchanges/%2F/cmp-x/publish",
     {"routing_key": "a.b", "properties": {"delivery_mode": 2, "headers": {"h": 1}}, "payload": "aGk=",
      "payload_encoding": "base64"}),
    ("POST", "/api/exchanges/%2F/cmp-x/publish",
     {"routing_key": "nowhere", "properties": {}, "payload": "x", "payload_encoding": "string"}),
    ("POST", "/api/exchanges/%2F/amq.default/publish", {"routing_key": "cmp-q"}),
    ("POST", "/api/exchanges/%2F/cmp-missing/publish",
     {"routing_key": "k", "properties": {}, "payload": "x", "payload_encoding": "string"}),
    ("POST", "/api/queues/%2F/cmp-q/get", {"count": 2, "ackmode": "ack_requeue_false"}),
    ("POST", "/api/queues/%2F/cmp-q/get", {"count": 2, "ackmode": "ack_requeue_true", "encoding": "auto"}),
    ("POST", "/api/queues/%2F/cmp-q/get", {"count": 2, "ackmode": "ack_requeue_false", "encoding": "auto"}),
    ("POST", "/api/queues/%2F/cmp-missing/get", {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"}),
    ("DELETE", "/api/bindings/%2F/e/cmp-x/q/cmp-q/a.%252A", None),
    ("GET", "/api/bindings/%2F/e/cmp-x/q/cmp-q", None),
    ("DELETE", "/api/queues/%2F/cmp-q/contents", None),
    ("DELETE", "/api/queues/%2F/cmp-q", None),
    ("DELETE", "/api/queues/%2F/cmp-q", None),
    ("DELETE", "/api/exchanges/%2F/cmp-x", None),
    ("GET", "/api/queues/%2F/cmp-q", None),
    ("GET", "/api/aliveness-test/%2F", None),
    ("GET", "/api/healthchecks/node", None),
    ("GET", "/api/health/checks/alarms", None),
    ("GET", "/api/whoami", None),
    ("GET", "/api/user-limits", None),
    ("PUT", "/api/vhosts/cmp-del-vh", None),
    ("PUT", "/api/users/cmp-del-u", {"password": "pw", "tags": ""}),
    ("PUT", "/api/users/cmp-del-u2", {"password": "pw", "tags": "management"}),
    ("PUT", "/api/permissions/cmp-del-vh/cmp-del-u", {"configure": ".*", "write": ".*", "read": ".*"}),
    ("PUT", "/api/permissions/cmp-del-vh/cmp-del-u2", {"configure": ".*", "write": ".*", "read": ".*"}),
    ("DELETE", "/api/permissions/cmp-del-vh/cmp-del-u", None),
    ("DELETE", "/api/permissions/cmp-del-vh/cmp-del-u", None),
    ("GET", "/api/permissions/cmp-del-vh/cmp-del-u", None),
    ("DELETE", "/api/users/cmp-del-u", None),
    ("DELETE", "/api/users/cmp-del-u", None),
    ("GET", "/api/users/cmp-del-u", None),
    ("POST", "/api/users/bulk-delete", {"users": ["cmp-del-u2", "cmp-del-none"]}),
    ("GET", "/api/users/cmp-del-u2", None),
    ("GET", "/api/permissions/cmp-del-vh/cmp-del-u2", None),
    ("POST", "/api/users/bulk-delete", {}),
    ("DELETE", "/api/vhosts/cmp-del-vh", None),
    ("DELETE", "/api/vhosts/cmp-del-vh", None),
    ("GET", "/api/vhosts/cmp-del-vh", None),
]


def test_same_requests_same_answers(rabbitmq_port: int, raftmq_port: int) -> None:
    diffs = []
    for method, path, body in SCRIPT:
        theirs, ours = call(rabbitmq_port, method, path, body), call(raftmq_port, method, path, body)
        if ours != theirs:
            diffs.append(f"{method} {path} {body}: ours {ours} theirs {theirs}")
    assert not diffs, "\n".join(diffs)


def _declare_sample(port: int, tag: str) -> None:
    for method, path, body in [
        ("PUT", f"/api/vhosts/{tag}-vh", None),
        ("PUT", f"/api/users/{tag}-user", {"password": "pw", "tags": "management"}),
        ("PUT", f"/api/permissions/{tag}-vh/guest", {"configure": ".*", "write": ".*", "read": ".*"}),
        ("PUT", f"/api/permissions/{tag}-vh/{tag}-user", {"configure": "", "write": ".*", "read": ".*"}),
        ("PUT", f"/api/policies/{tag}-vh/ttl", {"pattern": "^q", "definition": {"message-ttl": 60000},
                                                "apply-to": "queues", "priority": 1}),
        ("PUT", f"/api/queues/{tag}-vh/q1", {"durable": True, "arguments": {"x-max-length": 10}}),
        ("PUT", f"/api/exchanges/{tag}-vh/x1", {"type": "fanout", "durable": True}),
        ("POST", f"/api/bindings/{tag}-vh/e/x1/q/q1", {"routing_key": "k", "arguments": {}}),
    ]:
        status, answer = call(port, method, path, body)
        assert status in (201, 204), (method, path, status, answer)


def _comparable(definitions: dict[str, Any], tag: str) -> dict[str, Any]:
    """The parts both brokers write alike, for `tag`'s objects."""
    vhost = f"{tag}-vh"

    def mine(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return sorted((r for r in rows if r.get("vhost") == vhost), key=json.dumps)

    users = [{k: u[k] for k in ("name", "password_hash", "hashing_algorithm", "tags")}
             for u in definitions["users"] if u["name"] == f"{tag}-user"]
    return {"users": users, "vhosts": [v["name"] for v in definitions["vhosts"] if v["name"] == vhost],
            "permissions": mine(definitions["permissions"]), "policies": mine(definitions["policies"]),
            "queues": mine(definitions["queues"]), "exchanges": mine(definitions["exchanges"]),
            "bindings": mine(definitions["bindings"])}


@pytest.mark.parametrize("direction", ["rabbitmq-to-raftmq", "raftmq-to-rabbitmq"])
def test_definitions_move_both_ways(rabbitmq_port: int, raftmq_port: int, direction: str, tmp_path: Path) -> None:
    source, target = (rabbitmq_port, raftmq_port) if direction == "rabbitmq-to-raftmq" else (raftmq_port,
                                                                                              rabbitmq_port)
    tag = "r2f" if direction == "rabbitmq-to-raftmq" else "f2r"
    _declare_sample(source, tag)
    status, exported = call(source, "GET", "/api/definitions")
    assert status == 200
    status, answer = call(target, "POST", "/api/definitions", exported)
    assert status in (200, 201, 204), answer
    status, imported = call(target, "GET", "/api/definitions")
    assert _comparable(imported, tag) == _comparable(exported, tag)
    assert _comparable(imported, tag)["queues"], "the sample's queue is missing"
    user = f"{tag}-user"
    assert requests.get(f"http://127.0.0.1:{target}/api/whoami", auth=(user, "pw"), timeout=10).json()["name"] == user
