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

import pika
import pytest

from tests.cluster.cluster_proc import (
    ClusterProcs,
    cluster_fixture,  # noqa: F401 (the `cluster` fixture)
    connect,
    wait_until,
)

ROUNDS = 6


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
