"""At-least-once dead lettering on 3 real node processes: kill -9 of the source queue's leader mid-way.

A quorum source queue (x-dead-letter-strategy at-least-once, x-overflow reject-publish, x-max-length 200)
dead-letters to a quorum target through a fanout DLX that is not bound to it yet, so every dead letter stays held.
A consumer on a surviving node rejects all 200 messages; the source leader is killed with SIGKILL after the first
100 rejections, then the target is bound. Every message must reach the target (the new leader re-sends what the
old one held, and retries what routed nowhere), the source's holding area must empty (checked through the length
limit, which held messages count against: 200 new publishes are only all accepted once nothing is held), and the
restarted node's replica of the target must catch up. The default strategy (at most once) is checked first on
the same cluster, without a failure.
"""

from __future__ import annotations

import collections
import time
from functools import partial

import pika
from pika.adapters.blocking_connection import BlockingChannel

from tests.cluster.cluster_proc import (
    ClusterProcs,
    ConsumingThread,
    api_queue,
    channel,
    cluster_fixture,  # noqa: F401 (the `cluster` fixture)
    queue_known,
    ready_count,
    wait_until,
)

COUNT = 200
SOURCE_ARGS = {"x-queue-type": "quorum", "x-dead-letter-exchange": "dlx", "x-overflow": "reject-publish",
               "x-dead-letter-strategy": "at-least-once", "x-max-length": COUNT}


def _leader(port: int, queue: str) -> str | None:
    leader: str | None = api_queue(port, queue)["leader"]
    return leader


def _agreed_leader(cluster: ClusterProcs, queue: str, names: list[str]) -> str | None:
    seen = {_leader(cluster.node(n).port, queue) for n in names}
    return seen.pop() if len(seen) == 1 else None


def _publish_confirmed(port: int, queue: str, bodies: list[bytes], deadline_s: float) -> int:
    """Publish each body with confirms, again after a nack (the queue may be full for a while); returns nacks."""
    nacks = 0
    with channel(port) as ch:
        ch.confirm_delivery()
        pending = collections.deque(bodies)
        while pending and time.monotonic() < deadline_s:
            try:
                ch.basic_publish("", queue, pending[0], pika.BasicProperties(delivery_mode=2))
                pending.popleft()
            except pika.exceptions.NackError:
                nacks += 1
                time.sleep(0.1)
        assert not pending, f"{len(pending)} publishes to {queue} never confirmed"
    return nacks


class Rejecter(ConsumingThread):
    """Consumes a queue on one node and rejects (requeue=False) every delivery."""

    def __init__(self, port: int, queue: str) -> None:
        super().__init__(port, queue, prefetch_count=10)
        self.rejected: list[bytes] = []

    def handle(self, ch: BlockingChannel, delivery_tag: int, body: bytes) -> None:
        ch.basic_reject(delivery_tag, requeue=False)
        self.rejected.append(body)


def _drain(port: int, queue: str, deadline_s: float) -> list[bytes]:
    """Every message of the queue, by basic.get with acks (stops when the queue reads empty twice)."""
    bodies: list[bytes] = []
    empty = 0
    with channel(port) as ch:
        while empty < 2 and time.monotonic() < deadline_s:
            method, _props, body = ch.basic_get(queue, auto_ack=True)
            if method is None:
                empty += 1
                time.sleep(0.5)
            else:
                empty = 0
                bodies.append(body)
    return bodies


def _declare(cluster: ClusterProcs) -> None:
    with channel(cluster.nodes[0].port) as ch:
        ch.exchange_declare("dlx", "fanout", durable=True)
        ch.exchange_declare("dlx-amo", "fanout", durable=True)
        for target in ("dead", "dead-amo"):
            ch.queue_declare(target, durable=True, arguments={"x-queue-type": "quorum"})
        ch.queue_bind("dead-amo", "dlx-amo")  # "dead" is bound to "dlx" later, by the test
        ch.queue_declare("src", durable=True, arguments=SOURCE_ARGS)
        ch.queue_declare("src-amo", durable=True, arguments={"x-queue-type": "quorum",
                                                             "x-dead-letter-exchange": "dlx-amo"})
    for node in cluster.nodes:
        for queue in ("dead", "dead-amo", "src", "src-amo"):
            wait_until(partial(queue_known, node.port, queue), 30, f"queue {queue} on {node.name}")


def test_at_least_once_dead_letters_survive_a_leader_kill(cluster: ClusterProcs) -> None:
    names = [n.name for n in cluster.nodes]
    _declare(cluster)
    deadline_s = time.monotonic() + 240

    # The default strategy (at most once) on the same cluster, no failure: 20 rejected, 20 dead-lettered.
    _publish_confirmed(cluster.nodes[0].port, "src-amo", [f"a-{i}".encode() for i in range(20)], deadline_s)
    rejecter = Rejecter(cluster.nodes[1].port, "src-amo")
    rejecter.start()
    wait_until(lambda: ready_count(cluster.nodes[2].port, "dead-amo") == 20, 60, "20 at-most-once dead letters")
    rejecter.stop.set()
    rejecter.join(10)

    wait_until(lambda: _agreed_leader(cluster, "src", names) is not None, 30, "an agreed leader of src")
    leader = _agreed_leader(cluster, "src", names)
    assert leader is not None
    pub_node, con_node = (cluster.node(n) for n in names if n != leader)
    bodies = [f"m-{i}".encode() for i in range(COUNT)]
    _publish_confirmed(pub_node.port, "src", bodies, deadline_s)

    rejecter = Rejecter(con_node.port, "src")
    rejecter.start()
    wait_until(lambda: len(rejecter.rejected) >= COUNT // 2, 60, "100 rejections before the kill")
    cluster.kill(leader)
    with channel(pub_node.port) as ch:
        ch.queue_bind("dead", "dlx")
    wait_until(lambda: len(set(rejecter.rejected)) >= COUNT, 120, "every message rejected")
    wait_until(lambda: ready_count(pub_node.port, "dead") >= COUNT, 120, "every dead letter at the target")
    rejecter.stop.set()
    rejecter.join(10)
    assert rejecter.error is None

    # Held messages count against x-max-length: 200 new publishes all fit only once the holding area is empty.
    refill = [f"r-{i}".encode() for i in range(COUNT)]
    nacks = _publish_confirmed(pub_node.port, "src", refill, deadline_s)
    assert ready_count(pub_node.port, "src") == COUNT

    cluster.restart(leader)
    restarted = cluster.node(leader)
    target_count = ready_count(pub_node.port, "dead")
    wait_until(lambda: ready_count(restarted.port, "dead") == target_count, 90,
               "the restarted node's replica of the target to catch up")

    got = _drain(con_node.port, "dead", deadline_s)
    missing = set(bodies) - set(got)
    assert not missing, f"dead letters lost: {sorted(missing)[:10]} ({len(missing)} in all)"
    duplicates = len(got) - len(set(got))
    print(f"at-least-once: {len(got)} dead letters for {COUNT} rejections ({duplicates} duplicates); "
          f"{nacks} refill nacks while held messages settled")
