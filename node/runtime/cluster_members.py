"""Quorum member replacement: a member gone longer than `member_replace_after_ms` is swapped for an up node.

What it is for: a quorum queue keeps its voters on the nodes chosen at declaration. When one of them has been down
(no Raft connection, `PeerLiveness`) for `member_replace_after_ms`, the metadata leader asks
`cluster.metadata.placement.replacement_plan` which up node replaces it (one member per queue at a time, and only
while the queue still has a live majority, so the change can commit), and records the new member list in the
metadata (`SetQueueMembers`). The Raft side follows from there like every other member change: the queue group's
leader reconciles its membership with the metadata (`cluster_reconcile`: the new node is promoted once caught up,
then the old one is removed and kept as a learner).
"""

from __future__ import annotations

import logging
from typing import Any

from cluster.metadata import model as md

log = logging.getLogger("raftmq.cluster")


async def replace_member(runtime: Any, vhost: str, queue: str, old: str, new: str) -> bool:
    """Record `new` instead of `old` among the queue's members (the Raft change follows). True when committed."""
    record = runtime.store.state.queues.get((vhost, queue))
    if record is None or old not in record.members or new in record.members:
        return False
    log.warning("cluster: queue %s/%s: replacing member %s (down) with %s", vhost, queue, old, new)
    members = tuple(new if m == old else m for m in record.members)
    outcome = await runtime.apply_definition(md.SetQueueMembers(vhost, queue, members))
    return outcome is not None and outcome.ok
