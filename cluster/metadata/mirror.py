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
- `TransferMirror` is a controlled leadership move to a live ISR member (orderly shutdown, rebalance); with
  `unclean` (`ha-promote-on-shutdown: always`) to any live replica when no ISR member is live (an unclean
  election: the new ISR is the new leader alone, counted in `unclean_elections`).
- `AlterMirrorReplicas` changes the replica set (a policy's `ha-mode`/`ha-params`/`ha-nodes` changed, a node
  joined or left, a dead mirror is replaced) and may change `min_insync`/`promote_on_failure` with it. Removed
  replicas leave the ISR, ELR and unclean sets; new ones join the ISR only through the leader's `AlterMirrorIsr`
  once they caught up. The leader is never dropped while it is the only live ISR member the new set keeps: it
  moves first (epoch bumped) to the first live ISR member of the new set; if there is none, the leader stays a
  replica (the set is bigger than asked) and the proposer asks again later. Without a leader, ISR, ELR and unclean
  members are never dropped (they may hold the only copy). The same set again changes nothing.
- `ha-sync-mode: manual` (RabbitMQ's default): `AlterMirrorReplicas(hold_from=N)` (N > 0, the queue machine's
  next message id when the proposer added them, 0 = automatic or nothing below it) records each new replica in
  `held_out` (replica -> N). A held-out replica fetches as any other but is not synchronised: `AlterMirrorIsr`
  refuses it, so it never counts for the HW or confirms and `when-synced` never promotes it. `SyncMirror` (the
  operator's `sync_queue`, or the leader's node once every message with an id below N is gone) clears it; the
  leader then takes it into the ISR once it has fetched up to its log end. The leader and ISR members are never
  held out (an unclean election of a held-out replica clears it).
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
    # ha-sync-mode manual: replica -> join point (the queue's next message id when it was added); not synchronised,
    # so never in the ISR, until `SyncMirror` (absent in records written before it: nobody held out)
    held_out: dict[str, int] = field(default_factory=dict)


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
    unclean: bool = False  # ha-promote-on-shutdown: always: `to` may be out of sync if no ISR member is live
    cid: str = ""


@dataclass(frozen=True, slots=True)
class AlterMirrorReplicas:
    vhost: str
    name: str
    replicas: tuple[str, ...]  # the wanted replicas, in election preference order
    live: tuple[str, ...]  # the proposer's view of the live nodes
    min_insync: int = 0  # 0: keep the record's
    promote_on_failure: str = ""  # "": keep the record's
    hold_from: int = 0  # > 0 (ha-sync-mode manual): new replicas are held out of the ISR with this join point
    cid: str = ""


@dataclass(frozen=True, slots=True)
class SyncMirror:
    """Held-out replicas become synchronised (may join the ISR): `replicas`, or every held-out one if empty."""

    vhost: str
    name: str
    replicas: tuple[str, ...] = ()
    cid: str = ""


MirrorCommand = (DeclareMirror | AlterMirrorIsr | MirrorReplicaDown | MirrorReplicaUp | TransferMirror
                 | AlterMirrorReplicas | SyncMirror)
MIRROR_COMMAND_TYPES: tuple[type, ...] = (DeclareMirror, AlterMirrorIsr, MirrorReplicaDown, MirrorReplicaUp,
                                          TransferMirror, AlterMirrorReplicas, SyncMirror)


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


def _alter_replicas(old: MirrorRecord, c: AlterMirrorReplicas) -> Result:
    if not c.replicas or len(set(c.replicas)) != len(c.replicas):
        return None, f"mirrored queue {c.name!r}: replicas must be distinct and not empty"
    if c.promote_on_failure not in ("", *PROMOTE) or c.min_insync < 0:
        return None, f"mirrored queue {c.name!r}: bad min in-sync or promote-on-failure"
    wanted = list(c.replicas)
    leader, epoch = old.leader, old.epoch
    live = set(c.live)
    if leader and leader not in wanted:
        successors = [r for r in wanted if r in old.isr and r in live]
        if successors:  # move the leadership first (a transfer, in the same step)
            leader, epoch = successors[0], old.epoch + 1
        else:  # nobody in sync to take over yet: the leader stays until one is
            wanted.insert(0, leader)
    elif not leader:  # unavailable: keep everyone who may hold the only copy
        wanted += [r for r in old.replicas if r in set(old.isr) | set(old.elr) | set(old.unclean)
                   and r not in wanted]
    keep = set(wanted)
    isr = tuple(r for r in old.isr if r in keep and (epoch == old.epoch or r in live or r == leader))
    min_insync = c.min_insync or old.min_insync
    held_out = dict(old.held_out)
    if c.hold_from > 0:
        held_out.update({r: c.hold_from for r in wanted if r not in old.replicas})
    record = replace(old, replicas=tuple(wanted), leader=leader, epoch=epoch, isr=isr,
                     elr=tuple(r for r in old.elr if r in keep), unclean=tuple(r for r in old.unclean if r in keep),
                     min_insync=max(1, min(min_insync, len(wanted))),
                     promote_on_failure=c.promote_on_failure or old.promote_on_failure, held_out=held_out)
    record = _without_stale_holds(record)
    return (record if record != old else None), ""


def _without_stale_holds(record: MirrorRecord) -> MirrorRecord:
    """Only a replica that is neither the leader nor in the ISR can be held out."""
    held = {r: j for r, j in record.held_out.items()
            if r in record.replicas and r != record.leader and r not in record.isr}
    return record if held == record.held_out else replace(record, held_out=held)


def _sync(old: MirrorRecord, c: SyncMirror) -> Result:
    wanted = set(c.replicas) if c.replicas else set(old.held_out)
    held = {r: j for r, j in old.held_out.items() if r not in wanted}
    return (replace(old, held_out=held) if held != old.held_out else None), ""


def _transfer_unclean(old: MirrorRecord, c: TransferMirror) -> MirrorRecord | None:
    """ha-promote-on-shutdown: always, and no live ISR member: any live replica leads, alone in the ISR."""
    if (not c.unclean or c.to == old.leader or c.to not in old.replicas or c.to not in c.live
            or set(old.isr) & set(c.live) - {old.leader}):
        return None
    return replace(old, leader=c.to, epoch=old.epoch + 1, isr=(c.to,), elr=(), unclean=tuple(
        r for r in old.unclean if r != c.to), unclean_elections=old.unclean_elections + 1)


def _step(old: MirrorRecord, c: MirrorCommand) -> Result:
    if isinstance(c, AlterMirrorReplicas):
        return _alter_replicas(old, c)
    if isinstance(c, SyncMirror):
        return _sync(old, c)
    if isinstance(c, TransferMirror) and c.to not in old.isr:
        new_record = _transfer_unclean(old, c)
        return (_without_stale_holds(new_record) if new_record is not None else None), ""
    state = to_partition(old)
    settings = settings_of(old)
    if isinstance(c, AlterMirrorIsr):
        if c.leader != old.leader or c.epoch != old.epoch:
            return None, (f"fenced: {c.leader} in epoch {c.epoch} is not the leader of {c.name!r} "
                          f"(leader {old.leader or 'none'}, epoch {old.epoch})")
        if c.leader not in c.isr or not set(c.isr) <= set(old.replicas):
            return None, f"mirrored queue {c.name!r}: the ISR must hold the leader and replicas only"
        held = sorted(set(c.isr) & set(old.held_out))
        if held:
            return None, (f"mirrored queue {c.name!r}: {', '.join(held)} not synchronised (ha-sync-mode manual: "
                          "sync_queue, or consume the messages older than its join)")
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
    record = _without_stale_holds(from_partition(old, new))
    return (record if record != old else None), ""


def apply_mirror(mirrors: Mapping[MirrorKey, MirrorRecord], c: MirrorCommand) -> Result:
    """The new record for `c`'s queue (None: unchanged) or why `c` is refused."""
    old = mirrors.get((c.vhost, c.name))
    if isinstance(c, DeclareMirror):
        return _declare(old, c)
    if old is None:
        return None, f"no mirrored queue {c.name!r} in vhost {c.vhost}"
    return _step(old, c)
