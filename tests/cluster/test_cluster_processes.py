"""Cluster mode end to end: three real `raftmq node` processes on loopback, driven with pika.

- A quorum queue declared on one node is usable from every node: publish with confirms through one node,
  consume on another, in order.
- kill -9 of the queue leader's node in the middle of a confirmed publish stream: every confirmed message is
  delivered at least once, each publisher's order is kept (redelivered duplicates allowed), and the restarted
  node catches up (its own replica reports the same ready count as the others).
- A partition that leaves the leader alone (fault proxies on the Raft connections): publishes through the
  minority node get no confirm, the majority elects a new leader and confirms again; healed, the old leader
  catches up.
No assertion is about timing: waits have generous deadlines and only say how long they waited when they fail.
"""

from __future__ import annotations

import contextlib
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import pika
import requests
from pika.adapters.blocking_connection import BlockingChannel

from cluster.queue.replicated_codec import queue_group_id
from tests.cluster.cluster_proc import (
    ClusterProcs,
    ConsumingThread,
    api_queue,
    api_queue_rows,
    channel,
    cluster_fixture,  # noqa: F401 (the `cluster` fixture)
    connect,
    free_port,
    queue_known,
    ready_count,
    supervised,
    wait_until,
)

QUORUM = {"x-queue-type": "quorum"}
# Old names of the helpers now in cluster_proc, still imported from here by test_cluster_membership,
# test_cluster_unsafe and test_metadata_membership (those should import them from cluster_proc).


def _wait_queue_everywhere(cluster: ClusterProcs, queue: str) -> None:
    for node in cluster.nodes:
        wait_until(partial(queue_known, node.port, queue), 30, f"queue {queue} on {node.name}")


class Consumer(ConsumingThread):
    """Consumes `queue` on one node with manual acks, collecting bodies until told to stop."""

    def __init__(self, port: int, queue: str) -> None:
        super().__init__(port, queue, prefetch_count=50)
        self.bodies: list[bytes] = []

    def handle(self, ch: BlockingChannel, delivery_tag: int, body: bytes) -> None:
        self.bodies.append(body)
        ch.basic_ack(delivery_tag)


class Publisher(threading.Thread):
    """Publishes b"<tag>-<i>" for i in range(count) with confirms through one node; a message without a positive
    confirm (nack, closed channel or connection) is published again (at least once), in order."""

    def __init__(self, port: int, queue: str, count: int, tag: str = "p") -> None:
        super().__init__(daemon=True)
        self.port, self.queue, self.count, self.tag = port, queue, count, tag
        self.confirmed: list[int] = []
        self.retries = 0
        self.error: BaseException | None = None
        self.deadline_s = time.monotonic() + 240

    def _open(self) -> tuple[pika.BlockingConnection, BlockingChannel]:
        conn = connect(self.port)
        ch = conn.channel()
        ch.confirm_delivery()
        return conn, ch

    def run(self) -> None:
        conn, ch = self._open()
        i = 0
        while i < self.count and time.monotonic() < self.deadline_s:
            try:
                ch.basic_publish("", self.queue, f"{self.tag}-{i}".encode(),
                                 pika.BasicProperties(delivery_mode=2), mandatory=False)
                self.confirmed.append(i)
                i += 1
            except (pika.exceptions.NackError, pika.exceptions.UnroutableError):
                self.retries += 1
            except (pika.exceptions.AMQPError, OSError):
                self.retries += 1
                with contextlib.suppress(Exception):
                    conn.close()
                time.sleep(0.2)
                try:
                    conn, ch = self._open()
                except (pika.exceptions.AMQPError, OSError) as exc:
                    self.error = exc
                    time.sleep(0.5)
        with contextlib.suppress(Exception):
            conn.close()


def _check_delivery(bodies: list[bytes], tag: str, confirmed: list[int]) -> None:
    """Every confirmed number delivered; first deliveries in publish order (duplicates allowed)."""
    numbers = [int(b.decode().split("-")[1]) for b in bodies if b.decode().startswith(tag + "-")]
    missing = set(confirmed) - set(numbers)
    assert not missing, f"confirmed but never delivered: {sorted(missing)[:20]} ({len(missing)} in all)"
    first_seen: list[int] = []
    seen: set[int] = set()
    for n in numbers:
        if n not in seen:
            seen.add(n)
            first_seen.append(n)
    assert first_seen == sorted(first_seen), "per-publisher order broken"


def test_quorum_queue_publish_on_one_node_consume_on_another(cluster: ClusterProcs) -> None:
    n1, n2, n3 = cluster.nodes
    with channel(n1.port) as ch:
        ch.queue_declare("q-basic", durable=True, arguments=QUORUM)
    _wait_queue_everywhere(cluster, "q-basic")
    publisher = Publisher(n1.port, "q-basic", 100)
    publisher.run()
    assert publisher.confirmed == list(range(100))
    consumer = Consumer(n2.port, "q-basic")
    consumer.start()
    wait_until(lambda: len(consumer.bodies) >= 100, 60, "100 deliveries on n2")
    consumer.stop.set()
    consumer.join(10)
    assert consumer.bodies == [f"p-{i}".encode() for i in range(100)]
    wait_until(lambda: all(ready_count(n.port, "q-basic") == 0 for n in (n1, n2, n3)), 30, "acks everywhere")
    rows = [api_queue(n.port, "q-basic") for n in (n1, n2, n3)]
    assert {r["type"] for r in rows} == {"quorum"}
    assert all(sorted(r["members"]) == ["n1", "n2", "n3"] for r in rows), [(r["members"], r["leader"]) for r in rows]
    assert len({r["leader"] for r in rows}) == 1 and rows[0]["leader"] in ("n1", "n2", "n3")


def test_kill_the_queue_leader_mid_stream(cluster: ClusterProcs) -> None:
    queue, names = "q-failover", [n.name for n in cluster.nodes]
    group = queue_group_id("/", queue)
    with channel(cluster.nodes[0].port) as ch:
        ch.queue_declare(queue, durable=True, arguments=QUORUM)
    _wait_queue_everywhere(cluster, queue)
    wait_until(lambda: cluster.agreed_leader(names, group) is not None, 30, "an agreed queue leader")
    leader = cluster.agreed_leader(names, group)
    assert leader is not None
    pub_node, con_node = (cluster.node(n) for n in names if n != leader)

    consumer = Consumer(con_node.port, queue)
    consumer.start()
    publisher = Publisher(pub_node.port, queue, 200)
    publisher.start()
    wait_until(lambda: len(publisher.confirmed) >= 50, 120, "50 confirms before the kill")
    cluster.kill(leader)
    publisher.join(240)
    assert not publisher.is_alive()
    assert publisher.confirmed == list(range(200))
    wait_until(lambda: len(set(consumer.bodies)) >= 200, 120, "every message delivered")
    consumer.stop.set()
    consumer.join(10)
    assert consumer.error is None
    _check_delivery(consumer.bodies, "p", publisher.confirmed)
    survivors = [n for n in names if n != leader]
    assert cluster.agreed_leader(survivors, group) in survivors

    def recorded_leader_follows() -> bool:  # the new Raft leader records itself in the metadata
        rows = [api_queue(cluster.node(n).port, queue) for n in survivors]
        return all(r["leader"] in survivors and r["metadata_leader"] == r["leader"] for r in rows)

    wait_until(recorded_leader_follows, 30, "the metadata's queue leader to follow the Raft leader")

    # Messages that stay in the queue, then the killed node comes back and must catch up.
    tail = Publisher(pub_node.port, queue, 50, tag="t")
    tail.run()
    assert tail.confirmed == list(range(50))
    cluster.restart(leader)
    wait_until(lambda: all(ready_count(n.port, queue) == 50 for n in cluster.nodes), 90,
               "every replica (the restarted one too) to hold the 50 ready messages")
    wait_until(lambda: len({api_queue(n.port, queue)["raft"]["applied"] for n in cluster.nodes}) == 1, 30,
               "the restarted node's applied index to reach the others'")


def test_partition_leaves_the_leader_in_the_minority(tmp_path: Path) -> None:
    from chaos.faultproxy.background import FaultProxyThread

    with FaultProxyThread() as proxy_thread:
        procs = ClusterProcs(tmp_path, extra={"RAFTMQ_PROPOSAL_TIMEOUT_MS": "3000"})
        names = [n.name for n in procs.nodes]
        proxies: dict[frozenset[str], str] = {}
        for i, a in enumerate(procs.nodes):
            for b in procs.nodes[i + 1:]:  # the smaller name dials: route a's dial to b through a proxy
                port = free_port()
                name = f"{a.name}-{b.name}"
                _proxy_api(proxy_thread.api_port, "/proxies", {
                    "name": name, "listen": f"127.0.0.1:{port}", "upstream": f"127.0.0.1:{b.raft_port}"})
                procs.raft_via[(a.name, b.name)] = port
                proxies[frozenset((a.name, b.name))] = name
        with supervised(procs):
            procs.start_all()
            _partition_scenario(procs, names, proxies, proxy_thread.api_port)


def _proxy_api(api_port: int, path: str, body: dict[str, Any]) -> None:
    reply = requests.post(f"http://127.0.0.1:{api_port}{path}", json=body, timeout=10)
    assert reply.status_code in (200, 201), reply.text


def _partition_scenario(procs: ClusterProcs, names: list[str], proxies: dict[frozenset[str], str],
                        api_port: int) -> None:
    queue = "q-partition"
    group = queue_group_id("/", queue)
    with channel(procs.nodes[0].port) as ch:
        ch.queue_declare(queue, durable=True, arguments=QUORUM)
    _wait_queue_everywhere(procs, queue)
    wait_until(lambda: procs.agreed_leader(names, group) is not None, 30, "an agreed queue leader")
    leader = procs.agreed_leader(names, group)
    assert leader is not None
    majority = [n for n in names if n != leader]
    for pair, proxy in proxies.items():
        if leader in pair:
            _proxy_api(api_port, f"/proxies/{proxy}", {"enabled": False})

    # Minority side: a publish through the old leader's node gets no positive confirm.
    minority = Publisher(procs.node(leader).port, queue, 1, tag="m")
    minority.deadline_s = time.monotonic() + 8
    minority.start()
    # Majority side: a new leader, and confirms again.
    wait_until(lambda: procs.agreed_leader(majority, group) in majority, 60, "a majority-side leader")
    majority_pub = Publisher(procs.node(majority[0]).port, queue, 20, tag="M")
    majority_pub.run()
    assert majority_pub.confirmed == list(range(20))
    minority.join(30)
    assert minority.confirmed == [], "the minority side confirmed a publish"
    assert minority.retries >= 1

    for pair, proxy in proxies.items():
        if leader in pair:
            _proxy_api(api_port, f"/proxies/{proxy}", {"enabled": True})
    wait_until(lambda: len({ready_count(procs.node(n).port, queue) for n in names}) == 1, 60,
               "the healed node to agree on the ready count")
    assert ready_count(procs.node(leader).port, queue) >= 20


def test_a_member_down_too_long_is_replaced(tmp_path: Path) -> None:
    procs = ClusterProcs(tmp_path, size=4, extra={"RAFTMQ_MEMBER_REPLACE_AFTER_MS": "2000"})
    with supervised(procs):
        procs.start_all()
        queue = "q-replace"
        n1 = procs.nodes[0]
        with channel(n1.port) as ch:
            ch.queue_declare(queue, durable=True, arguments={**QUORUM, "x-quorum-initial-group-size": 3})
        _wait_queue_everywhere(procs, queue)
        members = api_queue(n1.port, queue)["members"]
        assert len(members) == 3 and "n1" in members
        spare = next(n.name for n in procs.nodes if n.name not in members)
        victim = next(m for m in members if m != "n1")
        procs.kill(victim)

        def replaced() -> bool:
            row = api_queue(n1.port, queue)
            return victim not in row["members"] and spare in row["members"] and spare in row["raft"]["voters"]

        wait_until(replaced, 90, f"{victim} replaced by {spare}")
        publisher = Publisher(n1.port, queue, 20)
        publisher.run()
        assert publisher.confirmed == list(range(20))
        survivors = [n.name for n in procs.nodes if n.name != victim]
        wait_until(lambda: all(ready_count(procs.node(n).port, queue) == 20 for n in survivors), 30,
                   "the 20 messages on every live replica")


def test_a_node_with_another_secret_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    procs = ClusterProcs(tmp_path, secrets={"n3": "a-different-secret-0123456789abcdef"})
    n1, n2, n3 = procs.nodes
    with supervised(procs):
        for node in (n1, n2):
            procs.spawn(node)
        for node in (n1, n2):
            procs.wait_ready(node)
        with channel(n1.port) as ch:
            ch.queue_declare("q-before", durable=True, arguments=QUORUM)
        wait_until(lambda: bool(api_queue(n1.port, "q-before")["members"]), 30, "the queue in the metadata")
        before = api_queue_rows(n1.port)
        procs.spawn(n3)
        assert n3.process is not None
        assert n3.process.wait(60) == 2
        assert "cannot join the cluster: ClusterSecretError" in n3.log_tail()
        after = api_queue_rows(n1.port)
        assert [(q["name"], q["members"]) for q in after] == [(q["name"], q["members"]) for q in before]
        nodes = requests.get(f"http://127.0.0.1:{n2.port + 10_000}/api/nodes", auth=("guest", "guest"),
                             timeout=10).json()
        assert {r["name"]: r["running"] for r in nodes} == {"n1": True, "n2": True, "n3": False}
        publisher = Publisher(n2.port, "q-before", 5)
        publisher.run()
        assert publisher.confirmed == list(range(5))


def test_exclusive_queues_of_a_dead_node_are_deleted(cluster: ClusterProcs) -> None:
    n1, n2, _ = cluster.nodes
    owner = connect(n2.port)
    owner.channel().queue_declare("q-exclusive", exclusive=True)

    def status_on_n1() -> int:
        try:
            ready_count(n1.port, "q-exclusive")
            return 200
        except pika.exceptions.ChannelClosedByBroker as exc:
            return int(exc.reply_code)

    wait_until(lambda: status_on_n1() == 405, 30, "n1 to see the queue locked by n2's connection")
    cluster.kill(n2.name)
    wait_until(lambda: status_on_n1() == 404, 60, "the dead node's exclusive queue to be deleted")
