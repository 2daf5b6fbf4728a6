"""Three RaftNodeRuntimes on loopback (one trio process): groups elect, replicate and apply over real TCP."""

from __future__ import annotations

import json
import pathlib
import socket

import cbor2
import trio

from cluster.authlink.handshake import CHALLENGE_BYTES, RAFT_LINK, FrameReader, frame
from cluster.raft.core.multiraft import MultiRaftConfig, NodeBatch
from cluster.raft.core.raft import RaftConfig
from cluster.raft.core.types import Entry, GroupId, Membership, NodeId
from cluster.raft.runtime.codec import decode_frame, encode_batch
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


def _one_connection_per_pair(runtimes: list[RaftNodeRuntime]) -> bool:
    """Every node holds one connection to each peer, and only the smaller id of a pair dialled it."""
    for runtime in runtimes:
        others = {other.node_id for other in runtimes} - {runtime.node_id}
        if runtime.transport.connected_peers() != others:
            return False
    return True


async def test_one_connection_per_pair_survives_killed_connections(tmp_path: pathlib.Path) -> None:
    runtimes, applied = _cluster(tmp_path, [b"s3cret"] * 3)
    n1, n2, n3 = runtimes

    async def propose_and_wait(count: int) -> None:
        target = len(applied["n1"]) + count
        proposed = 0
        while proposed < count:
            for group in GROUPS:
                for runtime in runtimes:
                    if runtime.is_leader(group) and proposed < count:
                        runtime.propose(group, f"{group}:{target}:{proposed}".encode())
                        proposed += 1
            await trio.sleep(0.02)
        while not all(len(applied[node]) >= target for node in NODES):
            await trio.sleep(0.05)

    async with trio.open_nursery() as nursery:
        for runtime in runtimes:
            await nursery.start(runtime.run)
        with trio.fail_after(60):
            await propose_and_wait(9)
            while not _one_connection_per_pair(runtimes):
                await trio.sleep(0.02)
            # n1 dials n2 and n3, n2 dials n3, n3 dials nobody: three connections for three pairs
            assert [r.transport.stats.connections_dialed for r in runtimes] == [2, 1, 0]
            assert [r.transport.stats.connections_accepted for r in runtimes] == [0, 1, 2]
            before = {r.node_id: dict(r.transport.stats.received_from) for r in runtimes}
            assert n2.transport.abort(NodeId("n1"))  # killed on the listener's side: the dialer notices, redials
            assert n1.transport.abort(NodeId("n3"))  # killed on the dialer's side
            while n1.transport.stats.connections_dialed < 4 or not _one_connection_per_pair(runtimes):
                await trio.sleep(0.02)
            await propose_and_wait(9)
        nursery.cancel_scope.cancel()
    assert n1.transport.stats.connections_dialed == 4 and n2.transport.stats.connections_dialed == 1
    assert n3.transport.stats.connections_dialed == 0
    # traffic flowed both ways over the re-established connections
    for receiver, sender in [(n1, "n2"), (n2, "n1"), (n1, "n3"), (n3, "n1")]:
        assert receiver.transport.stats.received_from[NodeId(sender)] > before[receiver.node_id][NodeId(sender)]
    assert sorted(applied["n1"]) == sorted(applied["n2"]) == sorted(applied["n3"])


async def test_a_node_with_the_wrong_secret_is_refused(tmp_path: pathlib.Path) -> None:
    runtimes, _ = _cluster(tmp_path, [b"right", b"right", b"wrong"])
    async with trio.open_nursery() as nursery:
        for runtime in runtimes:
            await nursery.start(runtime.run)
        with trio.fail_after(30):
            while runtimes[2].transport.stats.auth_failures < 2:  # n3 refuses both of its dialers
                await trio.sleep(0.05)
            while NodeId("n2") not in runtimes[0].transport.connected_peers():
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    assert runtimes[2].transport.stats.batches_received == 0
    assert runtimes[2].transport.connected_peers() == frozenset()
    assert NodeId("n3") not in runtimes[0].transport.stats.received_from
    assert NodeId("n3") not in runtimes[1].transport.stats.received_from


async def test_a_new_connection_from_the_same_peer_replaces_the_old_one() -> None:
    port_a, port_b = _free_ports(2)
    received: dict[str, list[NodeBatch]] = {"n1": [], "n2": []}
    a = Transport(NODES[0], {NODES[1]: ("127.0.0.1", port_b)}, b"k", received["n1"].append)
    b = Transport(NODES[1], {NODES[0]: ("127.0.0.1", port_a)}, b"k", received["n2"].append)
    async with trio.open_nursery() as nursery:
        await nursery.start(a.serve, "127.0.0.1", port_a)
        await nursery.start(b.serve, "127.0.0.1", port_b)
        with trio.fail_after(30):
            while NODES[0] not in b.connected_peers():
                await trio.sleep(0.01)
            # a second authenticated connection "from n1" (as after a half-open link): it replaces the first,
            # so the real n1 loses its connection and redials, and its new connection replaces this one in turn
            stream = await trio.open_tcp_stream("127.0.0.1", port_b)
            reader = FrameReader(stream)
            challenge = await reader.read()
            assert challenge is not None
            await stream.send_all(frame(cbor2.dumps([NODES[0], RAFT_LINK.proof(b"k", b"dial", challenge, NODES[0]),
                                                     b"c" * CHALLENGE_BYTES])))
            assert await reader.read() is not None  # b's proof: accepted
            while b.stats.connections_replaced < 2:
                await trio.sleep(0.01)
            assert await reader.read() is None  # replaced: b closed it
            await stream.aclose()
            while NODES[1] not in a.connected_peers() or NODES[0] not in b.connected_peers():
                await trio.sleep(0.01)
            a.send(NodeBatch(NODES[0], NODES[1], 0, ()))
            b.send(NodeBatch(NODES[1], NODES[0], 0, ()))
            while not (received["n1"] and received["n2"]):
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert a.stats.connections_dialed == 2 and b.stats.connections_dialed == 0
    assert b.stats.connections_accepted == 3


def test_batches_round_trip_through_the_codec() -> None:
    from cluster.raft.core.types import Append, Index, Term

    entries = (Entry(Term(2), Index(5), b"payload"),)
    batch = NodeBatch(NODES[0], NODES[1], 7, ((GROUPS[0], Append(NODES[0], NODES[1], Term(2), Index(4), Term(1),
                                                                 entries, Index(3))),))
    assert decode_frame(encode_batch(batch)) == batch


def test_transport_drops_when_a_peer_queue_is_full() -> None:
    transport = Transport(NODES[0], {NODES[1]: ("127.0.0.1", 1)}, b"s", lambda batch: None, queue_batches_max=2)
    for _ in range(5):
        transport.send(NodeBatch(NODES[0], NODES[1], 0, ()))
    assert transport.stats.batches_dropped == 3
