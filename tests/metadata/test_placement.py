"""Pure tests of queue placement, leader rebalancing and member replacement, against naive references."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.metadata import model as m
from cluster.metadata.model import AddNode, DeclareQueue, MetadataState, PutVhost, QueueRecord, SetNodeState
from cluster.metadata.placement import (
    PlacementError,
    evacuation_plan,
    place_queue,
    rebalance_plan,
    replacement_plan,
)


def cluster(nodes: list[str], down: tuple[str, ...] = ()) -> MetadataState:
    s = MetadataState()
    for n in [*nodes]:
        s, _ = m.apply(s, AddNode(n, f"{n}:1", m.PROTOCOL_VERSION))
    for n in down:
        s, _ = m.apply(s, SetNodeState(n, "down"))
    s, _ = m.apply(s, PutVhost("/"))
    return s


def declare(s: MetadataState, name: str, leader: str, members: tuple[str, ...], qtype: str = "quorum"
            ) -> MetadataState:
    s, out = m.apply(s, DeclareQueue(QueueRecord("/", name, qtype, leader=leader, members=members)))
    assert out.ok, out.refused
    return s


def test_client_local_places_leader_on_the_declaring_node_and_caps_the_group() -> None:
    s = cluster(["a", "b", "c"])
    assert place_queue(s, "/", "q", "quorum", "b", 3) == ("b", ("b", "a", "c"))
    assert place_queue(s, "/", "q", "quorum", "b", 5) == ("b", ("b", "a", "c"))
    assert place_queue(s, "/", "q", "classic", "c", 3) == ("c", ("c",))


def test_down_nodes_are_never_chosen() -> None:
    s = cluster(["a", "b", "c"], down=("b",))
    leader, members = place_queue(s, "/", "q", "quorum", "b", 3)
    assert leader == "a" and members == ("a", "c")


def test_balanced_picks_the_node_leading_fewest_and_members_with_fewest_queues() -> None:
    s = cluster(["a", "b", "c", "d"])
    s = declare(s, "q1", "a", ("a", "b", "c"))
    s = declare(s, "q2", "b", ("b", "c", "a"))
    # leaders: a 1, b 1, c 0, d 0 -> c; members: a 2, b 2, d 0 -> d then a
    assert place_queue(s, "/", "new", "quorum", "a", 3, "balanced") == ("c", ("c", "a", "d"))


def test_existing_queue_keeps_its_placement_and_errors_are_clear() -> None:
    s = declare(cluster(["a", "b", "c"]), "q1", "b", ("b", "c"))
    assert place_queue(s, "/", "q1", "quorum", "a", 3) == ("b", ("b", "c"))
    with pytest.raises(PlacementError, match="strategy"):
        place_queue(s, "/", "x", "quorum", "a", 3, "random")
    with pytest.raises(PlacementError, match="no node is up"):
        place_queue(cluster(["a"], down=("a",)), "/", "x", "quorum", "a", 3)


def test_rebalance_spreads_leaders_with_minimal_moves() -> None:
    s = cluster(["a", "b", "c"])
    for i in range(6):
        s = declare(s, f"q{i}", "a", ("a", "b", "c"))
    plan = rebalance_plan(s)
    assert len(plan) == 4  # 6 on a -> 2/2/2 needs exactly four moves
    after = apply_moves(s, plan)
    assert Counter(q.leader for q in after.queues.values()) == {"a": 2, "b": 2, "c": 2}
    assert rebalance_plan(after) == []


def test_rebalance_of_many_queues_moves_exactly_the_excess() -> None:
    s = cluster(["a", "b", "c", "d"])
    for i in range(300):
        s = declare(s, f"q{i:03}", "a", ("a", "b", "c") if i % 2 else ("a", "c", "d"))
    plan = rebalance_plan(s)
    assert len(plan) == 225  # 300 over 4 nodes: 75 each, so 225 leave a
    assert Counter(q.leader for q in apply_moves(s, plan).queues.values()) == {n: 75 for n in "abcd"}


def test_rebalance_moves_a_down_leader_to_an_up_member() -> None:
    s = declare(cluster(["a", "b", "c"]), "q", "a", ("a", "b"))
    s, _ = m.apply(s, SetNodeState("a", "down"))
    assert rebalance_plan(s) == [("/", "q", "b")]


def test_replacement_waits_for_the_limit_and_picks_the_emptiest_non_member() -> None:
    s = cluster(["a", "b", "c", "d", "e"])
    s = declare(s, "q1", "a", ("a", "b", "c"))
    s = declare(s, "q2", "a", ("a", "b", "d"))
    s = declare(s, "q3", "a", ("a", "b"), "classic")  # classic queues are never replaced
    assert replacement_plan(s, {"a": 1_000}, 5_000, 10_000) == []
    plan = replacement_plan(s, {"a": 1_000}, 11_000, 10_000)
    assert plan == [("/", "q1", "a", "e"), ("/", "q2", "a", "c")]  # e has no queue; then c (1) beats e (now 1)


def test_replacement_needs_a_candidate_and_a_live_majority() -> None:
    s = declare(cluster(["a", "b", "c"]), "q", "a", ("a", "b", "c"))
    assert replacement_plan(s, {"a": 0}, 100, 10) == []  # every up node is already a member
    s = declare(cluster(["a", "b", "c", "d"]), "q", "a", ("a", "b", "c"))
    assert replacement_plan(s, {"a": 0, "b": 0}, 100, 10) == []  # one of three alive: cannot commit a change


# ------------------------------------------------------------------------------------------ property tests

NODES = ["n1", "n2", "n3", "n4", "n5"]


@st.composite
def clusters(draw: st.DrawFn) -> MetadataState:
    nodes = NODES[:draw(st.integers(1, 5))]
    down = tuple(draw(st.lists(st.sampled_from(nodes), unique=True, max_size=len(nodes) - 1)))
    s = cluster(nodes, down)
    for i in range(draw(st.integers(0, 12))):
        members = tuple(draw(st.lists(st.sampled_from(nodes), min_size=1, max_size=3, unique=True)))
        s = declare(s, f"q{i}", draw(st.sampled_from(members)), members, draw(st.sampled_from(["quorum", "classic"])))
    return s


def apply_moves(s: MetadataState, plan: list[tuple[str, str, str]]) -> MetadataState:
    for vhost, name, leader in plan:
        s, out = m.apply(s, m.SetQueueLeader(vhost, name, leader))
        assert out.ok
    return s


@settings(max_examples=100, deadline=None)
@given(clusters(), st.sampled_from(["quorum", "classic"]), st.integers(1, 5), st.sampled_from(NODES),
       st.sampled_from(["client-local", "balanced"]))
def test_placement_invariants(s: MetadataState, qtype: str, size: int, local: str, strategy: str) -> None:
    up = {n for n, r in s.nodes.items() if r.state == "up"}
    leader, members = place_queue(s, "/", "new", qtype, local, size, strategy)
    assert members[0] == leader and len(set(members)) == len(members) and set(members) <= up
    assert len(members) == (1 if qtype == "classic" else min(size, len(up)))
    if strategy == "client-local" and local in up:
        assert leader == local
    s2, out = m.apply(s, DeclareQueue(QueueRecord("/", "new", qtype, leader=leader, members=members)))
    assert out.ok and place_queue(s2, "/", "new", qtype, local, size, strategy) == (leader, members)


@settings(max_examples=120, deadline=None)
@given(clusters())
def test_rebalance_ends_where_no_single_move_helps(s: MetadataState) -> None:
    up = {n for n, r in s.nodes.items() if r.state == "up"}
    plan = rebalance_plan(s)
    assert len({(v, n) for v, n, _ in plan}) == len(plan) <= len(s.queues)
    after = apply_moves(s, plan)
    counts = Counter(q.leader for q in after.queues.values() if q.leader in up)
    for q in after.queues.values():
        live = [x for x in q.members if x in up]
        if live:
            assert q.leader in up  # a down leader was moved when it could be
        if q.leader in up:
            assert all(counts[q.leader] - counts[x] < 2 for x in live)  # naive: no improving move left
    assert rebalance_plan(after) == []


@settings(max_examples=120, deadline=None)
@given(clusters(), st.dictionaries(st.sampled_from(NODES), st.integers(0, 100)), st.integers(0, 200))
def test_replacement_invariants(s: MetadataState, down_since: dict[str, int], now_ms: int) -> None:
    plan = replacement_plan(s, down_since, now_ms, 50)
    up = {n for n, r in s.nodes.items() if r.state == "up"} - set(down_since)
    assert len({(v, n) for v, n, _, _ in plan}) == len(plan)
    for vhost, name, old, new in plan:
        q = s.queues[(vhost, name)]
        assert q.type == "quorum" and old in q.members and new not in q.members and new in up
        assert now_ms - down_since[old] >= 50
        s, out = m.apply(s, m.AddQueueMember(vhost, name, new))
        assert out.ok
        s, out = m.apply(s, m.RemoveQueueMember(vhost, name, old))
        assert out.ok and len(s.queues[(vhost, name)].members) == len(q.members)


def test_evacuation_moves_or_shrinks_every_queue_of_a_leaving_node() -> None:
    s = cluster(["a", "b", "c", "d"])
    s = declare(s, "q1", "a", ("a", "b", "c"))
    s = declare(s, "q2", "b", ("a", "b", "c", "d"))
    s = declare(s, "solo", "a", ("a",), "classic")
    assert evacuation_plan(s, "a") == [("/", "q1", "a", "d"), ("/", "q2", "a", ""), ("/", "solo", "a", "b")]  # b, c, d tie at 2
    assert evacuation_plan(declare(cluster(["a"]), "x", "a", ("a",)), "a") == []  # nowhere to go


@settings(max_examples=120, deadline=None)
@given(clusters(), st.sampled_from(NODES))
def test_after_an_evacuation_the_node_can_be_removed_without_force(s: MetadataState, node: str) -> None:
    plan = evacuation_plan(s, node)
    for vhost, name, old, new in plan:
        if new:
            s, out = m.apply(s, m.AddQueueMember(vhost, name, new))
            assert out.ok and out.changes
        s, out = m.apply(s, m.RemoveQueueMember(vhost, name, old))
        assert out.ok and out.changes
    stuck = [q for q in s.queues.values() if node in q.members]
    assert all(q.members == (node,) for q in stuck)  # only sole-member queues with nowhere to go remain
    s, out = m.apply(s, m.RemoveNode(node))
    assert out.ok == (not stuck)
