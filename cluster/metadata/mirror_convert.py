"""A classic queue becomes mirrored after declare, and back: the one metadata command that switches its log (pure).

What it is for: an `ha-mode` policy applied to an existing classic queue (RabbitMQ 3.x) moves the queue from its
Raft group to a mirror log (docs/mirrored_queues.md, "A classic queue becomes mirrored"). The node that leads the
queue's Raft group seals that log (cluster/queue/seal.py), writes the sealed state as the seed of its mirror replica,
and only then commits `ConvertToMirror` naming itself the leader: in one step the queue's type becomes "mirrored",
its members the replicas, and its controller record (`MirrorRecord`) is created with that node leading epoch 0,
alone in the ISR (the only replica known to hold the seed: the others join the ISR through the leader's
`AlterMirrorIsr` once they have fetched up to its log end, as any new replica does; under `ha-sync-mode: manual`
with messages in the queue they start held out, `hold_from`, as mirrors added after declare).

Refused: no such queue, another incarnation (the queue was deleted and declared again since the seal), an exclusive
or non-classic queue other than an already mirrored one, a leader outside the replicas, bad settings. A queue
already mirrored: nothing to do (a repeated command after a timeout is harmless).

The way back (`ConvertToClassic`): when no `ha-mode` policy applies any more, the mirror leader's node seals the
mirror log (the same `Seal`, applied below the HW, so every node applies the same prefix), writes the sealed state as
the seed of the queue's new Raft group, and only then commits `ConvertToClassic` naming itself: the queue's type
becomes "classic", its members and leader that node alone (a classic queue is a Raft group placed on one node), its
`initial_leader` that node (it leads the new group's term 1 from its seed), its generation one more (so the new Raft
group has a new id, `group_of_record`) and its `MirrorRecord` is deleted. Refused: no such queue, another
incarnation, a queue that is not mirrored (or already converted: a repeat is a no-op), and a record that changed
since the seal (another epoch, or a leader that is not the sealing node: the current leader converts instead).
"""

from __future__ import annotations

from dataclasses import dataclass

from cluster.metadata.mirror import PROMOTE, MirrorRecord


@dataclass(frozen=True, slots=True)
class ConvertToMirror:
    vhost: str
    name: str
    incarnation: int  # the declaration that was sealed
    leader: str  # the node that sealed the log and holds the seed
    replicas: tuple[str, ...]  # leader first
    min_insync: int = 1
    promote_on_failure: str = "when-synced"
    hold_from: int = 0  # > 0 (ha-sync-mode manual, messages below it): the other replicas start held out
    cid: str = ""


def refusal(queue_type: str | None, incarnation: int | None, exclusive: bool, c: ConvertToMirror) -> str:
    """Why `c` cannot convert the queue as the metadata holds it ("" = it can; `queue_type` None: no such queue)."""
    if queue_type is None:
        return f"no queue {c.name!r} in vhost {c.vhost}"
    if incarnation != c.incarnation:
        return f"queue {c.name!r}: incarnation {incarnation} is not the sealed one ({c.incarnation})"
    if queue_type != "classic" or exclusive:
        return f"queue {c.name!r}: only a durable or transient classic queue becomes mirrored (it is {queue_type})"
    if not c.replicas or len(set(c.replicas)) != len(c.replicas) or c.replicas[0] != c.leader:
        return f"queue {c.name!r}: the replicas must be distinct, with the leader first"
    if not 1 <= c.min_insync <= len(c.replicas) or c.promote_on_failure not in PROMOTE:
        return f"queue {c.name!r}: bad min in-sync or promote-on-failure"
    return ""


def converted(c: ConvertToMirror) -> MirrorRecord:
    """The controller's record of the converted queue: `c.leader` leads epoch 0, alone in the ISR (the others
    held out of it from `c.hold_from` under ha-sync-mode manual, cluster/metadata/mirror.py)."""
    held = {r: c.hold_from for r in c.replicas if r != c.leader} if c.hold_from > 0 else {}
    return MirrorRecord(c.vhost, c.name, tuple(c.replicas), leader=c.leader, epoch=0, isr=(c.leader,),
                        min_insync=c.min_insync, promote_on_failure=c.promote_on_failure, held_out=held)


@dataclass(frozen=True, slots=True)
class ConvertToClassic:
    vhost: str
    name: str
    incarnation: int  # the declaration that was sealed
    generation: int  # the queue's generation when it was sealed (the new one is generation + 1)
    epoch: int  # the mirror epoch in which `leader` sealed the log
    leader: str  # the node that sealed the mirror log and holds the seed of the new Raft group
    cid: str = ""


def back_refusal(queue_type: str | None, incarnation: int | None, generation: int | None, record: MirrorRecord | None,
                 c: ConvertToClassic) -> str:
    """Why `c` cannot turn the queue back into a classic queue ("" = it can; `queue_type` None: no such queue;
    callers check for a repeat first)."""
    if queue_type is None:
        return f"no queue {c.name!r} in vhost {c.vhost}"
    if incarnation != c.incarnation or generation != c.generation:
        return (f"queue {c.name!r}: incarnation {incarnation} generation {generation} is not the sealed one "
                f"({c.incarnation}, {c.generation})")
    if queue_type != "mirrored" or record is None:
        return f"queue {c.name!r}: only a mirrored queue becomes classic again (it is {queue_type})"
    if record.epoch != c.epoch or record.leader != c.leader:
        return (f"queue {c.name!r}: the mirror record changed since the seal (leader {record.leader or '-'} epoch "
                f"{record.epoch}, sealed by {c.leader} in epoch {c.epoch})")
    return ""
