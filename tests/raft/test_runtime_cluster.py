"""Three RaftNodeRuntimes on loopback (one trio process): groups elect, replicate and apply over real TCP."""

from __future__ import annotations

import json
import pathlib
import socket

import trio

from cluster.raft.core.multiraft import MultiRaftConfig, NodeBatch
from cluster.raft.core.raft import RaftConfig
from cluster.raft.core.types import Entry, GroupId, Membership, NodeId
from cluster.raft.runtime.codec import decode_batch, encode_batch
from cluster.raft.runtime.node import RaftNodeRuntime
from cluster.raft.runtime.transport import Transport

NODES = [NodeId("n1"), NodeId("n2"), NodeId("n3")]
GROUPS = [GroupId(f"%2F/q{i}") for i in range(3)]
CONFIG = MultiRaftConfig(raft=RaftConfig(election_ticks=10, quiesce=True), node_heartbeat_ticks=2,
                         node_timeout_ticks=10)


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


def _cluster(tmp_path: pathlib.Path, secrets: list[bytes]) -> tuple[list[RaftNodeRuntime], dict[str, list[bytes]]]:
    ports = dict(zip(NODES, _free_ports(3), strict=True))
    applied: dict[str, list[bytes]] = {node: [] for node in NODES}
    runtimes = []
    for node, secret in zip(NODES, secrets, strict=True):
        peers = {peer: ("127.0.0.1", port) for peer, port in ports.items() if peer != node}

        def on_apply(group: GroupId, entry: Entry, node: str = node) -> None:
            if entry.data:
                applied[node].append(entry.data)

        runtime = RaftNodeRuntime(node, tmp_path / node, ("127.0.0.1", ports[node]), peers, secret, on_apply,
                                  CONFIG, tick_ms=10)
        for group in GROUPS:
            runtime.add_group(group, Membership(frozenset(NODES)))
        runtimes.append(runtime)
    return runtimes, applied


async def test_three_nodes_replicate_every_group_over_tcp(tmp_path: pathlib.Path) -> None:
    runtimes, applied = _cluster(tmp_path, [b"s3cret"] * 3)
    async with trio.open_nursery() as nursery:
        for runtime in runtimes:
            await nursery.start(runtime.run)
        with trio.fail_after(60):
            proposed = 0
            while proposed < 30:
                for group in GROUPS:
                    for runtime in runtimes:
                        if runtime.is_leader(group):
                            runtime.propose(group, f"{group}:{proposed}".encode())
                            proposed += 1
                await trio.sleep(0.02)
            while not all(len(applied[node]) >= 30 for node in NODES):
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    assert sorted(applied["n1"]) == sorted(applied["n2"]) == sorted(applied["n3"])
    telemetry_lines = [line for path in (tmp_path / "n1" / "telemetry").glob("*.jsonl")
                       for line in path.read_text().splitlines()]
    assert {json.loads(line)["type"] for line in telemetry_lines} == {"state", "append", "commit"}
    for runtime in runtimes:
        assert runtime.transport.stats.auth_failures == 0


async def test_a_node_with_the_wrong_secret_is_refused(tmp_path: pathlib.Path) -> None:
    runtimes, _ = _cluster(tmp_path, [b"right", b"right", b"wrong"])
    async with trio.open_nursery() as nursery:
        for runtime in runtimes:
            await nursery.start(runtime.run)
        with trio.fail_after(30):
            while runtimes[0].transport.stats.auth_failures == 0:
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    assert runtimes[2].transport.stats.batches_received == 0


def test_batches_round_trip_through_the_codec() -> None:
    from cluster.raft.core.types import Append, Index, Term

    entries = (Entry(Term(2), Index(5), b"payload"),)
    batch = NodeBatch(NODES[0], NODES[1], 7, ((GROUPS[0], Append(NODES[0], NODES[1], Term(2), Index(4), Term(1),
                                                                 entries, Index(3))),))
    assert decode_batch(encode_batch(batch)) == batch


def test_transport_drops_when_a_peer_queue_is_full() -> None:
    transport = Transport(NODES[0], {NODES[1]: ("127.0.0.1", 1)}, b"s", lambda batch: None, queue_batches_max=2)
    for _ in range(5):
        transport.send(NodeBatch(NODES[0], NODES[1], 0, ()))
    assert transport.stats.batches_dropped == 3
