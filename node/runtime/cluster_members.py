"""Quorum member replacement: a member gone longer than `member_replace_after_ms` is swapped for an up node.

What it is for: a quorum queue keeps its voters on the nodes chosen at declaration. When one of them has been down
(no Raft connection, `PeerLiveness`) for `member_replace_after_ms`, the metadata leader asks
`cluster.metadata.placement.replacement_plan` which up node replaces it (one member per queue at a time, and only
while the queue still has a live majority, so the change can commit), then:
1. promotes the new node in the queue's Raft group (it already holds a replica as a learner; added first if not),
2. removes the old member, then adds it back as a learner (every non-member node keeps a replica),
3. records the new member list in the metadata (`SetQueueMembers`).
Each Raft step is a best-effort `change_membership` (forwarded to the group's leader), repeated every
`STEP_RETRY_S` until this node's view of the group's membership shows it, for at most `STEP_TIMEOUT_S`; a step that
does not happen in time abandons the replacement (logged; the next plan tries again).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio

from cluster.metadata import model as md
from cluster.queue.replicated_codec import queue_group_id
from cluster.raft.core.types import ConfChange, ConfOp, GroupId, Membership, NodeId

log = logging.getLogger("raftmq.cluster")

STEP_RETRY_S = 1.0
STEP_TIMEOUT_S = 30.0


async def _membership_step(raft: Any, group: GroupId, change: ConfChange,
                           done: Callable[[Membership], bool]) -> bool:
    with trio.move_on_after(STEP_TIMEOUT_S):
        while True:
            membership = raft.membership_of(group)
            if membership is None:
                return False
            if done(membership):
                return True
            raft.change_membership(group, change)
            await trio.sleep(STEP_RETRY_S)
    return False


async def replace_member(runtime: Any, vhost: str, queue: str, old: str, new: str) -> bool:
    """Swap `old` for `new` among the queue's voters (Raft first, then the metadata). True when done."""
    raft = runtime.raft
    group = GroupId(queue_group_id(vhost, queue))
    old_id, new_id = NodeId(old), NodeId(new)
    log.warning("cluster: queue %s/%s: replacing member %s (down) with %s", vhost, queue, old, new)
    steps: list[tuple[ConfChange, Callable[[Membership], bool]]] = [
        (ConfChange(ConfOp.ADD_LEARNER, new_id), lambda m: new_id in m.members),
        (ConfChange(ConfOp.PROMOTE, new_id), lambda m: new_id in m.voters),
        (ConfChange(ConfOp.REMOVE, old_id), lambda m: old_id not in m.voters),
        (ConfChange(ConfOp.ADD_LEARNER, old_id), lambda m: old_id in m.learners),
    ]
    for change, done in steps:
        if not await _membership_step(raft, group, change, done):
            log.warning("cluster: queue %s/%s: membership step %s %s did not happen in %.0f s; replacement "
                        "abandoned for now", vhost, queue, change.op.value, change.node, STEP_TIMEOUT_S)
            return False
    record = runtime.store.state.queues.get((vhost, queue))
    if record is None:
        return False
    members = tuple(new if m == old else m for m in record.members)
    outcome = await runtime.apply_definition(md.SetQueueMembers(vhost, queue, members))
    return outcome is not None and outcome.ok
