"""The mirrored-queue controller as part of the metadata state machine: leader, epoch and ISR records and commands.

What it is for: a mirrored queue's leader, leader epoch, in-sync set (ISR), eligible leader replicas (ELR) and
unclean members are committed in the metadata group, as Kafka's controller records them, so every node agrees on
who leads in which epoch and a leader is only ever elected from the recorded ISR (or ELR), unless unclean election
is allowed (`promote_on_failure == "always"`). The rules themselves are the pure controller of
`cluster.mirror_queues.core.controller`; this module stores its `PartitionState` as a `MirrorRecord` and applies
the commands below to it. `cluster.metadata.model.apply` routes these commands here (`apply_mirror`).

How it works:
- `DeclareMirror` creates the record (the first replica leads epoch 0 with everyone in the ISR); declaring the same
  replicas again changes nothing, other replicas are refused. The queue record itself (type "mirrored") is
  checked by the model; deleting the queue or its vhost deletes the record.
- `AlterMirrorIsr` is the leader's shrink/expand request: accepted only from the recorded leader in its epoch,
  refused otherwise ("fenced"), so a deposed leader learns it is deposed and cannot move the ISR.
- `MirrorReplicaDown` / `MirrorReplicaUp` are the failure detector's reports (a node's process died / came back,
  `unclean` = it may have lost acknowledged writes). They carry the epoch the reporter saw (a report about an
  older epoch changes nothing, so a late or repeated report cannot depose a newer leader), the reporter's view of
  the live replicas, and the replicas' (last epoch, LEO) for KIP-966's unclean recovery. A down leader means an
  election; the epoch is bumped on every election and transfer.
- `TransferMirror` is a controlled leadership move to a live ISR member (orderly shutdown, rebalance).
Records keep sets as sorted tuples so they encode to cbor and compare equal after a round trip. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from cluster.mirror_queues.core import controller
from cluster.mirror_queues.core.types import IsrChanged, Promote, Settings

MirrorKey = tuple[str, str]  # (vhost, queue name)
PROMOTE = ("always", "when-synced")


@dataclass(frozen=True, slots=True)
class MirrorRecord:
    vhost: str
    name: str
    replicas: tuple[str, ...]
    leader: str = ""  # "" = none (no eligible replica is live: the queue is unavailable)
    epoch: int = 0
    isr: tuple[str, ...] = ()
    elr: tuple[str, ...] = ()
    unclean: tuple[str, ...] = ()
    unclean_elections: int = 0
    min_insync: int = 1
    promote_on_failure: str = "when-synced"
    eligible_leader_replicas: bool = True


@dataclass(frozen=True, slots=True)
class DeclareMirror:
    vhost: str
    name: str
    replicas: tuple[str, ...]
    min_insync: int = 1
    promote_on_failure: str = "when-synced"
    eligible_leader_replicas: bool = True
    cid: str = ""


@dataclass(frozen=True, slots=True)
class AlterMirrorIsr:
    vhost: str
    name: str
    leader: str
    epoch: int
    isr: tuple[str, ...]
    cid: str = ""


@dataclass(frozen=True, slots=True)
class MirrorReplicaDown:
    vhost: str
    name: str
    node: str
    epoch: int  # the epoch the reporter saw
    live: tuple[str, ...]  # the reporter's view of the live replicas (without `node`)
    log_ends: dict[str, Any] = field(default_factory=dict)  # replica -> [last epoch, LEO]
    cid: str = ""


@dataclass(frozen=True, slots=True)
class MirrorReplicaUp:
    vhost: str
    name: str
    node: str
    epoch: int
    live: tuple[str, ...]  # with `node`
    unclean: bool = False
    log_ends: dict[str, Any] = field(default_factory=dict)
    cid: str = ""


@dataclass(frozen=True, slots=True)
class TransferMirror:
    vhost: str
    name: str
    to: str
    live: tuple[str, ...]
    cid: str = ""


MirrorCommand = DeclareMirror | AlterMirrorIsr | MirrorReplicaDown | MirrorReplicaUp | TransferMirror
MIRROR_COMMAND_TYPES: tuple[type, ...] = (DeclareMirror, AlterMirrorIsr, MirrorReplicaDown, MirrorReplicaUp,
                                          TransferMirror)


def settings_of(record: MirrorRecord) -> Settings:
    """The controller's part of the queue's settings (the rest are the replicas' own)."""
    promote: Promote = "always" if record.promote_on_failure == "always" else "when-synced"
    return Settings(min_insync=record.min_insync, promote_on_failure=promote,
                    eligible_leader_replicas=record.eligible_leader_replicas)


def to_partition(record: MirrorRecord) -> controller.PartitionState:
    return controller.PartitionState(record.replicas, record.leader or None, record.epoch, frozenset(record.isr),
                                     frozenset(record.elr), frozenset(record.unclean), record.unclean_elections)


def from_partition(record: MirrorRecord, state: controller.PartitionState) -> MirrorRecord:
    return replace(record, leader=state.leader or "", epoch=state.epoch, isr=tuple(sorted(state.isr)),
                   elr=tuple(sorted(state.elr)), unclean=tuple(sorted(state.unclean)),
                   unclean_elections=state.unclean_elections)


def _log_ends(raw: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    return {str(r): (int(v[0]), int(v[1])) for r, v in raw.items()}


# (new record or None to leave it, refusal or "")
Result = tuple[MirrorRecord | None, str]


def _declare(old: MirrorRecord | None, c: DeclareMirror) -> Result:
    if not c.replicas or len(set(c.replicas)) != len(c.replicas):
        return None, f"mirrored queue {c.name!r}: replicas must be distinct and not empty"
    if not 1 <= c.min_insync <= len(c.replicas):
        return None, f"mirrored queue {c.name!r}: min in-sync {c.min_insync} outside 1..{len(c.replicas)}"
    if c.promote_on_failure not in PROMOTE:
        return None, f"mirrored queue {c.name!r}: unknown promote-on-failure {c.promote_on_failure!r}"
    if old is not None:
        if old.replicas == tuple(c.replicas):
            return None, ""
        return None, f"mirrored queue {c.name!r} exists with replicas {', '.join(old.replicas)}"
    state = controller.initial(tuple(c.replicas))
    record = MirrorRecord(c.vhost, c.name, tuple(c.replicas), min_insync=c.min_insync,
                          promote_on_failure=c.promote_on_failure,
                          eligible_leader_replicas=c.eligible_leader_replicas)
    return from_partition(record, state), ""


def _step(old: MirrorRecord, c: MirrorCommand) -> Result:
    state = to_partition(old)
    settings = settings_of(old)
    if isinstance(c, AlterMirrorIsr):
        if c.leader != old.leader or c.epoch != old.epoch:
            return None, (f"fenced: {c.leader} in epoch {c.epoch} is not the leader of {c.name!r} "
                          f"(leader {old.leader or 'none'}, epoch {old.epoch})")
        if c.leader not in c.isr or not set(c.isr) <= set(old.replicas):
            return None, f"mirrored queue {c.name!r}: the ISR must hold the leader and replicas only"
        new = controller.alter_isr(state, IsrChanged(c.leader, c.epoch, frozenset(c.isr)), settings)
    elif isinstance(c, TransferMirror):
        new = controller.transfer(state, c.to, frozenset(c.live))
    elif isinstance(c, MirrorReplicaDown | MirrorReplicaUp):
        if c.epoch != old.epoch or c.node not in old.replicas:
            return None, ""  # about an older epoch (or a stranger): stale, nothing to do
        live = frozenset(c.live) & frozenset(old.replicas)
        if isinstance(c, MirrorReplicaDown):
            new = controller.broker_down(state, c.node, live - {c.node}, settings, _log_ends(c.log_ends))
        else:
            new = controller.broker_up(state, c.node, live | {c.node}, c.unclean, settings, _log_ends(c.log_ends))
    else:
        return None, ""
    record = from_partition(old, new)
    return (record if record != old else None), ""


def apply_mirror(mirrors: Mapping[MirrorKey, MirrorRecord], c: MirrorCommand) -> Result:
    """The new record for `c`'s queue (None: unchanged) or why `c` is refused."""
    old = mirrors.get((c.vhost, c.name))
    if isinstance(c, DeclareMirror):
        return _declare(old, c)
    if old is None:
        return None, f"no mirrored queue {c.name!r} in vhost {c.vhost}"
    return _step(old, c)
