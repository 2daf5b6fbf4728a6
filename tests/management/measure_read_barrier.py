"""Measure what the management read barrier costs and what it prevents, on a running cluster (run by hand, not a test).

    raftmq cluster up --detach --data-dir /tmp/c --base-port 13000 --haproxy-port 13091
    .venv/bin/python -m tests.management.measure_read_barrier --ports 23000,23001,23002 --requests 300

Start the cluster once as it is (the barrier on, `management_read_barrier_ms` 2000) and once with
`RAFTMQ_MANAGEMENT_READ_BARRIER_MS=0` in the environment of `raftmq cluster up` (off), and compare. Three figures:
- GET latency of a definitions read (`/api/users`, behind the barrier) and of one that never waits (`/api/overview`),
  `--requests` each, one keep-alive client, round-robin over the nodes: p50, p90, max;
- the same definitions GET from 8 clients at once (how many requests share a barrier round: the latency under
  concurrency);
- misses: `--requests` rounds of "PUT a policy whose pattern changes through node i, then at once GET it through
  node i+1": how many reads showed the old pattern (expected 0 with the barrier on).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from typing import Any

import requests

AUTH = ("guest", "guest")


def _percentiles(samples: list[float]) -> str:
    ordered = sorted(samples)
    p90 = ordered[int(len(ordered) * 0.9) - 1]
    return f"p50 {statistics.median(ordered) * 1000:.1f} ms, p90 {p90 * 1000:.1f} ms, max {ordered[-1] * 1000:.1f} ms"


def _timed_gets(session: requests.Session, ports: list[int], path: str, count: int) -> list[float]:
    samples = []
    for i in range(count):
        started = time.perf_counter()
        reply = session.get(f"http://127.0.0.1:{ports[i % len(ports)]}{path}", auth=AUTH, timeout=30)
        samples.append(time.perf_counter() - started)
        assert reply.status_code == 200, reply.text
    return samples


def _concurrent(ports: list[int], path: str, count: int, clients: int) -> list[float]:
    samples: list[float] = []
    lock = threading.Lock()

    def client(index: int) -> None:
        session = requests.Session()
        mine = _timed_gets(session, ports[index % len(ports):] + ports[:index % len(ports)], path, count // clients)
        with lock:
            samples.extend(mine)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return samples


def _misses(session: requests.Session, ports: list[int], count: int) -> tuple[int, int]:
    missed = stale_headers = 0
    for i in range(count):
        writer, reader = ports[i % len(ports)], ports[(i + 1) % len(ports)]
        pattern = f"^measure-{i}$"
        put = session.put(f"http://127.0.0.1:{writer}/api/policies/%2F/measure-read-barrier", auth=AUTH, timeout=30,
                          json={"pattern": pattern, "definition": {"max-length": 1}, "apply-to": "queues"})
        assert put.status_code in (201, 204), put.text
        got = session.get(f"http://127.0.0.1:{reader}/api/policies/%2F/measure-read-barrier", auth=AUTH, timeout=30)
        body: Any = got.json() if got.status_code == 200 else {}
        missed += body.get("pattern") != pattern
        stale_headers += "X-Raftmq-Metadata" in got.headers
    session.delete(f"http://127.0.0.1:{ports[0]}/api/policies/%2F/measure-read-barrier", auth=AUTH, timeout=30)
    return missed, stale_headers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ports", required=True, help="the nodes' management ports, comma-separated")
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    ports = [int(p) for p in args.ports.split(",")]
    session = requests.Session()
    _timed_gets(session, ports, "/api/users", 10)  # (connections up, code paths warm)
    users = _timed_gets(session, ports, "/api/users", args.requests)
    overview = _timed_gets(session, ports, "/api/overview", args.requests)
    together = _concurrent(ports, "/api/users", args.requests, 8)
    missed, stale = _misses(session, ports, args.requests)
    print(f"GET /api/users, one client ({args.requests}): {_percentiles(users)}")
    print(f"GET /api/overview, one client ({args.requests}): {_percentiles(overview)}")
    print(f"GET /api/users, 8 clients at once ({len(together)}): {_percentiles(together)}")
    print(f"write through node i, read at once through node i+1: {missed}/{args.requests} missed the write "
          f"({stale} answered with X-Raftmq-Metadata)")


if __name__ == "__main__":
    main()
