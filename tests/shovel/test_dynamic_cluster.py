"""A dynamic shovel in a 3-node raftmq cluster on real processes: defined once through one node's API, run by exactly
one node (every node names the same one; every node lists the full status from that node), moved to another node
when its node is killed (kill -9), cleared everywhere. The source is a quorum queue in the cluster, the destination a
single raftmq node. The first test's nodes also have a static shovel in their config file."""

from __future__ import annotations

import collections
import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from chaos.shovel import COPY_LINE, count_copies
from tests.cluster.cluster_proc import ClusterProcs, api_queue, raft_links_up, supervised
from tests.integration.nodeproc import NodeProcess
from tests.shovel.helpers import count, ctl_call, drain, publish, start_node, uri, wait_until

QUORUM = {"x-queue-type": "quorum"}
# A static shovel in every node's config file (cluster/shovel/static.py), between two quorum queues of the cluster.
STATIC_TOML = """
[shovels.st]
reconnect_delay = 1
[shovels.st.source]
uris = ["amqp://"]
queue = "st-src"
queue_args = { "x-queue-type" = "quorum" }
[shovels.st.destination]
uris = ["amqp://"]
queue = "st-dst"
queue_args = { "x-queue-type" = "quorum" }
"""


@contextlib.contextmanager
def _cluster_and_dest(tmp_path: Path, config_toml: str = "") -> Iterator[tuple[ClusterProcs, tuple[NodeProcess, int]]]:
    extra = {}
    if config_toml:
        (tmp_path / "cluster.toml").write_text(config_toml)
        extra["RAFTMQ_CONFIG_FILE"] = str(tmp_path / "cluster.toml")
    dest = start_node(tmp_path / "dest")
    try:
        with supervised(ClusterProcs(tmp_path / "cluster", extra=extra)) as procs:
            procs.start_all()
            yield procs, dest
    finally:
        dest[0].stop()


@pytest.fixture
def cluster_and_dest(tmp_path: Path) -> Iterator[tuple[ClusterProcs, tuple[NodeProcess, int]]]:
    with _cluster_and_dest(tmp_path) as both:
        yield both


@pytest.fixture
def cluster_with_static_and_dest(tmp_path: Path) -> Iterator[tuple[ClusterProcs, tuple[NodeProcess, int]]]:
    """The same, every node's config file with the static shovel `st`."""
    with _cluster_and_dest(tmp_path, STATIC_TOML) as both:
        yield both


def _owners(procs: ClusterProcs, alive: list[str], kind: str = "dynamic") -> dict[str, tuple[str, str]]:
    """node -> (the owner it names, the state it shows) for the one shovel of that type, as each live node sees it
    itself (its own rows, `raftmq_local=true`: without it a node shows the status of the node that runs it)."""
    seen = {}
    for name in alive:
        try:
            reply = requests.get(f"http://127.0.0.1:{procs.node(name).port + 10_000}/api/shovels",
                                 params={"raftmq_local": "true"}, auth=("guest", "guest"), timeout=10)
        except requests.RequestException:
            return {}
        rows = [r for r in reply.json() if r["type"] == kind] if reply.status_code == 200 else []
        if len(rows) != 1:
            return {}
        seen[name] = (rows[0]["node"], rows[0]["state"])
    return seen


def _assert_full_status_everywhere(procs: ClusterProcs, names: list[str], owner: str, moved: int,
                                   static_owner: str) -> None:
    """`shovel_status` and /api/shovels/vhost/{vhost}/{name} on every node: the full status (URIs, counters) from the
    node running each shovel, as RabbitMQ lists every shovel of the cluster from any node."""
    for name in names:
        mport = procs.node(name).port + 10_000
        code, rows = ctl_call(mport, "shovel_status")
        assert code == 0 and [r["name"] for r in rows] == ["cs", "st"], (name, rows)
        row = rows[0]
        assert (row["node"], row["state"], row["src_queue"], row["dest_queue"]) == \
            (owner, "running", "cq-src", "from-cluster"), (name, row)
        assert row["src_uri"].startswith("amqp://guest@127.0.0.1:") and "guest:guest" not in row["src_uri"], row
        assert row["dest_uri"].startswith("amqp://guest@127.0.0.1:") and row["forwarded"] >= moved, (name, row)
        one = requests.get(f"http://127.0.0.1:{mport}/api/shovels/vhost/%2F/cs", auth=("guest", "guest"), timeout=10)
        assert one.status_code == 200 and one.json()["node"] == owner and one.json()["forwarded"] >= moved
        static = rows[1]
        assert (static["type"], static["node"], static["state"], static["dest_queue"]) == \
            ("static", static_owner, "running", "st-dst") and static["forwarded"] >= 20, (name, static)


def _one_runner(procs: ClusterProcs, alive: list[str], kind: str = "dynamic") -> str | None:
    """The node running the shovel (of that type), once every live node names it and it shows `running`."""
    seen = _owners(procs, alive, kind)
    owners = {owner for owner, _ in seen.values()}
    if len(seen) != len(alive) or len(owners) != 1:
        return None
    owner = owners.pop()
    if owner not in alive or seen[owner][1] != "running":
        return None
    others = [state for name, (_, state) in seen.items() if name != owner]
    return owner if all(state == "running elsewhere" for state in others) else None


def _copy_starts(procs: ClusterProcs, node: str, shovel: str) -> int:
    """How many copies of the shovel the node's log says it started."""
    text = procs.node(node).log_text().decode(errors="replace")
    return sum(1 for m in COPY_LINE.finditer(text) if m.group(1) == "started" and json.loads(m.group(2))["name"] == shovel)


def _names(mport: int) -> list[str] | None:
    code, rows = ctl_call(mport, "shovel_status")
    return [r["name"] for r in rows] if code == 0 else None


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
        cluster_with_static_and_dest: tuple[ClusterProcs, tuple[NodeProcess, int]]) -> None:
    """Also: every node lists the full status of the node running a shovel and forwards a restart to it; the static
    shovel of every node's config file runs on one node at a time, moves its messages once, and moves on too."""
    procs, (dest, _) = cluster_with_static_and_dest
    names = [n.name for n in procs.nodes]
    wait_until(lambda: all(raft_links_up(n.port) for n in procs.nodes), 60, "every node linked to every node")
    n1 = procs.node("n1")
    publish(n1.port, "cq-src", 300, declare=QUORUM)
    publish(n1.port, "st-src", 20, declare=QUORUM, prefix="st")
    static_owner = wait_until(lambda: _one_runner(procs, names, "static"), 60, "one node running the static shovel")
    value = {"src-uri": [uri(n.port) for n in procs.nodes], "src-queue": "cq-src",
             "dest-uri": uri(dest.port), "dest-queue": "from-cluster", "reconnect-delay": 1}
    code, out = ctl_call(n1.port + 10_000, "set_parameter", "shovel", "cs", json.dumps(value))
    assert code == 0, out
    owner = wait_until(lambda: _one_runner(procs, names), 60, "one node running the shovel, named by all")
    wait_until(lambda: count(dest.port, "from-cluster") == 300, 90, "300 messages at the destination")
    wait_until(lambda: count(n1.port, "st-dst") == 20, 60, "20 messages moved by the static shovel")
    _assert_full_status_everywhere(procs, names, owner, 300, static_owner)
    deaths: dict[str, list[int]] = {}
    _kill(procs, owner, deaths)
    killed_at = time.monotonic()
    alive = [n for n in names if n != owner]
    for name in alive:  # the owner does not answer: each node shows what it knows
        code, rows = ctl_call(procs.node(name).port + 10_000, "shovel_status")
        assert code == 0 and [r["name"] for r in rows] == ["cs", "st"], rows
    new_owner = wait_until(lambda: _one_runner(procs, alive), 90, "the shovel moved to a live node")
    assert new_owner != owner
    print(f"the shovel ran again on {new_owner} {time.monotonic() - killed_at:.1f} s after the kill of {owner} "
          f"(lease 10 s + margin 1.5 s after its last renewal)")
    publish(procs.node(alive[0]).port, "cq-src", 200, declare=QUORUM, prefix="late")
    publish(procs.node(alive[0]).port, "st-src", 10, declare=QUORUM, prefix="st-late")
    wait_until(lambda: count(dest.port, "from-cluster") >= 500, 120, "the later 200 messages shovelled too")
    wait_until(lambda: count(procs.node(alive[0]).port, "st-dst") >= 30, 120, "the static shovel's later 10")
    static_bodies = collections.Counter(body for body, _ in drain(procs.node(alive[0]).port, "st-dst"))
    assert set(static_bodies) == {f"st{n}".encode() for n in range(20)} | {f"st-late{n}".encode() for n in range(10)}
    print(f"static shovel: ran on {static_owner} before the kill of {owner}, on "
          f"{_one_runner(procs, alive, 'static')} after; duplicates {sum(static_bodies.values()) - len(static_bodies)}")
    _assert_one_copy_at_a_time(procs, "st", deaths)
    bodies = collections.Counter(body for body, _ in drain(dest.port, "from-cluster"))
    expected = {f"m{n}".encode() for n in range(300)} | {f"late{n}".encode() for n in range(200)}
    assert set(bodies) == expected  # nothing lost; duplicates (unconfirmed at the kill) are possible
    print(f"duplicates after the kill of {owner}: {sum(bodies.values()) - len(bodies)}")
    _assert_one_copy_at_a_time(procs, "cs", deaths)
    # (after the copy count: a restart's new copy may start before the old one has logged its stop)
    other = next(n for n in alive if n != new_owner)  # a restart asked of a node that does not run it reaches it
    starts = _copy_starts(procs, new_owner, "cs")
    assert ctl_call(procs.node(other).port + 10_000, "restart_shovel", "cs")[0] == 0
    assert ctl_call(procs.node(other).port + 10_000, "restart_shovel", "no-such")[0] != 0
    wait_until(lambda: _copy_starts(procs, new_owner, "cs") == starts + 1, 30, f"a new copy of cs on {new_owner}")
    assert wait_until(lambda: _one_runner(procs, alive), 60, "the restarted shovel running") == new_owner
    code, out = ctl_call(procs.node(alive[0]).port + 10_000, "clear_parameter", "shovel", "cs")
    assert code == 0, out
    wait_until(lambda: all(_names(procs.node(n).port + 10_000) == ["st"] for n in alive), 30,
               "the dynamic shovel gone from every live node (the static one stays)")


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
