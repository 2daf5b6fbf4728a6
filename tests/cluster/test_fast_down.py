"""Fast node-down detection (docs/cluster.md, "Liveness"): a peer that refuses connections is down at once.

- The decision rule (`PeerLiveness.observe` with the transport's refusing peers): refusing and unconnected is down
  now; connected wins; everything else keeps `down_after_ms`.
- Real processes, three nodes, `node_down_after_ms` 30 s so that only the fast path can return messages within
  the test's waits: a consumer on n3 holds the unacked messages of a quorum queue (prefetch), a consumer on n1
  waits. n3 paused with SIGSTOP for 2 s: nothing is redelivered (a paused node is not dead). n3 killed with
  kill -9: n1's consumer gets every message, flagged redelivered, long before 30 s (the time is printed, not
  asserted). n3 restarted, a new consumer there holds messages, n3 killed and restarted at once: its earlier
  life's messages come back to n1 too and the queue ends empty everywhere (nothing lost).
- The listening side: n1 (which dials both others, so they only listen for it) killed while its consumer holds
  messages: n2 and n3 find its port refusing with their probes, and n2's consumer gets the messages.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from functools import partial
from pathlib import Path

import pika
from pika.adapters.blocking_connection import BlockingChannel

from node.clustering.proposals import PeerLiveness
from tests.cluster.cluster_proc import (
    ClusterNode,
    ClusterProcs,
    raft_links_up,
    ready_count,
    supervised,
    wait_until,
)

QUORUM = {"x-queue-type": "quorum"}
QUEUE = "q-fast-down"
DOWN_AFTER_MS = 30_000
REDELIVERY_WAIT_S = 20.0  # clearly less than DOWN_AFTER_MS: only the fast path can make it


def test_refusing_unconnected_peers_are_down_at_once_and_others_keep_the_timing() -> None:
    live = PeerLiveness(("b", "c"), down_after_ms=30_000, start_ms=0)
    assert live.observe({"b", "c"}, 1000) == ([], [])
    assert live.observe({"b"}, 2000, refusing=()) == ([], [])  # c's link dropped: not refusing, wait
    assert live.observe({"b"}, 2500, refusing={"c"}) == (["c"], [])  # refusing: down now
    assert live.down_since_ms == {"c": 2500}
    assert live.observe({"b"}, 2750, refusing={"c"}) == ([], [])  # reported once
    assert live.observe({"b", "c"}, 3000, refusing=()) == ([], ["c"])  # back at its first connection
    assert live.observe({"c"}, 3250, refusing={"b"}) == (["b"], [])
    assert live.observe({"b", "c"}, 3500, refusing={"c"}) == ([], ["b"])  # connected wins over a stale report
    assert live.observe(set(), 33_499) == ([], [])
    assert live.observe(set(), 33_500) == (["b", "c"], [])  # the normal timing is unchanged


def _connect(port: int) -> pika.BlockingConnection:
    params = pika.ConnectionParameters("127.0.0.1", port, heartbeat=60, blocked_connection_timeout=60,
                                       connection_attempts=5, retry_delay=0.5)
    return pika.BlockingConnection(params)


def _publish(port: int, bodies: list[bytes]) -> None:
    conn = _connect(port)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for body in bodies:
            ch.basic_publish("", QUEUE, body, pika.BasicProperties(delivery_mode=2), mandatory=True)
    finally:
        conn.close()


def _ready_count(port: int) -> int | None:
    """The queue's ready count on that node, or None while the node does not know the queue yet (404)."""
    try:
        return ready_count(port, QUEUE)
    except pika.exceptions.ChannelClosedByBroker:
        return None


class Holder:
    """A consumer (prefetch `prefetch`) that takes deliveries and never acks them."""

    def __init__(self, port: int, prefetch: int) -> None:
        self.conn = _connect(port)
        self.bodies: list[bytes] = []
        ch = self.conn.channel()
        ch.basic_qos(prefetch_count=prefetch)
        ch.basic_consume(QUEUE, lambda _ch, _method, _props, body: self.bodies.append(body))

    def take(self, count: int) -> None:
        deadline = time.monotonic() + 30
        while len(self.bodies) < count:
            assert time.monotonic() < deadline, f"the holder got {len(self.bodies)} of {count} deliveries"
            self.conn.process_data_events(time_limit=0.1)

    def abandon(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()


class Acker(threading.Thread):
    """Consumes the queue on one node, acking, recording (body, redelivered)."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.got: list[tuple[bytes, bool]] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            conn = _connect(self.port)
            ch = conn.channel()
            ch.basic_qos(prefetch_count=50)

            def on_message(ch: BlockingChannel, method: object, props: object, body: bytes) -> None:
                self.got.append((body, bool(method.redelivered)))  # type: ignore[attr-defined]
                ch.basic_ack(method.delivery_tag)  # type: ignore[attr-defined]

            ch.basic_consume(QUEUE, on_message)
            while not self.stop.is_set():
                conn.process_data_events(time_limit=0.1)
            conn.close()
        except BaseException as exc:  # reported by the test
            self.error = exc

    def finish(self) -> None:
        self.stop.set()
        self.join(30)
        assert self.error is None, repr(self.error)


def _logged(node: ClusterNode, text: bytes) -> bool:
    return text in node.log_text()


def _wait_redelivered(acker: Acker, bodies: list[bytes], what: str) -> float:
    started = time.monotonic()
    wait_until(lambda: {b for b, _ in acker.got} >= set(bodies), REDELIVERY_WAIT_S, what, poll_s=0.05)
    elapsed_s = time.monotonic() - started
    assert all(redelivered for body, redelivered in acker.got if body in bodies)
    return elapsed_s


def _held_elsewhere(procs: ClusterProcs, publisher: ClusterNode, holder_node: ClusterNode,
                    bodies: list[bytes]) -> tuple[Holder, Acker]:
    """Declare the quorum queue through `publisher` and wait until every node knows it, publish `bodies` there,
    let a consumer on `holder_node` hold them all unacked, and start an acking consumer on `publisher`."""
    conn = _connect(publisher.port)
    conn.channel().queue_declare(QUEUE, durable=True, arguments=QUORUM)
    conn.close()
    wait_until(lambda: all(_ready_count(n.port) == 0 for n in procs.nodes), 30, "the queue on every node")
    # A peer is reported refusing only after a link to it was lost (never-connected peers keep the normal timing),
    # so every pair's link must be up before a kill: right after start a dialer may still be in its backoff.
    wait_until(lambda: all(raft_links_up(n.port) for n in procs.nodes), 30, "every node's Raft links")
    _publish(publisher.port, bodies)
    holder = Holder(holder_node.port, prefetch=len(bodies))
    holder.take(len(bodies))
    acker = Acker(publisher.port)
    acker.start()
    return holder, acker


def test_killed_node_consumers_messages_come_back_at_once_but_not_a_paused_nodes(tmp_path: Path) -> None:
    with supervised(ClusterProcs(tmp_path, extra={"RAFTMQ_NODE_DOWN_AFTER_MS": str(DOWN_AFTER_MS)})) as procs:
        procs.start_all()
        n1, n3 = procs.node("n1"), procs.node("n3")
        first = [f"a-{i}".encode() for i in range(10)]
        holder, acker = _held_elsewhere(procs, n1, n3, first)

        # Paused: no refusals (its kernel still accepts connections), so the 30 s timing applies.
        assert n3.process is not None
        n3.process.send_signal(signal.SIGSTOP)
        try:
            time.sleep(2.0)
            assert acker.got == [], "a paused node's consumer's messages were redelivered"
        finally:
            n3.process.send_signal(signal.SIGCONT)
        time.sleep(1.0)
        assert acker.got == []

        # Killed: its Raft port refuses, so n1 (and n2) report it down at once.
        procs.kill("n3")
        elapsed_s = _wait_redelivered(acker, first, "the killed node's unacked messages on n1")
        print(f"\nkill -9: {len(first)} unacked messages redelivered on n1 after {elapsed_s:.2f} s "
              f"(node_down_after_ms {DOWN_AFTER_MS})")
        holder.abandon()
        for survivor in (n1, procs.node("n2")):  # each survivor reports it (the queue leader's report detaches)
            wait_until(partial(_logged, survivor, b"node n3 refuses connections"), REDELIVERY_WAIT_S,
                       f"{survivor.name} to report n3 down as refusing")
        acker.finish()

        # Back, holding new messages, then killed and restarted at once (refusing only for a moment).
        procs.spawn(n3)
        procs.wait_ready(n3)
        wait_until(lambda: b"node n3 is back" in n1.log_text(), 60, "n1 to see n3 back")
        second = [f"b-{i}".encode() for i in range(5)]
        holder = Holder(n3.port, prefetch=10)
        _publish(n1.port, second)
        holder.take(5)
        procs.restart("n3")
        acker = Acker(n1.port)
        acker.start()
        elapsed_s = _wait_redelivered(acker, second, "the restarted node's earlier life's messages on n1")
        print(f"kill -9 and restart: {len(second)} unacked messages redelivered on n1 after {elapsed_s:.2f} s")
        holder.abandon()
        acker.finish()
        assert {b for b, _ in acker.got} == set(second)
        wait_until(lambda: all(_ready_count(n.port) == 0 for n in procs.nodes), 30, "an empty queue everywhere")


def test_a_killed_node_that_others_only_listen_for_is_found_by_their_probes(tmp_path: Path) -> None:
    with supervised(ClusterProcs(tmp_path, extra={"RAFTMQ_NODE_DOWN_AFTER_MS": str(DOWN_AFTER_MS)})) as procs:
        procs.start_all()
        n1, n2 = procs.node("n1"), procs.node("n2")
        bodies = [f"c-{i}".encode() for i in range(10)]
        holder, acker = _held_elsewhere(procs, n2, n1, bodies)
        procs.kill("n1")
        elapsed_s = _wait_redelivered(acker, bodies, "the killed dialer's unacked messages on n2")
        print(f"\nkill -9 of n1 (the dialer): {len(bodies)} messages redelivered on n2 after {elapsed_s:.2f} s")
        holder.abandon()
        for survivor in (n2, procs.node("n3")):
            wait_until(partial(_logged, survivor, b"node n1 refuses connections"), REDELIVERY_WAIT_S,
                       f"{survivor.name} to report n1 down as refusing")
        acker.finish()
        assert {b for b, _ in acker.got} == set(bodies)
