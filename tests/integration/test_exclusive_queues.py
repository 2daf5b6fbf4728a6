"""Exclusive queues with pika, in both modes: node-local in a cluster (issue 16 item 1), as RabbitMQ keeps them.

In cluster mode the owner connects to one node and the other clients to the others (each node's own AMQP port;
HAProxy's port for the RPC client), so every publish to the exclusive queue crosses nodes: the owner's node holds
the queue, the publisher's node forwards the publish to it with confirms (node/runtime/cluster/forward.py). In
single mode every client is on the one node. The RPC flow is the common case: an exclusive, auto-delete,
server-named reply queue, a request served by a client on another node, the reply arriving. Then publisher
confirms from another node, 405 RESOURCE_LOCKED for another connection on every node, the owner's close deleting
the queue everywhere. (kill -9 of the owner's node: tests/cluster/test_cluster_processes.py,
`test_exclusive_queues_of_a_dead_node_are_deleted`, on its own cluster: killing a node of the session's cluster
here would cost a restart.) No timing is asserted; waits are bounded by generous deadlines only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pika
import pika.exceptions

from tests.integration.clusterproc import ClusterProcess
from tests.integration.conftest import Target

WAIT_S = 60.0
CALLS = 5


def _ports(target: Target) -> list[int]:
    """Each node's own AMQP port (cluster mode), or the one node's."""
    if isinstance(target.node, ClusterProcess):
        return [n.plan.port for n in target.node.nodes]
    return [target.port]


@contextmanager
def _connection(target: Target, port: int) -> Iterator[pika.BlockingConnection]:
    connection = pika.BlockingConnection(pika.ConnectionParameters(
        host=target.host, port=port, credentials=pika.PlainCredentials("guest", "guest"), connection_attempts=1))
    try:
        yield connection
    finally:
        if connection.is_open:
            connection.close()


def _reply_code(target: Target, port: int, action: Callable[[pika.adapters.blocking_connection.BlockingChannel], object]
                ) -> int:
    with _connection(target, port) as connection:
        return _code_on(connection, action)


def _code_on(connection: pika.BlockingConnection,
             action: Callable[[pika.adapters.blocking_connection.BlockingChannel], object]) -> int:
    """200 if `action` on a new channel of `connection` succeeds, else the channel error's reply code."""
    try:
        action(connection.channel())
        return 200
    except pika.exceptions.ChannelClosedByBroker as exc:
        return int(exc.reply_code)


def _wait(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_rpc_reply_to_an_exclusive_auto_delete_queue_from_another_node(amqp_target: Target, uid: str) -> None:
    ports = _ports(amqp_target)
    server_port = ports[-1]
    with _connection(amqp_target, ports[0]) as client, _connection(amqp_target, server_port) as server:
        sch = server.channel()
        requests = sch.queue_declare(f"rpc-{uid}", auto_delete=True).method.queue

        def serve(ch: pika.adapters.blocking_connection.BlockingChannel, method: pika.spec.Basic.Deliver,
                  props: pika.BasicProperties, body: bytes) -> None:
            ch.basic_publish("", props.reply_to, b"re:" + body,
                             pika.BasicProperties(correlation_id=props.correlation_id))
            ch.basic_ack(method.delivery_tag)

        sch.basic_consume(requests, serve)
        cch = client.channel()
        reply_to = cch.queue_declare("", exclusive=True, auto_delete=True).method.queue
        replies: list[tuple[str, bytes]] = []
        cch.basic_consume(reply_to, lambda _c, _m, p, b: replies.append((p.correlation_id, b)), auto_ack=True)
        for n in range(CALLS):
            cch.basic_publish("", requests, f"req{n}".encode(),
                              pika.BasicProperties(reply_to=reply_to, correlation_id=str(n)))
            deadline = time.monotonic() + WAIT_S
            while len(replies) <= n:
                assert time.monotonic() < deadline, f"no reply to request {n}"
                server.process_data_events(time_limit=0.01)
                client.process_data_events(time_limit=0.01)
        assert replies == [(str(n), f"re:req{n}".encode()) for n in range(CALLS)]


def test_confirmed_publishes_from_another_node_reach_the_exclusive_queue(amqp_target: Target, uid: str) -> None:
    ports = _ports(amqp_target)
    with _connection(amqp_target, ports[0]) as owner, _connection(amqp_target, ports[-1]) as publisher:
        och = owner.channel()
        queue = och.queue_declare(f"excl-{uid}", exclusive=True).method.queue
        och.exchange_declare(f"x-{uid}", "direct", auto_delete=True)
        och.queue_bind(queue, f"x-{uid}", "k")
        pch = publisher.channel()
        pch.confirm_delivery()
        for n in range(20):  # each basic_publish waits for its confirm (pika raises on a nack)
            pch.basic_publish("", queue, f"d{n}".encode(), pika.BasicProperties(delivery_mode=2))
        _wait(lambda: _reply_code(amqp_target, ports[-1], lambda ch: ch.exchange_declare(f"x-{uid}", passive=True))
              == 200, "the exchange on the publisher's node")
        pch.basic_publish(f"x-{uid}", "k", b"via-exchange", mandatory=True)
        got: list[bytes] = []
        for _ in range(21):
            method, _props, body = och.basic_get(queue, auto_ack=True)
            assert method is not None, f"only {len(got)} messages arrived"
            got.append(body)
        assert got == [f"d{n}".encode() for n in range(20)] + [b"via-exchange"]
        assert och.basic_get(queue, auto_ack=True)[0] is None


def test_another_connection_gets_405_on_every_node_and_the_owner_s_close_deletes_it(amqp_target: Target, uid: str
                                                                                   ) -> None:
    ports = _ports(amqp_target)
    name = f"excl-{uid}"
    actions: list[Callable[[pika.adapters.blocking_connection.BlockingChannel], object]] = [
        lambda ch: ch.queue_declare(name, exclusive=True),
        lambda ch: ch.queue_declare(name, passive=True),
        lambda ch: ch.basic_consume(name, lambda *a: None),
        lambda ch: ch.basic_get(name),
        lambda ch: ch.queue_purge(name),
    ]
    with _connection(amqp_target, ports[0]) as owner:
        owner.channel().queue_declare(name, exclusive=True)
        for port in ports:
            with _connection(amqp_target, port) as other:
                assert [_code_on(other, action) for action in actions] == [405] * len(actions), port
    for port in ports:  # after the owner's close-ok: gone on every node at once
        assert _reply_code(amqp_target, port, lambda ch: ch.queue_declare(name, passive=True)) == 404
