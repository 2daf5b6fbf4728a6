"""Credit flow in cluster mode on 3 real nodes (node/broker/credit_flow.py): a fast publisher on one follower of a
quorum queue, a slow consumer on the other follower. The publisher's node stops reading its connection while the
queue is behind (its /api/connections row says "flow", as RabbitMQ's), so the backlog stays bounded instead of
growing with everything the publisher can write; once the consumer drains it, the publisher is read again.

No timing asserts: the waits are safety timeouts. Without credit flow the publisher writes its 40 MB (far more than
the kernel's socket buffers hold) into the queue within seconds and the ready count passes the bound.
"""

from __future__ import annotations

import contextlib
import threading
import time

import pika
import requests
from pika.adapters.blocking_connection import BlockingChannel

from cluster.queue.replicated_codec import queue_group_id
from node.broker.broker import BrokerConfig
from tests.cluster.cluster_proc import (
    ClusterProcs,
    ConsumingThread,
    api_queue,
    channel,
    cluster_fixture,  # noqa: F401 (the `cluster` fixture)
    connect,
    queue_known,
    wait_until,
)

QUEUE = "q-flow"
MESSAGES = 40_000
BODY = b"x" * 1024
CONFIG = BrokerConfig()
# What may pile up before a pause: the ready bound, the publishes in flight through Raft, and the reads under way.
READY_BOUND = CONFIG.publish_flow_ready_max + CONFIG.publish_flow_inflight_max + 2000
SAMPLES_AFTER_FLOW = 40


class SlowConsumer(ConsumingThread):
    """Acks each delivery after a short sleep: a few hundred messages a second at most."""

    def __init__(self, port: int) -> None:
        super().__init__(port, QUEUE, prefetch_count=10)
        self.count = 0

    def handle(self, ch: BlockingChannel, delivery_tag: int, body: bytes) -> None:
        time.sleep(0.003)
        ch.basic_ack(delivery_tag)
        self.count += 1


class FastPublisher(threading.Thread):
    """Publishes MESSAGES persistent 1 KiB messages without confirms, as fast as its socket takes them."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.stop = threading.Event()
        self.published = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            conn = connect(self.port)
            ch = conn.channel()
            props = pika.BasicProperties(delivery_mode=2)
            while self.published < MESSAGES and not self.stop.is_set():
                ch.basic_publish("", QUEUE, BODY, props)
                self.published += 1
            with contextlib.suppress(Exception):
                conn.close()
        except BaseException as exc:  # reported by the test
            self.error = exc


def _connection_states(port: int) -> list[str]:
    reply = requests.get(f"http://127.0.0.1:{port + 10_000}/api/connections", auth=("guest", "guest"), timeout=10)
    reply.raise_for_status()
    return [row["state"] for row in reply.json()]


def test_a_fast_publisher_is_throttled_to_a_slow_consumer_on_a_quorum_queue(cluster: ClusterProcs) -> None:
    names = [n.name for n in cluster.nodes]
    with channel(cluster.nodes[0].port) as ch:
        ch.queue_declare(QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
    for node in cluster.nodes:
        wait_until(lambda node=node: queue_known(node.port, QUEUE), 30, f"{QUEUE} on {node.name}")
    group = queue_group_id("/", QUEUE)
    wait_until(lambda: cluster.agreed_leader(names, group) is not None, 30, "an agreed queue leader")
    leader = cluster.agreed_leader(names, group)
    pub_node, con_node = (cluster.node(n) for n in names if n != leader)

    consumer = SlowConsumer(con_node.port)
    consumer.start()
    wait_until(lambda: api_queue(con_node.port, QUEUE)["consumers"] == 1, 30, "the consumer attached")
    publisher = FastPublisher(pub_node.port)
    publisher.start()
    try:
        ready_seen: list[int] = []

        def sample() -> bool:
            ready_seen.append(int(api_queue(pub_node.port, QUEUE)["messages_ready"]))
            return "flow" in _connection_states(pub_node.port)

        wait_until(sample, 120, "the publisher's connection in flow", poll_s=0.25)
        for _ in range(SAMPLES_AFTER_FLOW):  # the publisher keeps pushing; the backlog must stay bounded
            sample()
            time.sleep(0.25)
        assert publisher.error is None and consumer.error is None, (publisher.error, consumer.error)
        assert max(ready_seen) <= READY_BOUND, (max(ready_seen), ready_seen[-10:])
        # The rest of what it wrote waits unread (client and kernel buffers), not in the queue.
        assert publisher.published < MESSAGES
        delivered_before = consumer.count
        wait_until(lambda: consumer.count > delivered_before + 100, 60, "the consumer still receiving")
    finally:
        publisher.stop.set()
        consumer.stop.set()
        publisher.join(120)
        consumer.join(30)
    assert not publisher.is_alive(), "the publisher's connection was never read again"
