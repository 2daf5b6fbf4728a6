"""A dynamic shovel in a 3-node raftmq cluster on real processes: defined once through one node's API, run by exactly
one node (every node names the same one), moved to another node when its node is killed (kill -9), cleared
everywhere. The source is a quorum queue in the cluster, the destination a single raftmq node."""

from __future__ import annotations

import collections
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.shovel import count_copies
from tests.cluster.cluster_proc import ClusterProcs, api_queue, raft_links_up, supervised
from tests.integration.nodeproc import NodeProcess
from tests.shovel.helpers import count, ctl_call, drain, publish, start_node, uri, wait_until

QUORUM = {"x-queue-type": "quorum"}


@pytest.fixture
def cluster_and_dest(tmp_path: Path) -> Iterator[tuple[ClusterProcs, tuple[NodeProcess, int]]]:
    dest = start_node(tmp_path / "dest")
    try:
        with supervised(ClusterProcs(tmp_path / "cluster")) as procs:
            procs.start_all()
            yield procs, dest
    finally:
        dest[0].stop()


def _owners(procs: ClusterProcs, alive: list[str]) -> dict[str, tuple[str, str]]:
    """node -> (the owner it names, the state it shows) for the one shovel, as each live node sees it."""
    seen = {}
    for name in alive:
        code, rows = ctl_call(procs.node(name).port + 10_000, "shovel_status")
        if code != 0 or len(rows) != 1:
            return {}
        seen[name] = (rows[0]["node"], rows[0]["state"])
    return seen


def _one_runner(procs: ClusterProcs, alive: list[str]) -> str | None:
    """The node running the shovel, once every live node names it and it shows `running`."""
    seen = _owners(procs, alive)
    owners = {owner for owner, _ in seen.values()}
    if len(seen) != len(alive) or len(owners) != 1:
        return None
    owner = owners.pop()
    if owner not in alive or seen[owner][1] != "running":
        return None
    others = [state for name, (_, state) in seen.items() if name != owner]
    return owner if all(state == "running elsewhere" for state in others) else None


def _kill(procs: ClusterProcs, name: str, deaths: dict[str, list[int]]) -> None:
    procs.kill(name)
    deaths.setdefault(name, []).append(int(time.time() * 1000))


def _assert_one_copy_at_a_time(procs: ClusterProcs, shovel: str, deaths: dict[str, list[int]]) -> None:
    """From the nodes' `shovel copy started/stopped` lines and the kill times: never two copies at once."""
    logs = {n.name: n.log_text().decode(errors="replace") for n in procs.nodes}
    copies = count_copies(logs, deaths, shovel)
    print(f"copies of {shovel} (node, from, to): {copies.intervals}")
    assert copies.most == 1, copies.overlap


def test_cluster_shovel_runs_on_one_node_and_moves_when_it_dies(
        cluster_and_dest: tuple[ClusterProcs, tuple[NodeProcess, int]]) -> None:
    procs, (dest, _) = cluster_and_dest
    names = [n.name for n in procs.nodes]
    wait_until(lambda: all(raft_links_up(n.port) for n in procs.nodes), 60, "every node linked to every node")
    n1 = procs.node("n1")
    publish(n1.port, "cq-src", 300, declare=QUORUM)
    value = {"src-uri": [uri(n.port) for n in procs.nodes], "src-queue": "cq-src",
             "dest-uri": uri(dest.port), "dest-queue": "from-cluster", "reconnect-delay": 1}
    code, out = ctl_call(n1.port + 10_000, "set_parameter", "shovel", "cs", json.dumps(value))
    assert code == 0, out
    owner = wait_until(lambda: _one_runner(procs, names), 60, "one node running the shovel, named by all")
    wait_until(lambda: count(dest.port, "from-cluster") == 300, 90, "300 messages at the destination")
    deaths: dict[str, list[int]] = {}
    _kill(procs, owner, deaths)
    killed_at = time.monotonic()
    alive = [n for n in names if n != owner]
    new_owner = wait_until(lambda: _one_runner(procs, alive), 90, "the shovel moved to a live node")
    assert new_owner != owner
    print(f"the shovel ran again on {new_owner} {time.monotonic() - killed_at:.1f} s after the kill of {owner} "
          f"(lease 10 s + margin 1.5 s after its last renewal)")
    publish(procs.node(alive[0]).port, "cq-src", 200, declare=QUORUM, prefix="late")
    wait_until(lambda: count(dest.port, "from-cluster") >= 500, 120, "the later 200 messages shovelled too")
    bodies = collections.Counter(body for body, _ in drain(dest.port, "from-cluster"))
    expected = {f"m{n}".encode() for n in range(300)} | {f"late{n}".encode() for n in range(200)}
    assert set(bodies) == expected  # nothing lost; duplicates (unconfirmed at the kill) are possible
    print(f"duplicates after the kill of {owner}: {sum(bodies.values()) - len(bodies)}")
    _assert_one_copy_at_a_time(procs, "cs", deaths)
    code, out = ctl_call(procs.node(alive[0]).port + 10_000, "clear_parameter", "shovel", "cs")
    assert code == 0, out
    wait_until(lambda: all(ctl_call(procs.node(n).port + 10_000, "shovel_status") == (0, []) for n in alive), 30,
               "the shovel gone from every live node")


def _dest_connections(mport: int) -> int:
    code, rows = ctl_call(mport, "list_connections")
    return len(rows) if code == 0 and isinstance(rows, list) else -1


def test_rolling_restart_leaves_one_copy_and_loses_nothing(
        cluster_and_dest: tuple[ClusterProcs, tuple[NodeProcess, int]]) -> None:
    """Each node in turn is killed and started again (RabbitMQ #3260: duplicate shovels after a rolling restart).
    Afterwards exactly one copy runs: one connection at the destination, every node naming the same owner."""
    procs, (dest, dest_mport) = cluster_and_dest
    names = [n.name for n in procs.nodes]
    wait_until(lambda: all(raft_links_up(n.port) for n in procs.nodes), 60, "every node linked to every node")
    value = {"src-uri": [uri(n.port) for n in procs.nodes], "src-queue": "roll-src",
             "dest-uri": uri(dest.port), "dest-queue": "roll-dst", "reconnect-delay": 1}
    publish(procs.node("n1").port, "roll-src", 100, declare=QUORUM)
    assert ctl_call(procs.node("n1").port + 10_000, "set_parameter", "shovel", "roll", json.dumps(value))[0] == 0
    wait_until(lambda: _one_runner(procs, names), 60, "one node running the shovel")
    samples: list[int] = []
    deaths: dict[str, list[int]] = {}
    for name in names:
        _kill(procs, name, deaths)
        procs.restart(name)
        wait_until(lambda: all(raft_links_up(n.port) for n in procs.nodes), 90, f"links up after restarting {name}")
        wait_until(lambda: _one_runner(procs, names), 90, f"one runner after restarting {name}")
        samples.append(_dest_connections(dest_mport))
        publish(procs.node(name).port, "roll-src", 50, declare=QUORUM, prefix=f"after-{name}-")
    wait_until(lambda: count(dest.port, "roll-dst") >= 250, 120, "every message at the destination")
    wait_until(lambda: _dest_connections(dest_mport) == 1, 30, "exactly one shovel connection at the destination")
    assert _one_runner(procs, names)
    bodies = collections.Counter(body for body, _ in drain(dest.port, "roll-dst"))
    expected = {f"m{n}".encode() for n in range(100)} | {f"after-{name}-{n}".encode()
                                                         for name in names for n in range(50)}
    assert set(bodies) == expected
    print(f"destination connections after each restart: {samples}; "
          f"duplicates: {sum(bodies.values()) - len(bodies)}")
    _assert_one_copy_at_a_time(procs, "roll", deaths)


def test_killing_the_destination_queue_leader_loses_nothing(
        cluster_and_dest: tuple[ClusterProcs, tuple[NodeProcess, int]]) -> None:
    """A single node shovels into a quorum queue of the cluster (dest-uri lists every cluster node); kill -9 of the
    queue's Raft leader in the middle: with on-confirm every message ends up in the queue (duplicates counted)."""
    procs, (source, source_mport) = cluster_and_dest
    wait_until(lambda: all(raft_links_up(n.port) for n in procs.nodes), 60, "every node linked to every node")
    publish(procs.node("n1").port, "dq", 0, declare=QUORUM)  # declared on n1: its group starts led by n1
    total = 4000
    publish(source.port, "sq", total)
    value = {"src-uri": uri(source.port), "src-queue": "sq", "dest-uri": [uri(n.port) for n in procs.nodes],
             "dest-queue": "dq", "reconnect-delay": 1}
    assert ctl_call(source_mport, "set_parameter", "shovel", "into-cluster", json.dumps(value))[0] == 0
    wait_until(lambda: count(procs.node("n1").port, "dq") >= 300, 60, "the shovel moving messages")
    leader = api_queue(procs.node("n1").port, "dq")["leader"]
    assert leader in [n.name for n in procs.nodes]
    procs.kill(leader)
    survivor = next(n for n in procs.nodes if n.name != leader)
    wait_until(lambda: count(source.port, "sq") == 0, 180, "the source queue emptied")
    wait_until(lambda: count(survivor.port, "dq") >= total, 60, "every message in the destination queue")
    bodies = collections.Counter(body for body, _ in drain(survivor.port, "dq"))
    assert set(bodies) == {f"m{n}".encode() for n in range(total)}
    print(f"kill -9 of the destination queue's leader {leader}: duplicates {sum(bodies.values()) - len(bodies)}")
