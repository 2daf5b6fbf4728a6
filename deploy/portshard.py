"""Which fixed local ports this process may pick, when several test processes pick them at once (pytest-xdist).

The local runners and the test fixtures choose node ports at random below Linux's ephemeral range and check that they
bind: a node killed in a test must find its port free when it restarts. Two processes doing that at the same time
could pick the same port, or one could take a port the other freed to restart a node on it. `RAFTMQ_PORT_SHARD="i/n"`
(tests/conftest.py sets it in each xdist worker) splits the ports between n such processes: port p belongs to shard
(p // 100 % 10) * n // 10, its hundreds digit. A node derives its management, Raft, metadata and mirror ports by
adding multiples of 1000, which keep that digit, so a node and its derived ports are in one shard. Unset (or n = 1),
every port belongs to this process. `owned(port)` is the test every random port picker adds to its "does it bind".
"""

from __future__ import annotations

import os

ENV = "RAFTMQ_PORT_SHARD"
MAX_SHARDS = 10  # one per hundreds digit


def shard() -> tuple[int, int]:
    """(index, count) from RAFTMQ_PORT_SHARD; (0, 1) when unset."""
    raw = os.environ.get(ENV, "")
    if not raw:
        return 0, 1
    index, _, count = raw.partition("/")
    i, n = int(index), int(count)
    if not (0 < n <= MAX_SHARDS and 0 <= i < n):
        raise ValueError(f"{ENV}={raw!r}: want i/n with 0 <= i < n <= {MAX_SHARDS}")
    return i, n


def owned(port: int) -> bool:
    """Whether this process may pick `port` (always, outside a sharded run)."""
    i, n = shard()
    return n == 1 or (port // 100 % 10) * n // 10 == i
