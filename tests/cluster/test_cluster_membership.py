"""Quorum queue membership changes on a real 4-node cluster (`raftmq node` processes on loopback).

A quorum queue of 3 members is grown to the 4th node with `add_member` (management API, as `raftmq ctl
add_member`): the metadata lists it, the queue group's Raft leader promotes it to voter, and its replica holds
everything published before and after. Then the current Raft leader is shrunk away with `delete_member`: it hands
leadership over, is removed from the voters (staying a learner), and the metadata's recorded leader follows the
new Raft leader. Publishing with confirms and consuming keep working throughout. No assertion is about timing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import requests

from tests.cluster.cluster_proc import REPO_ROOT, ClusterProcs, api_queue, channel, ready_count, wait_until
from tests.cluster.test_cluster_processes import (
    QUORUM,
    Consumer,
    Publisher,
    _wait_queue_everywhere,
)


def _command(port: int, name: str, **args: Any) -> dict[str, Any]:
    reply = requests.post(f"http://127.0.0.1:{port + 10_000}/api/raftmq/{name}", json=args, auth=("guest", "guest"),
                          timeout=60)
    assert reply.status_code == 200, reply.text
    result: dict[str, Any] = reply.json()
    return result


def _ctl(port: int, *argv: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "node.cli", "ctl", "--node", f"127.0.0.1:{port + 10_000}", "--json",
                           *argv], cwd=REPO_ROOT, capture_output=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_grow_to_a_fourth_node_then_shrink_the_leader_away(tmp_path: Path) -> None:
    procs = ClusterProcs(tmp_path, size=4)
    try:
        procs.start_all()
        queue, n1 = "q-members", procs.nodes[0]
        with channel(n1.port) as ch:
            ch.queue_declare(queue, durable=True, arguments={**QUORUM, "x-quorum-initial-group-size": 3})
        _wait_queue_everywhere(procs, queue)
        members = api_queue(n1.port, queue)["members"]
        spare = next(n for n in procs.nodes if n.name not in members)
        before = Publisher(n1.port, queue, 20, tag="a")
        before.run()
        assert before.confirmed == list(range(20))

        grown = _ctl(n1.port, "add_member", queue, spare.name)  # raftmq ctl, as an operator would
        assert spare.name in grown["members"]

        def promoted() -> bool:
            row = api_queue(spare.port, queue)
            return spare.name in row["members"] and spare.name in row["raft"]["voters"] and row["leader"] is not None

        wait_until(promoted, 60, f"{spare.name} promoted to voter")
        after = Publisher(spare.port, queue, 20, tag="b")
        after.run()
        assert after.confirmed == list(range(20))
        wait_until(lambda: all(ready_count(n.port, queue) == 40 for n in procs.nodes), 30, "40 ready everywhere")

        leader = api_queue(n1.port, queue)["leader"]
        assert leader is not None
        gone = procs.node(leader)
        shrunk = _command(n1.port, "delete_member", vhost="/", queue=queue, node=leader)
        assert leader not in shrunk["members"] and len(shrunk["members"]) == 3

        def removed() -> bool:
            rows = [api_queue(n.port, queue) for n in procs.nodes]
            return all(leader not in r["raft"]["voters"] and leader in r["raft"]["learners"]
                       and r["leader"] is not None and r["leader"] != leader
                       and r["metadata_leader"] == r["leader"] for r in rows)

        wait_until(removed, 60, f"{leader} removed from the voters and the recorded leader in step")
        last = Publisher(gone.port, queue, 20, tag="c")  # through the removed member's node: still a learner
        last.run()
        assert last.confirmed == list(range(20))
        consumer = Consumer(spare.port, queue)
        consumer.start()
        wait_until(lambda: len(set(consumer.bodies)) >= 60, 60, "60 deliveries")
        consumer.stop.set()
        consumer.join(10)
        assert consumer.error is None
        for tag in "abc":
            assert {b for b in consumer.bodies if b.startswith(tag.encode() + b"-")} == \
                {f"{tag}-{i}".encode() for i in range(20)}
        wait_until(lambda: all(ready_count(n.port, queue) == 0 for n in procs.nodes), 30, "acks everywhere")
        wait_until(lambda: len({api_queue(n.port, queue)["raft"]["applied"] for n in procs.nodes}) == 1, 30,
                   "every replica (the grown one too) at the same applied index")
    except BaseException:
        print(procs.logs())
        raise
    finally:
        procs.stop_all()
