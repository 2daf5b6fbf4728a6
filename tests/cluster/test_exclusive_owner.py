"""Exclusive queues live and die with their connection, as every node sees it (issue 16), on 3 real nodes.

As soon as the owner has its declare-ok, and while its connection is open, another connection on any node gets
405 RESOURCE_LOCKED for a declare, a passive declare or a consume, and a publisher on another node reaches the
queue (a plain queue is found on every node at once the same way). Once the owner's close-ok has arrived, a
passive declare from a new connection on any node gets 404 at once (no waiting): the owning node answers the close
only after the queue's deletion is committed in the metadata, and a node answers for a queue owned by another
node's connection, or one it does not know, only after a metadata read barrier (node/broker/broker.py, "the owner
barrier"). No assertion is about timing.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from functools import partial
from typing import Any

import pika
import pytest
import requests

from tests.cluster.cluster_proc import (
    ClusterProcs,
    api_queue,
    connect,
    supervised,
    wait_until,
)

ROUNDS = 6
NEW_PASSWORD = "not-the-default-password"
DLX_ARGS = {"x-queue-type": "quorum", "x-dead-letter-exchange": "amq.direct", "x-dead-letter-routing-key": "to-excl"}
SOURCES = {"dl-at-most-once": DLX_ARGS,
           "dl-at-least-once": {**DLX_ARGS, "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"}}


@pytest.fixture(name="cluster", scope="module")
def module_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterProcs]:
    """Three started nodes, shared by this module's tests."""
    with supervised(ClusterProcs(tmp_path_factory.mktemp("exclusive"))) as procs:
        yield procs.start_all()


def _reply_code(port: int, action: str, queue: str) -> int:
    """What a new connection on `port` gets for `action` on `queue`: 200 for an ok, else the channel error code."""
    connection = connect(port)
    try:
        ch = connection.channel()
        if action == "passive":
            ch.queue_declare(queue, passive=True)
        elif action == "declare":
            ch.queue_declare(queue, exclusive=True)
        else:
            ch.basic_consume(queue, lambda *a: None)
        return 200
    except pika.exceptions.ChannelClosedByBroker as exc:
        return int(exc.reply_code)
    finally:
        if connection.is_open:
            connection.close()


def _one_round(owner_port: int, others: list[int]) -> None:
    owner = connect(owner_port)
    ch = owner.channel()
    queue = ch.queue_declare(f"excl-{uuid.uuid4().hex[:8]}", exclusive=True).method.queue
    plain = ch.queue_declare(f"plain-{uuid.uuid4().hex[:8]}", auto_delete=True).method.queue
    received: list[bytes] = []
    ch.basic_consume(queue, lambda _ch, _m, _p, body: received.append(body), auto_ack=True)
    for port in others:  # at once: the declare-ok left after the commit, and a node answers after a read barrier
        for action in ("passive", "declare", "consume"):
            assert _reply_code(port, action, queue) == 405, (action, port)
        assert _reply_code(port, "passive", plain) == 200, port
    publisher = connect(others[0])
    publisher.channel().basic_publish("", queue, b"reply")  # an RPC server's reply from another node
    publisher.close()
    wait_until(lambda: bool(owner.process_data_events(0.1) or received), 30, "the reply")
    assert received == [b"reply"]
    owner.close()  # returns once close-ok arrived
    for port in [*others, owner_port]:
        assert _reply_code(port, "passive", queue) == 404, port


@pytest.mark.timeout(300)
def test_an_exclusive_queue_is_locked_everywhere_then_gone_everywhere_at_close_ok(cluster: ClusterProcs) -> None:
    ports = [node.port for node in cluster.nodes]
    for i in range(ROUNDS):
        owner_port = ports[i % len(ports)]
        _one_round(owner_port, [port for port in ports if port != owner_port])


def _connect(port: int, password: str) -> pika.BlockingConnection:
    params = pika.ConnectionParameters("127.0.0.1", port, credentials=pika.PlainCredentials("guest", password),
                                       heartbeat=30, connection_attempts=3, retry_delay=0.5)
    return pika.BlockingConnection(params)


def _logs_in(port: int, password: str) -> bool:
    try:
        _connect(port, password).close()
        return True
    except pika.exceptions.AMQPConnectionError:
        return False


def _has_leader(port: int, queue: str) -> bool:
    return bool(api_queue(port, queue).get("leader"))


def _get_one(ch: Any, queue: str) -> int:
    """The delivery tag of a basic.get of `queue` (retried until the message is there)."""
    tags: list[int] = []

    def take() -> bool:
        method, _props, _body = ch.basic_get(queue)
        if method is not None:
            tags.append(method.delivery_tag)
        return bool(tags)

    wait_until(take, 30, f"a message in {queue}")
    return tags[0]


def _set_guest_password(port: int, old: str, new: str, ports: list[int]) -> None:
    reply = requests.put(f"http://127.0.0.1:{port + 10_000}/api/users/guest", auth=("guest", old), timeout=10,
                         json={"password": new, "tags": "administrator"})
    assert reply.status_code in (201, 204), reply.text
    wait_until(lambda: all(_logs_in(p, new) for p in ports), 30, "the new password on every node")


@pytest.mark.timeout(300)
def test_publishes_and_dead_letters_from_other_nodes_arrive_as_published_there_without_the_default_user(
        cluster: ClusterProcs) -> None:
    """Forwarding logs in with the nodes' internal login, not the default user (whose password changes here): a
    publish on another node reaches the exclusive queue with the exchange, routing key and headers it was published
    with, and so do dead letters of quorum queues led by other nodes (at most and at least once)."""
    names = [node.name for node in cluster.nodes]
    ports = {node.name: node.port for node in cluster.nodes}
    with connect(ports[names[0]]) as conn:
        ch = conn.channel()
        for source, args in SOURCES.items():
            ch.queue_declare(source, durable=True, arguments=args)
    leaders: set[str] = set()
    for source in SOURCES:
        wait_until(partial(_has_leader, ports[names[0]], source), 30, f"{source}'s leader")
        leaders.add(api_queue(ports[names[0]], source)["leader"])
    owner = next(name for name in names if name not in leaders)  # every dead letter crosses to another node
    publisher = next(name for name in names if name != owner)
    _set_guest_password(ports[owner], "guest", NEW_PASSWORD, list(ports.values()))
    try:
        owner_conn = _connect(ports[owner], NEW_PASSWORD)
        och = owner_conn.channel()
        queue = och.queue_declare("", exclusive=True).method.queue
        och.queue_bind(queue, "amq.direct", "to-excl")
        received: list[tuple[Any, Any, bytes]] = []
        och.basic_consume(queue, lambda _ch, method, props, body: received.append((method, props, body)),
                          auto_ack=True)
        with _connect(ports[publisher], NEW_PASSWORD) as conn:
            pch = conn.channel()
            pch.confirm_delivery()  # a forwarded publish the owner's node refused would raise NackError here
            pch.basic_publish("amq.direct", "to-excl", b"plain", pika.BasicProperties(content_type="text/plain"))
            pch.basic_publish("amq.direct", "to-excl", b"headers", pika.BasicProperties(headers={"h": "v"}))
            for source in SOURCES:
                pch.basic_publish("", source, source.encode())
                pch.basic_reject(_get_one(pch, source), requeue=False)  # dead-lettered to amq.direct "to-excl"
        wanted = {b"plain", b"headers", *(source.encode() for source in SOURCES)}
        wait_until(lambda: bool(owner_conn.process_data_events(0.1) or {r[2] for r in received} >= wanted), 30,
                   "every message at the exclusive queue")
        by_body = {body: (method, props) for method, props, body in received}
        assert {body for _m, _p, body in received} == wanted
        assert sorted(body for _m, _p, body in received if body in (b"plain", b"headers")) == [b"headers", b"plain"]
        for method, _props in by_body.values():
            assert (method.exchange, method.routing_key) == ("amq.direct", "to-excl")
        assert by_body[b"plain"][1].headers is None and by_body[b"plain"][1].content_type == "text/plain"
        assert by_body[b"headers"][1].headers == {"h": "v"}
        for source in SOURCES:
            deaths = by_body[source.encode()][1].headers["x-death"]
            assert [(d["queue"], d["reason"]) for d in deaths] == [(source, "rejected")]
        owner_conn.close()
    finally:
        _set_guest_password(ports[owner], NEW_PASSWORD, "guest", list(ports.values()))


def test_no_user_can_take_the_name_of_an_internal_login_on_any_node(cluster: ClusterProcs) -> None:
    """The internal logins' names (`raftmq-internal-*`) are checked before the user table, so a user of that name
    could never log in as itself: PUT /api/users and a definitions import refuse it with 400 on every node, and
    the metadata gets no such user."""
    for node in cluster.nodes:
        api = f"http://127.0.0.1:{node.port + 10_000}/api"
        for name in ("raftmq-internal-forward", "raftmq-internal-link", "raftmq-internal-other"):
            reply = requests.put(f"{api}/users/{name}", auth=("guest", "guest"), timeout=10,
                                 json={"password": "pw", "tags": "administrator"})
            assert reply.status_code == 400 and "reserved" in reply.json()["reason"], (node.name, reply.text)
        reply = requests.post(f"{api}/definitions", auth=("guest", "guest"), timeout=10, json={"users": [
            {"name": "raftmq-internal-forward", "password_hash": "x", "tags": ""}]})
        assert reply.status_code == 400 and "reserved" in reply.json()["reason"], (node.name, reply.text)
    users = requests.get(f"http://127.0.0.1:{cluster.nodes[0].port + 10_000}/api/users", auth=("guest", "guest"),
                         timeout=10).json()
    assert not [u["name"] for u in users if u["name"].startswith("raftmq-internal-")]
