"""A ring of three single-node clusters federating one exchange A -> B -> C -> A (each downstream of the one before;
real processes, pika): a message published on any of them arrives once on each of the others with max-hops 2 and
never loops; bindings travel upstream with `x-bound-from` and hop counts as RabbitMQ's plugin sends them, added
and removed as they change; with max-hops 1 a message and a binding go one hop only. One ring per module.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pika
import pytest

from tests.federation.test_exchange_single import Node, _start
from tests.shovel.helpers import connect, count, ctl_call, drain, uri, wait_until

NAMES = ("cluster-a", "cluster-b", "cluster-c")
Ring = dict[str, Node]


def _upstream_of(name: str) -> str:
    """The cluster `name` federates from: A <- C, B <- A, C <- B."""
    return NAMES[(NAMES.index(name) - 1) % 3]


def _set_upstream(ring: Ring, max_hops: int) -> None:
    for name, (_, mport) in ring.items():
        value = {"uri": uri(ring[_upstream_of(name)][0].port), "max-hops": max_hops, "reconnect-delay": 1}
        code, out = ctl_call(mport, "set_parameter", "federation-upstream", "up", json.dumps(value))
        assert code == 0, out


@pytest.fixture(scope="module")
def ring(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ring]:
    base = tmp_path_factory.mktemp("ring")
    nodes: Ring = {}
    try:
        for name in NAMES:
            nodes[name] = _start(base / name, name)
        for name, (node, _) in nodes.items():
            with connect(node.port) as conn:
                ch = conn.channel()
                ch.exchange_declare("fx", "topic", durable=True)
                ch.queue_declare(f"q-{name}", durable=True)
                ch.queue_bind(f"q-{name}", "fx", "#")
        _set_upstream(nodes, 2)
        for _, mport in nodes.values():
            code, out = ctl_call(mport, "set_policy", "fed", "^fx$", json.dumps({"federation-upstream-set": "all"}),
                                 "--apply-to", "exchanges")
            assert code == 0, out
        yield nodes
    finally:
        for node, _ in nodes.values():
            node.stop()


def _links(mport: int) -> list[dict[str, Any]]:
    code, rows = ctl_call(mport, "federation_status")
    assert code == 0, rows
    return list(rows)


def _bound_from(mport: int, key: str) -> list[list[tuple[str, int]]]:
    """The `x-bound-from` lists ((cluster-name, hops) per entry) of the bindings with routing key `key` from fx to
    an internal federation exchange on this node."""
    code, rows = ctl_call(mport, "list_bindings")
    assert code == 0, rows
    found = []
    for r in rows:
        if r["source"] == "fx" and r["destination"].startswith("federation: fx -> ") and r["routing_key"] == key:
            found.append([(e["cluster-name"], e["hops"]) for e in r["arguments"].get("x-bound-from", [])])
    return sorted(found)


def _publish(port: int, key: str, body: str) -> None:
    with connect(port) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("fx", key, body.encode(), pika.BasicProperties(delivery_mode=2))


def _settled(ring: Ring, dropped: int) -> bool:
    """Every upstream federation queue is empty and the links dropped `dropped` messages in all (loop check)."""
    total = 0
    for name, (node, mport) in ring.items():
        downstream = NAMES[(NAMES.index(name) + 1) % 3]
        if count(node.port, f"federation: fx -> {downstream}") != 0:
            return False
        total += sum(int(r["dropped"]) for r in _links(mport))
    return total == dropped


def _running(ring: Ring) -> bool:
    return all([r["status"] for r in _links(m)] == ["running"] for _, m in ring.values())


def test_a_message_crosses_each_cluster_once_with_max_hops_2(ring: Ring) -> None:
    wait_until(lambda: _running(ring), 60, "the ring's links never all ran")
    for name in ring:  # each cluster's own "#" reached its upstream
        upstream_mport = ring[_upstream_of(name)][1]
        wait_until(lambda m=upstream_mport, n=name: [(n, 2)] in _bound_from(m, "#"), 30, f"{name}'s binding")
    for name, (node, _) in ring.items():
        _publish(node.port, "k", f"from-{name}")
    # each message: origin -> next -> next again, which forwards it back to the origin's link; that link drops it
    # (x-received-from already has max-hops entries), once per message
    for name, (node, _) in ring.items():
        wait_until(lambda p=node.port, n=name: count(p, f"q-{n}") == 3, 30, f"q-{name} never got 3")
    wait_until(lambda: _settled(ring, 3), 30, "the ring never settled with one drop per message")
    for name, (node, _) in ring.items():
        got = drain(node.port, f"q-{name}")
        assert sorted(body for body, _ in got) == sorted(f"from-{n}".encode() for n in NAMES), name
        for body, headers in got:
            origin = body.decode().removeprefix("from-")
            hops = [e["cluster-name"] for e in headers.get("x-received-from", [])]
            expected = [] if origin == name else \
                [_upstream_of(name)] if _upstream_of(name) == origin else [_upstream_of(name), origin]
            assert hops == expected, (name, body, hops)


def test_bindings_travel_upstream_with_hop_counts(ring: Ring) -> None:
    (c, c_m), (b_m, a_m) = ring["cluster-c"], (ring["cluster-b"][1], ring["cluster-a"][1])
    wait_until(lambda: _running(ring), 60, "the ring's links never all ran")
    with connect(c.port) as conn:
        ch = conn.channel()
        ch.queue_declare("only-c", durable=True)
        ch.queue_bind("only-c", "fx", "only.c")
    # C's binding: on B with hops 2 (C's link), replayed by B's link on A with hops 1; A's link does not send it
    # back to C (C is in x-bound-from; its hops would be 0 too)
    wait_until(lambda: _bound_from(b_m, "only.c") == [[("cluster-c", 2)]], 30, "C's binding never reached B")
    wait_until(lambda: _bound_from(a_m, "only.c") == [[("cluster-b", 1), ("cluster-c", 2)]], 30,
               "C's binding never reached A through B")
    assert _bound_from(c_m, "only.c") == []
    _publish(ring["cluster-a"][0].port, "only.c", "to-c")
    wait_until(lambda: count(c.port, "only-c") == 1, 30, "A's message never reached C's only-c")
    with connect(c.port) as conn:
        conn.channel().queue_unbind("only-c", "fx", "only.c")
    wait_until(lambda: _bound_from(b_m, "only.c") == [] and _bound_from(a_m, "only.c") == [], 30,
               "the unbind never travelled upstream")
    assert [body for body, _ in drain(c.port, "only-c")] == [b"to-c"]
    for name, (node, _) in ring.items():
        drain(node.port, f"q-{name}")


def test_max_hops_1_stops_after_one_hop(ring: Ring) -> None:
    _set_upstream(ring, 1)  # the links restart (new counters)
    b_m = ring["cluster-b"][1]
    # bindings go one hop: C's "#" is on B with hops 1 and is not replayed on A
    wait_until(lambda: _bound_from(b_m, "#") == [[("cluster-c", 1)]], 60, "C's binding with hops 1 on B")
    wait_until(lambda: _bound_from(ring["cluster-a"][1], "#") == [[("cluster-b", 1)]], 30,
               "A still has a binding replayed over two hops")
    wait_until(lambda: _running(ring), 60, "the ring's links never all ran again")
    a, b, c = (ring[n][0] for n in NAMES)
    _publish(a.port, "k", "hop-1")
    wait_until(lambda: count(b.port, "q-cluster-b") == 1, 30, "A's message never reached B")
    # B routes it to C's upstream queue; C's link drops it (one hop already)
    wait_until(lambda: _settled(ring, 1), 30, "C's link never dropped the second hop")
    assert count(c.port, "q-cluster-c") == 0 and count(a.port, "q-cluster-a") == 1
