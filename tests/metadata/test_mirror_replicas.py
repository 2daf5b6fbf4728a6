"""AlterMirrorReplicas and the unclean TransferMirror (cluster/metadata/mirror.py) through the codec and model.apply."""

from __future__ import annotations

from cluster.metadata.mirror import (
    AlterMirrorIsr,
    AlterMirrorReplicas,
    MirrorReplicaDown,
    TransferMirror,
)
from tests.metadata.test_mirror_controller import ABC, _apply, _rec, _state

ABCD = ("a", "b", "c", "d")


def test_growing_adds_replicas_outside_the_isr_and_the_queue_members_follow() -> None:
    s = _state(("a",))
    s, outcome = _apply(s, AlterMirrorReplicas("/", "q", ABC, ABC, min_insync=2))
    assert outcome.ok and {c.kind for c in outcome.changes} == {"mirror", "queue"}
    rec = _rec(s)
    assert (rec.replicas, rec.leader, rec.epoch, rec.isr, rec.min_insync) == (ABC, "a", 0, ("a",), 2)
    assert s.queues[("/", "q")].members == ABC and s.queues[("/", "q")].leader == "a"
    again, outcome = _apply(s, AlterMirrorReplicas("/", "q", ABC, ABC, min_insync=2))  # a repeat: a no-op
    assert outcome.ok and not outcome.changes and again == s
    s, outcome = _apply(s, AlterMirrorIsr("/", "q", "a", 0, ("a", "c")))  # c caught up: the leader adds it
    assert outcome.ok and _rec(s).isr == ("a", "c")


def test_shrinking_drops_followers_from_the_isr_and_caps_min_insync() -> None:
    s = _state(ABCD, min_insync=3)
    s, outcome = _apply(s, AlterMirrorReplicas("/", "q", ("a", "b"), ABCD))
    rec = _rec(s)
    assert outcome.ok and (rec.replicas, rec.isr, rec.epoch, rec.min_insync) == (("a", "b"), ("a", "b"), 0, 2)
    _, outcome = _apply(s, AlterMirrorIsr("/", "q", "a", 0, ("a", "b", "c")))  # c is no replica any more
    assert outcome.refused


def test_the_leader_moves_to_a_live_synced_member_before_it_is_removed() -> None:
    s = _state()
    s, _ = _apply(s, AlterMirrorIsr("/", "q", "a", 0, ("a", "c")))
    s, _ = _apply(s, AlterMirrorReplicas("/", "q", ("b", "c"), ABC))
    rec = _rec(s)
    assert (rec.replicas, rec.leader, rec.epoch, rec.isr) == (("b", "c"), "c", 1, ("c",))
    assert s.queues[("/", "q")].leader == "c"


def test_the_leader_stays_while_no_other_isr_member_is_kept() -> None:
    s = _state()
    s, _ = _apply(s, AlterMirrorIsr("/", "q", "a", 0, ("a",)))
    s, _ = _apply(s, AlterMirrorReplicas("/", "q", ("b", "c"), ABC))
    rec = _rec(s)
    assert (rec.replicas, rec.leader, rec.epoch, rec.isr) == (("a", "b", "c"), "a", 0, ("a",))
    s, _ = _apply(s, AlterMirrorIsr("/", "q", "a", 0, ("a", "b")))  # b caught up; the same request again moves
    s, _ = _apply(s, AlterMirrorReplicas("/", "q", ("b", "c"), ABC))
    assert (_rec(s).replicas, _rec(s).leader, _rec(s).epoch) == (("b", "c"), "b", 1)


def test_without_a_leader_isr_members_are_kept() -> None:
    s = _state(eligible_leader_replicas=False)
    s, _ = _apply(s, AlterMirrorIsr("/", "q", "a", 0, ("a",)))
    s, _ = _apply(s, MirrorReplicaDown("/", "q", "a", 0, ("b", "c")))
    assert _rec(s).leader == ""
    s, _ = _apply(s, AlterMirrorReplicas("/", "q", ("b", "c"), ("b", "c")))
    assert _rec(s).replicas == ("b", "c", "a") and _rec(s).isr == ("a",)


def test_bad_replica_lists_are_refused() -> None:
    s = _state()
    for bad in ((), ("a", "a")):
        assert "distinct" in _apply(s, AlterMirrorReplicas("/", "q", bad, ABC))[1].refused
    assert _apply(s, AlterMirrorReplicas("/", "q", ABC, ABC, promote_on_failure="never"))[1].refused


def test_unclean_transfer_only_with_no_live_isr_member() -> None:
    s = _state()
    s, _ = _apply(s, AlterMirrorIsr("/", "q", "a", 0, ("a", "b")))
    same, _ = _apply(s, TransferMirror("/", "q", "c", ABC, unclean=True))  # b is in sync and live: not c
    assert same == s
    same, _ = _apply(s, TransferMirror("/", "q", "c", ("a", "c")))  # when-synced never promotes c
    assert same == s
    s, outcome = _apply(s, TransferMirror("/", "q", "c", ("a", "c"), unclean=True))
    rec = _rec(s)
    assert outcome.ok and (rec.leader, rec.epoch, rec.isr, rec.unclean_elections) == ("c", 1, ("c",), 1)
