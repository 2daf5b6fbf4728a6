"""Mirrored queues on a real 3-node cluster behind HAProxy, with pika: an `ha-mode` policy makes a classic queue
mirrored on every node (leader, epoch, ISR, HW and LEOs on /api/queues), publishes are confirmed and consumed, a
kill -9 of the leader's node loses nothing confirmed and the queue serves again from a new leader elected from the
ISR in a newer epoch. One cluster for the module, with `mirror_trim_records = 10`, so every replica trims its log
into snapshots as it goes: the killed node, restarted after the new leader trimmed past its log end, restores its
own snapshot, installs the leader's and rejoins the ISR holding the same messages (the one node restart here costs
~20 s of CI on this machine).

The second test reuses the cluster for policy changes after declare (node/clustering/mirror_policy.py): a queue
declared under `exactly 1` gains mirrors under `exactly 3`, moves to two listed nodes under `nodes` (the leadership
first), its leader's SIGTERM hands the leadership to the synced replica (`ha-promote-on-shutdown`) and, with
`mirror_replace_after_ms = 1000`, the third node replaces the stopped mirror (`exactly 2`); nothing confirmed is lost.

A third test (`ha-sync-mode: manual`, RabbitMQ's default): mirrors added by a policy change to queues holding
messages fetch everything but stay out of the ISR (not in RabbitMQ's `synchronised_slave_nodes`) until `raftmq ctl
sync_queue` for one queue, and until the messages older than their join are consumed for the other (a message
published after the join does not hold them); the queue actions' answers in a cluster. The other tests that add
mirrors to queues holding messages ask for `ha-sync-mode: automatic`.

The time from the kill to the first new confirm is printed (`-s`), not asserted (timings stay out of pass/fail)."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest

from cluster.mirror_queues.runtime.storage import read_records, read_snapshot
from tests.integration.clusterproc import ClusterProcess
from tests.management.test_real_node import run_ctl
from tests.policies.test_policy_real_node import http

QUEUE = "ha.orders"
WAIT_S = 60.0
POLICY = {"pattern": "^ha\\.", "apply-to": "queues",
          "definition": {"ha-mode": "exactly", "ha-params": 3, "ha-min-insync": 2}}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterProcess]:
    proc = ClusterProcess(Path(tmp_path_factory.mktemp("mirror-cluster")), extra_config="mirror_trim_records = 10\n"
                                                                                 "mirror_replace_after_ms = 1000\n")
    try:
        yield proc.start()
    finally:
        proc.shutdown()


def _row(cluster: ClusterProcess, node: Any, queue: str = QUEUE) -> dict[str, Any]:
    status, row = http(node.plan.management_port, "GET", f"/api/queues/%2F/{queue}")
    assert status == 200, row
    assert isinstance(row, dict)
    return row


def _replica_dirs(node: Any, queue: str) -> list[Path]:
    """The directories of `queue`'s mirrored replicas on `node` (named after the group, q/<vhost>/<name>/<i...>;
    each test looks at its own queue's only, so one test's leftovers do not fail the next)."""
    return [d for d in (node.data_dir / "mirror").iterdir() if d.name.startswith(f"q~%2F~{queue}~")]


def _mirror_totals(node: Any) -> dict[str, int]:
    """The aggregated mirror gauges of `node`'s /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{node.plan.management_port}/metrics", timeout=10) as resp:
        lines = resp.read().decode().splitlines()
    return {name: int(value) for name, value in (line.split() for line in lines
                                                 if line.startswith("raftmq_mirror_queues"))}


def _telemetry(node: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for path in (node.data_dir / "mirror" / "telemetry").glob("*.jsonl")
            for line in path.read_text().splitlines()]


def _wait(what: str, predicate: Any) -> Any:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except (OSError, AssertionError):
            value = None
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"not within {WAIT_S} s: {what}")


def _channel(cluster: ClusterProcess) -> tuple[pika.BlockingConnection, Any]:
    conn = pika.BlockingConnection(pika.ConnectionParameters(cluster.host, cluster.port, connection_attempts=1,
                                                             socket_timeout=5, blocked_connection_timeout=30))
    ch = conn.channel()
    ch.confirm_delivery()
    return conn, ch


def _publish_until_confirmed(cluster: ClusterProcess, body: bytes) -> None:
    """Through HAProxy, reconnecting (a connection may land on the dead node) until the broker confirms."""
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            conn, ch = _channel(cluster)
            with conn:
                ch.basic_publish("", QUEUE, body, pika.BasicProperties(delivery_mode=2))
                return
        except (pika.exceptions.AMQPError, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


CONVERTED = "hc.converted"


def test_a_classic_queue_becomes_mirrored_through_a_policy(cluster: ClusterProcess) -> None:
    """RabbitMQ 3.x: an ha-mode policy applied to an existing classic queue mirrors it, keeping its messages and
    consumers (node/runtime/cluster/mirror_conversion.py). Before the policy: 20 confirmed, 2 consumed, 2 unacked on
    an open channel, one consumer holding a delivery. After: the queue is mirrored on every node with all three in
    the ISR, the consumer is not cancelled and gets the next message after its ack, publishing goes on, and every
    message not acked is delivered once (the unacked ones redelivered)."""
    nodes = {n.plan.name: n for n in cluster.nodes}
    producer, pub = _channel(cluster)
    holder = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", nodes["rmq2"].plan.port))
    with producer, holder:
        pub.queue_declare(CONVERTED, durable=True)
        published = [f"c{i}".encode() for i in range(20)]
        for body in published:
            pub.basic_publish("", CONVERTED, body, pika.BasicProperties(delivery_mode=2))
        getter = holder.channel()
        fetched = [getter.basic_get(CONVERTED) for _ in range(4)]
        for method, _props, _body in fetched[:2]:
            getter.basic_ack(method.delivery_tag)  # c0, c1: consumed
        consumer = holder.channel()
        consumer.basic_qos(prefetch_count=1)
        deliveries: list[tuple[Any, bytes]] = []
        cancelled: list[Any] = []
        consumer.add_on_cancel_callback(cancelled.append)
        tag = consumer.basic_consume(CONVERTED, lambda _ch, method, _p, body: deliveries.append((method, body)))
        holder.process_data_events(time_limit=1)
        assert [body for _m, body in deliveries] == [b"c4"]
        row = _row(cluster, nodes["rmq1"], CONVERTED)
        assert row.get("type") != "mirrored" and not row.get("mirror")

        status, _ = http(nodes["rmq1"].plan.management_port, "PUT", "/api/policies/%2F/hc",
                         {"pattern": "^hc\\.", "apply-to": "queues",
                          "definition": {"ha-mode": "exactly", "ha-params": 3, "ha-min-insync": 2,
                                         "ha-sync-mode": "automatic"}})  # (manual: test_new_mirrors_wait_...)
        assert status == 201
        during = [f"d{i}".encode() for i in range(5)]  # while the queue moves: confirmed once it took them
        for body in during:
            pub.basic_publish("", CONVERTED, body, pika.BasicProperties(delivery_mode=2))
        for name, n in nodes.items():
            mirror = _wait(f"{CONVERTED} mirrored on {name} with every node in sync", lambda n=n: (
                (m := _row(cluster, n, CONVERTED).get("mirror")) and sorted(m["isr"]) == sorted(nodes) and m))
            assert sorted(mirror["replicas"]) == sorted(nodes) and mirror["epoch"] == 0
        after = [f"a{i}".encode() for i in range(5)]
        for body in after:
            pub.basic_publish("", CONVERTED, body, pika.BasicProperties(delivery_mode=2))
        consumer.basic_ack(deliveries[0][0].delivery_tag)  # the consumer goes on: it gets the next message
        deadline = time.monotonic() + WAIT_S
        while len(deliveries) < 2 and time.monotonic() < deadline:
            holder.process_data_events(time_limit=0.2)
        assert [body for _m, body in deliveries] == [b"c4", b"c5"] and not cancelled
        consumer.basic_cancel(tag)
        consumer.close()  # c5 back unacked, as c2 and c3 with the getter's channel
        getter.close()

    expected = {*published[2:], *during, *after} - {b"c4"}
    conn, ch = _channel(cluster)
    with conn:
        got: list[tuple[bytes, bool]] = []
        ch.basic_consume(CONVERTED, lambda _ch, m, _p, body: got.append((body, m.redelivered)), auto_ack=True)
        deadline = time.monotonic() + WAIT_S
        while len(got) < len(expected) and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.2)
        conn.process_data_events(time_limit=0.5)  # (nothing more may come)
        assert sorted(body for body, _r in got) == sorted(expected)  # each once: nothing lost, nothing twice
        assert {body for body, redelivered in got if redelivered} == {b"c2", b"c3", b"c5"}
        ch.queue_delete(CONVERTED)
    http(nodes["rmq1"].plan.management_port, "DELETE", "/api/policies/%2F/hc")
    for name, n in nodes.items():
        _wait(f"{CONVERTED} gone on {name}", lambda n=n: http(n.plan.management_port, "GET",
                                                              f"/api/queues/%2F/{CONVERTED}")[0] == 404
              and not _replica_dirs(n, CONVERTED))


SYNCED, DRAINED = "hs.synced", "hs.drained"


def _qrow(port: int, queue: str) -> dict[str, Any]:
    status, row = http(port, "GET", f"/api/queues/%2F/{queue}")
    assert status == 200 and isinstance(row, dict), row
    return row


def _until(what: str, predicate: Any) -> Any:
    """`_wait`, a row without the fields looked at yet counting as not yet."""
    def guarded() -> Any:
        try:
            return predicate()
        except (KeyError, TypeError):
            return None
    return _wait(what, guarded)


def _sync_policy(port: int, definition: dict[str, Any]) -> None:
    status, _ = http(port, "PUT", "/api/policies/%2F/hs", {"pattern": "^hs\\.", "apply-to": "queues",
                                                          "definition": definition})
    assert status in (201, 204)


def test_new_mirrors_wait_for_a_sync_or_the_backlog_to_drain(cluster: ClusterProcess,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    nodes = {n.plan.name: n.plan.management_port for n in cluster.nodes}
    port = nodes["rmq1"]
    _sync_policy(port, {"ha-mode": "exactly", "ha-params": 1})  # ha-sync-mode: manual, the default
    _until("the policy on every node", lambda: all(http(p, "GET", "/api/policies/%2F/hs")[0] == 200
                                                  for p in nodes.values()))
    conn = pika.BlockingConnection(pika.ConnectionParameters(cluster.host, cluster.port))
    with conn:
        ch = conn.channel()
        ch.confirm_delivery()
        for queue in (SYNCED, DRAINED):
            ch.queue_declare(queue, durable=True)
            for i in range(5):
                ch.basic_publish("", queue, f"old{i}".encode(), pika.BasicProperties(delivery_mode=2))
    leaders = {q: _until(f"{q} mirrored", lambda q=q: _qrow(port, q)["mirror"]["leader"]) for q in (SYNCED, DRAINED)}

    _sync_policy(port, {"ha-mode": "exactly", "ha-params": 3})
    for queue, leader in leaders.items():  # every mirror fetched the whole log, none is in sync
        lport = nodes[leader]
        mirror = _until(f"{queue}: two new mirrors caught up", lambda q=queue, lp=lport, ld=leader: (
            (m := _qrow(lp, q)["mirror"]) and len(m["replicas"]) == 3 and len(m["leo"]) == 3
            and set(m["leo"].values()) == {m["leo"][ld]} and m))
        row = _qrow(lport, queue)
        assert mirror["isr"] == [leader] and sorted(mirror["held_out"]) == sorted(n for n in nodes if n != leader)
        assert sorted(row["slave_nodes"]) == sorted(mirror["held_out"]) and row["synchronised_slave_nodes"] == []

    code, out = run_ctl(port, capsys, "sync_queue", SYNCED)  # RabbitMQ's command
    assert code == 0 and "Synchronising queue 'hs.synced'" in out, out
    _until(f"{SYNCED}: every mirror in sync", lambda: (
        (row := _qrow(nodes[leaders[SYNCED]], SYNCED))["mirror"]["isr"] == sorted(nodes)
        and sorted(row["synchronised_slave_nodes"]) == sorted(row["slave_nodes"]) and not row["mirror"]["held_out"]))
    code, out = run_ctl(port, capsys, "cancel_sync_queue", SYNCED)
    assert code == 0 and "not_syncing" in out, out

    conn = pika.BlockingConnection(pika.ConnectionParameters(cluster.host, cluster.port))
    with conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("", DRAINED, b"new", pika.BasicProperties(delivery_mode=2))  # after the join
        assert _qrow(nodes[leaders[DRAINED]], DRAINED)["mirror"]["held_out"]
        got = []
        for _ in range(5):  # the backlog older than the join, consumed and acked
            method, _props, body = ch.basic_get(DRAINED)
            got.append(body)
            ch.basic_ack(method.delivery_tag)
        assert got == [f"old{i}".encode() for i in range(5)]
        _until(f"{DRAINED}: every mirror in sync once its old messages are gone", lambda: (
            (m := _qrow(nodes[leaders[DRAINED]], DRAINED)["mirror"])["isr"] == sorted(nodes) and not m["held_out"]))
        assert ch.queue_declare(DRAINED, passive=True).method.message_count == 1
        ch.basic_publish("", DRAINED, b"confirmed by all", pika.BasicProperties(delivery_mode=2))
        ch.queue_declare("plain.q", durable=True)
        for queue in (SYNCED, DRAINED):
            ch.queue_delete(queue)

    code, out = run_ctl(port, capsys, "sync_queue", "plain.q")
    assert code == 65 and "not_mirrored" in out, out
    assert http(port, "POST", "/api/queues/%2F/plain.q/actions", {"action": "sync"})[0] == 204  # as RabbitMQ's
    status, body = http(port, "POST", "/api/queues/%2F/plain.q/actions", {"action": 3})
    assert status == 400 and body == {"error": "bad_request", "reason": "{unknown,3}"}
    http(port, "DELETE", "/api/policies/%2F/hs")


BACK = "hk.back"
BACK_POLICY = {"pattern": "^hk\\.", "apply-to": "queues",
               "definition": {"ha-mode": "exactly", "ha-params": 3, "ha-min-insync": 2,
                              "ha-sync-mode": "automatic"}}  # back to mirrored with its messages: synced at once


def _mirrored_everywhere(cluster: ClusterProcess, nodes: dict[str, Any]) -> str:
    """Waits until BACK is mirrored on every node with every node in the ISR; its leader."""
    leaders = {_wait(f"{BACK} mirrored on {name} with every node in sync", lambda n=n: (
        (m := _row(cluster, n, BACK).get("mirror")) and sorted(m["isr"]) == sorted(nodes) and m["leader"]))
        for name, n in nodes.items()}
    assert len(leaders) == 1
    return str(leaders.pop())


def test_a_mirrored_queue_becomes_classic_when_its_policy_goes(cluster: ClusterProcess) -> None:
    """RabbitMQ 3.x: a mirrored queue whose policy no longer mirrors it goes on as a classic queue, keeping its
    messages and consumers (node/runtime/cluster/mirror_back.py). Under an ha policy: 20 confirmed, 2 consumed, 2
    unacked on an open channel, one consumer holding a delivery; the policy deleted: the queue is classic on every
    node (no mirror columns, no replica files), the consumer is not cancelled and gets the next message after its
    ack, publishing goes on, and a kill -9 and restart of the queue's node keeps every message. Then the policy
    again: mirrored again, and every message not acked is delivered once (the unacked ones redelivered)."""
    nodes = {n.plan.name: n for n in cluster.nodes}
    status, _ = http(nodes["rmq1"].plan.management_port, "PUT", "/api/policies/%2F/hk", BACK_POLICY)
    assert status == 201
    _wait("the policy on every node", lambda: all(
        http(n.plan.management_port, "GET", "/api/policies/%2F/hk")[0] == 200 for n in cluster.nodes))
    producer, pub = _channel(cluster)
    holder = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", nodes["rmq2"].plan.port))
    with producer, holder:
        pub.queue_declare(BACK, durable=True)
        published = [f"b{i}".encode() for i in range(20)]
        for body in published:
            pub.basic_publish("", BACK, body, pika.BasicProperties(delivery_mode=2))
        leader = _mirrored_everywhere(cluster, nodes)
        getter = holder.channel()
        fetched = [getter.basic_get(BACK) for _ in range(4)]
        for method, _props, _body in fetched[:2]:
            getter.basic_ack(method.delivery_tag)  # b0, b1: consumed
        consumer = holder.channel()
        consumer.basic_qos(prefetch_count=1)
        deliveries: list[tuple[Any, bytes]] = []
        cancelled: list[Any] = []
        consumer.add_on_cancel_callback(cancelled.append)
        tag = consumer.basic_consume(BACK, lambda _ch, method, _p, body: deliveries.append((method, body)))
        holder.process_data_events(time_limit=1)
        assert [body for _m, body in deliveries] == [b"b4"]

        status, _ = http(nodes["rmq1"].plan.management_port, "DELETE", "/api/policies/%2F/hk")
        assert status == 204
        during = [f"d{i}".encode() for i in range(5)]  # while the queue moves: confirmed once it took them
        for body in during:
            pub.basic_publish("", BACK, body, pika.BasicProperties(delivery_mode=2))
        for name, n in nodes.items():
            row = _wait(f"{BACK} classic on {name} led by {leader}, its replica files gone", lambda n=n: (
                (r := _row(cluster, n, BACK)) and not r.get("mirror") and r.get("leader") == leader
                and not _replica_dirs(n, BACK) and r))
            assert row["type"] == "classic" and row["members"] == [leader] and not row.get("slave_nodes")
        after = [f"a{i}".encode() for i in range(5)]
        for body in after:
            pub.basic_publish("", BACK, body, pika.BasicProperties(delivery_mode=2))
        consumer.basic_ack(deliveries[0][0].delivery_tag)  # the consumer goes on: it gets the next message
        deadline = time.monotonic() + WAIT_S
        while len(deliveries) < 2 and time.monotonic() < deadline:
            holder.process_data_events(time_limit=0.2)
        assert [body for _m, body in deliveries] == [b"b4", b"b5"] and not cancelled
        consumer.basic_cancel(tag)
        consumer.close()  # b5 back unacked, as b2 and b3 with the getter's channel
        getter.close()

    expected = {*published[2:], *during, *after} - {b"b4"}
    node = nodes[leader]  # the classic queue's node: the mirror leader that sealed its log
    assert node.process is not None
    node.process.kill()  # kill -9, then start again: a durable queue keeps its messages
    node.process.wait()
    cluster.start()
    _wait(f"{BACK} holds its {len(expected)} messages after {leader}'s restart",
          lambda: all(_row(cluster, n, BACK).get("messages") == len(expected) for n in nodes.values()))

    status, _ = http(nodes["rmq1"].plan.management_port, "PUT", "/api/policies/%2F/hk", BACK_POLICY)
    assert status == 201
    _mirrored_everywhere(cluster, nodes)  # the round trip: mirrored again
    again = [f"m{i}".encode() for i in range(3)]
    conn, ch = _channel(cluster)
    with conn:
        for body in again:
            ch.basic_publish("", BACK, body, pika.BasicProperties(delivery_mode=2))
        got: list[tuple[bytes, bool]] = []
        ch.basic_consume(BACK, lambda _ch, m, _p, body: got.append((body, m.redelivered)), auto_ack=True)
        deadline = time.monotonic() + WAIT_S
        while len(got) < len(expected) + len(again) and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.2)
        conn.process_data_events(time_limit=0.5)  # (nothing more may come)
        assert sorted(body for body, _r in got) == sorted({*expected, *again})  # each once
        assert {body for body, redelivered in got if redelivered} == {b"b2", b"b3", b"b5"}
        ch.queue_delete(BACK)
    http(nodes["rmq1"].plan.management_port, "DELETE", "/api/policies/%2F/hk")
    for name, n in nodes.items():
        _wait(f"{BACK} gone on {name}", lambda n=n: http(n.plan.management_port, "GET",
                                                         f"/api/queues/%2F/{BACK}")[0] == 404 and not _replica_dirs(n, BACK))


def test_mirrored_queue_survives_kill_9_of_its_leader(cluster: ClusterProcess) -> None:
    nodes = {n.plan.name: n for n in cluster.nodes}
    any_node = cluster.nodes[0]
    status, _ = http(any_node.plan.management_port, "PUT", "/api/policies/%2F/ha", POLICY)
    assert status == 201
    _wait("the policy on every node", lambda: all(
        http(n.plan.management_port, "GET", "/api/policies/%2F/ha")[0] == 200 for n in cluster.nodes))
    conn, ch = _channel(cluster)
    with conn:
        ch.queue_declare(QUEUE, durable=True)
        confirmed = [f"m{i}".encode() for i in range(30)]
        for body in confirmed:
            ch.basic_publish("", QUEUE, body, pika.BasicProperties(delivery_mode=2))
        ch.basic_publish("", QUEUE, b"transient", pika.BasicProperties(delivery_mode=1))
        confirmed.append(b"transient")  # (a mirrored queue's failover keeps transient messages, as RabbitMQ's)
        for _ in range(5):  # consumed and acked: never seen again
            method, _props, body = ch.basic_get(QUEUE)
            assert body in confirmed
            confirmed.remove(body)
            ch.basic_ack(method.delivery_tag)

    rows = {name: _wait(f"{QUEUE} on {name}", lambda n=n: _row(cluster, n).get("mirror") and _row(cluster, n))
            for name, n in nodes.items()}
    leader = rows["rmq1"]["mirror"]["leader"]
    assert leader in nodes
    for row in rows.values():
        mirror = row["mirror"]
        assert (mirror["leader"], mirror["epoch"], sorted(mirror["replicas"])) == (leader, 0, sorted(nodes))
    leader_row = _wait("every replica in the ISR at the HW, the 5 acks committed", lambda: (
        (row := _row(cluster, nodes[leader]))["mirror"]["isr"] == sorted(nodes)
        and set(row["mirror"]["leo"]) == set(nodes) and row["mirror"]["hw"] >= 31
        and all(_row(cluster, n).get("messages") == 26 for n in nodes.values()) and row))
    assert leader_row["slave_nodes"] and leader_row["synchronised_slave_nodes"] == leader_row["slave_nodes"]
    for name, n in nodes.items():  # every replica trimmed: a snapshot, and fewer records on disk than committed
        (replica_dir,) = _replica_dirs(n, QUEUE)
        snapshot = _wait(f"a snapshot on {name}", lambda d=replica_dir: read_snapshot(d))
        assert snapshot.offset >= 10 and len(read_records(replica_dir)) < leader_row["mirror"]["hw"]
    with urllib.request.urlopen(f"http://127.0.0.1:{nodes[leader].plan.management_port}/metrics/per-object",
                                timeout=10) as resp:
        assert f'raftmq_mirror_isr_size{{vhost="/",queue="{QUEUE}"}} 3' in resp.read().decode()
    assert _mirror_totals(nodes[leader]) == {"raftmq_mirror_queues": 1, "raftmq_mirror_queues_under_replicated": 0,
                                             "raftmq_mirror_queues_below_min_insync": 0,
                                             "raftmq_mirror_queues_without_leader": 0}

    killed = nodes[leader]
    assert killed.process is not None
    killed.process.kill()  # kill -9
    killed_at = time.monotonic()
    _publish_until_confirmed(cluster, b"after-kill")
    print(f"\nkill -9 of the leader {leader} -> first new confirm through HAProxy: "
          f"{time.monotonic() - killed_at:.2f} s")
    confirmed.append(b"after-kill")
    survivor = next(n for name, n in nodes.items() if name != leader)
    mirror = _row(cluster, survivor)["mirror"]
    assert mirror["leader"] not in (None, leader) and mirror["epoch"] >= 1
    assert leader not in mirror["isr"]
    assert _mirror_totals(survivor) == {"raftmq_mirror_queues": 1, "raftmq_mirror_queues_under_replicated": 1,
                                        "raftmq_mirror_queues_below_min_insync": 0,
                                        "raftmq_mirror_queues_without_leader": 0}  # 2 of 3 in sync, min-insync 2

    conn, ch = _channel(cluster)
    with conn:
        count = ch.queue_declare(QUEUE, passive=True).method.message_count
        got: list[bytes] = []
        ch.basic_consume(QUEUE, lambda _ch, _m, _p, body: got.append(body), auto_ack=True)
        deadline = time.monotonic() + WAIT_S
        while len(got) < count and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.2)
    assert [b for b in confirmed if b not in got] == []  # nothing confirmed is lost (redeliveries may repeat)

    late = [f"late{i}".encode() for i in range(30)]  # the new leader trims beyond the killed node's log end
    conn, ch = _channel(cluster)
    with conn:
        for body in late:
            ch.basic_publish("", QUEUE, body, pika.BasicProperties(delivery_mode=2))
    new_leader = nodes[_row(cluster, survivor)["mirror"]["leader"]]
    (leader_dir,) = _replica_dirs(new_leader, QUEUE)
    (killed_dir,) = _replica_dirs(killed, QUEUE)
    killed_end = max((o for o, _e, _p in read_records(killed_dir)), default=-1) + 1
    assert (_wait("the new leader's log start beyond the killed node's log end",
                  lambda: (s := read_snapshot(leader_dir)) is not None and s.offset > killed_end and s)).offset
    cluster.start()  # the killed node again: its own snapshot, then the leader's
    _wait(f"{leader} back in the ISR", lambda: leader in _row(cluster, new_leader)["mirror"]["isr"])
    _wait(f"{leader} holds the 30 new messages", lambda: _row(cluster, killed).get("messages") == len(late))
    assert _row(cluster, new_leader).get("messages") == len(late)
    # the new leader's mirror telemetry (what `raftmq lag` reads): the ISR without the killed node, then with it
    _wait("the ISR expansion in the new leader's telemetry", lambda: (
        isr := [r["isr"] for r in _telemetry(new_leader) if r["type"] == "isr"])
        and any(leader not in members for members in isr) and leader in isr[-1])
    assert any(r["type"] == "state" and r.get("followers") for r in _telemetry(new_leader))

    conn, ch = _channel(cluster)
    with conn:
        ch.queue_delete(QUEUE)  # every node drops its replica (and its files)
    for name, n in nodes.items():
        if name != leader:
            _wait(f"{QUEUE} gone on {name}", lambda n=n: http(n.plan.management_port, "GET",
                                                               f"/api/queues/%2F/{QUEUE}")[0] == 404)
            assert not _replica_dirs(n, QUEUE), _replica_dirs(n, QUEUE)


MOVES = "hb.moves"


def _mirror_of(node: Any, queue: str = MOVES) -> dict[str, Any]:
    status, row = http(node.plan.management_port, "GET", f"/api/queues/%2F/{queue}")
    assert status == 200 and isinstance(row, dict) and row.get("mirror"), row
    mirror: dict[str, Any] = row["mirror"]
    return mirror


def _set_moves_policy(cluster: ClusterProcess, definition: dict[str, Any]) -> None:
    # mirrors added to a queue holding messages join the ISR at once only under automatic (manual, the default,
    # holds them out until a sync: test_new_mirrors_wait_for_a_sync_or_the_backlog_to_drain)
    definition = {"ha-sync-mode": "automatic", **definition}
    for node in cluster.nodes:
        if node.process is not None and node.process.poll() is None:
            status, _ = http(node.plan.management_port, "PUT", "/api/policies/%2F/hb",
                             {"pattern": "^hb\\.", "apply-to": "queues", "definition": definition})
            assert status in (201, 204)
            return


def _settled(node: Any, replicas: set[str]) -> dict[str, Any] | None:
    """The queue's mirror row on `node` once its replicas are `replicas`, all in the ISR, led by one of them."""
    mirror = _mirror_of(node)
    ok = set(mirror["replicas"]) == replicas and set(mirror["isr"]) == replicas and mirror["leader"] in replicas
    return mirror if ok else None


def test_policy_changes_move_the_mirrors_and_shutdown_hands_over(cluster: ClusterProcess) -> None:
    started = time.monotonic()
    nodes = {n.plan.name: n for n in cluster.nodes}
    _set_moves_policy(cluster, {"ha-mode": "exactly", "ha-params": 1})
    _wait("the policy on every node", lambda: all(
        http(n.plan.management_port, "GET", "/api/policies/%2F/hb")[0] == 200 for n in cluster.nodes))
    conn, ch = _channel(cluster)
    with conn:
        ch.queue_declare(MOVES, durable=True)
        for i in range(5):
            ch.basic_publish("", MOVES, f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
    first = _wait("one replica", lambda: (m := _mirror_of(nodes["rmq1"]))["leader"] and len(m["replicas"]) == 1 and m)
    leader = first["leader"]
    print(f"{time.monotonic() - started:.1f} s: declared")

    _set_moves_policy(cluster, {"ha-mode": "exactly", "ha-params": 3, "ha-min-insync": 2})
    grown = _wait("three replicas in sync", lambda: _settled(nodes[leader], set(nodes)))
    assert grown["leader"] == leader and grown["min_insync"] == 2
    print(f"{time.monotonic() - started:.1f} s: grown")

    listed = sorted(n for n in nodes if n != leader)  # the leader is not listed: it hands over first
    _set_moves_policy(cluster, {"ha-mode": "nodes", "ha-params": listed})
    moved = _wait("the two listed replicas in sync", lambda: _settled(nodes[listed[0]], set(listed)))
    assert moved["epoch"] == grown["epoch"] + 1 and moved["leader"] in listed
    conn, ch = _channel(cluster)
    with conn:
        ch.basic_publish("", MOVES, b"after-move", pika.BasicProperties(delivery_mode=2))
    print(f"{time.monotonic() - started:.1f} s: moved")

    _set_moves_policy(cluster, {"ha-mode": "exactly", "ha-params": 2})  # the same two: nothing moves
    stopping = nodes[moved["leader"]]
    successor = next(n for n in listed if n != moved["leader"])
    _wait("the leader's own view settled", lambda: _settled(stopping, set(listed)))
    assert stopping.process is not None
    stopping.process.terminate()  # SIGTERM: an orderly shutdown
    assert stopping.process.wait(60) == 0
    print(f"{time.monotonic() - started:.1f} s: stopped")
    assert f"leadership to {successor}" in stopping.log_path.read_text(errors="replace").rsplit("---- start", 1)[-1]
    handed = _wait("the replacement of the stopped mirror in sync",
                   lambda: _settled(nodes[successor], {successor, leader}))
    assert handed["leader"] == successor and handed["epoch"] == moved["epoch"] + 1  # a transfer, no election

    print(f"\n{time.monotonic() - started:.1f} s: replaced")
    expected = sorted([f"m{i}".encode() for i in range(5)] + [b"after-move"])
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", nodes[leader].plan.port))
    with conn:
        ch = conn.channel()
        got: list[bytes] = []
        ch.basic_consume(MOVES, lambda _ch, _m, _p, body: got.append(body), auto_ack=True)
        deadline = time.monotonic() + WAIT_S
        while len(got) < len(expected) and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.1)
    assert sorted(got) == expected
    print(f"{time.monotonic() - started:.1f} s: consumed")

