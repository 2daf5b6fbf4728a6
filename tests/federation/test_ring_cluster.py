"""The ring of tests/federation/test_ring.py with a 3-node cluster as its middle member: single node A -> 3-node
cluster B (quorum queue) -> single node C -> A, max-hops 2 (real processes, pika). A message published on each
member arrives once on each of the others and never loops; C's binding travels through the cluster to A with its
hop count. About a minute (six processes): a file of its own so that CI can leave it out.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.cluster_proc import ClusterProcs, supervised
from tests.federation.test_exchange_single import _start
from tests.federation.test_ring import _publish
from tests.shovel.helpers import connect, count, ctl_call, drain, uri, wait_until

Member = tuple[int, list[int]]  # an AMQP port, the management ports of its nodes
CLUSTER_B = "n1,n2,n3"


@pytest.fixture
def ring(tmp_path: Path) -> Iterator[dict[str, Member]]:
    a = _start(tmp_path / "a", "cluster-a")
    c = _start(tmp_path / "c", "cluster-c")
    try:
        with supervised(ClusterProcs(tmp_path / "b")) as procs:
            procs.start_all()
            b_ports = [n.port for n in procs.nodes]
            members = {"cluster-a": (a[0].port, [a[1]]), CLUSTER_B: (b_ports[0], [p + 10_000 for p in b_ports]),
                       "cluster-c": (c[0].port, [c[1]])}
            upstream = {"cluster-a": [c[0].port], CLUSTER_B: [a[0].port], "cluster-c": b_ports}
            for name, (port, mports) in members.items():
                with connect(port) as conn:
                    ch = conn.channel()
                    ch.exchange_declare("fx", "topic", durable=True)
                    ch.queue_declare(f"q-{name}", durable=True, arguments={"x-queue-type": "quorum"}
                                     if name == CLUSTER_B else None)
                    ch.queue_bind(f"q-{name}", "fx", "#")
                value = {"uri": [uri(p) for p in upstream[name]], "max-hops": 2, "reconnect-delay": 1}
                assert ctl_call(mports[0], "set_parameter", "federation-upstream", "up", json.dumps(value))[0] == 0
                assert ctl_call(mports[0], "set_policy", "fed", "^fx$", json.dumps({"federation-upstream": "up"}),
                                "--apply-to", "exchanges")[0] == 0
            yield members
    finally:
        a[0].stop()
        c[0].stop()


def _links(member: Member) -> list[dict[str, Any]] | None:
    rows: list[dict[str, Any]] = []
    for mport in member[1]:
        code, found = ctl_call(mport, "federation_status")
        if code != 0:
            return None
        rows += found
    return rows


def _bound_from(member: Member, key: str) -> list[list[tuple[str, int]]]:
    code, rows = ctl_call(member[1][0], "list_bindings")
    assert code == 0, rows
    return sorted([(e["cluster-name"], e["hops"]) for e in r["arguments"].get("x-bound-from", [])] for r in rows
                  if r["source"] == "fx" and r["destination"].startswith("federation: fx -> ")
                  and r["routing_key"] == key)


def test_a_ring_through_a_3_node_cluster_delivers_once_and_never_loops(ring: dict[str, Member]) -> None:
    names = list(ring)
    for member in ring.values():
        wait_until(lambda m=member: (rows := _links(m)) is not None and [r["status"] for r in rows] == ["running"],
                   90, "each member runs its one link on one node")
    # C's binding: on B (C's link) with hops 2, then on A (B's link, whichever node runs it) with hops 1
    wait_until(lambda: [("cluster-c", 2)] in _bound_from(ring[CLUSTER_B], "#"), 30, "C's binding on B")
    wait_until(lambda: [(CLUSTER_B, 1), ("cluster-c", 2)] in _bound_from(ring["cluster-a"], "#"), 30,
               "C's binding on A through the cluster")
    for name, (port, _) in ring.items():
        _publish(port, "k", f"from-{name}")
    for name, (port, _) in ring.items():
        wait_until(lambda p=port, n=name: count(p, f"q-{n}") == 3, 60, f"q-{name} never got 3")
    # each message comes round once more and is dropped by its origin's link: 3 drops, upstream queues empty
    def settled() -> bool:  # (the upstream queue of member i+1's link is on member i)
        rows = [r for m in ring.values() for r in (_links(m) or [])]
        return sum(int(r["dropped"]) for r in rows) == 3 and all(
            count(ring[names[i]][0], f"federation: fx -> {names[(i + 1) % 3]}") == 0 for i in range(3))
    wait_until(settled, 60, "the ring never settled with one drop per message")
    for name, (port, _) in ring.items():
        assert sorted(body for body, _ in drain(port, f"q-{name}")) == sorted(f"from-{n}".encode() for n in names)
