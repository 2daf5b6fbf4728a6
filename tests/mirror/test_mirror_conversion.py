"""A classic queue becoming mirrored, the pure parts: the seal rule of a replicated queue (cluster/queue/seal.py,
cluster/queue/replicated.py) and the metadata command that switches the queue (cluster/metadata/mirror_convert.py).
The real-cluster test is in test_mirror_cluster.py (`test_a_classic_queue_becomes_mirrored_through_a_policy`)."""

from __future__ import annotations

from cluster.metadata import model
from cluster.metadata.mirror import MirrorRecord
from cluster.metadata.mirror_convert import ConvertToMirror
from cluster.metadata.model import DeclareQueue, MetadataState, PutVhost, QueueRecord
from cluster.queue.envelope import Envelope, EnvelopeCodec
from cluster.queue.replicated import Proposal, ReplicatedQueue
from cluster.queue.seal import Seal, applicable
from cluster.queue.types import Accepted, Enqueue, QueuedMessage
from tests.metadata.test_mirror_controller import _apply

ABC = ("a", "b", "c")


def _enqueue(seq: int) -> Enqueue:
    return Enqueue(QueuedMessage(f"m{seq}", 2, True), 0, "p", seq)


def test_a_sealed_replica_refuses_every_later_entry_without_recording_it() -> None:
    replica = ReplicatedQueue("q")
    assert replica.apply(Proposal("a", 1, _enqueue(1))) == [Accepted("p", 1, 1)]
    assert replica.apply(Proposal("b", 7, Seal())) == [] and replica.sealed
    assert replica.apply(Proposal("a", 2, _enqueue(2))) is None  # committed after the seal: applied nowhere
    assert replica.apply(Proposal("b", 8, Seal())) is None  # a second seal too
    assert replica.queue.ready_count == 1 and replica.refused_count == 2
    assert not replica.seen("a", 2)  # not recorded: the proposer sends it again to the new log

    sealed = ReplicatedQueue.restore(replica.snapshot(lambda p: p), lambda p: p)  # a Raft snapshot after the seal
    assert sealed.sealed and sealed.apply(Proposal("a", 2, _enqueue(2))) is None
    seed = ReplicatedQueue.restore(replica.snapshot(lambda p: p, sealed=False), lambda p: p)  # the new log's seed
    assert not seed.sealed and seed.seen("b", 7) and seed.seen("a", 1)
    assert seed.apply(Proposal("a", 2, _enqueue(2))) == [Accepted("p", 2, 2)]  # applied once, from the new log
    assert seed.apply(Proposal("a", 1, _enqueue(1))) is None  # applied before the seal: skipped as a retry
    assert seed.queue.ready_count == 2


def test_a_host_applies_a_batch_up_to_and_including_the_seal() -> None:
    batch = [_enqueue(1), Seal(), _enqueue(2), Seal()]
    assert applicable(False, batch) == 2
    assert applicable(True, batch) == 0
    assert applicable(False, [_enqueue(1), _enqueue(2)]) == 2
    assert applicable(False, []) == 0


def test_the_seal_travels_through_the_envelope_codec() -> None:
    codec = EnvelopeCodec("a", lambda p: p, lambda p: p)
    envelope = Envelope(5, "a", 3, Seal())
    decoded = EnvelopeCodec("b", lambda p: p, lambda p: p).read_batch([codec.encode(envelope)], 5).envelopes
    assert decoded == [envelope]


def _classic(s: MetadataState, incarnation: int = 9) -> MetadataState:
    for command in (PutVhost("/"), DeclareQueue(QueueRecord("/", "q", leader="a", members=("a",),
                                                            incarnation=incarnation))):
        s, outcome = model.apply(s, command)
        assert outcome.ok, outcome.refused
    return s


def test_convert_switches_the_queue_and_creates_its_record_with_the_leader_alone_in_sync() -> None:
    s = _classic(MetadataState())
    s, outcome = _apply(s, ConvertToMirror("/", "q", 9, "a", ABC, min_insync=2))
    assert outcome.ok and {c.kind for c in outcome.changes} == {"queue", "mirror"}
    queue = s.queues[("/", "q")]
    assert (queue.type, queue.members, queue.leader, queue.incarnation) == ("mirrored", ABC, "a", 9)
    assert s.mirrors[("/", "q")] == MirrorRecord("/", "q", ABC, "a", 0, ("a",), min_insync=2)
    again, outcome = _apply(s, ConvertToMirror("/", "q", 9, "b", ("b",)))  # converted already: nothing changes
    assert outcome.ok and not outcome.changes and again == s


def test_convert_is_refused_for_another_incarnation_or_bad_settings() -> None:
    s = _classic(MetadataState())
    for command, why in ((ConvertToMirror("/", "q", 8, "a", ABC), "incarnation"),
                         (ConvertToMirror("/", "nope", 9, "a", ABC), "no queue"),
                         (ConvertToMirror("/", "q", 9, "b", ABC), "leader first"),
                         (ConvertToMirror("/", "q", 9, "a", ABC, min_insync=4), "min in-sync")):
        _, outcome = _apply(s, command)
        assert why in outcome.refused, (command, outcome.refused)
    quorum, _ = model.apply(MetadataState(), PutVhost("/"))
    quorum, outcome = model.apply(quorum, DeclareQueue(QueueRecord("/", "q", type="quorum", leader="a", members=ABC,
                                                                   incarnation=9)))
    assert outcome.ok, outcome.refused
    _, outcome = _apply(quorum, ConvertToMirror("/", "q", 9, "a", ABC))
    assert "only a durable or transient classic queue" in outcome.refused
