"""The mirrored-queue controller in the metadata state machine (cluster/metadata/mirror.py), through model.apply."""

from __future__ import annotations

import cbor2

from cluster.metadata import model
from cluster.metadata.mirror import (
    AlterMirrorIsr,
    DeclareMirror,
    MirrorRecord,
    MirrorReplicaDown,
    MirrorReplicaUp,
    TransferMirror,
)
from cluster.metadata.model import (
    DeclareQueue,
    DeleteQueue,
    DeleteVhost,
    MetadataState,
    PutVhost,
    QueueRecord,
)

ABC = ("a", "b", "c")


def _state(replicas: tuple[str, ...] = ABC, **declare: object) -> MetadataState:
    """A mirrored queue "q" in "/" declared with `replicas` (the first leads). Also used by test_mirror_replicas."""
    s = MetadataState()
    for command in (PutVhost("/"), DeclareQueue(QueueRecord("/", "q", type="mirrored", leader=replicas[0],
                                                            members=replicas)),
                    DeclareMirror("/", "q", replicas, **declare)):  # type: ignore[arg-type]
        s, outcome = model.apply(s, command)
        assert outcome.ok, outcome.refused
    return s


def _apply(s: MetadataState, command: model.Command) -> tuple[MetadataState, model.Outcome]:
    # every command goes through the codec, as it does on its way through the Raft log
    decoded = model.command_from_dict(cbor2.loads(cbor2.dumps(model.command_to_dict(command))))
    return model.apply(s, decoded)


def _rec(s: MetadataState) -> MirrorRecord:
    return s.mirrors[("/", "q")]


def test_declare_starts_epoch_0_with_everyone_in_sync_and_is_idempotent() -> None:
    s = _state()
    assert _rec(s) == MirrorRecord("/", "q", ABC, "a", 0, ABC)
    again, outcome = _apply(s, DeclareMirror("/", "q", ABC))
    assert outcome.ok and not outcome.changes and again == s
    _, outcome = _apply(s, DeclareMirror("/", "q", ("a", "b")))
    assert "exists with replicas" in outcome.refused


def test_declare_needs_a_mirrored_queue_record_and_sane_settings() -> None:
    s, _ = model.apply(MetadataState(), PutVhost("/"))
    _, outcome = _apply(s, DeclareMirror("/", "q", ABC))
    assert "no mirrored queue" in outcome.refused
    s, _ = model.apply(s, DeclareQueue(QueueRecord("/", "q", type="mirrored", leader="a", members=ABC)))
    assert "min in-sync" in _apply(s, DeclareMirror("/", "q", ABC, min_insync=4))[1].refused
    assert "promote" in _apply(s, DeclareMirror("/", "q", ABC, promote_on_failure="sometimes"))[1].refused


def test_isr_change_accepted_only_from_the_leader_in_its_epoch() -> None:
    s = _state()
    s, outcome = _apply(s, AlterMirrorIsr("/", "q", "a", 0, ("a", "b")))
    assert outcome.ok and outcome.changes[0].kind == "mirror" and _rec(s).isr == ("a", "b")
    for stale in (AlterMirrorIsr("/", "q", "b", 0, ("a", "b", "c")), AlterMirrorIsr("/", "q", "a", 1, ("a",))):
        same, outcome = _apply(s, stale)
        assert outcome.refused.startswith("fenced") and same == s


def test_leader_down_elects_from_the_recorded_isr_and_bumps_the_epoch() -> None:
    s = _state()
    s, _ = _apply(s, AlterMirrorIsr("/", "q", "a", 0, ("a", "c")))  # b fell behind
    s, outcome = _apply(s, MirrorReplicaDown("/", "q", "a", 0, ("b", "c")))
    assert outcome.ok and (_rec(s).leader, _rec(s).epoch, _rec(s).isr) == ("c", 1, ("c",))
    # the same report again (or a late one about epoch 0) changes nothing
    again, outcome = _apply(s, MirrorReplicaDown("/", "q", "a", 0, ("b", "c")))
    assert outcome.ok and again == s
    # a follower's failure is not the controller's business: the leader's lag check shrinks the ISR
    same, _ = _apply(s, MirrorReplicaDown("/", "q", "b", 1, ("c",)))
    assert same == s


def test_no_eligible_replica_leaves_the_queue_unavailable_unless_unclean_election() -> None:
    for promote, leader, unclean_elections in (("when-synced", "", 0), ("always", "b", 1)):
        s = _state(promote_on_failure=promote, eligible_leader_replicas=False)
        s, _ = _apply(s, AlterMirrorIsr("/", "q", "a", 0, ("a",)))
        s, _ = _apply(s, MirrorReplicaDown("/", "q", "a", 0, ("b", "c")))
        assert (_rec(s).leader, _rec(s).unclean_elections) == (leader, unclean_elections), promote


def test_unavailable_queue_waits_for_its_isr_member() -> None:
    s = _state(eligible_leader_replicas=False)
    s, _ = _apply(s, AlterMirrorIsr("/", "q", "a", 0, ("a",)))
    s, _ = _apply(s, MirrorReplicaDown("/", "q", "a", 0, ("b", "c")))
    assert _rec(s).leader == "" and _rec(s).epoch == 0
    s, _ = _apply(s, MirrorReplicaUp("/", "q", "b", 0, ("b", "c")))
    assert _rec(s).leader == ""  # b is not in the ISR
    s, _ = _apply(s, MirrorReplicaUp("/", "q", "a", 0, ABC))
    assert (_rec(s).leader, _rec(s).epoch) == ("a", 1)


def test_unclean_restart_leaves_the_isr_with_elr() -> None:
    s = _state(min_insync=2)
    s, _ = _apply(s, MirrorReplicaUp("/", "q", "b", 0, ABC, unclean=True, log_ends={"b": [0, 3]}))
    assert _rec(s).isr == ("a", "c") and _rec(s).unclean == ("b",)


def test_transfer_moves_leadership_to_a_live_isr_member() -> None:
    s = _state()
    s, outcome = _apply(s, TransferMirror("/", "q", "b", ABC))
    assert outcome.ok and (_rec(s).leader, _rec(s).epoch) == ("b", 1)
    same, _ = _apply(s, TransferMirror("/", "q", "z", ABC))
    assert same == s


def test_snapshot_round_trip_and_cascading_deletes() -> None:
    s = _state()
    s, _ = _apply(s, AlterMirrorIsr("/", "q", "a", 0, ("a", "b")))
    restored = model.restore(cbor2.loads(cbor2.dumps(model.snapshot(s))))
    assert restored.mirrors == s.mirrors
    gone, outcome = _apply(s, DeleteQueue("/", "q"))
    assert not gone.mirrors and ("mirror", ("/", "q"), "deleted") in [(c.kind, c.key, c.action)
                                                                       for c in outcome.changes]
    gone, _ = _apply(s, DeleteVhost("/"))
    assert not gone.mirrors
