"""Network partitions between local processes: network namespaces on a bridge, cut by nftables rules (root only).

How it works: `NetLab(tag, names)` creates, per name, a namespace "<tag>-<name>" with a veth pair whose host end is
enslaved to a bridge "<tag>-br", and gives it 10.<a>.<b>.<i>/24 (start a node inside with `exec_argv`,
listening on `address(name)`; the host is `host_address()` on the bridge, so clients on the host reach every node).
`partition(blocked)` installs, in each namespace, one nftables table "chaos" dropping input and output to the
addresses of the peers it must not reach; `heal()` deletes those tables. `partition_pairs` is
the pure part: a partition shape (halves, majorities-ring, isolate, bridge) over node names, from a seeded
random.Random, as the set of node pairs cut off from each other. `destroy()` removes the namespaces and the bridge
and is safe to call twice; use the lab as a context manager so cleanup runs in a finally block. `for_process`
derives the tag and the /24 from the process id, so concurrent runs on one machine do not collide.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from collections.abc import Iterable
from itertools import combinations

SHAPES = ("halves", "majorities-ring", "isolate", "bridge")
COMMAND_TIMEOUT_S = 10.0
NFT_TABLE = "chaos"

Pair = frozenset[str]


def available() -> str | None:
    """None when partitions can be made here, else the reason they cannot."""
    if os.geteuid() != 0:
        return "needs root"
    missing = [tool for tool in ("ip", "nft") if shutil.which(tool) is None]
    return f"missing {', '.join(missing)}" if missing else None


def _all_pairs(left: Iterable[str], right: Iterable[str]) -> set[Pair]:
    right = list(right)
    return {frozenset((a, b)) for a in left for b in right if a != b}


def isolate_pairs(node: str, nodes: list[str]) -> set[Pair]:
    """`node` cut off from every other node."""
    return _all_pairs([node], nodes)


def partition_pairs(shape: str, nodes: list[str], rng: random.Random) -> set[Pair]:
    """The pairs of nodes that cannot talk under a partition shape (Jepsen's nemesis shapes)."""
    shuffled = rng.sample(nodes, len(nodes))
    if shape == "halves":
        half = len(shuffled) // 2
        return _all_pairs(shuffled[:half], shuffled[half:])
    if shape == "isolate":
        return isolate_pairs(shuffled[0], nodes)
    if shape == "bridge":
        others = shuffled[1:]
        half = len(others) // 2
        return _all_pairs(others[:half], others[half:])
    if shape == "majorities-ring":
        return _ring_pairs(shuffled)
    raise ValueError(f"unknown partition shape {shape!r}: expected one of {SHAPES}")


def _ring_pairs(ring: list[str]) -> set[Pair]:
    """Each node keeps its nearest ring neighbours, enough to see a majority; no two see the same one."""
    count = len(ring)
    majority = count // 2 + 1
    reach = majority // 2
    blocked = set()
    for i, j in combinations(range(count), 2):
        distance = min(j - i, count - (j - i))
        if distance > reach:
            blocked.add(frozenset((ring[i], ring[j])))
    return blocked


def _run(argv: list[str], stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, check=check,
                          timeout=COMMAND_TIMEOUT_S)


class NetLab:
    def __init__(self, tag: str, names: list[str], subnet: tuple[int, int] = (213, 0)) -> None:
        if len(tag) > 6:
            raise ValueError("tag must be at most 6 characters (interface names are limited to 15)")
        if len(names) > 250:
            raise ValueError("at most 250 namespaces")
        self.tag, self.names, self.subnet = tag, list(names), subnet
        self.bridge = f"{tag}-br"

    @classmethod
    def for_process(cls, prefix: str, names: list[str]) -> NetLab:
        """A lab named and addressed after this process: tag <prefix><pid mod 10^4>, subnet 10.(100..199).x."""
        pid = os.getpid()
        return cls(f"{prefix[:2]}{pid % 10_000:04d}", names, (100 + pid % 100, (pid // 100) % 250))

    def __enter__(self) -> NetLab:
        try:
            self.create()
        except BaseException:
            self.destroy()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.destroy()

    def namespace(self, name: str) -> str:
        return f"{self.tag}-{name}"

    def address(self, name: str) -> str:
        return f"10.{self.subnet[0]}.{self.subnet[1]}.{self.names.index(name) + 1}"

    def host_address(self) -> str:
        """The host's own address on the bridge (clients on the host reach every namespace through it)."""
        return f"10.{self.subnet[0]}.{self.subnet[1]}.254"

    def exec_argv(self, name: str, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.namespace(name), *argv]

    def create(self) -> None:
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        _run(["ip", "addr", "add", f"{self.host_address()}/24", "dev", self.bridge])
        _run(["ip", "link", "set", self.bridge, "up"])
        for index, name in enumerate(self.names, start=1):
            namespace, host_end = self.namespace(name), f"{self.tag}-h{index}"
            _run(["ip", "netns", "add", namespace])
            _run(["ip", "link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", namespace])
            _run(["ip", "link", "set", host_end, "master", self.bridge, "up"])
            _run(self.exec_argv(name, ["ip", "addr", "add", f"{self.address(name)}/24", "dev", "eth0"]))
            _run(self.exec_argv(name, ["ip", "link", "set", "eth0", "up"]))
            _run(self.exec_argv(name, ["ip", "link", "set", "lo", "up"]))

    def partition(self, blocked: set[Pair]) -> None:
        """Replace any current partition by `blocked` (pairs of names that must not reach each other)."""
        self.heal()
        for name in self.names:
            peers = sorted(self.address(other) for pair in blocked if name in pair for other in pair if other != name)
            if not peers:
                continue
            addresses = ", ".join(peers)
            script = (f"table inet {NFT_TABLE} {{\n"
                      f"  chain input {{ type filter hook input priority 0; policy accept;"
                      f" ip saddr {{ {addresses} }} drop; }}\n"
                      f"  chain output {{ type filter hook output priority 0; policy accept;"
                      f" ip daddr {{ {addresses} }} drop; }}\n}}\n")
            _run(self.exec_argv(name, ["nft", "-f", "-"]), stdin=script)

    def heal(self) -> None:
        for name in self.names:
            _run(self.exec_argv(name, ["nft", "delete", "table", "inet", NFT_TABLE]), check=False)

    def destroy(self) -> None:
        """Remove every namespace (their veth ends go with them), host veth ends and the bridge; ignore absent."""
        for index, name in enumerate(self.names, start=1):
            _run(["ip", "netns", "del", self.namespace(name)], check=False)
            _run(["ip", "link", "del", f"{self.tag}-h{index}"], check=False)
        _run(["ip", "link", "del", self.bridge], check=False)
