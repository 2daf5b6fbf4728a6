"""Policies on a real single `raftmq node` process with pika: a max-length policy set with `raftmq ctl` caps an
existing queue at once and survives a restart; a message-ttl policy set over HTTP expires messages; clearing the
policy gives the queue its own arguments back."""

from __future__ import annotations

import base64
import json
import time
import urllib.request

import pika

from node import ctl
from tests.integration.nodeproc import NodeProcess
from tests.management.test_real_node import (
    _wait_accepts,
    node_fixture,  # noqa: F401 (the `node` fixture)
)

POLL_S = 15.0


def http(port: int, method: str, path: str, body: object = None) -> tuple[int, object]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


def channel(port: int) -> tuple[pika.BlockingConnection, object]:
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", port, credentials=pika.PlainCredentials("guest", "guest")))
    ch = conn.channel()
    ch.confirm_delivery()
    return conn, ch


def ready(ch: object, queue: str) -> int:
    return int(ch.queue_declare(queue, passive=True).method.message_count)  # type: ignore[attr-defined]


def publish(ch: object, queue: str, n: int) -> None:
    for i in range(n):
        ch.basic_publish("", queue, f"m{i}".encode(),  # type: ignore[attr-defined]
                         pika.BasicProperties(delivery_mode=2))


def test_policies_apply_clear_and_survive_a_restart(node: tuple[NodeProcess, int]) -> None:
    proc, mport = node
    conn, ch = channel(proc.port)
    with conn:
        ch.queue_declare("pol-jobs", durable=True)  # type: ignore[attr-defined]
        ch.queue_declare("ttl-q", durable=True)  # type: ignore[attr-defined]
        publish(ch, "pol-jobs", 5)
        assert ready(ch, "pol-jobs") == 5
        code = ctl.main(["--node", f"127.0.0.1:{mport}", "set_policy", "cap", "^pol-", '{"max-length": 3}',
                         "--apply-to", "queues", "--priority", "2"])
        assert code == 0
        assert ready(ch, "pol-jobs") == 3  # the existing backlog was cut at once (drop-head)
        publish(ch, "pol-jobs", 4)
        assert ready(ch, "pol-jobs") == 3
        status, _ = http(mport, "PUT", "/api/policies/%2F/short", {"pattern": "^ttl-", "apply-to": "queues",
                                                                    "definition": {"message-ttl": 100}})
        assert status == 201
        status, body = http(mport, "PUT", "/api/policies/%2F/bad", {"pattern": "^x", "definition": {"ttl": 1}})
        assert status == 400 and "not recognised" in body["reason"]  # type: ignore[index]
        publish(ch, "ttl-q", 3)
        deadline = time.monotonic() + POLL_S
        while ready(ch, "ttl-q") and time.monotonic() < deadline:
            conn.sleep(0.1)
        assert ready(ch, "ttl-q") == 0
    _, row = http(mport, "GET", "/api/queues/%2F/pol-jobs")
    assert row["policy"] == "cap" and row["effective_policy_definition"] == {"max-length": 3}  # type: ignore[index]

    proc.restart()
    _wait_accepts(mport, proc)
    _, policies = http(mport, "GET", "/api/policies/%2F")
    assert sorted(p["name"] for p in policies) == ["cap", "short"]  # type: ignore[attr-defined]
    conn, ch = channel(proc.port)
    with conn:
        assert ready(ch, "pol-jobs") == 3
        publish(ch, "pol-jobs", 2)
        assert ready(ch, "pol-jobs") == 3
        assert ctl.main(["--node", f"127.0.0.1:{mport}", "clear_policy", "cap"]) == 0
        publish(ch, "pol-jobs", 2)
        assert ready(ch, "pol-jobs") == 5
    _, row = http(mport, "GET", "/api/queues/%2F/pol-jobs")
    assert row["policy"] is None  # type: ignore[index]
