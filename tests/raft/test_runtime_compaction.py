"""Automatic compaction in the runtime: snapshots from the host's state machine bound a group's files on disk, a
restarted node restores from its snapshot, and a node that missed the compacted entries catches up by snapshot."""

from __future__ import annotations

import hashlib
import pathlib

import trio

from cluster.raft.core.multiraft import MultiRaftConfig
from cluster.raft.core.raft import RaftConfig
from cluster.raft.core.types import Entry, GroupId, Membership, NodeId
from cluster.raft.runtime.compaction import CompactionConfig
from cluster.raft.runtime.node import RaftNodeRuntime
from cluster.raft.runtime.storage import stream_name
from tests.raft.test_runtime_cluster import _free_ports

NODES = [NodeId("n1"), NodeId("n2"), NodeId("n3")]
G = GroupId("%2F/compacted")
CONFIG = MultiRaftConfig(raft=RaftConfig(election_ticks=10, quiesce=True), node_heartbeat_ticks=2,
                         node_timeout_ticks=10)
PAYLOAD_BYTES = 1000
ENTRIES = 150


class Chain:
    """A tiny state machine: how many commands were applied, and a hash chained over them."""

    def __init__(self) -> None:
        self.count = 0
        self.digest = b""
        self.restored: list[bytes] = []

    def on_apply(self, group: GroupId, entry: Entry) -> None:
        if entry.data:
            self.count += 1
            self.digest = hashlib.sha256(self.digest + entry.data).digest()

    def snapshot(self, group: GroupId) -> bytes:
        return self.count.to_bytes(8, "big") + self.digest

    def restore(self, group: GroupId, data: bytes) -> None:
        self.restored.append(data)
        self.count, self.digest = (int.from_bytes(data[:8], "big"), data[8:]) if data else (0, b"")


def _stream_bytes(data_dir: pathlib.Path) -> int:
    """Bytes in the group's NodeLog stream directory (segments, indexes, snapshot)."""
    for directory in (data_dir / "streams").iterdir():
        if (directory / "stream.name").read_bytes() == stream_name(G).encode():
            return sum(path.stat().st_size for path in directory.iterdir())
    raise AssertionError("no stream directory")


def _runtimes(tmp_path: pathlib.Path, ports: dict[NodeId, int], hosts: dict[NodeId, Chain],
              nodes: list[NodeId]) -> list[RaftNodeRuntime]:
    runtimes = []
    for node in nodes:
        peers = {peer: ("127.0.0.1", port) for peer, port in ports.items() if peer != node}
        runtime = RaftNodeRuntime(node, tmp_path / node, ("127.0.0.1", ports[node]), peers, b"k", hosts[node].on_apply,
                                  CONFIG, tick_ms=10, telemetry=False, snapshots=hosts[node],
                                  compaction=CompactionConfig(entries_max=20))
        runtime.add_group(G, Membership(frozenset(NODES)))
        runtimes.append(runtime)
    return runtimes


async def _propose(runtimes: list[RaftNodeRuntime], hosts: dict[NodeId, Chain], count: int, tag: str) -> None:
    nodes = [runtime.node_id for runtime in runtimes]
    target = hosts[nodes[0]].count + count
    proposed = 0
    while proposed < count:
        for runtime in runtimes:
            data = f"{tag}{proposed:06}".encode().ljust(PAYLOAD_BYTES, b".")
            if runtime.is_leader(G) and proposed < count and runtime.propose(G, data):
                proposed += 1
        await trio.sleep(0.002)
    while not all(hosts[node].count >= target for node in nodes):
        await trio.sleep(0.02)


async def test_compaction_bounds_the_stream_and_a_restart_restores_from_the_snapshot(tmp_path: pathlib.Path) -> None:
    ports = dict(zip(NODES, _free_ports(3), strict=True))
    hosts = {node: Chain() for node in NODES}
    runtimes = _runtimes(tmp_path, ports, hosts, NODES)
    async with trio.open_nursery() as nursery:
        for runtime in runtimes:
            await nursery.start(runtime.run)
        with trio.fail_after(60):
            await _propose(runtimes, hosts, ENTRIES, "a")
        nursery.cancel_scope.cancel()
    written = ENTRIES * PAYLOAD_BYTES
    for runtime in runtimes:
        assert runtime.stats.compactions >= 2
        assert runtime.storage is not None and runtime.storage.log.snapshot_offset(stream_name(G)) >= 0
        # segments behind the snapshot are gone: what is left is the snapshot plus fewer than ~2 thresholds
        assert _stream_bytes(runtime.data_dir) < written // 3
    digests = {hosts[node].digest for node in NODES}
    assert len(digests) == 1 and all(hosts[node].count == ENTRIES for node in NODES)

    # restart every node with an empty state machine: each restores its snapshot, then replays what follows
    fresh = {node: Chain() for node in NODES}
    runtimes = _runtimes(tmp_path, ports, fresh, NODES)
    async with trio.open_nursery() as nursery:
        for runtime in runtimes:
            await nursery.start(runtime.run)
        with trio.fail_after(60):
            while not all(fresh[node].count >= ENTRIES for node in NODES):
                await trio.sleep(0.02)
            await _propose(runtimes, fresh, 10, "b")
        nursery.cancel_scope.cancel()
    for node in NODES:
        assert fresh[node].restored and fresh[node].restored[0] != b""  # started from the stored snapshot
        assert int.from_bytes(fresh[node].restored[0][:8], "big") > 0
    assert len({fresh[node].digest for node in NODES}) == 1 and fresh["n1"].count == ENTRIES + 10


async def test_a_node_behind_the_snapshot_catches_up_by_install_snapshot(tmp_path: pathlib.Path) -> None:
    ports = dict(zip(NODES, _free_ports(3), strict=True))
    hosts = {node: Chain() for node in NODES}
    pair = _runtimes(tmp_path, ports, hosts, NODES[:2])  # n3 is down while n1 and n2 commit and compact
    async with trio.open_nursery() as nursery:
        for runtime in pair:
            await nursery.start(runtime.run)
        with trio.fail_after(60):
            await _propose(pair, hosts, 60, "a")
            while not all(runtime.stats.compactions > 0 for runtime in pair):
                await trio.sleep(0.02)
            (late,) = _runtimes(tmp_path, ports, hosts, NODES[2:])
            await nursery.start(late.run)
            while hosts["n3"].count < 60:
                await trio.sleep(0.02)
        nursery.cancel_scope.cancel()
    assert hosts["n3"].restored  # it got the state machine from a snapshot, not by replaying every entry
    assert hosts["n3"].digest == hosts["n1"].digest == hosts["n2"].digest
