"""A queue is usable as soon as its declare-ok left (issue 16): the first publish to a new queue is confirmed and
delivered, on 3 real nodes, whichever node the publisher and the consumer use.

A new queue's Raft group starts with its declaring node as the leader of term 1 (cluster.raft.core.raft,
`bootstrap_state`), so nothing waits for an election; when that node dies right after the declare, the others
elect a leader of a later term and the queue works as before. No timing is asserted here (measurements:
docs/benchmarks.md).
"""

from __future__ import annotations

import time

import pika
from pika.adapters.blocking_connection import BlockingChannel

from tests.cluster.cluster_proc import (
    ClusterProcs,
    channel,
    cluster_fixture,  # noqa: F401 (the `cluster` fixture)
    connect,
)

QUORUM = {"x-queue-type": "quorum"}


def _get_one(ch: BlockingChannel, queue: str, timeout_s: float = 30) -> bytes:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        method, _, body = ch.basic_get(queue, auto_ack=True)
        if method is not None:
            return bytes(body)
        time.sleep(0.05)
    raise AssertionError(f"nothing delivered from {queue} within {timeout_s} s")


def test_first_publish_to_a_new_queue_is_confirmed_and_delivered(cluster: ClusterProcs) -> None:
    ports = [n.port for n in cluster.nodes]
    conns = [connect(port) for port in ports]
    try:
        chans = [conn.channel() for conn in conns]
        for ch in chans:
            ch.confirm_delivery()
        for round_no in range(3):
            for kind, arguments in (("quorum", QUORUM), ("classic", {})):
                for declarer in range(3):
                    publisher, consumer = (declarer + round_no) % 3, (declarer + 1) % 3
                    name = f"first-{kind}-{round_no}-{declarer}"
                    chans[declarer].queue_declare(name, durable=True, arguments=arguments)
                    # right after declare-ok: on the declaring node's channel, or on another node (which may learn
                    # the queue from the metadata a moment later: until then the publish is returned unroutable)
                    _publish(chans[publisher], name, f"m-{name}".encode())
                    assert _get_one(chans[consumer], name) == f"m-{name}".encode()
    finally:
        for conn in conns:
            conn.close()


def test_an_rpc_reply_queue_answers_at_once(cluster: ClusterProcs) -> None:
    """An exclusive server-named reply queue: the reply, published on another node, arrives (RPC clients)."""
    n1, n2, _ = cluster.nodes
    client = connect(n1.port)
    try:
        ch = client.channel()
        reply_to = ch.queue_declare("", exclusive=True, auto_delete=True).method.queue
        got: list[bytes] = []
        ch.basic_consume(reply_to, lambda c, m, p, body: got.append(body), auto_ack=True)
        with channel(n2.port) as server:
            server.confirm_delivery()
            _publish(server, reply_to, b"reply")
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            client.process_data_events(time_limit=0.05)
        assert got == [b"reply"]
    finally:
        client.close()


def test_the_declaring_node_dies_right_after_the_declare(cluster: ClusterProcs) -> None:
    """The named leader of term 1 is gone before it could lead: the others elect one and the queue works."""
    n1, n2, n3 = cluster.nodes
    with channel(n1.port) as ch:
        ch.queue_declare("orphan", durable=True, arguments=QUORUM)
    cluster.kill("n1")
    with channel(n2.port) as ch:
        ch.confirm_delivery()
        _publish(ch, "orphan", b"after")
    with channel(n3.port) as ch:
        assert _get_one(ch, "orphan") == b"after"
    cluster.restart("n1")
    with channel(n1.port) as ch:
        ch.confirm_delivery()
        ch.basic_publish("", "orphan", b"back", mandatory=True)
        assert _get_one(ch, "orphan", 60) == b"back"


def _publish(ch: BlockingChannel, queue: str, body: bytes, timeout_s: float = 30) -> None:
    """Publish with confirms (mandatory) until the node routes it to the queue; raises if it is nacked."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            ch.basic_publish("", queue, body, mandatory=True)
            return
        except pika.exceptions.UnroutableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
