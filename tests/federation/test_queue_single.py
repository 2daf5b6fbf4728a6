"""Queue federation between two single raftmq nodes (real processes, pika): the downstream queue pulls from the
upstream queue only while it has a consumer, the upstream's own consumers are served first (the link consumes at
x-priority -1), messages carry x-received-from and the original routing key, the link's status is listed by ctl and
the HTTP API with `type: queue`, and clearing the policy stops the link without touching the upstream queue."""

from __future__ import annotations

import base64
import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pika
import pytest

from tests.federation.test_exchange_single import Node, _links, _start
from tests.shovel.helpers import connect, count, ctl_call, publish, uri, wait_until


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Node, Node]]:
    root = tmp_path_factory.mktemp("fedq")
    a = _start(root / "a", "cluster-a")
    try:
        b = _start(root / "b", "cluster-b")
        try:
            yield a, b
        finally:
            b[0].stop()
    finally:
        a[0].stop()


class Consumer:
    """A pika consumer kept open; `pump()` processes what arrived (acks each message)."""

    def __init__(self, port: int, queue: str, prefetch: int = 1000) -> None:
        self.conn = connect(port)
        self.ch = self.conn.channel()
        self.ch.basic_qos(prefetch_count=prefetch)
        self.got: list[tuple[bytes, dict[str, Any]]] = []
        self.tag = self.ch.basic_consume(queue, self._on)

    def _on(self, ch: Any, method: Any, props: pika.BasicProperties, body: bytes) -> None:
        self.got.append((body, dict(props.headers or {})))
        ch.basic_ack(method.delivery_tag)

    def pump(self) -> int:
        self.conn.process_data_events(time_limit=0.1)
        return len(self.got)

    def close(self) -> None:
        self.ch.basic_cancel(self.tag)
        self.conn.close()


def _queue_links(mport: int) -> list[dict[str, Any]]:
    return [r for r in _links(mport) if r["type"] == "queue"]


def _http_get(mport: int, path: str) -> list[dict[str, Any]]:
    request = urllib.request.Request(f"http://127.0.0.1:{mport}{path}")
    request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(request, timeout=10) as answer:
        rows: list[dict[str, Any]] = json.loads(answer.read())
    return rows


def test_queue_federation_pulls_only_for_local_consumers(nodes: tuple[Node, Node]) -> None:
    (a, _), (b, b_m) = nodes
    publish(a.port, "fq", 50)  # upstream: 50 messages waiting
    with connect(b.port) as conn:
        conn.channel().queue_declare("fq", durable=True)
    code, out = ctl_call(b_m, "set_parameter", "federation-upstream", "up",
                         json.dumps({"uri": uri(a.port), "reconnect-delay": 1}))
    assert code == 0, out
    code, out = ctl_call(b_m, "set_policy", "fedq", "^fq$", json.dumps({"federation-upstream": "up"}),
                         "--apply-to", "queues")
    assert code == 0, out
    rows = wait_until(lambda: [r for r in _queue_links(b_m) if r["status"] == "running"], 30, "no running link")
    row = rows[0]
    assert (row["queue"], row["upstream_queue"], row["upstream"], row["consuming"]) == ("fq", "fq", "up", False)
    assert row["consumer_tag"] == "federation-link-up" and row["local_connection"].endswith("queue: fq)")
    assert [r["id"] for r in _http_get(b_m, "/api/federation-links/%2F") if r["type"] == "queue"] == [row["id"]]
    # no consumer downstream: nothing moves
    assert count(a.port, "fq") == 50 and count(b.port, "fq") == 0
    # a consumer downstream: the link pulls everything
    down = Consumer(b.port, "fq")
    try:
        wait_until(lambda: down.pump() >= 50, 30, "the 50 upstream messages never reached B's consumer")
        assert sorted(body for body, _ in down.got) == sorted(f"m{n}".encode() for n in range(50))
        headers = down.got[0][1]
        hop = headers["x-received-from"]
        assert len(hop) == 1 and hop[0]["cluster-name"] == "cluster-a" and hop[0]["queue"] == "fq"
        assert ":guest@" not in hop[0]["uri"]
        assert headers["x-original-routing-key"] == "fq" and headers["x-original-exchange"] == ""
        wait_until(lambda: count(a.port, "fq") == 0, 30, "messages left upstream")
        with connect(a.port) as conn:  # the upstream sees the link's consumer
            assert conn.channel().queue_declare("fq", passive=True).method.consumer_count == 1
        # the upstream's own consumer comes first (the link consumes at x-priority -1)
        local = Consumer(a.port, "fq", prefetch=100)
        try:
            publish(a.port, "fq", 20, prefix="a")
            wait_until(lambda: local.pump() >= 20, 30, "A's own consumer never got A's messages")
            down.pump()
            assert len(down.got) == 50 and len(local.got) == 20
        finally:
            local.close()
        # with its own consumer gone, B pulls again
        publish(a.port, "fq", 5, prefix="b")
        wait_until(lambda: down.pump() >= 55, 30, "B never pulled after A's consumer left")
    finally:
        down.close()
    # no consumer downstream any more: the link stops consuming, messages stay upstream
    wait_until(lambda: not _queue_links(b_m)[0]["consuming"], 30, "the link kept consuming")
    publish(a.port, "fq", 10, prefix="c")
    assert count(a.port, "fq") == 10 and count(b.port, "fq") == 0
    with connect(a.port) as conn:
        assert conn.channel().queue_declare("fq", passive=True).method.consumer_count == 0
    # clearing the policy removes the link; the upstream queue and its messages stay
    assert ctl_call(b_m, "clear_policy", "fedq")[0] == 0
    wait_until(lambda: _queue_links(b_m) == [], 30, "the link was not removed")
    assert count(a.port, "fq") == 10


def test_upstream_queue_and_consumer_tag_keys(nodes: tuple[Node, Node]) -> None:
    (a, a_m), (b, b_m) = nodes
    publish(a.port, "upq", 7, prefix="u")
    with connect(b.port) as conn:
        conn.channel().queue_declare("dq", durable=True)
    code, out = ctl_call(b_m, "set_parameter", "federation-upstream", "up2",
                         json.dumps({"uri": uri(a.port), "queue": "upq", "consumer-tag": "my-tag",
                                     "ack-mode": "on-publish"}))
    assert code == 0, out
    assert ctl_call(b_m, "set_policy", "fedq2", "^dq$", json.dumps({"federation-upstream": "up2"}),
                    "--apply-to", "queues")[0] == 0
    down = Consumer(b.port, "dq")
    try:
        wait_until(lambda: down.pump() >= 7, 30, "upq's messages never reached dq")
        consumers = _http_get(a_m, "/api/consumers")  # the link's consumer upstream: its tag, priority -1
        mine = [c for c in consumers if c["queue"]["name"] == "upq"]
        assert [(c["consumer_tag"], c["arguments"]) for c in mine] == [("my-tag", {"x-priority": -1})]
        row = _queue_links(b_m)[0]
        assert (row["upstream_queue"], row["consumer_tag"], row["forwarded"]) == ("upq", "my-tag", 7)
    finally:
        down.close()
    assert ctl_call(b_m, "clear_policy", "fedq2")[0] == 0
    wait_until(lambda: _queue_links(b_m) == [], 30, "the link was not removed")
