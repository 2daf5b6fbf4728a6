"""Online membership of the cluster on real `raftmq node` processes: join_cluster, leave_cluster, restarts.

Three nodes start as a cluster (`cluster_nodes` lists n1..n3). A 4th node starts alone (its `cluster_nodes` lists
only itself) and is told `raftmq ctl join_cluster n1=...` (run against the new node, as `rabbitmqctl`): it becomes a
member of the metadata group, every node lists it, a quorum queue is grown onto it (`raftmq ctl grow`), and a
publisher with confirms and a consumer both use the 4th node. A node with another secret is refused and changes
nothing. Then the metadata leader (if one of n1..n3, else n3) runs `leave_cluster`: its queue membership moves,
it hands leadership over, it is removed from the metadata group, it stops, and the cluster serves without it.
Finally a remaining original node (whose `cluster_nodes` still lists the node that left) and n4 (which lists only
itself) are killed and restarted: both come back with the membership the metadata says. Last, the third node is
killed and `forget_cluster_node`-ed: the group shrinks to the two live nodes, which go on serving. No assertion is
about timing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import requests

from tests.cluster.cluster_proc import (
    REPO_ROOT,
    ClusterNode,
    ClusterProcs,
    api_queue,
    channel,
    free_amqp_ports,
    ready_count,
    wait_until,
)
from tests.cluster.test_cluster_processes import (
    QUORUM,
    Consumer,
    Publisher,
)


def _ctl(port: int, *argv: str) -> tuple[int, dict[str, Any] | str]:
    done = subprocess.run([sys.executable, "-m", "node.cli", "ctl", "--node", f"127.0.0.1:{port + 10_000}", "--json",
                           *argv], cwd=REPO_ROOT, capture_output=True, timeout=180, check=False)
    if done.returncode != 0:
        return done.returncode, (done.stdout + done.stderr).decode(errors="replace")
    result: dict[str, Any] = json.loads(done.stdout)
    return 0, result


def _ok(port: int, *argv: str) -> dict[str, Any]:
    code, result = _ctl(port, *argv)
    assert code == 0 and isinstance(result, dict), result
    return result


def _nodes(port: int) -> dict[str, bool]:
    """name -> running, from a node's /api/nodes."""
    try:
        reply = requests.get(f"http://127.0.0.1:{port + 10_000}/api/nodes", auth=("guest", "guest"), timeout=5)
        reply.raise_for_status()
    except requests.RequestException:
        return {}
    return {row["name"]: bool(row["running"]) for row in reply.json()}


def _all_see(nodes: list[ClusterNode], names: set[str]) -> bool:
    return all(_nodes(n.port) == dict.fromkeys(names, True) for n in nodes)


def _extra_node(procs: ClusterProcs, name: str, secret: str | None = None) -> ClusterNode:
    """A node outside `cluster_nodes` of the others, started alone (its `cluster_nodes` lists only itself)."""
    taken = {n.port for n in procs.nodes}
    port = next(p for p in free_amqp_ports(8) if all(abs(p - t) > 2 for t in taken))
    node = ClusterNode(name, port, procs.root / name)
    procs.nodes.append(node)
    procs.extra_alone = {**getattr(procs, "extra_alone", {}), name: f"{name}=127.0.0.1:{port}"}
    if secret is not None:
        procs.secrets[name] = secret
    return node


class AloneProcs(ClusterProcs):
    """ClusterProcs where the nodes in `extra_alone` are started with only themselves in `cluster_nodes`."""

    extra_alone: dict[str, str]

    def cluster_nodes(self, viewer: ClusterNode) -> str:
        alone = getattr(self, "extra_alone", {})
        if viewer.name in alone:
            return alone[viewer.name]
        return ",".join(f"{n.name}=127.0.0.1:{n.port}" for n in self.nodes if n.name not in alone)


def _metadata_leader(procs: ClusterProcs, among: list[ClusterNode]) -> ClusterNode | None:
    """The node among `among` that leads the metadata group (its /api/nodes row: metadata leader == self)."""
    for node in among:
        try:
            rows = requests.get(f"http://127.0.0.1:{node.port + 10_000}/api/nodes", auth=("guest", "guest"),
                                timeout=5).json()
        except requests.RequestException:
            continue
        meta = next((r.get("metadata") or {} for r in rows if r["name"] == node.name), {})
        if meta.get("leader") and meta.get("leader") == meta.get("self"):
            return node
    return None


def _publish_and_consume(port: int, queue: str, tag: str) -> None:
    publisher = Publisher(port, queue, 20, tag=tag)
    publisher.run()
    assert publisher.confirmed == list(range(20)) and publisher.error is None
    consumer = Consumer(port, queue)
    consumer.start()
    wait_until(lambda: {b for b in consumer.bodies if b.startswith(tag.encode() + b"-")} ==
               {f"{tag}-{i}".encode() for i in range(20)}, 60, f"the 20 {tag} messages consumed")
    consumer.stop.set()
    consumer.join(10)
    assert consumer.error is None


def test_join_grow_leave_and_restart(tmp_path: Path) -> None:
    procs = AloneProcs(tmp_path, size=3)
    try:
        procs.start_all()
        n1, n2, n3 = procs.nodes[:3]
        n4 = _extra_node(procs, "n4")
        procs.spawn(n4)
        procs.wait_ready(n4)
        wait_until(lambda: set(_nodes(n4.port)) == {"n4"}, 30, "n4 alone before the join")

        started = time.monotonic()
        joined = _ok(n4.port, "join_cluster", f"n1=127.0.0.1:{n1.port}")
        assert joined["joined"] is True
        answered = time.monotonic()
        wait_until(lambda: _all_see([n1, n2, n3, n4], {"n1", "n2", "n3", "n4"}), 60, "every node lists n4")
        print(f"join_cluster answered after {answered - started:.2f} s; every node lists n4 as running after "
              f"{time.monotonic() - started:.2f} s")  # reported, never asserted

        intruder = _extra_node(procs, "n5", secret="another-secret-0123456789abcdef")
        procs.spawn(intruder)
        procs.wait_ready(intruder)
        wait_until(lambda: set(_nodes(intruder.port)) == {"n5"}, 30, "n5's management API")
        code, refusal = _ctl(intruder.port, "join_cluster", f"127.0.0.1:{n2.port}")
        assert code != 0 and "secret" in str(refusal), refusal
        assert _nodes(n1.port) == dict.fromkeys(["n1", "n2", "n3", "n4"], True)  # nothing changed
        procs.kill("n5")

        queue = "q-joined"
        with channel(n1.port) as ch:
            ch.queue_declare(queue, durable=True, arguments={**QUORUM, "x-quorum-initial-group-size": 3})
        _ok(n1.port, "grow", "n4", "all")

        def n4_votes() -> bool:
            row = api_queue(n4.port, queue)
            return "n4" in row["members"] and "n4" in row["raft"]["voters"] and row["leader"] is not None

        wait_until(n4_votes, 60, "n4 a voter of the queue")
        _publish_and_consume(n4.port, queue, "a")

        leader = _metadata_leader(procs, [n1, n2, n3])
        leaving = leader or n3  # the harder case: the metadata leader leaves
        print(f"leaving: {leaving.name} (metadata leader: {leader.name if leader else 'n4'})")
        started = time.monotonic()
        left = _ok(leaving.port, "leave_cluster")
        assert left["left"] is True
        print(f"leave_cluster answered after {time.monotonic() - started:.2f} s (moved {left['moved']})")
        wait_until(lambda: not leaving.alive(), 30, f"{leaving.name} to stop after leaving")
        remaining = [n for n in (n1, n2, n3, n4) if n is not leaving]
        names = {n.name for n in remaining}
        wait_until(lambda: _all_see(remaining, names), 60, f"{leaving.name} gone from every node's status")
        assert leaving.name not in api_queue(remaining[0].port, queue)["members"]
        _publish_and_consume(remaining[0].port, queue, "b")

        for node in (remaining[0], n4):  # the first still lists the node that left in cluster_nodes; n4 only itself
            procs.restart(node.name)
            wait_until(lambda: _all_see(remaining, names), 60, f"membership after {node.name}'s restart")
        wait_until(lambda: api_queue(n4.port, queue)["leader"] is not None, 60, "a queue leader after the restarts")
        _publish_and_consume(n4.port, queue, "c")
        wait_until(lambda: all(ready_count(n.port, queue) == 0 for n in remaining), 30, "acks everywhere")

        dead, keeper = remaining[1], remaining[0]  # forget_cluster_node of a dead node shrinks the group to two
        procs.kill(dead.name)
        wait_until(lambda: _nodes(keeper.port).get(dead.name) is False, 60, f"{dead.name} seen down")
        forgot = _ok(keeper.port, "forget_cluster_node", dead.name)
        assert forgot["removed_from_group"]
        survivors = [keeper, n4]
        wait_until(lambda: _all_see(survivors, {keeper.name, "n4"}), 60, f"{dead.name} forgotten everywhere")
        assert dead.name not in api_queue(keeper.port, queue)["members"]
        wait_until(lambda: api_queue(n4.port, queue)["leader"] is not None, 60, "a queue leader of two")
        _publish_and_consume(keeper.port, queue, "d")
    except BaseException:
        print(procs.logs())
        raise
    finally:
        procs.stop_all()
