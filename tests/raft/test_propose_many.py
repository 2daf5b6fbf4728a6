"""`propose_many`: a batch of proposals is one log append and one round of appends (not one message per
proposal), bounded like `propose`; the router hands a group's proposals of one cycle to it in order."""

from __future__ import annotations

import random

from cluster.raft.core.multiraft import MultiRaft, MultiRaftConfig
from cluster.raft.core.raft import RaftConfig, RaftCore
from cluster.raft.core.types import (
    Append,
    AppendResp,
    ConfChange,
    ConfOp,
    EntryKind,
    GroupId,
    Index,
    Membership,
    NodeId,
    Ready,
    Role,
    Term,
    VoteResp,
)
from cluster.raft.runtime.codec import Command
from cluster.raft.runtime.routing import CommandRouter

N1, N2, N3 = NodeId("n1"), NodeId("n2"), NodeId("n3")
THREE = Membership(frozenset({N1, N2, N3}))


def first(low: int, high: int) -> int:
    return low


def drain(core: RaftCore) -> Ready:
    ready = core.ready()
    core.advance(ready)
    return ready


def replicating_leader(config: RaftConfig | None = None) -> RaftCore:
    """n1 leads term 1 of a 3-voter group, both followers in REPLICATE state and up to date."""
    core = RaftCore(N1, config or RaftConfig(pre_vote=False), first, THREE)
    core.campaign()
    drain(core)
    core.step(VoteResp(N2, N1, Term(1), reject=False))
    drain(core)
    assert core.role is Role.LEADER
    for follower in (N2, N3):
        core.step(AppendResp(follower, N1, Term(1), core.log.last_index()))
    drain(core)
    return core


def appends_to(ready: Ready, node: NodeId) -> list[Append]:
    return [m for m in ready.messages if isinstance(m, Append) and m.dst == node]


def test_a_batch_is_one_append_per_follower_with_every_entry() -> None:
    datas = [f"d{i}".encode() for i in range(20)]
    batched, single = replicating_leader(), replicating_leader()
    assert batched.propose_many(datas) == 20
    for data in datas:
        assert single.propose(data) is not None
    ready_batched, ready_single = drain(batched), drain(single)
    assert ready_batched.entries == ready_single.entries  # the same log either way
    assert [e.data for e in ready_batched.entries] == datas
    assert all(e.kind is EntryKind.NORMAL and e.term == 1 for e in ready_batched.entries)
    for node in (N2, N3):
        (append,) = appends_to(ready_batched, node)
        assert [e.data for e in append.entries] == datas
        assert len(appends_to(ready_single, node)) == 20


def test_a_batch_commits_once_a_follower_has_it() -> None:
    core = replicating_leader()
    last = core.log.last_index()
    assert core.propose_many([b"a", b"b", b"c"]) == 3
    drain(core)
    core.step(AppendResp(N2, N1, Term(1), Index(last + 3)))
    ready = drain(core)
    assert [e.data for e in ready.committed_entries] == [b"a", b"b", b"c"]


def test_a_batch_is_cut_by_the_uncommitted_bound_and_refused_when_not_leader() -> None:
    core = replicating_leader(RaftConfig(pre_vote=False, uncommitted_entries_max=5))
    uncommitted = core.log.last_index() - core.log.committed
    assert core.propose_many([b"x"] * 10) == 5 - uncommitted
    assert core.propose_many([b"y"]) == 0
    assert core.propose_many([]) == 0
    follower = RaftCore(N2, RaftConfig(), first, THREE)
    assert follower.propose_many([b"z"]) == 0


def test_the_router_proposes_a_groups_commands_as_one_batch_in_order() -> None:
    group = GroupId("led")
    multi = MultiRaft(N1, MultiRaftConfig(), random.Random(1).randrange)
    multi.add_group(group, Membership(frozenset({N1})))
    multi.groups[group].campaign()
    for _ in range(5):
        multi.advance(multi.ready())
    router = CommandRouter(N1)
    for data in (b"p1", b"p2"):
        router.offer(Command("propose", group, data))
    router.offer(Command("conf", group, ConfChange(ConfOp.ADD_LEARNER, N2).encode()))
    router.offer(Command("propose", group, b"p3"))
    assert router.route(multi, now_ms=0, retry_held=False) == []
    assert router.stats.local == 4 and router.stats.refused == 0
    entries = multi.groups[group].log.unstable_entries()
    kinds = [(e.kind, e.data) for e in entries]
    assert kinds == [(EntryKind.NORMAL, b"p1"), (EntryKind.NORMAL, b"p2"),
                     (EntryKind.CONF_CHANGE, ConfChange(ConfOp.ADD_LEARNER, N2).encode()), (EntryKind.NORMAL, b"p3")]


def test_the_router_holds_a_batch_refused_during_a_leadership_transfer() -> None:
    group = GroupId("g")
    multi = MultiRaft(N1, MultiRaftConfig(raft=RaftConfig(pre_vote=False)), random.Random(1).randrange)
    multi.add_group(group, THREE)
    core = multi.groups[group]
    core.campaign()
    multi.advance(multi.ready())
    core.step(VoteResp(N2, N1, Term(1), reject=False))
    multi.advance(multi.ready())
    assert core.role is Role.LEADER and core.transfer_leadership(N2)
    router = CommandRouter(N1, hold_ms=100)
    router.offer(Command("propose", group, b"a"))
    router.offer(Command("propose", group, b"b"))
    router.route(multi, now_ms=0, retry_held=False)
    assert router.held_count == 2 and router.stats.local == 0 and router.stats.refused == 0
    router.route(multi, now_ms=200, retry_held=True)
    assert router.held_count == 0 and router.stats.expired == 2
