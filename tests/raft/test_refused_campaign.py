"""The fast election after a refused connection (`MultiRaft.peer_refused`, `RaftCore.leader_refused`).

A leader whose node refuses connections (its process is gone) is replaced within a few ticks instead of after the
election timeout, by one election (the survivors campaign in rank order); a refusal reported for a live leader
(a wrong one, or one only some followers see) never bumps its term; a silent leader (paused, partitioned: no
refusal) keeps the ordinary timing. Ticks are the cores' logical clock (no wall-clock timing here).
"""

from __future__ import annotations

import random

from cluster.raft.core.multiraft import MultiRaft, MultiRaftConfig, NodeBatch
from cluster.raft.core.raft import RaftConfig, RaftCore
from cluster.raft.core.types import GroupId, Membership, NodeId, Role

N1, N2, N3, N4, N5 = (NodeId(f"n{i}") for i in range(1, 6))
G = GroupId("g0")
ELECTION_TICKS = 10


def _cluster(nodes: tuple[NodeId, ...], quiesce: bool = True, seed: int = 1) -> dict[NodeId, MultiRaft]:
    config = MultiRaftConfig(raft=RaftConfig(election_ticks=ELECTION_TICKS, quiesce=quiesce), node_heartbeat_ticks=2,
                             node_timeout_ticks=ELECTION_TICKS)
    cluster = {node: MultiRaft(node, config, random.Random(f"{seed}{node}").randrange) for node in nodes}
    for multi in cluster.values():
        multi.add_group(G, Membership(frozenset(nodes)))
    return cluster


def _round(cluster: dict[NodeId, MultiRaft], down: set[NodeId]) -> None:
    sent: list[NodeBatch] = []
    for node, multi in cluster.items():
        if node not in down:
            ready = multi.ready()
            multi.advance(ready)
            sent.extend(ready.batches)
    for batch in sent:
        if batch.dst not in down and batch.src not in down:
            cluster[batch.dst].step(batch)


def _settle(cluster: dict[NodeId, MultiRaft], down: set[NodeId] = set(), rounds: int = 10) -> None:  # noqa: B006
    for _ in range(rounds):
        _round(cluster, down)


def _tick(cluster: dict[NodeId, MultiRaft], down: set[NodeId] = set()) -> None:  # noqa: B006
    for node, multi in cluster.items():
        if node not in down:
            multi.tick()
    _settle(cluster, down, rounds=3)


def _core(cluster: dict[NodeId, MultiRaft], node: NodeId) -> RaftCore:
    return cluster[node].groups[G]


def _leaders(cluster: dict[NodeId, MultiRaft], down: set[NodeId] = set()) -> list[NodeId]:  # noqa: B006
    return [node for node in cluster if node not in down and _core(cluster, node).role is Role.LEADER]


def _elect(cluster: dict[NodeId, MultiRaft], leader: NodeId) -> int:
    _core(cluster, leader).campaign()
    _settle(cluster)
    assert _leaders(cluster) == [leader]
    return _core(cluster, leader).term


def test_followers_of_a_refusing_leader_elect_a_new_one_within_a_few_ticks_in_one_term() -> None:
    for seed in range(20):
        for quiesce in (True, False):
            cluster = _cluster((N1, N2, N3), quiesce=quiesce, seed=seed)
            term = _elect(cluster, N1)
            for _ in range(4):
                _tick(cluster)
            down = {N1}
            for node in (N2, N3):
                assert cluster[node].peer_refused(N1) == [G]
            ticks = 0
            while not _leaders(cluster, down):
                _tick(cluster, down)
                ticks += 1
                assert ticks < ELECTION_TICKS, "the ordinary election timeout, not the refusal, elected"
            assert _leaders(cluster, down) == [N2]  # the first survivor by rank
            assert _core(cluster, N2).term == term + 1  # one election, no split vote


def test_a_refusal_seen_by_one_follower_first_still_elects_once_the_other_sees_it() -> None:
    cluster = _cluster((N1, N2, N3), quiesce=False)
    _elect(cluster, N1)
    down = {N1}
    cluster[N2].peer_refused(N1)
    for _ in range(ELECTION_TICKS // 2):
        _tick(cluster, down)
    assert not _leaders(cluster, down)  # N3 still in N1's lease: it ignored N2's pre-vote
    cluster[N3].peer_refused(N1)
    for _ in range(ELECTION_TICKS // 2):
        _tick(cluster, down)
    assert len(_leaders(cluster, down)) == 1


def test_a_refusal_reported_for_a_live_leader_does_not_disturb_it() -> None:
    """A wrong refusal (a fault proxy, a firewall) at one follower: its pre-vote is ignored by the follower that
    still hears the leader, no term is bumped, and it follows the leader again at its next heartbeat."""
    for seed in range(20):
        cluster = _cluster((N1, N2, N3), quiesce=False, seed=seed)
        term = _elect(cluster, N1)
        assert cluster[N2].peer_refused(N1) == [G]
        for _ in range(5 * ELECTION_TICKS):
            _tick(cluster)
            assert _leaders(cluster) == [N1]
        assert all(_core(cluster, node).term == term for node in (N1, N2, N3))
        assert _core(cluster, N2).lead == N1 and _core(cluster, N2).role is Role.FOLLOWER


def test_a_silent_leader_without_refusals_keeps_the_ordinary_election_timeout() -> None:
    """A paused or partitioned leader's node refuses nothing: no one campaigns before the election timeout."""
    cluster = _cluster((N1, N2, N3), quiesce=False)
    _elect(cluster, N1)
    down = {N1}
    for _ in range(ELECTION_TICKS - 1):
        _tick(cluster, down)
        assert not _leaders(cluster, down)
        assert all(_core(cluster, node).role is Role.FOLLOWER for node in (N2, N3))


def test_five_voters_with_two_refusing_skip_the_dead_in_the_rank() -> None:
    cluster = _cluster((N1, N2, N3, N4, N5), quiesce=False)
    term = _elect(cluster, N1)
    down = {N1, N2}
    for node in (N3, N4, N5):
        cluster[node].peer_refused(N2)
        cluster[node].peer_refused(N1)
    ticks = 0
    while not _leaders(cluster, down):
        _tick(cluster, down)
        ticks += 1
        assert ticks < ELECTION_TICKS
    assert _leaders(cluster, down) == [N3]
    assert _core(cluster, N3).term == term + 1


def test_a_batch_from_the_peer_clears_its_refusal_and_repeats_do_nothing() -> None:
    cluster = _cluster((N1, N2, N3), quiesce=False)
    _elect(cluster, N1)
    assert cluster[N2].peer_refused(N1) == [G]
    assert cluster[N2].peer_refused(N1) == []  # already refusing
    _tick(cluster)  # N1's heartbeat arrives: alive
    assert N1 not in cluster[N2].refusing_peers
    assert cluster[N2].peer_refused(N3) == []  # not its leader
    assert cluster[N2].peer_refused(NodeId("stranger")) == []
