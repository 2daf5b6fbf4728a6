"""`raftmq bench memory`: resident memory of a node holding a backlog of N messages of S bytes.

How it works: start one `raftmq node` (temporary data directory), let it settle, read its resident set size
(VmRSS from /proc/<pid>/status) empty, declare a durable queue, fill it with N persistent messages of S bytes
(bench/recovery.py's confirmed raw-socket publisher; nobody consumes), wait a moment, read VmRSS again. It prints
the difference per million messages, the overhead per message beyond its body, and the straight-line
extrapolation to 10 million messages (the issue's target is "a few hundred MB" for 10M x 1 KiB). With --restart it
also kills the node with SIGKILL and measures the recovered node's RSS with the same backlog, since recovery
builds the in-memory state in another way than publishing does.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.frames import ProtocolError
from bench.recovery import (
    READY_TIMEOUT_S,
    NodeUnderTest,
    declare_queue,
    fill_queue,
    queue_message_count,
    rss_bytes,
)

QUEUE = "bench-memory"
SETTLE_S = 2.0
MB = 1_000_000


@dataclass(frozen=True, slots=True)
class MemoryResult:
    messages: int
    body_size_bytes: int
    rss_empty_bytes: int
    rss_backlog_bytes: int
    rss_recovered_bytes: int | None

    @property
    def per_million_mb(self) -> float:
        return (self.rss_backlog_bytes - self.rss_empty_bytes) / MB / (self.messages / 1e6)

    @property
    def overhead_per_message_bytes(self) -> float:
        return (self.rss_backlog_bytes - self.rss_empty_bytes) / self.messages - self.body_size_bytes

    def extrapolated_mb(self, messages: int) -> float:
        return self.rss_empty_bytes / MB + self.per_million_mb * messages / 1e6


def measure_memory(node: NodeUnderTest, messages: int, body_size: int, window: int,
                   restart: bool) -> MemoryResult:
    node.spawn()
    node.wait_answers()
    time.sleep(SETTLE_S)
    empty = rss_bytes(node.pid)
    declare_queue(node.endpoint, QUEUE)
    print(f"empty node: RSS {empty / MB:.0f} MB; filling {messages:,} x {body_size} B ...", flush=True)
    fill_queue(node.endpoint, QUEUE, messages, body_size, window, progress=True)
    if queue_message_count(node.endpoint, QUEUE) != messages:
        raise RuntimeError("the queue does not report the whole backlog")
    time.sleep(SETTLE_S)
    backlog = rss_bytes(node.pid)
    print(f"with the backlog: RSS {backlog / MB:.0f} MB", flush=True)
    recovered = None
    if restart:
        node.kill9()
        node.spawn()
        node.wait_answers(READY_TIMEOUT_S)
        while queue_message_count(node.endpoint, QUEUE) != messages:
            time.sleep(0.1)
        time.sleep(SETTLE_S)
        recovered = rss_bytes(node.pid)
    return MemoryResult(messages, body_size, empty, backlog, recovered)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raftmq bench memory", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000, help="backlog size (messages)")
    parser.add_argument("--body-size", type=int, default=1024, help="body bytes per message")
    parser.add_argument("--window", type=int, default=2000, help="unconfirmed messages while filling")
    parser.add_argument("--restart", action="store_true", help="also measure after kill -9 and recovery")
    parser.add_argument("--json", help="also write the result as JSON to this file")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="raftmq-bench-memory-"))
    node = NodeUnderTest(workdir / "data", workdir / "node.log")
    try:
        result = measure_memory(node, args.messages, args.body_size, args.window, args.restart)
    except (OSError, ProtocolError, RuntimeError) as error:
        print(f"raftmq bench memory: {error}", file=sys.stderr)
        return 1
    finally:
        node.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    recovered = "" if result.rss_recovered_bytes is None else (
        f"; after kill -9 and recovery {result.rss_recovered_bytes / MB:.0f} MB")
    print(f"RSS empty {result.rss_empty_bytes / MB:.0f} MB, with {result.messages:,} x {result.body_size_bytes} B "
          f"{result.rss_backlog_bytes / MB:.0f} MB{recovered}\n"
          f"{result.per_million_mb:.0f} MB per million messages ({result.overhead_per_message_bytes:.0f} B per "
          f"message beyond its body); extrapolated to 10M: {result.extrapolated_mb(10_000_000) / 1000:.1f} GB")
    if args.json:
        Path(args.json).write_text(json.dumps({**asdict(result), "per_million_mb": result.per_million_mb,
                                               "extrapolated_10m_mb": result.extrapolated_mb(10_000_000)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
