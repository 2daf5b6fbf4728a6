"""A classic queue becomes mirrored after declare, in a cluster: its log moves from its Raft group to a mirror log.

What it is for: RabbitMQ 3.x mirrors an existing classic queue when an `ha-mode` policy starts applying to it,
keeping its messages and consumers (docs/mirrored_queues.md, "A classic queue becomes mirrored"). Here a classic
queue's log is a Raft group and a mirrored queue's a mirror log (node/runtime/cluster/mirror_groups.py); every
node's broker applies the queue's log to its copy of the queue machine, so the move needs one point of the log
that every node agrees on, after which the old log is read no more and the new one starts: the seal.

How it works, in order (`ClusterRuntime` calls these; `step` runs in the poll loop of mirror_polling.py):
1. `step` (every node, every poll): for each classic queue whose Raft group this node leads and whose policy now
   asks for mirroring, propose `Seal` into the Raft group (the broker's `seal_queue`; again after RESEND_MS
   while it has not applied).
2. `cut` (every node, each committed batch of a Raft group): a replica applies nothing after the seal
   (cluster/queue/seal.py), so entries committed after it are not handed to the broker and not marked applied
   in the proposal tracker: their proposers keep them and send them again to the new log (step 4). It counts the
   seals applied here (`stats["seals_applied"]`: mirror_back.py looks at its queues again when it changes).
3. `step`, once this node applied the seal and still leads the Raft group: write the sealed state, seal lifted,
   as the seed of this node's mirror replica (`MirrorGroups.seed`: the snapshot at offset SEED_OFFSET, epoch 0),
   then commit `ConvertToMirror` (cluster/metadata/mirror_convert.py): the queue's type becomes mirrored, the
   replicas those the policy chooses with this node first, and this node leads epoch 0 alone in the ISR. The seed
   is on disk before the commit, so the leader never starts the mirror log empty. A queue sealed here is
   converted even if its policy went away meanwhile (the seal cannot be undone; mirror_back.py then turns it back).
4. `switch` (every node, from `_sync_groups`, when the metadata says mirrored for a queue hosted as a Raft group):
   seed this node's replica too when its broker applied the seal (and no seed is there yet), remove the Raft group
   (its entries after the seal are never applied), keep the queue's pending proposals (except seals) and let
   `_sync_groups` add the mirror group, which restores the seed and takes the pending proposals. A node that had
   not applied the seal starts with an empty mirror log: it fetches below the leader's log start and installs the
   leader's snapshot (its broker's copy is replaced). Followers join the ISR once they reach the leader's log end.
Consumers stay attached (their Attach is in the state the seed holds) and are not cancelled, as in RabbitMQ;
unacked deliveries stay unacked to the same consumer. A publish committed in Raft after the seal is applied once,
from the new log, and confirmed then (or nacked if the new log does not take it before `proposal_timeout_ms`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final

from cluster.metadata import model as md
from cluster.metadata.mirror_convert import ConvertToMirror
from cluster.queue.envelope import Envelope, frame_snapshot
from cluster.queue.seal import Seal, applicable
from cluster.raft.core.types import GroupId
from node.broker.ha_policy import mirror_replicas
from node.clustering.definitions import live_nodes, mirror_spec_in, vhost_policies
from node.clustering.incarnations import group_of_record, queue_key
from node.clustering.mirror_sync import hold_from
from node.runtime.dispatch import wall_ms

log = logging.getLogger("raftmq.cluster")

FULL_SCAN_MS: Final = 5_000
RESEND_MS: Final = 2_000  # a seal or conversion not seen applied is tried again after this long


def cut(rt: Any, group: GroupId, key: tuple[str, str], envelopes: list[Envelope]) -> list[Envelope]:
    """A Raft (or mirror: the way back, mirror_back.py) group's committed envelopes that this node's replica applies:
    none after the seal (step 2)."""
    keep = applicable(rt.broker.queue_sealed(*key), [envelope.command for envelope in envelopes])
    if keep and type(envelopes[keep - 1].command) is Seal:
        rt.stats["seals_applied"] = rt.stats.get("seals_applied", 0) + 1
        log.info("cluster: queue %s: its log is sealed here (group %s)", queue_key(*key), group)
    if keep == len(envelopes):
        return envelopes
    rt.stats["after_seal"] = rt.stats.get("after_seal", 0) + len(envelopes) - keep
    return envelopes[:keep]


def switch(rt: Any, wanted: Mapping[GroupId, md.QueueRecord]) -> None:
    """Step 4: the groups hosted as Raft groups whose queue the metadata now says is mirrored leave Raft here."""
    assert rt.raft is not None and rt.mirror is not None
    for group, queue in wanted.items():
        if queue.type != "mirrored" or group not in rt.group_queues or group in rt.mirror.groups:
            continue
        vhost, name = rt.group_queues[group]
        if not rt.broker.queue_sealed(vhost, name):
            log.info("cluster: queue %s becomes mirrored; this node had not applied the seal of its Raft log: "
                     "it starts from the mirror leader's snapshot", queue_key(vhost, name))
        elif not rt.mirror.directory_of(group).exists():  # (the converting node seeded it before its commit)
            rt.mirror.seed(group, _seed(rt, group, vhost, name))
        log.info("cluster: queue %s becomes mirrored: leaving its Raft group %s", queue_key(vhost, name), group)
        rt.raft.remove_group(group)
        del rt.group_queues[group]
        rt.group_incarnations.pop(group, None)
        for pending in rt.tracker.of_group(queue_key(vhost, name)):
            if pending.envelope is not None and type(pending.envelope.command) is Seal:
                rt.tracker.applied(pending.proposal_id)  # (done: the log it sealed is gone)


def drop_raft_streams(rt: Any, state: md.MetadataState) -> None:
    """Before Raft starts: the Raft stream a mirrored queue's group may have left here (this node was down when the
    queue became mirrored, so it never removed its Raft group) is deleted when Raft starts (none: nothing done)."""
    for queue in state.queues.values():
        if queue.type == "mirrored" and not queue.exclusive_owner:
            rt.raft.remove_group(group_of_record(queue))


def _seed(rt: Any, group: GroupId, vhost: str, name: str) -> bytes:
    incarnation = rt.group_incarnations.get(group, 0)
    return frame_snapshot(incarnation, bytes(rt.broker.queue_snapshot(vhost, name, sealed=False)))


class Progress:
    """What `step` remembers between polls."""

    def __init__(self) -> None:
        self.last: dict[tuple[str, tuple[str, str]], int] = {}  # ("seal"|"convert", (vhost, name)) -> proposed at
        self.scanned: tuple[Any, ...] | None = None  # what the last full scan depended on (`full_scan_due`)
        self.scanned_ms = 0


def full_scan_due(progress: Any, depends_on: tuple[Any, ...], now: int) -> bool:
    """Whether a step looks at every queue again: something in `depends_on` is not the same object as at the last
    full scan, or FULL_SCAN_MS passed since. When so, this scan is remembered (`progress.scanned`, `scanned_ms`)."""
    last = progress.scanned
    if last is not None and all(a is b for a, b in zip(depends_on, last, strict=True)) \
            and now - progress.scanned_ms < FULL_SCAN_MS:
        return False
    progress.scanned, progress.scanned_ms = depends_on, now
    return True


def _ha_policies(state: md.MetadataState) -> dict[str, list[Any]]:
    """The policies of each vhost that has an ha-mode policy (the others' queues need no policy match)."""
    vhosts = {p.vhost for p in state.policies.values() if "ha-mode" in p.definition}
    return {vhost: vhost_policies(state, vhost) for vhost in vhosts}


async def step(rt: Any, progress: Progress) -> None:
    """Steps 1 and 3 for the classic queues whose Raft group this node leads. Every queue is looked at when the
    metadata changed and every FULL_SCAN_MS (a Raft leadership can change meanwhile); in between only the queues
    with a seal or conversion under way."""
    if rt.store is None or rt.raft is None or rt.mirror is None:
        return
    state = rt.store.state
    now = wall_ms()
    last = progress.last
    for stale in [k for k in last if k[1] not in state.queues or state.queues[k[1]].type != "classic"]:
        del last[stale]
    if full_scan_due(progress, (state,), now):
        queues = list(state.queues.values())
    else:
        queues = [state.queues[key] for key in dict.fromkeys(key for _kind, key in last)]
    if not queues:
        return
    policies = _ha_policies(state)
    for queue in queues:
        key = (queue.vhost, queue.name)
        group = group_of_record(queue)
        if (queue.type != "classic" or queue.exclusive_owner or group not in rt.group_queues
                or group in rt.mirror.groups or not rt.raft.is_leader(group)):
            continue
        sealed = rt.broker.queue_sealed(*key)
        vhost_ha = policies.get(queue.vhost)
        if not sealed and vhost_ha is None:
            continue
        spec = mirror_spec_in(state, queue.vhost, queue.name, vhost_ha) if vhost_ha is not None else None
        action = ("convert" if sealed else "seal", key)
        if (not sealed and spec is None) or now - last.get(action, now - RESEND_MS) < RESEND_MS:
            continue
        last[action] = now
        if not sealed:
            log.info("cluster: queue %s: an ha-mode policy applies: sealing its Raft log", queue_key(*key))
            rt.dispatch(rt.broker.seal_queue(*key))
            continue
        replicas = mirror_replicas(spec, live_nodes(state, rt.name), rt.name) if spec is not None else (rt.name,)
        min_insync = max(1, min(spec.min_insync, len(replicas))) if spec is not None else 1
        promote = spec.promote_on_failure if spec is not None else "when-synced"
        rt.mirror.seed(group, _seed(rt, group, *key))  # on disk before the metadata names this node the leader
        command = ConvertToMirror(queue.vhost, queue.name, queue.incarnation, rt.name, replicas, min_insync,
                                  promote, hold_from(spec, rt.broker.queue_msg_id_span(*key)))
        log.info("cluster: queue %s: converting to mirrored (replicas %s)", queue_key(*key), ",".join(replicas))
        await rt.apply_definition(command)
