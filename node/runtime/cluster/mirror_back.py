"""A mirrored queue becomes classic again, in a cluster: its log moves from its mirror log to a new Raft group.

What it is for: RabbitMQ 3.x stops mirroring a queue when no `ha-mode` policy applies to it any more, keeping its
messages and consumers (docs/mirrored_queues.md, "A mirrored queue becomes classic again"). It is the reverse of
mirror_conversion.py and uses the same cut point, the seal: every node's broker applies the mirror log's records
below the HW to its copy of the queue machine, so every node applies the same prefix up to the `Seal` record, and
nothing after it (`mirror_conversion.cut`, for mirror groups too).

How it works, in order (`ClusterRuntime` calls these; `step` runs in the poll loop of mirror_polling.py):
1. `step` (every node, every poll): for each mirrored queue whose mirror log this node leads (the committed record
   names it, in its replica's epoch) and to which no `ha-mode` policy applies now, propose `Seal` into the mirror
   log (the broker's `seal_queue`; again after RESEND_MS while it has not applied). The groups are looked at only
   when what that depends on changed (the metadata, a replica's role, a seal applied here: `_changed`), while a
   seal or conversion is under way, and every FULL_SCAN_MS.
2. Every node applies the mirror records up to the seal and none after it; later proposals stay with their
   proposers (the tracker) and go to the new Raft group after the switch (step 4), where they are applied once.
3. `step`, once this node applied the seal and still leads: write the sealed state, seal lifted, as the seed of the
   queue's new Raft group (a file under <data_dir>/raft-seeds/, fsynced) and only then commit `ConvertToClassic`
   (cluster/metadata/mirror_convert.py): type classic, members and initial leader this node, generation + 1 (so
   the Raft group has a new id: a node down meanwhile drops the older group's stream instead of rejoining with it),
   the mirror record deleted. Refused if the record changed since the seal (then the current leader converts).
4. `switch` (every node, from `_sync_groups`, when the metadata says classic for a queue hosted as a mirror group):
   remove the mirror group and its files, keep the queue's pending proposals (except seals), and let
   `_sync_groups` add the Raft group with `bootstrap`'s seed: the seed file on the sealing node (which leads term 1
   from it), this node's own sealed state seal lifted elsewhere (the same prefix), or nothing on a node that had
   not applied the seal: it starts empty and gets the leader's snapshot by InstallSnapshot. The seed is restored
   into the broker as the group is created (the broker's replica is unsealed again).
Consumers stay attached (their Attach is in the seed) and message ids do not change, as in RabbitMQ. A queue sealed
here is converted even if a policy mirrors it again meanwhile (the seal cannot be undone; mirror_conversion.py then
makes it mirrored again).
"""

from __future__ import annotations

import logging
import pathlib
from collections.abc import Mapping
from typing import Any, Final

import trio

from cluster.metadata import model as md
from cluster.metadata.mirror_convert import ConvertToClassic
from cluster.mirror_queues.runtime.storage import write_atomically
from cluster.queue.envelope import frame_snapshot
from cluster.queue.group_ids import queue_group_id
from cluster.queue.seal import Seal
from cluster.raft.core.types import GroupId, NodeId
from cluster.raft.runtime.group_hosting import Bootstrap
from node.clustering.definitions import mirror_spec_in, vhost_policies
from node.clustering.incarnations import group_of_record, queue_key
from node.runtime.cluster.mirror_conversion import (
    FULL_SCAN_MS as FULL_SCAN_MS,  # (the same rule as the conversion)
)
from node.runtime.cluster.mirror_conversion import full_scan_due
from node.runtime.dispatch import wall_ms

log = logging.getLogger("raftmq.cluster")

RESEND_MS: Final = 2_000  # a seal or conversion not seen applied is tried again after this long
SEEDS_DIR: Final = "raft-seeds"


def seed_path(data_dir: pathlib.Path, group: str) -> pathlib.Path:
    return data_dir / SEEDS_DIR / group.encode().hex()


def _write_seed(path: pathlib.Path, data: bytes) -> None:
    """(In a worker thread) the seed file, atomically and durably."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, data)


def _own_seed(rt: Any, vhost: str, name: str, incarnation: int) -> bytes:
    return frame_snapshot(incarnation, bytes(rt.broker.queue_snapshot(vhost, name, sealed=False)))


def switch(rt: Any, wanted: Mapping[GroupId, md.QueueRecord]) -> None:
    """Step 4: the queues hosted as mirror groups that the metadata now says are classic (under a new group id)
    leave their mirror log here; `_sync_groups` then adds their Raft group (seeded: `bootstrap`)."""
    assert rt.mirror is not None
    classic = {(q.vhost, q.name): (group, q) for group, q in wanted.items() if q.type == "classic"}
    for group in list(rt.mirror.groups):
        key = rt.group_queues.get(group)
        if key is None or key not in classic or classic[key][0] == group:
            continue
        new_group, queue = classic[key]
        if queue.incarnation != rt.group_incarnations.get(group):
            continue  # another declaration: the ordinary remove and add
        vhost, name = key
        if rt.broker.queue_sealed(vhost, name):
            if not (queue.initial_leader == rt.name and seed_path(rt.data_dir, new_group).exists()):
                rt.seeds[new_group] = _own_seed(rt, vhost, name, queue.incarnation)
        else:
            log.info("cluster: queue %s becomes classic; this node had not applied the seal of its mirror log: it "
                     "starts from the Raft leader's snapshot", queue_key(vhost, name))
        log.info("cluster: queue %s becomes classic: leaving its mirror log %s for Raft group %s",
                 queue_key(vhost, name), group, new_group)
        rt.mirror.remove_group(group)
        del rt.group_queues[group]
        rt.group_incarnations.pop(group, None)
        rt._record_incarnation(group, None)
        for pending in rt.tracker.of_group(queue_key(vhost, name)):
            if pending.envelope is not None and type(pending.envelope.command) is Seal:
                rt.tracker.applied(pending.proposal_id)  # (done: the log it sealed is gone)


def bootstrap(rt: Any, group: GroupId, queue: md.QueueRecord) -> Bootstrap | None:
    """How the Raft group of a queue that came back from a mirror log starts (None: not such a group): from the
    seed file on the node that sealed it (which leads term 1), else from this node's own seed taken at the switch,
    else empty (InstallSnapshot from the leader)."""
    if not queue.generation or not queue.initial_leader:
        return None
    leader = NodeId(queue.initial_leader)
    own = rt.seeds.pop(group, None)
    path = seed_path(rt.data_dir, group)
    if queue.initial_leader == rt.name and path.exists():
        return Bootstrap(leader, lead=True, seed=path.read_bytes())
    return Bootstrap(leader, seed=own)


class Progress:
    """What `step` remembers between polls."""

    def __init__(self) -> None:
        self.last: dict[tuple[str, tuple[str, str]], int] = {}  # ("seal"|"convert", (vhost, name)) -> proposed at
        self.seeds_checked: Any = None  # the metadata state the seed files were last checked against
        self.scanned: tuple[Any, ...] | None = None  # what `_changed` compares: the last scan's
        self.scanned_ms = 0


def _changed(rt: Any, progress: Progress, now: int) -> bool:
    """Whether the mirror groups need a look: whether the answer of the scan below can differ from the last one.
    It depends on the metadata (records, policies: `store.state`), on the replicas' role and epoch (changed only
    as `_sync_groups` applies a metadata state here: `rt.mirrored`) and on the seals applied here (`cut`), which
    are all compared by identity (the count is the object `stats` holds); every FULL_SCAN_MS it looks anyway."""
    return full_scan_due(progress, (rt.store.state, rt.mirrored, rt.stats.get("seals_applied", 0)), now)


async def step(rt: Any, progress: Progress) -> None:
    """Steps 1 and 3 for the mirrored queues this node leads: every mirror group is looked at when something it
    depends on changed (`_changed`) or a seal or conversion is under way, else none."""
    if rt.store is None or rt.mirror is None:
        return
    state = rt.store.state
    now = wall_ms()
    last = progress.last
    for stale in [k for k in last if k[1] not in state.mirrors]:
        del last[stale]
    if state is not progress.seeds_checked:  # (a seed goes stale only by a metadata change)
        progress.seeds_checked = state
        _drop_old_seeds(rt, state)
    if not _changed(rt, progress, now) and not last:
        return
    policies: dict[str, list[Any]] = {}  # per vhost, made once per poll
    for group, g in list(rt.mirror.groups.items()):
        key = (g.vhost, g.name)
        queue, record = state.queues.get(key), state.mirrors.get(key)
        if (queue is None or record is None or queue.type != "mirrored" or group_of_record(queue) != group
                or record.leader != rt.name or g.replica.role != "leader" or g.replica.epoch != record.epoch):
            continue
        sealed = rt.broker.queue_sealed(*key)
        if g.vhost not in policies:
            policies[g.vhost] = vhost_policies(state, g.vhost)
        if not sealed and mirror_spec_in(state, g.vhost, g.name, policies[g.vhost]) is not None:
            continue
        action = ("convert" if sealed else "seal", key)
        if now - last.get(action, now - RESEND_MS) < RESEND_MS:
            continue
        last[action] = now
        if not sealed:
            log.info("cluster: queue %s: no ha-mode policy applies any more: sealing its mirror log", queue_key(*key))
            rt.dispatch(rt.broker.seal_queue(*key))
            continue
        new_group = queue_group_id(queue.vhost, queue.name, queue.incarnation, queue.generation + 1)
        seed = _own_seed(rt, queue.vhost, queue.name, queue.incarnation)
        await trio.to_thread.run_sync(_write_seed, seed_path(rt.data_dir, new_group), seed)  # before the commit
        log.info("cluster: queue %s: converting back to classic (Raft group %s led here)", queue_key(*key), new_group)
        await rt.apply_definition(ConvertToClassic(queue.vhost, queue.name, queue.incarnation, queue.generation,
                                                   record.epoch, rt.name))


def _drop_old_seeds(rt: Any, state: md.MetadataState) -> None:
    """Seed files of groups the metadata no longer has (the queue was deleted or converted again)."""
    directory = rt.data_dir / SEEDS_DIR
    if not directory.is_dir():
        return
    wanted = {group_of_record(q).encode().hex() for q in state.queues.values() if q.type == "classic"}
    wanted |= {queue_group_id(q.vhost, q.name, q.incarnation, q.generation + 1).encode().hex()
               for q in state.queues.values() if q.type == "mirrored"}
    for path in directory.iterdir():
        if path.name not in wanted and not path.name.endswith(".tmp"):
            path.unlink(missing_ok=True)
