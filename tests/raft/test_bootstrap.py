"""Groups bootstrapped with a named first leader (`raft.bootstrap_state`, `RaftCore.start_bootstrapped`): the named
node leads term 1 without an election, the others know it at once, nobody else can take term 1, and the storage
keeps the bootstrap term and vote with the group's first record."""

from __future__ import annotations

import pathlib
import random

import trio

from cluster.raft.core.multiraft import MultiRaft, MultiRaftConfig, NodeBatch
from cluster.raft.core.raft import BOOTSTRAP_TERM, RaftConfig, RaftCore, bootstrap_state
from cluster.raft.core.types import (
    Append,
    Entry,
    EntryKind,
    GroupId,
    HardState,
    HeartbeatResp,
    Index,
    Membership,
    NodeId,
    PersistedState,
    PreVote,
    Ready,
    Role,
    Snapshot,
    Term,
    Vote,
    VoteResp,
)
from cluster.raft.runtime.group_hosting import Bootstrap
from cluster.raft.runtime.node import RaftNodeRuntime
from cluster.raft.runtime.storage import RaftStorage
from tests.raft.test_core import N1, N2, N3, THREE, first
from tests.raft.test_runtime_cluster import _free_ports

G = GroupId("g")


def core(node: NodeId, leader: NodeId = N1, membership: Membership = THREE) -> RaftCore:
    return RaftCore(node, RaftConfig(), first, persisted=bootstrap_state(membership, leader))


def drain(raft: RaftCore) -> Ready:
    ready = raft.ready()
    raft.advance(ready)
    return ready


def test_the_named_leader_leads_term_1_at_once_and_the_others_know_it() -> None:
    leader, follower = core(N1), core(N2)
    assert leader.start_bootstrapped(lead=True)
    assert (leader.role, leader.term, leader.lead) == (Role.LEADER, BOOTSTRAP_TERM, N1)
    ready = leader.ready()
    assert ready.hard_state is None  # term 1 and the vote are the bootstrap state itself (stored with the group)
    assert [(e.index, e.term, e.kind) for e in ready.entries] == [(1, 1, EntryKind.EMPTY)]
    assert {m.dst for m in ready.messages if isinstance(m, Append)} == {N2, N3}  # streamed, not probed
    assert not follower.start_bootstrapped(lead=False)
    assert (follower.role, follower.term, follower.lead, follower.vote) == (Role.FOLLOWER, 1, N1, N1)
    assert drain(follower).messages == (HeartbeatResp(N2, N1, Term(1)),)  # "send me the log"


def test_a_proposal_commits_in_one_round_trip() -> None:
    nodes = {node: core(node) for node in (N1, N2, N3)}
    nodes[N1].start_bootstrapped(lead=True)
    nodes[N2].start_bootstrapped(lead=False)
    nodes[N3].start_bootstrapped(lead=False)
    assert nodes[N1].propose(b"first") == 2
    for _ in range(3):
        for raft in nodes.values():
            for message in drain(raft).messages:
                nodes[message.dst].step(message)
    assert nodes[N1].log.committed == 2
    assert all(raft.term == 1 for raft in nodes.values())


def test_a_single_voter_group_commits_as_soon_as_its_own_write_is_durable() -> None:
    alone = core(N1, membership=Membership(frozenset({N1}), frozenset({N2})))
    assert alone.start_bootstrapped(lead=True)
    alone.propose(b"x")
    drain(alone)
    assert alone.log.committed == 2


def test_no_other_node_can_win_term_1() -> None:
    voter = core(N2)
    voter.start_bootstrapped(lead=False)
    drain(voter)
    voter.step(Vote(N3, N2, Term(1), Index(5), Term(1)))  # even with a longer log: its term-1 vote is cast
    assert drain(voter).messages[-1] == VoteResp(N2, N3, Term(1), reject=True)
    assert voter.vote == N1


def test_a_restarted_or_wrongly_told_core_does_not_lead() -> None:
    leader = core(N1)
    assert not leader.start_bootstrapped(lead=False)  # the host did not create the group in this life
    assert leader.role is Role.FOLLOWER and leader.lead is None
    used = core(N1)
    used.start_bootstrapped(lead=True)
    drain(used)
    restarted = RaftCore(N1, RaftConfig(), first, persisted=used_state(used))
    assert not restarted.start_bootstrapped(lead=True)  # its log is not empty: not the untouched bootstrap state
    assert restarted.role is Role.FOLLOWER
    outsider = core(N1, leader=NodeId("n9"))
    assert not outsider.start_bootstrapped(lead=False) and outsider.lead is None  # not a voter: no leader taken


def used_state(raft: RaftCore) -> PersistedState:
    return PersistedState(HardState(raft.term, raft.vote, raft.log.committed),
                          Snapshot(Index(0), Term(0), raft.membership), raft.log.slice(Index(1), raft.log.last_index()))


def test_when_the_named_leader_is_down_the_others_elect_a_leader_of_term_2() -> None:
    config = MultiRaftConfig(raft=RaftConfig(quiesce=True), node_heartbeat_ticks=2, node_timeout_ticks=6)
    nodes = {node: MultiRaft(node, config, random.Random(node).randrange) for node in (N2, N3)}
    for multi in nodes.values():
        multi.add_group(G, None, bootstrap_state(THREE, N1))
        multi.start_bootstrapped(G, lead=False)
    prevotes = 0
    for _ in range(60):
        sent: list[NodeBatch] = []
        for multi in nodes.values():
            multi.tick()
            ready = multi.ready()
            multi.advance(ready)
            sent.extend(batch for batch in ready.batches if batch.dst in nodes)
        for batch in sent:
            prevotes += sum(isinstance(m, PreVote) for _, m in batch.messages)
            nodes[batch.dst].step(batch)
    leaders = [multi.groups[G] for multi in nodes.values() if multi.groups[G].role is Role.LEADER]
    assert len(leaders) == 1 and leaders[0].term == 2 and prevotes


def test_storage_keeps_the_bootstrap_term_and_vote_in_the_first_record(tmp_path: pathlib.Path) -> None:
    storage = RaftStorage.open(tmp_path)
    initial = bootstrap_state(THREE, N1)
    assert storage.load(G, THREE, initial.hard_state) is None
    storage.commit()
    storage.close()
    reopened = RaftStorage.open(tmp_path)
    state = reopened.load(G, THREE, HardState(Term(1), N2, Index(0)))  # an existing stream ignores a bootstrap
    assert state is not None
    assert state.hard_state == HardState(Term(1), N1, Index(0))
    assert state.snapshot.membership == THREE
    reopened.close()


async def test_proposals_made_before_the_group_exists_go_out_when_it_is_added_without_any_tick(
        tmp_path: pathlib.Path) -> None:
    """Three runtimes whose timers never fire during the test (no election, no tick-driven retry of held
    commands): proposals queued on the leader and on a follower before the group is added there are committed and
    applied everywhere, from the moment the bootstrapped group is added (its leader known at once)."""
    ports = dict(zip((N1, N2, N3), _free_ports(3), strict=True))
    applied: dict[NodeId, list[bytes]] = {node: [] for node in ports}
    runtimes = {}
    for node in ports:
        peers = {peer: ("127.0.0.1", port) for peer, port in ports.items() if peer != node}

        def on_apply(group: GroupId, entry: Entry, node: NodeId = node) -> None:
            if entry.data:
                applied[node].append(entry.data)

        runtimes[node] = RaftNodeRuntime(node, tmp_path / node, ("127.0.0.1", ports[node]), peers, b"s3cret",
                                         on_apply, tick_ms=600_000, telemetry=False)
    async with trio.open_nursery() as nursery:
        for runtime in runtimes.values():
            await nursery.start(runtime.run)
        runtimes[N2].propose(G, b"from-a-follower")
        runtimes[N1].propose(G, b"from-the-leader")
        for node in (N2, N3, N1):
            runtimes[node].add_group(G, THREE, Bootstrap(N1, lead=node == N1))
            await trio.sleep(0.05)
        with trio.fail_after(30):
            while not all(len(entries) == 2 for entries in applied.values()):
                await trio.sleep(0.01)
        assert all(runtime.leader_of(G) == N1 for runtime in runtimes.values())
        nursery.cancel_scope.cancel()
    assert all(sorted(entries) == [b"from-a-follower", b"from-the-leader"] for entries in applied.values())
