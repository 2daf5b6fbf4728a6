"""Does a mirrored queue's log stay bounded? A long publish/consume run on a real 3-node cluster, sampled.

What it is for: showing (not asserting: the figures depend on the machine) that with log trimming
(`mirror_trim_records`, node/runtime/cluster/mirror_groups.py) each replica's files and each node's memory stay flat
however many messages pass through a mirrored queue, where without it they grow with every command.

How it works: starts a 3-node cluster (the integration tests' `ClusterProcess`, free ports, behind HAProxy) with
`mirror_trim_records = N`, sets an `ha-mode: exactly 3` policy, then in rounds publishes `--batch` persistent
messages with confirms and consumes them with acks through pika; after each round prints, per node, the bytes
under `<data_dir>/mirror/` (log, snapshot, epochs, HW checkpoint), the records in its log file
(length-prefixed, as storage.py writes them) and the node process's resident memory (VmRSS). Stops the cluster at the end.

    python -m bench.mirror_log_bounded [--rounds 20] [--batch 500] [--trim-records 2000]
"""

from __future__ import annotations

import argparse
import pathlib
import tempfile
import time

import pika

from tests.integration.clusterproc import ClusterProcess
from tests.policies.test_policy_real_node import http

QUEUE = "ha.bounded"
POLICY = {"pattern": "^ha\\.", "apply-to": "queues", "definition": {"ha-mode": "exactly", "ha-params": 3}}


def _log_records(path: pathlib.Path) -> int:
    """Records in a replica's `log` file (4-byte length, 4-byte CRC, body: cluster/mirror_queues/runtime/storage.py;
    the bench does not import the broker's packages)."""
    data = path.read_bytes() if path.exists() else b""
    count = position = 0
    while position + 8 <= len(data):
        position += 8 + int.from_bytes(data[position:position + 4], "big")
        count += 1
    return count


def _rss_kib(pid: int) -> int:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _sample(cluster: ClusterProcess) -> str:
    parts = []
    for node in cluster.nodes:
        mirror = node.data_dir / "mirror"
        size = sum(p.stat().st_size for p in mirror.rglob("*") if p.is_file()) if mirror.exists() else 0
        records = sum(_log_records(d / "log") for d in mirror.iterdir()) if mirror.exists() else 0
        rss = _rss_kib(node.process.pid) if node.process is not None else 0
        parts.append(f"{node.plan.name}: {size / 1024:8.1f} KiB {records:6d} rec {rss / 1024:6.1f} MiB")
    return " | ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--trim-records", type=int, default=2000)
    args = parser.parse_args()
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="mirror-bounded-"))
    cluster = ClusterProcess(workdir, extra_config=f"mirror_trim_records = {args.trim_records}\n")
    cluster.start()
    try:
        status, _ = http(cluster.nodes[0].plan.management_port, "PUT", "/api/policies/%2F/ha", POLICY)
        assert status in (201, 204), status
        time.sleep(1.0)
        params = pika.ConnectionParameters(cluster.host, cluster.port, socket_timeout=10)
        with pika.BlockingConnection(params) as conn:
            ch = conn.channel()
            ch.confirm_delivery()
            ch.queue_declare(QUEUE, durable=True)
            body = b"x" * 512
            print(f"trim every {args.trim_records} records; {args.batch} messages a round (512-byte bodies)")
            started = time.monotonic()
            for round_no in range(1, args.rounds + 1):
                for _ in range(args.batch):
                    ch.basic_publish("", QUEUE, body, pika.BasicProperties(delivery_mode=2))
                got = 0
                while got < args.batch:
                    method, _props, _body = ch.basic_get(QUEUE)
                    if method is None:
                        conn.sleep(0.05)
                        continue
                    ch.basic_ack(method.delivery_tag)
                    got += 1
                print(f"round {round_no:3d} ({round_no * args.batch:6d} msgs, {time.monotonic() - started:6.1f} s)"
                      f"  {_sample(cluster)}", flush=True)
            ch.queue_delete(QUEUE)
    finally:
        cluster.shutdown()
        print(f"(cluster stopped; files under {workdir})")


if __name__ == "__main__":
    main()
