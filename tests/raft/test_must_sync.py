"""Which Ready records must be fsynced before the Ready's messages leave (`image.must_sync`, etcd's MustSync), that
a commit index written without its own fsync is durable after the next one, and that a volatile group's entries
commit without an fsync on a real runtime."""

from __future__ import annotations

import pathlib

import trio

from cluster.raft.core.image import must_sync
from cluster.raft.core.multiraft import MultiRaftConfig
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
from cluster.raft.runtime.node import RaftNodeRuntime
from cluster.raft.runtime.storage import RaftStorage
from tests.raft.test_runtime_cluster import _free_ports

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


def test_a_volatile_groups_entries_need_no_fsync_but_a_new_term_or_vote_does() -> None:
    entry = Entry(Term(2), Index(6), b"m")
    assert not must_sync(BEFORE, _ready(entries=(entry,)), volatile=True)
    assert not must_sync(BEFORE, _ready(HardState(Term(2), N1, Index(6)), entries=(entry,), committed=(entry,)),
                         volatile=True)
    assert must_sync(BEFORE, _ready(HardState(Term(3), N1, Index(5))), volatile=True)
    assert must_sync(BEFORE, _ready(snapshot=Snapshot(Index(9), Term(2), SOLO)), volatile=True)


async def test_a_volatile_single_voter_group_commits_without_an_fsync_per_proposal(tmp_path: pathlib.Path) -> None:
    """A runtime hosting one volatile single-voter group (a non-durable classic queue): its proposals commit and
    apply with no fsync each (only its election's term and vote are synced); a durable group beside it still
    fsyncs its entries."""
    volatile, durable = GroupId("volatile"), GroupId("durable")
    applied: dict[GroupId, list[bytes]] = {volatile: [], durable: []}
    port = _free_ports(1)[0]
    runtime = RaftNodeRuntime(N1, tmp_path, ("127.0.0.1", port), {}, b"s", lambda group, entry: None,
                              MultiRaftConfig(raft=RaftConfig(election_ticks=10)), tick_ms=10,
                              on_apply_many=lambda group, entries: applied[group].extend(
                                  entry.data for entry in entries if entry.data))
    runtime.add_group(volatile, SOLO, volatile=True)
    async with trio.open_nursery() as nursery:
        await nursery.start(runtime.run)
        with trio.fail_after(30):
            while not runtime.is_leader(volatile):
                await trio.sleep(0.01)
            assert runtime.pipeline is not None
            assert runtime.propose(volatile, b"warm-up")  # after the election's term and vote were synced
            while not applied[volatile]:
                await trio.sleep(0.01)
            fsyncs = runtime.pipeline.stats.fsyncs
            for number in range(20):  # one at a time: each its own Ready
                assert runtime.propose(volatile, f"v{number}".encode())
                while len(applied[volatile]) <= number + 1:
                    await trio.sleep(0)
            assert runtime.pipeline.stats.fsyncs == fsyncs
            runtime.add_group(durable, SOLO)
            while not runtime.is_leader(durable):
                await trio.sleep(0.01)
            fsyncs = runtime.pipeline.stats.fsyncs
            assert runtime.propose(durable, b"d0")
            while not applied[durable]:
                await trio.sleep(0.01)
            assert runtime.pipeline.stats.fsyncs > fsyncs
        nursery.cancel_scope.cancel()
    assert applied[volatile] == [b"warm-up", *(f"v{number}".encode() for number in range(20))]
