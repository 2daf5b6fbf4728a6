"""Measurement, not a test: propose-to-apply latency of a local proposal (on the leader) vs a forwarded one (on a
follower), each timed until the proposing node's own replica applies it. Three runtimes on loopback, real fsync,
one proposal in flight at a time. Skipped unless RAFTMQ_MEASURE=1; prints median and p99 (see docs/raft.md).

    RAFTMQ_MEASURE=1 .venv/bin/pytest tests/raft/test_runtime_forward_latency.py -s
"""

from __future__ import annotations

import os
import pathlib
import statistics

import pytest
import trio

from cluster.raft.core.types import EntryKind, GroupId, Membership, NodeId
from cluster.raft.runtime.node import RaftNodeRuntime
from tests.raft.test_runtime_cluster import CONFIG, NODES, _free_ports

SAMPLES = int(os.environ.get("RAFTMQ_MEASURE_SAMPLES", "300"))
G = GroupId("%2F/latency")


@pytest.mark.skipif(os.environ.get("RAFTMQ_MEASURE") != "1", reason="measurement; set RAFTMQ_MEASURE=1")
async def test_measure_forwarded_vs_local_propose_to_apply(tmp_path: pathlib.Path) -> None:
    ports = dict(zip(NODES, _free_ports(3), strict=True))
    applied_at: dict[NodeId, dict[bytes, float]] = {node: {} for node in NODES}
    waiting: dict[tuple[NodeId, bytes], trio.Event] = {}
    runtimes: dict[NodeId, RaftNodeRuntime] = {}
    for node in NODES:
        peers = {peer: ("127.0.0.1", port) for peer, port in ports.items() if peer != node}

        def on_apply(group: GroupId, entry: object, node: NodeId = node) -> None:
            data = getattr(entry, "data", b"")
            if getattr(entry, "kind", None) is EntryKind.NORMAL and data:
                applied_at[node][data] = trio.current_time()
                event = waiting.pop((node, data), None)
                if event is not None:
                    event.set()

        runtime = RaftNodeRuntime(node, tmp_path / node, ("127.0.0.1", ports[node]), peers, b"k", on_apply,
                                  CONFIG, tick_ms=10)
        runtime.add_group(G, Membership(frozenset(NODES)))
        runtimes[node] = runtime

    async def sample(node: NodeId, label: str) -> list[float]:
        latencies = []
        for n in range(SAMPLES):
            data = f"{label}:{n}".encode()
            done = waiting[(node, data)] = trio.Event()
            started = trio.current_time()
            assert runtimes[node].propose(G, data)
            await done.wait()
            latencies.append((applied_at[node][data] - started) * 1000)
        return latencies

    async with trio.open_nursery() as nursery:
        for runtime in runtimes.values():
            await nursery.start(runtime.run)
        with trio.fail_after(240):
            while not any(runtime.is_leader(G) for runtime in runtimes.values()):
                await trio.sleep(0.01)
            leader = next(node for node, runtime in runtimes.items() if runtime.is_leader(G))
            follower = next(node for node in NODES if node != leader)
            while runtimes[follower].leader_of(G) != leader:
                await trio.sleep(0.01)
            await sample(leader, "warm")
            local = await sample(leader, "local")
            forwarded = await sample(follower, "forwarded")
        nursery.cancel_scope.cancel()
    for label, values in (("local", local), ("forwarded", forwarded)):
        ordered = sorted(values)
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        print(f"{label}: n={len(values)} median={statistics.median(values):.2f} ms p99={p99:.2f} ms")
