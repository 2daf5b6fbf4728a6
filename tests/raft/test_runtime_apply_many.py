"""Three runtimes over TCP, one of them applying through `on_apply_many`: every node applies every group's
entries in the same order; a burst of proposals on a leader goes out as batches (propose_many)."""

from __future__ import annotations

import pathlib

import trio

from cluster.raft.core.multiraft import MultiRaftConfig
from cluster.raft.core.raft import RaftConfig
from cluster.raft.core.types import Entry, GroupId, Membership, NodeId
from cluster.raft.runtime.node import RaftNodeRuntime
from tests.raft.test_runtime_cluster import _free_ports

NODES = [NodeId("n1"), NodeId("n2"), NodeId("n3")]
GROUPS = [GroupId("g0"), GroupId("g1")]
CONFIG = MultiRaftConfig(raft=RaftConfig(election_ticks=30, quiesce=True), node_heartbeat_ticks=2,
                         node_timeout_ticks=10)
PER_GROUP = 200


async def test_apply_many_sees_every_entry_in_order(tmp_path: pathlib.Path) -> None:
    ports = dict(zip(NODES, _free_ports(3), strict=True))
    applied: dict[NodeId, dict[GroupId, list[bytes]]] = {node: {g: [] for g in GROUPS} for node in NODES}
    batch_sizes: list[int] = []
    runtimes = []
    for node in NODES:
        peers = {peer: ("127.0.0.1", port) for peer, port in ports.items() if peer != node}

        def on_apply(group: GroupId, entry: Entry, node: NodeId = node) -> None:
            assert node != NODES[0], "n1 applies through on_apply_many only"
            if entry.data:
                applied[node][group].append(entry.data)

        def on_apply_many(group: GroupId, entries: tuple[Entry, ...], node: NodeId = node) -> None:
            batch_sizes.append(len(entries))
            applied[node][group].extend(entry.data for entry in entries if entry.data)

        runtime = RaftNodeRuntime(node, tmp_path / node, ("127.0.0.1", ports[node]), peers, b"s", on_apply,
                                  CONFIG, tick_ms=10, on_apply_many=on_apply_many if node == NODES[0] else None)
        for group in GROUPS:
            runtime.add_group(group, Membership(frozenset(NODES)))
        runtimes.append(runtime)
    async with trio.open_nursery() as nursery:
        for runtime in runtimes:
            await nursery.start(runtime.run)
        with trio.fail_after(120):
            while not all(set(applied[node][g]) >= _expected(g) for node in NODES for g in GROUPS):
                proposed = False
                for group in GROUPS:  # a burst per group (the router proposes it as batches); again if lost
                    leaders = [runtime for runtime in runtimes if runtime.is_leader(group)]
                    missing = sorted(_expected(group) - set(applied[NODES[0]][group]))
                    for data in missing if leaders else []:
                        assert leaders[0].propose(group, data)
                        proposed = True
                with trio.move_on_after(3 if proposed else 0.05):
                    while not all(set(applied[node][g]) >= _expected(g) for node in NODES for g in GROUPS):
                        await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    for group in GROUPS:  # every node applied the same sequence (a re-proposal may repeat an entry)
        shortest = min(len(applied[node][group]) for node in NODES)
        assert applied[NODES[0]][group][:shortest] == applied[NODES[1]][group][:shortest] \
            == applied[NODES[2]][group][:shortest]
    assert sum(batch_sizes) >= len(GROUPS) * PER_GROUP
    assert runtimes[0].stats.applied_entries == sum(batch_sizes)


def _expected(group: GroupId) -> set[bytes]:
    return {f"{group}:{number:03}".encode() for number in range(PER_GROUP)}
