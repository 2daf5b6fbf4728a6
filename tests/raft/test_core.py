"""Unit tests of RaftCore and MultiRaft behaviour that the scripts do not pin down."""

from __future__ import annotations

import random

from cluster.raft.core.multiraft import MultiRaft, MultiRaftConfig, NodeBatch
from cluster.raft.core.raft import BrokenVariant, RaftConfig, RaftCore
from cluster.raft.core.types import (
    Append,
    AppendResp,
    Entry,
    GroupId,
    HardState,
    Index,
    Membership,
    NodeId,
    PersistedState,
    Ready,
    Role,
    Snapshot,
    Term,
    Vote,
    VoteResp,
)

N1, N2, N3 = NodeId("n1"), NodeId("n2"), NodeId("n3")
THREE = Membership(frozenset({N1, N2, N3}))


def first(low: int, high: int) -> int:
    return low


def follower_with(entries: list[tuple[int, int]], term: int = 5, broken: BrokenVariant | None = None) -> RaftCore:
    log = tuple(Entry(Term(t), Index(i), f"e{i}".encode()) for i, t in entries)
    state = PersistedState(HardState(Term(term), None, Index(0)), Snapshot(Index(0), Term(0), THREE), log)
    return RaftCore(N2, RaftConfig(), first, persisted=state, broken=broken)


def drain(core: RaftCore) -> Ready:
    ready = core.ready()
    core.advance(ready)
    return ready


def test_vote_is_in_the_same_ready_as_the_hard_state_that_records_it() -> None:
    core = RaftCore(N2, RaftConfig(pre_vote=False), first, THREE)
    core.step(Vote(N1, N2, Term(1), Index(0), Term(0)))
    ready = core.ready()
    assert ready.hard_state == HardState(Term(1), N1, Index(0))
    assert ready.messages == (VoteResp(N2, N1, Term(1), reject=False),)


def test_follower_keeps_matching_entries_when_a_stale_append_arrives() -> None:
    core = follower_with([(1, 5), (2, 5), (3, 5)])
    drain(core)
    stale = Append(N1, N2, Term(5), Index(0), Term(0), (Entry(Term(5), Index(1), b"e1"),), Index(0))
    core.step(stale)
    assert core.log.last_index() == 3  # nothing it acknowledged is dropped
    assert drain(core).messages[-1] == AppendResp(N2, N1, Term(5), Index(1))


def test_broken_variant_truncates_matching_entries() -> None:
    core = follower_with([(1, 5), (2, 5), (3, 5)], broken=BrokenVariant.TRUNCATE_ON_APPEND)
    drain(core)
    core.step(Append(N1, N2, Term(5), Index(0), Term(0), (Entry(Term(5), Index(1), b"e1"),), Index(0)))
    assert core.log.last_index() == 1


def test_follower_truncates_at_the_first_real_conflict_only() -> None:
    core = follower_with([(1, 1), (2, 1), (3, 2), (4, 2)])
    drain(core)
    entries = (Entry(Term(1), Index(2), b"e2"), Entry(Term(3), Index(3), b"new"))
    core.step(Append(N1, N2, Term(5), Index(1), Term(1), entries, Index(0)))
    ready = core.ready()
    assert [(e.index, e.term) for e in ready.entries] == [(3, 3)]  # storage rewrites from index 3 only
    assert core.log.last_index() == 3


def test_rejection_carries_a_term_hint_for_fast_backtracking() -> None:
    core = follower_with([(1, 1), (2, 1), (3, 2), (4, 2), (5, 2)])
    core.step(Append(N1, N2, Term(5), Index(5), Term(4), (), Index(0)))
    (resp,) = core.ready().messages
    assert isinstance(resp, AppendResp) and resp.reject
    assert (resp.hint_index, resp.hint_term) == (5, 2)


def test_single_voter_commits_only_after_its_own_persistence() -> None:
    core = RaftCore(N1, RaftConfig(), first, Membership(frozenset({N1})))
    core.campaign()
    assert core.role is Role.LEADER
    index = core.propose(b"x")
    ready = core.ready()
    assert ready.committed_entries == ()  # not durable yet, so not committed
    core.advance(ready)
    ready = drain(core)
    assert [e.index for e in ready.committed_entries] == [1, index]


def test_restart_reloads_term_vote_log_and_reapplies_committed_entries() -> None:
    log = (Entry(Term(2), Index(1), b"a"), Entry(Term(2), Index(2), b"b"), Entry(Term(3), Index(3), b"c"))
    state = PersistedState(HardState(Term(3), N1, Index(2)), Snapshot(Index(0), Term(0), THREE), log)
    core = RaftCore(N2, RaftConfig(), first, persisted=state)
    assert (core.term, core.vote, core.log.committed) == (3, N1, 2)
    ready = drain(core)
    assert [e.data for e in ready.committed_entries] == [b"a", b"b"]
    assert ready.hard_state is None  # nothing changed since it was loaded


def test_proposals_are_refused_beyond_the_uncommitted_bound() -> None:
    core = RaftCore(N1, RaftConfig(uncommitted_entries_max=3, pre_vote=False), first, THREE)
    core.campaign()
    core.step(VoteResp(N2, N1, Term(1), False))
    assert core.role is Role.LEADER  # its empty entry is the first uncommitted one
    accepted = [core.propose(b"x") for _ in range(5)]
    assert accepted == [2, 3, None, None, None]


def test_learner_never_campaigns() -> None:
    membership = Membership(frozenset({N1, N2}), frozenset({N3}))
    core = RaftCore(N3, RaftConfig(), first, membership)
    for _ in range(100):
        core.tick()
    assert core.role is Role.FOLLOWER and core.ready().messages == ()


# --- MultiRaft -------------------------------------------------------------------------------------------


def _cluster(groups: int) -> dict[NodeId, MultiRaft]:
    config = MultiRaftConfig(raft=RaftConfig(quiesce=True), node_heartbeat_ticks=2, node_timeout_ticks=6)
    nodes = {node: MultiRaft(node, config, random.Random(node).randrange) for node in (N1, N2, N3)}
    for multi in nodes.values():
        for g in range(groups):
            multi.add_group(GroupId(f"g{g}"), THREE)
    return nodes


def _round(nodes: dict[NodeId, MultiRaft], down: set[NodeId] = frozenset()) -> list[NodeBatch]:  # type: ignore[assignment]
    sent: list[NodeBatch] = []
    for node, multi in nodes.items():
        if node in down:
            continue
        ready = multi.ready()
        multi.advance(ready)
        sent.extend(ready.batches)
    for batch in sent:
        if batch.dst not in down and batch.src not in down:
            nodes[batch.dst].step(batch)
    return sent


def test_multiraft_batches_per_destination_and_quiesces_idle_groups() -> None:
    nodes = _cluster(groups=50)
    for g in range(50):
        nodes[N1].groups[GroupId(f"g{g}")].campaign()
    for _ in range(10):
        _round(nodes)
    for _ in range(4):
        for multi in nodes.values():
            multi.tick()
        sent = _round(nodes)
        assert len({(b.src, b.dst) for b in sent}) == len(sent)  # one batch per node pair
    for multi in nodes.values():
        assert multi.active_group_count() == 0
    for _ in range(20):  # idle: only node-level heartbeats flow, no group messages
        for multi in nodes.values():
            multi.tick()
        sent = _round(nodes)
        assert all(not batch.messages for batch in sent)


def test_node_failure_detection_wakes_the_groups_a_dead_node_led() -> None:
    nodes = _cluster(groups=3)
    for g in range(3):
        nodes[N1].groups[GroupId(f"g{g}")].campaign()
    for _ in range(10):
        _round(nodes)
    for _ in range(4):
        for multi in nodes.values():
            multi.tick()
        _round(nodes)
    assert all(core.quiesced for multi in nodes.values() for core in multi.groups.values())
    down = {N1}
    for _ in range(60):
        for node, multi in nodes.items():
            if node not in down:
                multi.tick()
        _round(nodes, down)
    for g in range(3):
        leaders = [n for n in (N2, N3) if nodes[n].groups[GroupId(f"g{g}")].role is Role.LEADER]
        assert len(leaders) == 1
    assert N1 in nodes[N2].down_peers


def test_a_vote_rejection_teaches_a_stale_candidate_the_commit_index() -> None:
    """The voter's (commit, term) names a prefix the candidate shares (log matching): it is committed there too."""
    log = tuple(Entry(Term(5), Index(i), f"e{i}".encode()) for i in (1, 2, 3))
    state = PersistedState(HardState(Term(5), None, Index(0)), Snapshot(Index(0), Term(0), THREE), log)
    core = RaftCore(N2, RaftConfig(pre_vote=False), first, persisted=state)
    drain(core)
    core.campaign()
    drain(core)
    assert core.role is Role.CANDIDATE and core.log.committed == 0
    core.step(VoteResp(N3, N2, core.term, reject=True, commit=Index(3), commit_term=Term(4)))  # not our entry 3
    assert core.log.committed == 0
    core.step(VoteResp(N1, N2, core.term, reject=True, commit=Index(2), commit_term=Term(5)))
    assert core.log.committed == 2
    assert [entry.index for entry in drain(core).committed_entries] == [1, 2]
