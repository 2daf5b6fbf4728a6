"""Measure metadata apply latency and failover time on 3 real processes (run by hand, not a test).

    .venv/bin/python -m tests.metadata.measure --rounds 5

Failover time = kill -9 of the metadata leader to the first successful apply on a survivor (the apply is issued
right after the kill and retried by the store). Apply latency = one PutVhost round trip through a node's stdin
control channel, durable (fsynced) journal on every node.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from cluster.metadata.model import PutVhost
from tests.metadata.helpers import free_addresses
from tests.metadata.test_processes import NodeProc


def one_round(tmp: Path, applies: int) -> tuple[list[float], float]:
    addrs = free_addresses(3)
    nodes = [NodeProc(f"n{i}", a, [b for b in addrs if b != a], tmp / f"n{i}") for i, a in enumerate(addrs)]
    try:
        for n in nodes:
            n.start()
        for n in nodes:
            n.wait_ready()
        latencies = []
        for i in range(applies):
            t0 = time.monotonic()
            nodes[i % 3].apply(PutVhost(f"v{i}"))
            latencies.append((time.monotonic() - t0) * 1000)
        leader_addr = nodes[0].request({"op": "status"})["status"]["leader"]
        leader = next(n for n in nodes if n.address == leader_addr)
        survivor = next(n for n in nodes if n is not leader)
        t0 = time.monotonic()
        leader.kill9()
        survivor.apply(PutVhost("after-kill"))
        return latencies, (time.monotonic() - t0) * 1000
    finally:
        for n in nodes:
            n.stop()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--applies", type=int, default=30)
    a = p.parse_args()
    lat: list[float] = []
    failovers: list[float] = []
    with tempfile.TemporaryDirectory() as d:
        for r in range(a.rounds):
            round_lat, failover = one_round(Path(d) / f"r{r}", a.applies)
            lat += round_lat
            failovers.append(failover)
    lat.sort()
    print(f"apply latency ms: median {statistics.median(lat):.1f} p90 {lat[int(len(lat) * 0.9)]:.1f} "
          f"max {lat[-1]:.1f} (n={len(lat)})")
    print(f"failover ms (kill -9 leader -> first applied command): {[round(f) for f in failovers]} "
          f"median {statistics.median(failovers):.0f}")


if __name__ == "__main__":
    main()
