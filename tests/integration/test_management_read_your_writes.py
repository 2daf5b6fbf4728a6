"""A management read sees a change just made, whichever node each goes through (both modes; in cluster mode each
change goes through one node and is read back at once, with no waiting loop, through each of the others).

RabbitMQ's management reads Mnesia, whose transactions are applied on every node before the write returns; raftmq's
nodes pass a metadata read barrier before answering a request that reads definitions (docs/management.md, "Reads
see every committed change"). The loop writes through each node in turn: a vhost, a user (and logs in as it through
the others), its permissions, user and vhost limits, a policy whose pattern changes every round, a runtime
parameter, a queue declared through the API, then deletes of a permission and a user. Every read must show the
change; `X-Raftmq-Metadata` (the barrier timed out) must never be set on this healthy cluster."""

from __future__ import annotations

from typing import Any

import pytest
import requests

from tests.integration.conftest import Target
from tests.integration.test_vhost_limits import management_ports

ROUNDS = 3


class Api:
    def __init__(self, ports: list[int]) -> None:
        self.ports = ports
        self.session = requests.Session()  # keep-alive, as rabbitmqadmin and monitoring clients do

    def call(self, port: int, method: str, path: str, auth: tuple[str, str] = ("guest", "guest"),
             **kwargs: Any) -> requests.Response:
        reply = self.session.request(method, f"http://127.0.0.1:{port}{path}", auth=auth, timeout=30, **kwargs)
        assert "X-Raftmq-Metadata" not in reply.headers, (method, path, reply.headers)
        return reply

    def write(self, port: int, method: str, path: str, **kwargs: Any) -> None:
        reply = self.call(port, method, path, **kwargs)
        assert reply.status_code in (200, 201, 204), (port, method, path, reply.status_code, reply.text)

    def read(self, port: int, path: str, **kwargs: Any) -> Any:
        reply = self.call(port, "GET", path, **kwargs)
        assert reply.status_code == 200, (port, path, reply.status_code, reply.text)
        return reply.json()


@pytest.fixture
def api(amqp_target: Target) -> Api:
    return Api(management_ports(amqp_target))


def test_every_node_reads_a_change_made_through_another_at_once(api: Api, uid: str) -> None:
    vhost, user, policy = f"ryw-{uid}", f"ryw-{uid}", f"ryw-{uid}"
    v = vhost  # (no character to quote)
    try:
        for i in range(ROUNDS):
            writer = api.ports[i % len(api.ports)]
            readers = [p for p in api.ports if p != writer] or [writer]
            _round(api, writer, readers, v, f"{user}-{i}", policy, i)
    finally:
        first = api.ports[0]
        api.call(first, "DELETE", f"/api/vhosts/{v}")
        for i in range(ROUNDS):
            api.call(first, "DELETE", f"/api/users/{user}-{i}")


def _round(api: Api, writer: int, readers: list[int], v: str, user: str, policy: str, i: int) -> None:
    if i == 0:
        api.write(writer, "PUT", f"/api/vhosts/{v}")
        api.write(writer, "PUT", f"/api/permissions/{v}/guest", json={"configure": ".*", "write": ".*", "read": ".*"})
        for port in readers:
            assert api.read(port, f"/api/vhosts/{v}")["name"] == v
    api.write(writer, "PUT", f"/api/users/{user}", json={"password": "pw", "tags": "management"})
    for port in readers:
        assert api.read(port, f"/api/users/{user}")["tags"] == ["management"]
        assert api.read(port, "/api/whoami", auth=(user, "pw"))["name"] == user  # its login, on another node
    api.write(writer, "PUT", f"/api/permissions/{v}/{user}", json={"configure": f"c{i}", "write": ".*", "read": ".*"})
    for port in readers:
        assert api.read(port, f"/api/permissions/{v}/{user}")["configure"] == f"c{i}"
        assert v in [row["name"] for row in api.read(port, "/api/vhosts", auth=(user, "pw"))]
    api.write(writer, "PUT", f"/api/user-limits/{user}/max-channels", json={"value": 10 + i})
    api.write(writer, "PUT", f"/api/vhost-limits/{v}/max-queues", json={"value": 100 + i})
    api.write(writer, "PUT", f"/api/policies/{v}/{policy}",
              json={"pattern": f"^round-{i}$", "definition": {"max-length": 10 + i}, "apply-to": "queues"})
    api.write(writer, "PUT", f"/api/parameters/federation-upstream/{v}/up",
              json={"value": {"uri": f"amqp://host-{i}"}})
    api.write(writer, "PUT", f"/api/queues/{v}/q-{i}", json={"durable": True, "arguments": {}})
    for port in readers:
        assert api.read(port, f"/api/user-limits/{user}") == [{"user": user, "value": {"max-channels": 10 + i}}]
        assert api.read(port, f"/api/vhost-limits/{v}") == [{"vhost": v, "value": {"max-queues": 100 + i}}]
        assert api.read(port, f"/api/policies/{v}/{policy}")["pattern"] == f"^round-{i}$"
        assert api.read(port, f"/api/parameters/federation-upstream/{v}/up")["value"]["uri"] == f"amqp://host-{i}"
        assert api.read(port, f"/api/queues/{v}/q-{i}")["durable"] is True
    api.write(writer, "DELETE", f"/api/permissions/{v}/{user}")
    for port in readers:
        assert api.call(port, "GET", f"/api/permissions/{v}/{user}").status_code == 404
    api.write(writer, "DELETE", f"/api/users/{user}")
    for port in readers:
        assert api.call(port, "GET", f"/api/users/{user}").status_code == 404
        assert api.call(port, "GET", "/api/whoami", auth=(user, "pw")).status_code == 401
