"""A mirrored queue on a real single `raftmq node` with pika: an `ha-mode` policy (RabbitMQ's words for a bad
one), publishes confirmed, consumed and acked as from a classic queue, /api/queues showing the one replica as
leader and ISR with HW = LEO, and the queue still mirrored with its messages after a restart. `sync_queue` (ctl and
the API's queue actions) on one node: a mirrored queue is its own only replica (nothing to hold out); a classic
queue is `not_mirrored`, as rabbitmqctl says."""

from __future__ import annotations

import json

import pytest

from tests.integration.nodeproc import NodeProcess
from tests.management.test_real_node import (
    _wait_accepts,
    node_fixture,  # noqa: F401 (the `node` fixture)
    run_ctl,
)
from tests.policies.test_policy_real_node import channel, http, publish, ready


def test_a_mirrored_queue_on_one_node_works_as_a_classic_queue(node: tuple[NodeProcess, int],
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    proc, mport = node
    status, body = http(mport, "PUT", "/api/policies/%2F/bad", {"pattern": "^ha", "definition": {"ha-mode": "exactly"}})
    assert status == 400 and 'ha-mode=\\"exactly\\" takes an integer' in json.dumps(body)
    status, _ = http(mport, "PUT", "/api/policies/%2F/ha", {
        "pattern": "^ha\\.", "apply-to": "queues",
        "definition": {"ha-mode": "exactly", "ha-params": 3, "ha-sync-mode": "automatic", "ha-min-insync": 2}})
    assert status == 201
    conn, ch = channel(proc.port)
    with conn:
        ch.queue_declare("ha.jobs", durable=True)  # type: ignore[attr-defined]
        publish(ch, "ha.jobs", 20)  # (confirm mode: each publish waits for its ack)
        got = []
        for _ in range(5):
            method, _props, body_ = ch.basic_get("ha.jobs")  # type: ignore[attr-defined]
            got.append(body_)
            ch.basic_ack(method.delivery_tag)  # type: ignore[attr-defined]
        assert got == [f"m{i}".encode() for i in range(5)]
        assert ready(ch, "ha.jobs") == 15
    _, row = http(mport, "GET", "/api/queues/%2F/ha.jobs")
    mirror = row["mirror"]  # type: ignore[index]
    assert row["policy"] == "ha" and row["type"] == "classic"  # type: ignore[index]
    assert mirror["leader"] == row["node"] and mirror["isr"] == [row["node"]]  # type: ignore[index]
    assert mirror["hw"] == 20 and mirror["leo"] == {row["node"]: 20}  # type: ignore[index]

    proc.restart()
    _wait_accepts(mport, proc)
    _, row = http(mport, "GET", "/api/queues/%2F/ha.jobs")
    assert row["mirror"]["leader"] == row["node"]  # type: ignore[index]
    conn, ch = channel(proc.port)
    with conn:
        assert ready(ch, "ha.jobs") == 15
        method, _props, body_ = ch.basic_get("ha.jobs", auto_ack=True)  # type: ignore[attr-defined]
        assert body_ == b"m5"

    code, out = run_ctl(mport, capsys, "sync_queue", "ha.jobs")
    assert code == 0 and "Synchronising queue 'ha.jobs' in vhost '/'" in out, out
    code, out = run_ctl(mport, capsys, "cancel_sync_queue", "ha.jobs")
    assert code == 0 and "not_syncing" in out, out
    conn, ch = channel(proc.port)
    with conn:
        ch.queue_declare("plain.jobs")  # type: ignore[attr-defined]
    code, out = run_ctl(mport, capsys, "sync_queue", "plain.jobs")
    assert code == 65 and "not_mirrored" in out, out
    assert http(mport, "POST", "/api/queues/%2F/plain.jobs/actions", {"action": "sync"})[0] == 204  # as RabbitMQ's
    assert http(mport, "POST", "/api/queues/%2F/ha.jobs/actions", {"action": "sync"})[0] == 204
    status, body = http(mport, "POST", "/api/queues/%2F/ha.jobs/actions", {"action": "resync"})
    assert status == 400 and body == {"error": "bad_request", "reason": '{unknown,<<"resync">>}'}
    assert http(mport, "POST", "/api/queues/%2F/ha.jobs/actions", {})[0] == 400
    assert http(mport, "POST", "/api/queues/%2F/nope/actions", {"action": "sync"})[0] == 404
