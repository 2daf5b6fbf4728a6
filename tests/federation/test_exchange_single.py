"""Exchange federation between two single raftmq nodes (real processes, pika): messages published to the upstream
exchange arrive at the downstream exchange's bound queues with `x-received-from`; bindings made later are
replayed upstream; a link whose internal exchange was deleted upstream restarts (its periodic
passive check); refusals of bad parameters and policies; a two-node ring does not loop (max-hops / cluster seen).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from tests.integration.nodeproc import NodeProcess
from tests.shovel.helpers import _accepts, connect, count, ctl_call, drain, free_port, uri, wait_until

Node = tuple[NodeProcess, int]


def _start(workdir: Path, name: str) -> Node:
    mport = free_port()
    node = NodeProcess(workdir, extra_args=("--management-port", str(mport), "--node-name", name)).start()
    wait_until(lambda: _accepts(mport), 30, f"management port {mport} never opened")
    return node, mport


@pytest.fixture
def two_nodes(tmp_path: Path) -> Iterator[tuple[Node, Node]]:
    a = _start(tmp_path / "a", "cluster-a")
    try:
        b = _start(tmp_path / "b", "cluster-b")
        try:
            yield a, b
        finally:
            b[0].stop()
    finally:
        a[0].stop()


def _declare(port: int, exchange: str, queues: dict[str, str]) -> None:
    with connect(port) as conn:
        ch = conn.channel()
        ch.exchange_declare(exchange, "topic", durable=True)
        for queue, key in queues.items():
            ch.queue_declare(queue, durable=True)
            ch.queue_bind(queue, exchange, key)


def _publish(port: int, exchange: str, keys: list[str]) -> None:
    with connect(port) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        for n, key in enumerate(keys):
            ch.basic_publish(exchange, key, f"{key}#{n}".encode(), pika.BasicProperties(delivery_mode=2))


def _federate(mport: int, upstream_port: int, **extra: Any) -> None:
    code, out = ctl_call(mport, "set_parameter", "federation-upstream", "up",
                         json.dumps({"uri": uri(upstream_port), **extra}))
    assert code == 0, out
    code, out = ctl_call(mport, "set_policy", "fed", "^fx$", json.dumps({"federation-upstream-set": "all"}),
                         "--apply-to", "exchanges")
    assert code == 0, out


def _links(mport: int) -> list[dict[str, Any]]:
    code, rows = ctl_call(mport, "federation_status")
    assert code == 0, rows
    return list(rows)


def _upstream_bindings(mport: int, queue: str) -> set[str]:
    """The routing keys the link of upstream queue `queue` bound upstream: bindings of the upstream exchange to
    its internal exchange `<queue> A|B`, the queue's only binding (both for a moment while a link reconnects)."""
    code, rows = ctl_call(mport, "list_bindings")
    assert code == 0, rows
    internal = {r["source"] for r in rows if r["destination"] == queue and r["source"]}
    if not internal <= {f"{queue} A", f"{queue} B"}:
        return {f"(the queue is bound to {sorted(internal)})"}
    return {r["routing_key"] for r in rows if r["destination"] in internal}


def test_messages_and_bindings_flow_from_upstream_to_downstream(two_nodes: tuple[Node, Node]) -> None:
    (a, a_m), (b, b_m) = two_nodes
    _declare(a.port, "fx", {})
    _declare(b.port, "fx", {"bq": "a.*"})
    queue = "federation: fx -> cluster-b"
    _declare(a.port, "fx", {queue: "a.*"})  # as earlier raftmq versions left it: bound directly (the link unbinds)
    _federate(b_m, a.port, **{"reconnect-delay": 1})
    wait_until(lambda: _upstream_bindings(a_m, queue) == {"a.*"}, 30, "the downstream binding never reached A")
    rows = wait_until(lambda: [r for r in _links(b_m) if r["status"] == "running"], 30, "no running link")
    assert (rows[0]["exchange"], rows[0]["upstream"], rows[0]["type"]) == ("fx", "up", "exchange")
    _publish(a.port, "fx", ["a.1"] * 20 + ["b.1"] * 5)
    wait_until(lambda: count(b.port, "bq") == 20, 30, "the federated messages never arrived")
    got = drain(b.port, "bq")
    assert sorted(body for body, _ in got) == sorted(f"a.1#{n}".encode() for n in range(20))
    hop = got[0][1]["x-received-from"]
    assert len(hop) == 1 and hop[0]["cluster-name"] == "cluster-a" and hop[0]["exchange"] == "fx"
    assert "guest@" in hop[0]["uri"] and ":guest@" not in hop[0]["uri"]  # no password
    # a binding made later is replayed upstream; an unbind removes it there
    with connect(b.port) as conn:
        ch = conn.channel()
        ch.queue_declare("bq2", durable=True)
        ch.queue_bind("bq2", "fx", "b.*")
        ch.queue_unbind("bq", "fx", "a.*")
    wait_until(lambda: _upstream_bindings(a_m, queue) == {"b.*"}, 30, "the binding changes never reached A")
    _publish(a.port, "fx", ["b.2"] * 3 + ["a.2"])
    wait_until(lambda: count(b.port, "bq2") == 3, 30, "messages for the new binding never arrived")
    assert count(a.port, queue) == 0 and count(b.port, "bq") == 0
    # a restart (by the id federation_status shows) reconnects and keeps the upstream queue
    link = _links(b_m)[0]
    assert ctl_call(b_m, "restart_federation_link", "no-such-id")[0] != 0
    code, out = ctl_call(b_m, "restart_federation_link", link["id"])
    assert code == 0, out
    wait_until(lambda: [r for r in _links(b_m) if r["status"] == "running" and r["forwarded"] == 0], 30,
               "the restarted link never ran again")
    _publish(a.port, "fx", ["b.3"] * 2)
    wait_until(lambda: count(b.port, "bq2") == 5, 30, "messages after the restart never arrived")
    # the internal exchange deleted upstream: the link's periodic passive check sees it gone and restarts the link,
    # which declares it and its bindings again (before, nothing reached the upstream queue until a reconnect)
    internal = {r["source"] for r in ctl_call(a_m, "list_bindings")[1] if r["destination"] == queue and r["source"]}
    with connect(a.port) as conn:
        conn.channel().exchange_delete(internal.pop())
    wait_until(lambda: _upstream_bindings(a_m, queue) == {"b.*"}, 30, "the internal exchange was never declared again")
    _publish(a.port, "fx", ["b.4"] * 2)
    wait_until(lambda: count(b.port, "bq2") == 7, 30, "messages after the internal exchange came back never arrived")
    # removing the policy removes the link and its upstream queue
    assert ctl_call(b_m, "clear_policy", "fed")[0] == 0
    wait_until(lambda: count(a.port, queue) == -1, 30, "the upstream queue was not deleted")
    assert _links(b_m) == []
    wait_until(lambda: not [r for r in ctl_call(a_m, "list_exchanges")[1] if r["name"].startswith(queue)], 30,
               "the internal exchange was not deleted")


def test_bad_parameters_and_policies_are_refused(two_nodes: tuple[Node, Node]) -> None:
    (_, _), (_, b_m) = two_nodes
    code, out = ctl_call(b_m, "set_parameter", "federation-upstream", "up", json.dumps({"max-hops": 2}))
    assert code == 65 and 'Key "uri" not found in federation-upstream' in str(out)
    code, out = ctl_call(b_m, "set_parameter", "federation-upstream-set", "s", json.dumps([{"upstream": 1}]))
    assert code == 65 and "upstream should be binary" in str(out)
    code, out = ctl_call(b_m, "set_policy", "p", "^x", json.dumps({"federation-upstream": "a",
                                                                   "federation-upstream-set": "all"}))
    assert code == 65 and "cannot specify federation-upstream and federation-upstream-set together" in str(out)
    code, rows = ctl_call(b_m, "list_parameters")
    assert code == 0 and rows == []


def test_a_two_node_ring_does_not_loop(two_nodes: tuple[Node, Node]) -> None:
    (a, a_m), (b, b_m) = two_nodes
    _declare(a.port, "fx", {"qa": "#"})
    _declare(b.port, "fx", {"qb": "#"})
    _federate(a_m, b.port)
    _federate(b_m, a.port)
    for mport, queue in ((a_m, "federation: fx -> cluster-b"), (b_m, "federation: fx -> cluster-a")):
        wait_until(lambda m=mport, q=queue: "#" in _upstream_bindings(m, q), 30, f"{queue} never bound")
    _publish(a.port, "fx", ["from-a"])
    wait_until(lambda: count(b.port, "qb") == 1, 30, "A's message never reached B")
    # B's own message goes to A after the copy of A's message that came back to A (same upstream queue, FIFO):
    # once it arrives, the copy was seen and dropped
    _publish(b.port, "fx", ["from-b"])
    wait_until(lambda: count(a.port, "qa") == 2, 30, "B's message never reached A")
    wait_until(lambda: sum(int(r["dropped"]) for r in _links(a_m)) == 1, 30, "A's link never dropped the copy")
    assert sorted(body for body, _ in drain(a.port, "qa")) == [b"from-a#0", b"from-b#0"]
    assert sorted(body for body, _ in drain(b.port, "qb")) == [b"from-a#0", b"from-b#0"]
