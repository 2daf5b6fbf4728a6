"""Committed entries per second, fsync on, for G groups of 3 replicas: 3 processes on loopback.

    .venv/bin/python -m bench.micro.raft_throughput --groups 1 --seconds 10
    .venv/bin/python -m bench.micro.raft_throughput --groups 1000 --seconds 20

The parent picks three ports and starts three children (`--child n1` ...), each a RaftNodeRuntime over a NodeLog
in a temporary directory (group commit: one fsync per Ready cycle for every group). Every node keeps up to
`--window` proposals of `--payload-bytes` outstanding in each group it leads. After `--warmup` seconds each child
counts the entries it applies for `--seconds` and prints one JSON line; the parent reports committed entries/s
(the entries applied on a node: every committed entry of every group is applied on every replica).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import socket
import subprocess
import sys
import tempfile
import time

import trio

from cluster.raft.core.multiraft import MultiRaftConfig
from cluster.raft.core.raft import RaftConfig
from cluster.raft.core.types import Entry, GroupId, Membership, NodeId
from cluster.raft.runtime.node import RaftNodeRuntime

NODES = [NodeId("n1"), NodeId("n2"), NodeId("n3")]


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


async def _child(args: argparse.Namespace) -> dict[str, object]:
    node = NodeId(args.child)
    ports = dict(zip(NODES, (int(p) for p in args.ports.split(",")), strict=True))
    groups = [GroupId(f"%2F/q{i}") for i in range(args.groups)]
    outstanding = dict.fromkeys(groups, 0)
    counters = {"applied": 0, "measuring": 0}
    prefix = node.encode() + b":"

    def on_apply(group: GroupId, entry: Entry) -> None:
        if not entry.data:
            return
        if counters["measuring"]:
            counters["applied"] += 1
        if entry.data.startswith(prefix):
            outstanding[group] = max(0, outstanding[group] - 1)

    config = MultiRaftConfig(raft=RaftConfig(election_ticks=20, heartbeat_ticks=2, quiesce=True),
                             node_heartbeat_ticks=4, node_timeout_ticks=40)
    peers = {peer: ("127.0.0.1", port) for peer, port in ports.items() if peer != node}
    runtime = RaftNodeRuntime(node, pathlib.Path(args.dir) / node, ("127.0.0.1", ports[node]), peers,
                              b"benchmark-secret", on_apply, config, tick_ms=args.tick_ms)
    for group in groups:
        runtime.add_group(group, Membership(frozenset(NODES)))
    payload = b"x" * args.payload_bytes
    async with trio.open_nursery() as nursery:
        await nursery.start(runtime.run)
        deadline = trio.current_time() + args.warmup + args.seconds
        measure_from = trio.current_time() + args.warmup
        started = 0.0
        while trio.current_time() < deadline:
            if not counters["measuring"] and trio.current_time() >= measure_from:
                counters["measuring"] = 1
                started = time.perf_counter()
            for group in groups:
                if runtime.is_leader(group):
                    while outstanding[group] < args.window:
                        runtime.propose(group, prefix + payload)
                        outstanding[group] += 1
            await trio.sleep(0.001)
        elapsed = time.perf_counter() - started
        nursery.cancel_scope.cancel()
    leaders = sum(1 for group in groups if runtime.is_leader(group))
    assert runtime.pipeline is not None
    fsyncs = runtime.pipeline.stats  # the Ready pipeline counts the Raft loop's fsyncs
    return {"node": node, "applied": counters["applied"], "seconds": elapsed,
            "fsyncs": fsyncs.fsyncs, "fsync_ms_avg": round(1000 * fsyncs.fsync_seconds / max(1, fsyncs.fsyncs), 2),
            "cycles": runtime.stats.ready_cycles, "leaders": leaders}


def _parent(args: argparse.Namespace) -> None:
    ports = ",".join(str(port) for port in _free_ports(3))
    with tempfile.TemporaryDirectory(prefix="raft-bench-") as directory:
        children = [
            subprocess.Popen(
                [sys.executable, __file__, "--child", node, "--ports", ports, "--dir", directory,
                 "--groups", str(args.groups), "--seconds", str(args.seconds), "--warmup", str(args.warmup),
                 "--window", str(args.window), "--payload-bytes", str(args.payload_bytes),
                 "--tick-ms", str(args.tick_ms)],
                stdout=subprocess.PIPE, text=True)
            for node in NODES
        ]
        results = [json.loads(child.communicate()[0].strip().splitlines()[-1]) for child in children]
    rate = min(result["applied"] / result["seconds"] for result in results)
    summary = {"groups": args.groups, "replicas": 3, "payload_bytes": args.payload_bytes, "window": args.window,
               "committed_entries_per_s": round(rate), "per_node": results}
    print(json.dumps(summary))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--groups", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--window", type=int, default=64, help="outstanding proposals per led group")
    parser.add_argument("--payload-bytes", type=int, default=100)
    parser.add_argument("--tick-ms", type=int, default=50)
    parser.add_argument("--child")
    parser.add_argument("--ports")
    parser.add_argument("--dir")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(trio.run(_child, args)), flush=True)
    else:
        _parent(args)


if __name__ == "__main__":
    main()
