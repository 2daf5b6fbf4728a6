"""Exchange federation into a 3-node raftmq cluster on real processes: a single raftmq node is the upstream; the
cluster's federated exchange routes to a quorum queue. Exactly one cluster node runs the link; when it is killed
(kill -9) another node takes the link over and nothing published upstream is lost (duplicates are possible)."""

from __future__ import annotations

import collections
import json

import pika

from tests.cluster.cluster_proc import ClusterProcs, raft_links_up
from tests.federation.conftest import link_runners
from tests.federation.test_exchange_single import Node, _links, _publish
from tests.shovel.helpers import connect, count, ctl_call, drain, uri, wait_until


def test_cluster_runs_the_link_once_and_moves_it_when_its_node_dies(
        cluster_and_upstream: tuple[ClusterProcs, Node]) -> None:
    procs, (up, _) = cluster_and_upstream
    names = [n.name for n in procs.nodes]
    wait_until(lambda: all(raft_links_up(n.port) for n in procs.nodes), 60, "every node linked to every node")
    with connect(up.port) as conn:
        conn.channel().exchange_declare("fx", "topic", durable=True)
    n1 = procs.node("n1")
    with connect(n1.port) as conn:
        ch = conn.channel()
        ch.exchange_declare("fx", "topic", durable=True)
        ch.queue_declare("cq", durable=True, arguments={"x-queue-type": "quorum"})
        ch.queue_bind("cq", "fx", "#")
    mport = n1.port + 10_000
    assert ctl_call(mport, "set_parameter", "federation-upstream", "up",
                    json.dumps({"uri": uri(up.port), "reconnect-delay": 1}))[0] == 0
    assert ctl_call(mport, "set_policy", "fed", "^fx$", json.dumps({"federation-upstream": "up"}),
                    "--apply-to", "exchanges")[0] == 0
    runners = wait_until(lambda: (r := link_runners(procs, names, "exchange")) and len(r) == 1 and r, 60, "one node runs the link")
    owner = runners[0]
    cluster_name = ",".join(names)
    queue = f"federation: fx -> {cluster_name}"
    wait_until(lambda: count(up.port, queue) >= 0, 30, "the upstream queue was never declared")
    wait_until(lambda: _links(procs.node(owner).port + 10_000)[0]["bindings"] == 1, 30, "binding never replayed")
    _publish(up.port, "fx", ["early"] * 200)
    wait_until(lambda: count(n1.port if owner != "n1" else procs.node("n2").port, "cq") == 200, 90,
               "200 messages in the cluster's quorum queue")
    procs.kill(owner)
    alive = [n for n in names if n != owner]
    wait_until(lambda: (r := link_runners(procs, alive, "exchange")) and len(r) == 1, 90, "the link moved to a live node")
    _publish(up.port, "fx", ["late"] * 100)  # (keys are bodies' prefixes: "late#0" ... "late#99")
    port = procs.node(alive[0]).port
    wait_until(lambda: count(port, "cq") >= 300, 120, "the later 100 messages arrived too")
    bodies = collections.Counter(body for body, _ in drain(port, "cq"))
    expected = {f"early#{n}".encode() for n in range(200)} | {f"late#{n}".encode() for n in range(100)}
    assert set(bodies) == expected
    print(f"duplicates after the kill of {owner}: {sum(bodies.values()) - len(bodies)}")
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", up.port)) as conn:
        assert conn.channel().queue_declare(queue, passive=True).method.consumer_count == 1
