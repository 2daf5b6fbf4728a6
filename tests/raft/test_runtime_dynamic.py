"""RaftNodeRuntime while running: groups added and removed, commands from any node, leader reports, status.

Three real runtimes in one trio process over loopback TCP (as test_runtime_cluster.py). Every wait polls with a
generous deadline; nothing asserts on timings.
"""

from __future__ import annotations

import itertools
import json
import pathlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import trio

from cluster.raft.core.types import ConfChange, ConfOp, Entry, EntryKind, GroupId, Membership, NodeId
from cluster.raft.runtime.node import RaftNodeRuntime
from cluster.raft.runtime.storage import stream_name
from tests.raft.test_runtime_cluster import CONFIG, NODES, _free_ports

N1, N2, N3 = NODES
WAIT_S = 60


@dataclass
class Cluster:
    runtimes: dict[NodeId, RaftNodeRuntime]
    applied: dict[NodeId, list[tuple[GroupId, bytes]]] = field(default_factory=dict)
    leader_events: dict[NodeId, list[tuple[GroupId, NodeId | None]]] = field(default_factory=dict)

    def applied_data(self, node: NodeId, group: GroupId) -> list[bytes]:
        return [data for applied_group, data in self.applied[node] if applied_group == group]


def _build(tmp_path: pathlib.Path, groups: dict[GroupId, Membership], hold_ms: int = 2000) -> Cluster:
    ports = dict(zip(NODES, _free_ports(3), strict=True))
    cluster = Cluster({})
    for node in NODES:
        peers = {peer: ("127.0.0.1", port) for peer, port in ports.items() if peer != node}
        applied = cluster.applied.setdefault(node, [])
        events = cluster.leader_events.setdefault(node, [])

        def on_apply(group: GroupId, entry: Entry, applied: list[tuple[GroupId, bytes]] = applied) -> None:
            if entry.kind is EntryKind.NORMAL and entry.data:
                applied.append((group, entry.data))

        def on_leader_change(group: GroupId, leader: NodeId | None,
                             events: list[tuple[GroupId, NodeId | None]] = events) -> None:
            events.append((group, leader))

        runtime = RaftNodeRuntime(node, tmp_path / node, ("127.0.0.1", ports[node]), peers, b"s3cret", on_apply,
                                  CONFIG, tick_ms=10, on_leader_change=on_leader_change, forward_hold_ms=hold_ms)
        for group, membership in groups.items():
            runtime.add_group(group, membership)
        cluster.runtimes[node] = runtime
    return cluster


@asynccontextmanager
async def _running(cluster: Cluster) -> AsyncIterator[None]:
    async with trio.open_nursery() as nursery:
        for runtime in cluster.runtimes.values():
            await nursery.start(runtime.run)
        with trio.fail_after(WAIT_S):
            yield
        nursery.cancel_scope.cancel()


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await trio.sleep(0.01)


async def _agreed_leader(cluster: Cluster, group: GroupId, nodes: list[NodeId] = NODES) -> NodeId:
    """Wait until every node in `nodes` knows the same leader of `group`; return it."""

    def agreed() -> bool:
        leaders = {cluster.runtimes[node].leader_of(group) for node in nodes}
        return len(leaders) == 1 and None not in leaders

    await _until(agreed)
    leader = cluster.runtimes[nodes[0]].leader_of(group)
    assert leader is not None
    return leader


def _everyone_applied(cluster: Cluster, group: GroupId, data: list[bytes], nodes: list[NodeId] = NODES) -> bool:
    return all(set(data) <= set(cluster.applied_data(node, group)) for node in nodes)


ALL_VOTERS = Membership(frozenset(NODES))
G = GroupId("%2F/dynamic")


async def test_groups_added_and_removed_while_running(tmp_path: pathlib.Path) -> None:
    first = GroupId("%2F/first")
    cluster = _build(tmp_path, {first: ALL_VOTERS})
    async with _running(cluster):
        for runtime in cluster.runtimes.values():
            runtime.add_group(G, ALL_VOTERS)
        leader = await _agreed_leader(cluster, G)
        assert cluster.runtimes[leader].propose(G, b"one")
        await _until(lambda: _everyone_applied(cluster, G, [b"one"]))
        for runtime in cluster.runtimes.values():
            assert runtime.groups() == sorted([first, G])
            runtime.remove_group(G)
        await _until(lambda: all(runtime.groups() == [first] for runtime in cluster.runtimes.values()))
        await _until(lambda: all(runtime.storage is not None and stream_name(G) not in runtime.storage.log.streams()
                                 for runtime in cluster.runtimes.values()))  # deleted in a worker thread
        for runtime in cluster.runtimes.values():
            assert runtime.leader_of(G) is None and runtime.membership_of(G) is None
        # the group left alive keeps working, and the removed one can come back (fresh: its stream is gone)
        first_leader = await _agreed_leader(cluster, first)
        assert cluster.runtimes[first_leader].propose(first, b"still here")
        for runtime in cluster.runtimes.values():
            runtime.add_group(G, ALL_VOTERS)
        leader = await _agreed_leader(cluster, G)
        assert cluster.runtimes[leader].propose(G, b"two")
        await _until(lambda: _everyone_applied(cluster, G, [b"two"]) and
                     _everyone_applied(cluster, first, [b"still here"]))
    for node in NODES:
        assert cluster.applied_data(node, G) == [b"one", b"two"]


async def test_a_group_removed_and_added_at_once_comes_back_fresh(tmp_path: pathlib.Path) -> None:
    """A group removed and added again in one turn starts from an empty log, not from its old stream (the removal's
    stream deletion comes first)."""
    cluster = _build(tmp_path, {G: ALL_VOTERS})
    async with _running(cluster):
        leader = await _agreed_leader(cluster, G)
        assert cluster.runtimes[leader].propose(G, b"old")
        await _until(lambda: _everyone_applied(cluster, G, [b"old"]))
        for runtime in cluster.runtimes.values():
            runtime.remove_group(G)
            runtime.add_group(G, ALL_VOTERS)  # at once: both changes are carried out in the same turn
        await _until(lambda: all(not runtime._group_changes for runtime in cluster.runtimes.values()))
        leader = await _agreed_leader(cluster, G)
        assert cluster.runtimes[leader].propose(G, b"new")
        await _until(lambda: _everyone_applied(cluster, G, [b"new"]))
    for node in NODES:
        assert cluster.applied_data(node, G) == [b"old", b"new"]  # "old" not applied again: the log started empty


async def test_followers_and_learners_forward_proposals_to_the_leader(tmp_path: pathlib.Path) -> None:
    membership = Membership(frozenset({N1, N2}), frozenset({N3}))
    cluster = _build(tmp_path, {G: membership})
    async with _running(cluster):
        leader = await _agreed_leader(cluster, G)
        follower = ({N1, N2} - {leader}).pop()
        sent = []
        for n in range(20):
            for node in (follower, N3):
                data = f"{node}:{n}".encode()
                assert cluster.runtimes[node].propose(G, data)
                sent.append(data)
        await _until(lambda: _everyone_applied(cluster, G, sent))
    assert cluster.runtimes[follower].router.stats.forwarded >= 20
    assert cluster.runtimes[N3].router.stats.forwarded >= 20
    assert cluster.runtimes[leader].router.stats.received >= 40
    assert cluster.applied_data(N1, G) == cluster.applied_data(N2, G) == cluster.applied_data(N3, G)


async def test_a_proposal_for_a_group_added_a_moment_later_is_held_then_delivered(tmp_path: pathlib.Path) -> None:
    cluster = _build(tmp_path, {}, hold_ms=30_000)
    async with _running(cluster):
        assert cluster.runtimes[N3].propose(G, b"early")  # nobody hosts G yet
        await _until(lambda: cluster.runtimes[N3].router.held_count == 1)
        for runtime in cluster.runtimes.values():
            runtime.add_group(G, ALL_VOTERS)
        await _until(lambda: _everyone_applied(cluster, G, [b"early"]))
    assert cluster.runtimes[N3].router.stats.expired == 0


async def test_a_proposal_without_a_leader_is_dropped_after_the_hold(tmp_path: pathlib.Path) -> None:
    cluster = _build(tmp_path, {}, hold_ms=200)
    async with _running(cluster):
        assert cluster.runtimes[N1].propose(GroupId("%2F/nowhere"), b"lost")
        await _until(lambda: cluster.runtimes[N1].router.stats.expired == 1)
        assert cluster.runtimes[N1].router.held_count == 0


async def test_leader_changes_are_reported_on_every_node(tmp_path: pathlib.Path) -> None:
    cluster = _build(tmp_path, {G: ALL_VOTERS})
    scopes = {node: trio.CancelScope() for node in NODES}

    async def run(runtime: RaftNodeRuntime, scope: trio.CancelScope,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with scope:
            await runtime.run(task_status=task_status)

    async with trio.open_nursery() as nursery:
        for node in NODES:
            await nursery.start(run, cluster.runtimes[node], scopes[node])
        with trio.fail_after(WAIT_S):
            leader = await _agreed_leader(cluster, G)
            await _until(lambda: all(events and events[-1] == (G, leader)
                                     for events in cluster.leader_events.values()))
            target = sorted(set(NODES) - {leader})[0]
            asker = sorted(set(NODES) - {leader, target})[0]
            assert cluster.runtimes[asker].transfer_leadership(G, target)  # forwarded by a follower
            await _until(lambda: all(events[-1] == (G, target) for events in cluster.leader_events.values()))
            scopes[target].cancel()  # the leader's node stops: the others lose it, then elect another
            survivors = sorted(set(NODES) - {target})
            seen = {node: len(cluster.leader_events[node]) for node in survivors}
            await _until(lambda: all((G, None) in cluster.leader_events[node][seen[node]:] for node in survivors))
            await _until(lambda: all(cluster.leader_events[node][-1][1] not in (None, target) for node in survivors))
            successor = await _agreed_leader(cluster, G, survivors)
            await _until(lambda: all(cluster.leader_events[node][-1] == (G, successor) for node in survivors))
        nursery.cancel_scope.cancel()
    for node, events in cluster.leader_events.items():
        assert events[0] == (G, leader), node  # the first report is the first known leader, never None first
        for earlier, later in itertools.pairwise(events):
            assert earlier != later  # only changes are reported


async def test_membership_changes_forwarded_from_a_follower(tmp_path: pathlib.Path) -> None:
    two = Membership(frozenset({N1, N2}))
    cluster = _build(tmp_path, {})
    for node in (N1, N2):
        cluster.runtimes[node].add_group(G, two)
    async with _running(cluster):
        leader = await _agreed_leader(cluster, G, [N1, N2])
        follower = ({N1, N2} - {leader}).pop()
        assert cluster.runtimes[leader].propose(G, b"before")
        await _until(lambda: _everyone_applied(cluster, G, [b"before"], [N1, N2]))
        # n3 joins as a learner (it starts with the membership it is joining), then becomes a voter
        cluster.runtimes[N3].add_group(G, Membership(two.voters, frozenset({N3})))
        assert cluster.runtimes[follower].change_membership(G, ConfChange(ConfOp.ADD_LEARNER, N3))
        await _until(lambda: cluster.runtimes[leader].membership_of(G) == Membership(two.voters, frozenset({N3})))
        await _until(lambda: _everyone_applied(cluster, G, [b"before"]))
        promoted = Membership(frozenset(NODES))
        while cluster.runtimes[leader].membership_of(G) != promoted:  # refused until caught up: retry
            cluster.runtimes[follower].change_membership(G, ConfChange(ConfOp.PROMOTE, N3))
            await trio.sleep(0.1)
        await _until(lambda: all(runtime.membership_of(G) == promoted for runtime in cluster.runtimes.values()))
        status = cluster.runtimes[leader].group_status(G)
        assert status["voters"] == sorted(NODES) and status["learners"] == []
        assert status["leader"] == leader and set(status["match"]) == set(NODES)
        assert cluster.runtimes[N3].propose(G, b"after")
        await _until(lambda: _everyone_applied(cluster, G, [b"after"]))


async def test_group_status_and_connected_peers(tmp_path: pathlib.Path) -> None:
    cluster = _build(tmp_path, {G: ALL_VOTERS})
    async with _running(cluster):
        leader = await _agreed_leader(cluster, G)
        assert cluster.runtimes[leader].propose(G, b"x")
        await _until(lambda: _everyone_applied(cluster, G, [b"x"]))
        await _until(lambda: all(runtime.connected_peers() == frozenset(NODES) - {node}
                                 for node, runtime in cluster.runtimes.items()))
        for node, runtime in cluster.runtimes.items():
            status = runtime.group_status(G)
            assert status["leader"] == leader and status["voters"] == sorted(NODES)
            assert status["applied"] >= 2 and status["commit"] >= status["applied"]
            assert status["last_index"] >= status["commit"]
            assert ("match" in status) == (node == leader)
            assert status["role"] == ("leader" if node == leader else "follower")
    appends = [json.loads(line) for path in (tmp_path / leader / "telemetry").glob("*.jsonl")
               for line in path.read_text().splitlines()]
    appends = [record for record in appends if record["type"] == "append"]
    assert appends and all(record["entries_term"] == record["term"] for record in appends)
