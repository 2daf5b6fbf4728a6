"""Cluster mode: RabbitMQ's pre-declared exchanges (amq.direct, amq.fanout, amq.topic, amq.headers, amq.match) exist
in every vhost on every node and in the metadata, so binds to them commit (the metadata refused them: 404 "no
exchange 'amq.fanout' in vhost /" while a passive declare succeeded); also in a vhost created at runtime. Three
real nodes; pika clients.
"""

from __future__ import annotations

import pika
import requests
from pika.adapters.blocking_connection import BlockingChannel

from tests.cluster.cluster_proc import ClusterProcs, cluster_fixture, connect, management_up, wait_until

__all__ = ["cluster_fixture"]

ROUTES = {"amq.direct": "k", "amq.fanout": "", "amq.topic": "a.*", "amq.headers": "", "amq.match": ""}
HEADERS_ARGS = {"x-match": "all", "kind": "t"}


def _bind_all(ch: BlockingChannel, queue: str) -> None:
    ch.queue_declare(queue, durable=True)
    for exchange, key in ROUTES.items():
        ch.exchange_declare(exchange, passive=True)
        arguments = HEADERS_ARGS if exchange in ("amq.headers", "amq.match") else None
        ch.queue_bind(queue, exchange, routing_key=key, arguments=arguments)


def _publish_each(ch: BlockingChannel) -> None:
    properties = pika.BasicProperties(headers={"kind": "t"})
    for exchange in ROUTES:
        ch.basic_publish(exchange, "a.b" if exchange == "amq.topic" else "k", exchange.encode(), properties)


def _got_all(port: int, vhost: str, queue: str, want: set[bytes]) -> None:
    got: set[bytes] = set()

    def drained() -> bool:
        connection = connect_vhost(port, vhost)
        try:
            ch = connection.channel()
            while True:
                method, _properties, body = ch.basic_get(queue, auto_ack=True)
                if method is None:
                    break
                got.add(body)
        finally:
            connection.close()
        return got == want

    wait_until(drained, 20, f"every amq.* exchange routed to {queue} in {vhost}: got {got}")


def connect_vhost(port: int, vhost: str) -> pika.BlockingConnection:
    if vhost == "/":
        return connect(port)
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, virtual_host=vhost,
                                                             connection_attempts=3, retry_delay=0.5))


def _exercise(cluster: ClusterProcs, vhost: str) -> None:
    """On each node: bind a queue to every amq.* exchange, publish through them on the next node, get on the next."""
    ports = [node.port for node in cluster.nodes]
    want = {exchange.encode() for exchange in ROUTES}
    for index, port in enumerate(ports):
        queue = f"q-amq-{vhost.strip('/') or 'root'}-{index}"
        connection = connect_vhost(port, vhost)
        try:
            _bind_all(connection.channel(), queue)
        finally:
            connection.close()
        publisher = connect_vhost(ports[(index + 1) % len(ports)], vhost)
        try:
            _publish_each(publisher.channel())
        finally:
            publisher.close()
        _got_all(ports[(index + 2) % len(ports)], vhost, queue, want)


def test_binds_to_predeclared_exchanges_commit_on_every_node(cluster: ClusterProcs) -> None:
    _exercise(cluster, "/")


def test_a_vhost_created_at_runtime_has_them_on_every_node(cluster: ClusterProcs) -> None:
    vhost = "v-runtime"
    api = f"http://127.0.0.1:{cluster.nodes[1].port + 10_000}/api"
    for node in cluster.nodes:  # the management API listens after AMQP
        wait_until(lambda node=node: management_up(node.port), 30, f"{node.name}'s management API to listen")
    requests.put(f"{api}/vhosts/{vhost}", auth=("guest", "guest"), timeout=30).raise_for_status()
    requests.put(f"{api}/permissions/{vhost}/guest", auth=("guest", "guest"), timeout=30,
                 json={"configure": ".*", "write": ".*", "read": ".*"}).raise_for_status()

    def everywhere() -> bool:
        for node in cluster.nodes:
            reply = requests.get(f"http://127.0.0.1:{node.port + 10_000}/api/exchanges/{vhost}",
                                 auth=("guest", "guest"), timeout=10)
            if reply.status_code != 200 or not set(ROUTES) <= {row["name"] for row in reply.json()}:
                return False
            permission = requests.get(f"http://127.0.0.1:{node.port + 10_000}/api/permissions/{vhost}/guest",
                                      auth=("guest", "guest"), timeout=10)
            if permission.status_code != 200:
                return False
        return True

    wait_until(everywhere, 20, f"{vhost}, its amq.* exchanges and guest's permissions on every node")
    _exercise(cluster, vhost)
