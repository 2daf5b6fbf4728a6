"""An AMQP client logs in as a user, into a vhost, created a moment ago through another node (both modes).

RabbitMQ's management API returns once Mnesia applied the change on every node, so a script may create a user,
a vhost and a permission and connect as that user at once, through any node. A raftmq node that has not applied
the metadata entry yet would refuse the login (403) or the vhost (530); it asks again once it caught up with the
metadata instead (node/amqp/connection_handshake.py `_refusal_held`). Each round creates them through one node and
connects through every other node's own AMQP port with no waiting loop; a wrong password is still refused, at
once in single mode and after the recheck in a cluster."""

from __future__ import annotations

import pika
import pika.exceptions
import pytest
import requests

from tests.integration.conftest import Target
from tests.integration.test_vhost_limits import amqp_ports, management_ports

ROUNDS = 6


def _write(port: int, method: str, path: str, body: object = None) -> None:
    reply = requests.request(method, f"http://127.0.0.1:{port}{path}", json=body, auth=("guest", "guest"),
                             timeout=30)
    assert reply.status_code in (201, 204), (port, method, path, reply.status_code, reply.text)


def _connect(target: Target, port: int, user: str, password: str, vhost: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        host=target.host, port=port, virtual_host=vhost, credentials=pika.PlainCredentials(user, password),
        connection_attempts=1, socket_timeout=10))


def test_a_user_and_vhost_made_through_one_node_log_in_through_every_other_at_once(amqp_target: Target,
                                                                                  uid: str) -> None:
    api_ports, ports = management_ports(amqp_target), amqp_ports(amqp_target)
    made: list[tuple[str, str]] = []
    try:
        for i in range(ROUNDS):
            writer = i % len(api_ports)
            user, vhost = f"ryw-amqp-{uid}-{i}", f"ryw-amqp-{uid}-{i}"
            made.append((user, vhost))
            _write(api_ports[writer], "PUT", f"/api/vhosts/{vhost}")
            _write(api_ports[writer], "PUT", f"/api/users/{user}", {"password": "pw", "tags": ""})
            _write(api_ports[writer], "PUT", f"/api/permissions/{vhost}/{user}",
                   {"configure": ".*", "write": ".*", "read": ".*"})
            for port in [p for n, p in enumerate(ports) if n != writer] or ports:
                with _connect(amqp_target, port, user, "pw", vhost) as conn:
                    conn.channel().queue_declare("", exclusive=True)
                with pytest.raises(pika.exceptions.ProbableAuthenticationError):
                    _connect(amqp_target, port, user, "wrong", vhost)
    finally:
        for user, vhost in made:
            requests.delete(f"http://127.0.0.1:{api_ports[0]}/api/users/{user}", auth=("guest", "guest"), timeout=30)
            requests.delete(f"http://127.0.0.1:{api_ports[0]}/api/vhosts/{vhost}", auth=("guest", "guest"),
                            timeout=30)
