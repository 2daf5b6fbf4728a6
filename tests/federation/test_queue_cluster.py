"""Queue federation into a 3-node raftmq cluster on real processes: a single raftmq node is the upstream, the
cluster's quorum queue is federated and has a consumer on one node. Exactly one cluster node runs the link (not
necessarily the consumer's: every replica knows the queue's consumers and ready count); when that node is killed
(kill -9), another node takes the link over and every message published upstream reaches the consumer (duplicates
are possible, loss is not)."""

from __future__ import annotations

import collections
import json

from tests.cluster.cluster_proc import ClusterProcs, raft_links_up
from tests.federation.conftest import link_runners
from tests.federation.test_exchange_single import Node
from tests.federation.test_queue_single import Consumer
from tests.shovel.helpers import connect, count, ctl_call, publish, uri, wait_until


def test_cluster_queue_link_moves_when_its_node_dies(cluster_and_upstream: tuple[ClusterProcs, Node]) -> None:
    procs, (up, _) = cluster_and_upstream
    names = [n.name for n in procs.nodes]
    wait_until(lambda: all(raft_links_up(n.port) for n in procs.nodes), 60, "every node linked to every node")
    publish(up.port, "fq", 200, prefix="early")
    n1 = procs.node("n1")
    with connect(n1.port) as conn:
        conn.channel().queue_declare("fq", durable=True, arguments={"x-queue-type": "quorum"})
    mport = n1.port + 10_000
    assert ctl_call(mport, "set_parameter", "federation-upstream", "up",
                    json.dumps({"uri": uri(up.port), "reconnect-delay": 1, "prefetch-count": 10}))[0] == 0
    assert ctl_call(mport, "set_policy", "fedq", "^fq$", json.dumps({"federation-upstream": "up"}),
                    "--apply-to", "queues")[0] == 0
    runners = wait_until(lambda: (r := link_runners(procs, names, "queue")) and len(r) == 1 and r, 60, "one node runs the link")
    owner = runners[0]
    alive = [n for n in names if n != owner]
    consumer = Consumer(procs.node(alive[0]).port, "fq", prefetch=50)
    try:
        # kill the link's node half way: the link pulls 10 at a time (prefetch-count) and the consumer (prefetch 50)
        # acks only as it is pumped, so the link pauses and resumes as the queue's ready count rises and falls, and
        # messages are still upstream or in flight when the node dies
        wait_until(lambda: consumer.pump() >= 100, 90, "early messages reached the cluster's consumer")
        upstream_left = count(up.port, "fq")
        procs.kill(owner)
        wait_until(lambda: (r := link_runners(procs, alive, "queue")) and len(r) == 1, 90, "the link moved to a live node")
        publish(up.port, "fq", 100, prefix="late")
        wait_until(lambda: consumer.pump() >= 300, 120, "the later 100 messages arrived too")
        bodies = collections.Counter(body for body, _ in consumer.got)
    finally:
        consumer.close()
    expected = {f"early{n}".encode() for n in range(200)} | {f"late{n}".encode() for n in range(100)}
    assert set(bodies) == expected
    assert count(up.port, "fq") == 0
    print(f"kill -9 of {owner} with {200 - upstream_left} early messages taken from the upstream queue; "
          f"duplicates: {sum(bodies.values()) - len(bodies)}")
