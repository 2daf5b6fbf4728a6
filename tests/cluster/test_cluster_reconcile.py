"""Unit tests of `cluster_reconcile`: the Raft membership steps a queue group's leader takes towards the metadata."""

from __future__ import annotations

from cluster.raft.core.types import ConfChange, ConfOp, Membership, NodeId
from node.clustering.reconcile import LEADER_RECORD_INTERVAL_MS, Transfer, leader_to_record, next_step

NODES = ("n1", "n2", "n3", "n4")


def _m(voters: str, learners: str = "") -> Membership:
    return Membership(frozenset(NodeId(n) for n in voters.split()), frozenset(NodeId(n) for n in learners.split()))


def _apply(m: Membership, step: ConfChange) -> Membership:
    voters, learners = set(m.voters), set(m.learners)
    if step.op is ConfOp.ADD_LEARNER:
        learners.add(step.node)
    elif step.op is ConfOp.PROMOTE:
        learners.discard(step.node)
        voters.add(step.node)
    else:
        voters.discard(step.node)
        learners.discard(step.node)
    return Membership(frozenset(voters), frozenset(learners))


def test_in_step_means_nothing_to_do() -> None:
    assert next_step(NodeId("n1"), ("n1", "n2", "n3"), NODES, _m("n1 n2 n3", "n4")) is None


def test_grow_promotes_the_learner_then_stops() -> None:
    m = _m("n1 n2 n3", "n4")
    assert next_step(NodeId("n1"), ("n1", "n2", "n3", "n4"), NODES, m) == ConfChange(ConfOp.PROMOTE, NodeId("n4"))
    assert next_step(NodeId("n1"), ("n1", "n2", "n3", "n4"), NODES, _m("n1 n2 n3 n4")) is None


def test_a_member_unknown_to_the_group_is_added_as_learner_first() -> None:
    step = next_step(NodeId("n1"), ("n1", "n2", "n4"), NODES, _m("n1 n2 n3"))
    assert step == ConfChange(ConfOp.ADD_LEARNER, NodeId("n4"))


def test_replacement_adds_before_it_removes_and_keeps_the_old_member_as_learner() -> None:
    m, wanted, steps = _m("n1 n2 n3", "n4"), ("n1", "n2", "n4"), []
    for _ in range(10):
        step = next_step(NodeId("n1"), wanted, NODES, m)
        if step is None:
            break
        assert isinstance(step, ConfChange)
        steps.append((step.op, step.node))
        m = _apply(m, step)
    assert steps == [(ConfOp.PROMOTE, "n4"), (ConfOp.REMOVE, "n3"), (ConfOp.ADD_LEARNER, "n3")]
    assert m == _m("n1 n2 n4", "n3")


def test_a_leader_no_longer_wanted_hands_over_instead_of_removing_itself() -> None:
    step = next_step(NodeId("n1"), ("n2", "n3"), NODES, _m("n1 n2 n3", "n4"))
    assert step == Transfer((NodeId("n2"), NodeId("n3")))
    # the new leader then removes n1
    assert next_step(NodeId("n2"), ("n2", "n3"), NODES, _m("n1 n2 n3", "n4")) == ConfChange(ConfOp.REMOVE,
                                                                                           NodeId("n1"))


def test_members_outside_the_cluster_are_ignored() -> None:
    assert next_step(NodeId("n1"), ("n1", "gone"), ("n1", "n2"), _m("n1", "n2")) is None
    assert next_step(NodeId("n1"), ("gone",), ("n1", "n2"), _m("n1", "n2")) is None


def test_leader_recorded_only_by_the_raft_leader_when_it_differs_and_rate_limited() -> None:
    me = NodeId("n2")
    members = ("n1", "n2", "n3")
    assert leader_to_record(me, me, "n1", members, None, 1000)
    assert not leader_to_record(me, NodeId("n1"), "n1", members, None, 1000)
    assert not leader_to_record(me, me, "n2", members, None, 1000)
    assert not leader_to_record(me, me, "n1", ("n1", "n3"), None, 1000)
    assert not leader_to_record(me, me, "n1", members, 1000, 1000 + LEADER_RECORD_INTERVAL_MS - 1)
    assert leader_to_record(me, me, "n1", members, 1000, 1000 + LEADER_RECORD_INTERVAL_MS)
