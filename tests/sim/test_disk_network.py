"""The simulated disk loses exactly the unsynced writes (maybe tearing the last); the network replays exactly."""

from __future__ import annotations

import random

from chaos.sim.disk import SimDisk
from chaos.sim.network import NetworkFaults, SimNetwork
from cluster.raft.core.multiraft import NodeBatch
from cluster.raft.core.types import (
    Entry,
    GroupId,
    HardState,
    Index,
    Membership,
    NodeId,
    Ready,
    Term,
)

G = GroupId("g")
N1, N2 = NodeId("n1"), NodeId("n2")
MEMBERS = {G: Membership(frozenset({N1, N2}))}


def _ready(first: int, count: int, term: int = 1, commit: int = 0) -> Ready:
    entries = tuple(Entry(Term(term), Index(i), b"x") for i in range(first, first + count))
    return Ready(HardState(Term(term), N1, Index(commit)), None, entries, (), ())


def test_synced_writes_survive_every_crash() -> None:
    for seed in range(50):
        disk = SimDisk(N1)
        disk.write_ready(G, _ready(1, 5, commit=3))
        disk.sync()
        disk.write_ready(G, _ready(6, 5, term=2, commit=8))
        disk.crash(random.Random(seed))
        state = disk.load(MEMBERS)[G]
        assert len(state.entries) >= 5
        assert state.hard_state.commit in (3, 8)
        assert [e.index for e in state.entries] == list(range(1, len(state.entries) + 1))


def test_crash_can_tear_the_last_entries_record() -> None:
    lengths = set()
    for seed in range(200):
        disk = SimDisk(N1)
        disk.write_ready(G, _ready(1, 6))
        disk.crash(random.Random(seed))
        lengths.add(len(disk.load(MEMBERS)[G].entries))
    assert 0 in lengths and 6 in lengths and lengths & {1, 2, 3, 4, 5}


def test_a_later_entries_record_replaces_the_conflicting_tail() -> None:
    disk = SimDisk(N1)
    disk.write_ready(G, _ready(1, 5, term=1))
    disk.write_ready(G, _ready(3, 1, term=2))
    disk.sync()
    entries = disk.load(MEMBERS)[G].entries
    assert [(e.index, e.term) for e in entries] == [(1, 1), (2, 1), (3, 2)]


def _deliveries(seed: int) -> list[tuple[int, NodeBatch]]:
    net = SimNetwork(random.Random(seed), NetworkFaults(0.2, 0.2, 1, 5))
    out = []
    for tick in range(30):
        net.send(tick, NodeBatch(N1, N2, tick, ()))
        out.extend((tick, batch) for batch in net.due(tick))
    return out


def test_network_is_deterministic_per_seed_and_reorders_duplicates_and_loses() -> None:
    assert _deliveries(7) == _deliveries(7)
    incarnations = [batch.incarnation for _, batch in _deliveries(7)]
    assert incarnations != sorted(incarnations)  # reordered
    assert len(incarnations) != len(set(incarnations)) or len(set(incarnations)) < 30  # duplicated or lost


def test_partition_cuts_links_both_ways_and_in_flight_batches() -> None:
    net = SimNetwork(random.Random(1), NetworkFaults(0.0, 0.0, 2, 2))
    net.send(0, NodeBatch(N1, N2, 0, ()))
    net.partition([{N1}, {N2}])
    net.send(0, NodeBatch(N2, N1, 0, ()))
    assert net.due(5) == []
    net.heal()
    net.send(5, NodeBatch(N2, N1, 1, ()))
    assert [batch.incarnation for batch in net.due(7)] == [1]
