"""Which Ready records must be fsynced before the Ready's messages leave (`image.must_sync`, etcd's MustSync), and
that a commit index written without its own fsync is durable after the next one and never needed for recovery."""

from __future__ import annotations

import pathlib

from cluster.raft.core.image import must_sync
from cluster.raft.core.raft import RaftConfig, RaftCore
from cluster.raft.core.types import (
    ConfChange,
    ConfOp,
    Entry,
    EntryKind,
    GroupId,
    HardState,
    Index,
    Membership,
    NodeId,
    Ready,
    Snapshot,
    Term,
)
from cluster.raft.runtime.storage import RaftStorage

G = GroupId("%2F/orders")
N1, N2 = NodeId("n1"), NodeId("n2")
SOLO = Membership(frozenset({N1}))
BEFORE = HardState(Term(2), N1, Index(5))


def _ready(hard_state: HardState | None = None, entries: tuple[Entry, ...] = (), committed: tuple[Entry, ...] = (),
           snapshot: Snapshot | None = None) -> Ready:
    return Ready(hard_state=hard_state, snapshot=snapshot, entries=entries, committed_entries=committed, messages=())


def test_only_a_moved_commit_index_needs_no_fsync() -> None:
    normal = Entry(Term(2), Index(6), b"m")
    assert not must_sync(BEFORE, _ready(HardState(Term(2), N1, Index(6)), committed=(normal,)))
    assert not must_sync(BEFORE, _ready())
    assert must_sync(BEFORE, _ready(entries=(Entry(Term(2), Index(7), b"n"),)))
    assert must_sync(BEFORE, _ready(HardState(Term(3), None, Index(5))))  # a new term
    assert must_sync(BEFORE, _ready(HardState(Term(2), N2, Index(5))))  # a vote (defensive: same term)
    assert must_sync(BEFORE, _ready(snapshot=Snapshot(Index(9), Term(2), SOLO)))
    change = Entry(Term(2), Index(6), ConfChange(ConfOp.ADD_LEARNER, N2).encode(), EntryKind.CONF_CHANGE)
    assert must_sync(BEFORE, _ready(HardState(Term(2), N1, Index(6)), committed=(change,)))  # membership


def test_an_unsynced_commit_index_is_durable_after_the_next_fsync(tmp_path: pathlib.Path) -> None:
    storage = RaftStorage.open(tmp_path)
    assert storage.load(G, SOLO) is None
    storage.commit()
    core = RaftCore(N1, RaftConfig(), lambda low, high: low, SOLO)
    core.campaign()
    syncs = []
    for i in range(5):
        core.propose(f"m{i}".encode())
        for _ in range(2):  # the entry (must be durable), then the commit it reached (need not be)
            ready = core.ready()
            sync = storage.write_ready(G, ready)
            syncs.append(sync)
            if sync:
                storage.commit()
            core.advance(ready)
    assert syncs.count(False) >= 5  # every commit-only hard state went without its own fsync
    storage.commit()  # the next fsync (any cycle's) covers them
    committed = core.log.committed
    storage.close()
    reopened = RaftStorage.open(tmp_path)
    persisted = reopened.load(G, SOLO)
    assert persisted is not None and persisted.hard_state.commit == committed
    reopened.close()
