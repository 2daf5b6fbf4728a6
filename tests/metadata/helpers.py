"""Shared helpers for the metadata store tests: free loopback ports, configs, waiting with deadlines."""

from __future__ import annotations

import random
import socket
from collections.abc import Callable
from pathlib import Path

import trio

from cluster.metadata.store import MetadataStore, StoreConfig
from deploy.portshard import owned

SECRET = "test-cluster-secret-0123456789"
FAST = {"raft_min_timeout_s": 0.3, "raft_max_timeout_s": 0.8, "connection_timeout_s": 1.5}


PORT_LOW, PORT_HIGH = 20000, 32000  # below Linux's ephemeral range: no outgoing connection takes these ports


def free_addresses(n: int) -> list[str]:
    """n loopback addresses whose ports bind now. Chosen below the ephemeral range, so a node that is killed and
    restarted in a test finds its port free again (port 0 would hand out ports any outgoing connection may take)."""
    rng = random.Random()
    addrs: list[str] = []
    while len(addrs) < n:
        port = rng.randrange(PORT_LOW, PORT_HIGH)
        if not owned(port):
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        if f"127.0.0.1:{port}" not in addrs:
            addrs.append(f"127.0.0.1:{port}")
    return addrs


def config(i: int, addrs: list[str], secret: str = SECRET, data_dir: Path | None = None,
           **extra: object) -> StoreConfig:
    peers = tuple(a for j, a in enumerate(addrs) if j != i)
    kw: dict[str, object] = {**FAST, **extra}
    return StoreConfig(f"n{i}", addrs[i], peers, secret, data_dir, **kw)  # type: ignore[arg-type]


async def wait_until(predicate: Callable[[], bool], timeout_s: float = 20.0, what: str = "condition") -> None:
    with trio.move_on_after(timeout_s):
        while not predicate():
            await trio.sleep(0.05)
        return
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


async def start_all(configs: list[StoreConfig]) -> list[MetadataStore]:
    stores = [MetadataStore(c) for c in configs]
    async with trio.open_nursery() as nursery:
        for s in stores:
            nursery.start_soon(s.start)
    return stores
