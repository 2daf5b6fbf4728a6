"""Policies in cluster mode, on three real `raftmq node` processes: a max-length policy set through one node's
management API reaches every replica of a quorum queue at one point of its log (the queue's Raft leader proposes
SetArgs): the backlog is cut on all replicas, a consumer on a follower node gets only the newest messages, and
clearing the policy lifts the limit everywhere. No assertion is about timing (waits have generous deadlines)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pika
import requests

from cluster.queue.replicated_codec import queue_group_id
from tests.cluster.cluster_proc import (
    ClusterProcs,
    cluster_fixture,  # noqa: F401 (the `cluster` fixture)
    management_up,
    wait_until,
)
from tests.cluster.cluster_proc import channel as plain_channel

WAIT_S = 30.0


@contextlib.contextmanager
def channel(port: int) -> Iterator[Any]:
    """A channel in confirm mode."""
    with plain_channel(port) as ch:
        ch.confirm_delivery()
        yield ch


def api(port: int, method: str, path: str, body: Any = None) -> requests.Response:
    return requests.request(method, f"http://127.0.0.1:{port + 10_000}{path}", json=body, auth=("guest", "guest"),
                            timeout=15)


def queue_row(port: int, queue: str) -> dict[str, Any] | None:
    reply = api(port, "GET", "/api/queues")
    reply.raise_for_status()
    return next((row for row in reply.json() if row["name"] == queue), None)


def wait_rows(cluster: ClusterProcs, queue: str, what: str, check: Any) -> None:
    for node in cluster.nodes:
        def ok(port: int = node.port) -> bool:
            row = queue_row(port, queue)
            return row is not None and bool(check(row))

        wait_until(ok, WAIT_S, f"{what} on {node.name}")


def publish(port: int, queue: str, bodies: list[bytes]) -> None:
    with channel(port) as ch:
        for body in bodies:
            ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))


def test_max_length_policy_applies_on_every_replica_and_clears(cluster: ClusterProcs) -> None:
    n1, n2, n3 = cluster.nodes
    for node in cluster.nodes:  # the management API listens after AMQP
        wait_until(lambda node=node: management_up(node.port), WAIT_S, f"{node.name}'s management API to listen")
    with channel(n1.port) as ch:
        ch.queue_declare("pq", durable=True, arguments={"x-queue-type": "quorum"})
    wait_rows(cluster, "pq", "queue known", lambda row: row["leader"] is not None)
    publish(n1.port, "pq", [f"m{i}".encode() for i in range(5)])
    wait_rows(cluster, "pq", "5 ready", lambda row: row["messages_ready"] == 5)

    reply = api(n2.port, "PUT", "/api/policies/%2F/cap",
                {"pattern": "^pq$", "apply-to": "queues", "definition": {"max-length": 2}, "priority": 1})
    assert reply.status_code == 201, reply.text
    bad = api(n2.port, "PUT", "/api/policies/%2F/bad", {"pattern": "^pq$", "definition": {"max-length": -1}})
    assert bad.status_code == 400
    wait_rows(cluster, "pq", "policy cap, 2 ready",
              lambda row: row["policy"] == "cap" and row["messages_ready"] == 2
              and row["effective_policy_definition"] == {"max-length": 2})
    assert [p["name"] for p in api(n3.port, "GET", "/api/policies").json()] == ["cap"]

    publish(n2.port, "pq", [f"m{i}".encode() for i in range(5, 8)])
    wait_rows(cluster, "pq", "still 2 ready", lambda row: row["messages_ready"] == 2)
    leader = cluster.agreed_leader([n.name for n in cluster.nodes], queue_group_id("/", "pq"))
    follower = next(n for n in cluster.nodes if n.name != leader)
    got = []
    with channel(follower.port) as ch:
        for _ in range(2):
            method, _props, body = ch.basic_get("pq", auto_ack=True)
            assert method is not None
            got.append(body)
    assert got == [b"m6", b"m7"]

    assert api(n3.port, "DELETE", "/api/policies/%2F/cap").status_code == 204
    assert api(n3.port, "DELETE", "/api/policies/%2F/cap").status_code == 404
    wait_rows(cluster, "pq", "no policy", lambda row: row["policy"] is None)
    publish(n3.port, "pq", [f"n{i}".encode() for i in range(4)])
    wait_rows(cluster, "pq", "4 ready without the limit", lambda row: row["messages_ready"] == 4)
