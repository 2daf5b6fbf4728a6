"""Publish-to-delivery balance on a running 3-node cluster (issue 16, credit flow): confirmed/s, delivered/s and
end-to-end latency (publish to delivery) p50/p99 for one publisher and one consumer on a 3-replica quorum queue.

    raftmq cluster up --detach --data-dir /tmp/c --base-port 6500 --haproxy-port 6599
    python -m bench.micro.cluster_credit_flow --base-port 6500 --layout leader --seconds 8
    raftmq cluster down --data-dir /tmp/c

A fresh quorum queue is declared through rmq1 (node i listens on base port + i, management on that + 10000); once
its leader and three members show in rmq1's /api/queues, the clients are placed relative to that leader:
`leader` (publisher and consumer on the leader's node), `follower` (both on one follower), `followers` (publisher
on one follower, consumer on the other), `pubF-consL` (publisher on a follower, consumer on the leader's node).
The clients are `bench.loadgen`'s raw-socket workers in their own processes: 100 B persistent messages, a confirm
window of `--window` (500), consumer prefetch 1000 with a multiple ack after each read; every 4th delivery's
latency is sampled from the send time in its body. Prints one line per run; the queue is deleted afterwards.
"""

from __future__ import annotations

import argparse
import base64
import json
import time
import urllib.request
from typing import Any

from bench.client import Endpoint
from bench.loadgen import ConsumerSpec, PublisherSpec, PublishTarget
from bench.processes import run_workers
from bench.stats import summarize_latencies_ns
from bench.workloads import Topology, declare, delete

LAYOUTS = ("leader", "follower", "followers", "pubF-consL")


def _api_queue(management_port: int, queue: str) -> dict[str, Any]:
    request = urllib.request.Request(f"http://127.0.0.1:{management_port}/api/queues/%2F/{queue}")
    request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(request, timeout=5) as reply:
        row: dict[str, Any] = json.load(reply)
    return row


def _leader(base_port: int, queue: str) -> str:
    for _ in range(120):
        try:
            row = _api_queue(base_port + 10_001, queue)
            if row.get("leader") and len(row.get("members", [])) == 3:
                return str(row["leader"])
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"no leader with 3 members for {queue}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-port", type=int, default=5672)
    parser.add_argument("--layout", choices=LAYOUTS, default="leader")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--window", type=int, default=500)
    args = parser.parse_args()
    nodes = {f"rmq{i}": Endpoint("127.0.0.1", args.base_port + i) for i in (1, 2, 3)}
    queue = f"credit-{args.layout}-{int(time.time() * 1000) % 10**8}"
    topology = Topology((queue,), {"x-queue-type": "quorum"})
    declare(nodes["rmq1"], topology)
    try:
        leader = _leader(args.base_port, queue)
        followers = [name for name in nodes if name != leader]
        publisher, consumer = {
            "leader": (leader, leader), "follower": (followers[0], followers[0]),
            "followers": (followers[0], followers[1]), "pubF-consL": (followers[0], leader),
        }[args.layout]
        specs: list[PublisherSpec | ConsumerSpec] = [ConsumerSpec(nodes[consumer], (queue,), prefetch=1000, latency_sample_every=4),
                 PublisherSpec(nodes[publisher], (PublishTarget("", queue),), 100, args.window, 64)]
        results = run_workers(specs, args.warmup, args.seconds)
        for result in results:
            if result.error:
                print("error:", result.error)
        pub = next(r for r in results if r.role == "publisher")
        con = next(r for r in results if r.role == "consumer")
        e2e = summarize_latencies_ns(con.latencies_ns)  # nearest rank, as raftmq bench
        p50, p99 = (float("nan") if v is None else v for v in (e2e.p50_ms, e2e.p99_ms))
        confirmed_s = pub.confirmed / pub.measured_s if pub.measured_s else 0.0
        delivered_s = con.delivered / con.measured_s if con.measured_s else 0.0
        print(f"{args.layout:11s} leader={leader} publisher={publisher} consumer={consumer} "
              f"confirmed/s={confirmed_s:8.0f} delivered/s={delivered_s:8.0f} "
              f"ratio={con.delivered / max(1, pub.confirmed):.3f} e2e p50={p50:7.1f} ms "
              f"p99={p99:7.1f} ms", flush=True)
    finally:
        delete(nodes["rmq1"], topology)


if __name__ == "__main__":
    main()
