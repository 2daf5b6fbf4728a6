"""LeaseOwnership (cluster/link/ownership.py) on the real metadata model, in one trio process: two or three nodes
share one in-memory metadata log (a node "cut off" gets no commit); short lease timings. Every 20 ms the test asks
each node whether it runs the shovel, as the managers do, and checks that never two nodes answer "here" at the same
time, through a hand-over to the preferred node, a cut-off holder and a restarted holder. The assertions are on the
order of events only (who ran when), not on how long things took."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import trio

from cluster.link.ownership import LeaseOwnership, LeaseTiming
from cluster.metadata import model as md

TIMING = LeaseTiming(lease_ms=1200, renew_every_ms=200, stop_guard_ms=500, margin_ms=150)
KEY = ("/", "s1")


class Log:
    """The metadata group: one state, commands applied in order; a cut-off node's commands time out."""

    def __init__(self) -> None:
        self.state = md.MetadataState()
        self.cut: set[str] = set()

    def apply_for(self, node: str) -> Callable[[Any, float], Any]:
        async def apply(command: Any, timeout_s: float) -> md.Outcome:
            await trio.sleep(0.005)
            if node in self.cut:
                await trio.sleep(timeout_s)
                raise TimeoutError("no majority")
            self.state, outcome = md.apply(self.state, command)
            return outcome
        return apply


async def _watch(nodes: list[LeaseOwnership], seen: list[set[str]]) -> None:
    while True:
        here = [o.node for o in nodes if o.owner("shovel", *KEY) == o.node]
        assert len(here) <= 1, f"two copies: {here}"
        if not seen or seen[-1] != set(here):
            seen.append(set(here))
        await trio.sleep(0.02)


async def _until(check: Callable[[], bool], timeout_s: float = 20.0) -> None:
    with trio.fail_after(timeout_s):
        while not check():
            await trio.sleep(0.02)


def _start(nursery: trio.Nursery, log: Log, name: str, preferred: list[str]) -> LeaseOwnership:
    ownership = LeaseOwnership(name, lambda: log.state, log.apply_for(name), lambda vhost, n: preferred[0], TIMING)
    nursery.start_soon(ownership.run)
    return ownership


@pytest.mark.parametrize("case", ["hand-over", "hand-over-slow-stop", "cut-off", "restart"])
async def test_never_two_nodes_run_the_shovel(case: str) -> None:
    log, preferred, seen = Log(), ["a"], list[set[str]]()
    async with trio.open_nursery() as nursery:
        nodes = [_start(nursery, log, name, preferred) for name in ("a", "b")]
        nursery.start_soon(_watch, nodes, seen)
        await _until(lambda: {"a"} in seen)
        if case == "hand-over":  # a is no longer preferred (b came back): a stops, releases, b claims
            preferred[0] = "b"
            await _until(lambda: seen[-1] == {"b"})
            assert log.state.leases[("shovel", *KEY)].generation == 2
        elif case == "hand-over-slow-stop":  # a's copy takes long to close: the lease stays a's until it has
            closing = [True]
            nodes[0].busy["shovel"] = lambda vhost, name: closing[0]
            preferred[0] = "b"
            await trio.sleep(3 * TIMING.stop_guard_ms / 1000)
            assert seen[-1] == set() and log.state.leases[("shovel", *KEY)].holder == "a"
            closing[0] = False
            await _until(lambda: seen[-1] == {"b"})
        elif case == "cut-off":  # a loses the majority: it stops on its own; b takes over once a's lease ended
            log.cut.add("a")
            preferred[0] = "b"
            await _until(lambda: seen[-1] == {"b"})
            assert set() in seen[seen.index({"a"}):]  # a gap between the two: nobody ran it for a while
        else:  # a's process restarts (a new LeaseOwnership named a; the old one, still asked, must stop running it)
            nodes.append(_start(nursery, log, "a", preferred))
            await _until(lambda: log.state.leases[("shovel", *KEY)].generation == 2 and seen[-1] == {"a"})
        nursery.cancel_scope.cancel()
    print(f"{case}: who ran it, in order: {seen}")
