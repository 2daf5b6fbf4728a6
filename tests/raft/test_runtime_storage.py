"""RaftStorage on a real NodeLog: what a Ready persisted comes back after reopening, compaction included."""

from __future__ import annotations

import pathlib

from cluster.raft.core.raft import RaftConfig, RaftCore
from cluster.raft.core.types import GroupId, Membership, NodeId
from cluster.raft.runtime.storage import RaftStorage

G = GroupId("%2F/orders")
N1 = NodeId("n1")
SOLO = Membership(frozenset({N1}))


def _cycle(core: RaftCore, storage: RaftStorage) -> None:
    ready = core.ready()
    storage.write_ready(G, ready)
    storage.commit()
    core.advance(ready)


def test_a_single_voter_group_survives_reopen_and_compaction(tmp_path: pathlib.Path) -> None:
    storage = RaftStorage.open(tmp_path)
    assert storage.load(G, SOLO) is None
    core = RaftCore(N1, RaftConfig(), lambda low, high: low, SOLO)
    core.campaign()
    for i in range(20):
        core.propose(f"m{i}".encode())
        _cycle(core, storage)
        _cycle(core, storage)
    snapshot = core.compact(b"state-through-10")
    storage.compact(G, snapshot)
    for i in range(20, 25):
        core.propose(f"m{i}".encode())
        _cycle(core, storage)
        _cycle(core, storage)
    storage.close()

    reopened = RaftStorage.open(tmp_path)
    state = reopened.load(G, SOLO)
    assert state is not None
    assert state.hard_state == core._hard_state()
    assert state.snapshot.data == b"state-through-10"
    assert [entry.data for entry in state.entries][-1] == b"m24"
    assert state.entries[0].index == snapshot.index + 1
    restarted = RaftCore(N1, RaftConfig(), lambda low, high: low, persisted=state)
    assert restarted.log.last_index() == core.log.last_index() and restarted.term == core.term
    reopened.close()
