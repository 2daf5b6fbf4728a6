"""Keeping each queue's Raft membership and recorded leader in step with the metadata (run by the group's leader).

What it is for: the metadata (`QueueRecord.members`) says which nodes are a queue's voters; `add_member`,
`delete_member`, `grow`, `shrink`, `forget_cluster_node` and the automatic member replacement change only that.
The node that leads the queue's Raft group turns the difference into Raft membership changes, one at a time:

1. a wanted voter that the group does not know yet is added as a learner (`ADD_LEARNER`);
2. a wanted voter that is a learner is promoted (`PROMOTE`; the Raft leader refuses it until the learner caught
   up, so it is simply asked again on the next round);
3. only when every wanted voter is a voter: a voter that is no longer wanted is removed (`REMOVE`), and a cluster
   node that is not a voter is (re-)added as a learner (every node keeps a replica). If the leader itself is no
   longer wanted, it first hands leadership to a wanted voter (`transfer`) instead of removing itself.

`next_step` is pure (the runtime calls it every `RECONCILE_POLL_S` for the groups it leads and carries out what it
returns); `leader_to_record` says when the leader should propose `SetQueueLeader` so the metadata names the Raft
leader after a failover.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cluster.raft.core.types import ConfChange, ConfOp, Membership, NodeId

RECONCILE_POLL_S = 1.0
LEADER_RECORD_INTERVAL_MS = 5000  # at most one SetQueueLeader per queue this often, from its Raft leader


@dataclass(frozen=True, slots=True)
class Transfer:
    """Hand the group's leadership to one of `candidates` (wanted voters; the leader is no longer wanted)."""

    candidates: tuple[NodeId, ...]


Step = ConfChange | Transfer | None


def next_step(me: NodeId, wanted: Iterable[str], cluster_nodes: Iterable[str], membership: Membership) -> Step:
    """The one change the group's leader (`me`) makes next so `membership` becomes: voters = `wanted` (those that
    are cluster nodes), learners = every other cluster node. None: nothing to do."""
    nodes = {NodeId(n) for n in cluster_nodes}
    voters_wanted = {NodeId(n) for n in wanted} & nodes
    if not voters_wanted:
        return None
    for node in sorted(voters_wanted - membership.voters):
        if node not in membership.members:
            return ConfChange(ConfOp.ADD_LEARNER, node)
        return ConfChange(ConfOp.PROMOTE, node)
    for node in sorted(membership.voters - voters_wanted):
        if node == me:
            return Transfer(tuple(sorted(voters_wanted)))
        return ConfChange(ConfOp.REMOVE, node)
    for node in sorted(nodes - membership.members):
        return ConfChange(ConfOp.ADD_LEARNER, node)
    return None


def leader_to_record(me: NodeId, raft_leader: NodeId | None, recorded_leader: str, members: Iterable[str],
                     last_recorded_ms: int | None, now_ms: int) -> bool:
    """Whether `me`, the group's Raft leader, should propose `SetQueueLeader(me)`: the metadata names another
    leader, `me` is a member (the model refuses a non-member), and the last attempt is long enough ago."""
    if raft_leader != me or recorded_leader == me or me not in set(members):
        return False
    return last_recorded_ms is None or now_ms - last_recorded_ms >= LEADER_RECORD_INTERVAL_MS
