"""Partition shapes (pure) and a real partition between two network namespaces (root, ip and nft needed)."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from chaos import netns

NODES = ["n1", "n2", "n3", "n4", "n5"]


def reachable(blocked: set[frozenset[str]], node: str) -> set[str]:
    return {other for other in NODES if frozenset((node, other)) not in blocked}


@pytest.mark.parametrize("seed", range(5))
def test_shapes_cut_what_they_promise(seed: int) -> None:
    rng = random.Random(seed)
    halves = netns.partition_pairs("halves", NODES, rng)
    assert sorted(len(reachable(halves, n)) for n in NODES) == [2, 2, 3, 3, 3]
    isolate = netns.partition_pairs("isolate", NODES, rng)
    assert sorted(len(reachable(isolate, n)) for n in NODES) == [1, 4, 4, 4, 4]
    bridge = netns.partition_pairs("bridge", NODES, rng)
    assert sorted(len(reachable(bridge, n)) for n in NODES) == [3, 3, 3, 3, 5]
    ring = netns.partition_pairs("majorities-ring", NODES, rng)
    views = [frozenset(reachable(ring, n)) for n in NODES]
    assert all(len(view) == 3 for view in views) and len(set(views)) == 5


def test_same_seed_same_partition_and_unknown_shape_fails() -> None:
    assert netns.partition_pairs("halves", NODES, random.Random(3)) == netns.partition_pairs(
        "halves", NODES, random.Random(3))
    with pytest.raises(ValueError):
        netns.partition_pairs("triangle", NODES, random.Random(0))
    assert all(len(pair) == 2 for pair in netns.partition_pairs("halves", NODES, random.Random(1)))


SERVER = """
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 7788)); s.listen(16)
while True:
    c, _ = s.accept(); c.sendall(b"ok"); c.close()
"""
CLIENT = """
import socket, sys
try:
    s = socket.create_connection((sys.argv[1], 7788), timeout=1.0); sys.exit(0 if s.recv(2) == b"ok" else 1)
except OSError:
    sys.exit(1)
"""


@pytest.mark.skipif(netns.available() is not None, reason=f"network namespaces: {netns.available()}")
def test_partition_blocks_and_heal_restores_tcp() -> None:
    lab = netns.NetLab.for_process("ts", ["a", "b"])
    with lab:
        server = subprocess.Popen(lab.exec_argv("b", [sys.executable, "-c", SERVER]))
        try:
            def connects() -> bool:
                argv = lab.exec_argv("a", [sys.executable, "-c", CLIENT, lab.address("b")])
                return subprocess.run(argv, timeout=20).returncode == 0

            assert any(connects() for _ in range(20))  # the server may take a moment to listen
            lab.partition({frozenset(("a", "b"))})
            assert not connects()
            lab.heal()
            assert connects()
        finally:
            server.kill()
            server.wait(10)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"{lab.tag}-" not in listed
