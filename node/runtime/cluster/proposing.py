"""Queue proposals of `ClusterRuntime` (a mixin: node/runtime/cluster/runtime.py): `ProposeQueue` effects into Raft.

- `_on_propose`: the broker's `ProposeQueue` (numbered by the broker) becomes an `Envelope` for the queue group's
  incarnation, encoded by the broker's `envelope_codec`, tracked by the pure `node.clustering.proposals.
  ProposalTracker` until this node's replica applied it, and handed to the queue's Raft group (or its mirror
  group). A barrier (`Detach`) waits until the group's earlier proposals applied (`_release`); a full tracker
  refuses the proposal at once (`proposal_abandoned`: a waiting publish is nacked).
- Retries (`_retry_timer`, every `RETRY_POLL_S`): a group's unapplied proposals are sent again `RETRY_MS` after the
  last send (doubling per resend while its leader is unchanged; at once when it changes: `_send_group`, called by
  the runtime's `_on_leader_change`); one not applied after `proposal_timeout_ms` is abandoned and the broker told.
- A proposal that waited for the queue's next declaration is re-framed for the new incarnation when sent
  (`_propose_raw`); a quarantined group (its queue being deleted by a local client) takes none.
- `test_unsafe_confirm_before_commit` (test only): the local replica applies a publish before Raft commits it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import trio

from cluster.queue.envelope import Envelope, EnvelopeCodec
from cluster.queue.types import Detach, Enqueue, EnqueueMany
from cluster.raft.core.types import GroupId
from cluster.raft.runtime.node import RaftNodeRuntime
from node.clustering.incarnations import QueueGroups, queue_key
from node.clustering.proposals import Pending, ProposalTracker
from node.runtime.dispatch import wall_ms

log = logging.getLogger("raftmq.cluster")

RETRY_MS = 500  # a group's unapplied proposals are sent again this often (the leader may have changed)
RETRY_POLL_S = 0.1


class QueueProposals:
    """The proposal path of `ClusterRuntime`, which sets these attributes."""

    name: str
    broker: Any
    node: Any
    envelopes: EnvelopeCodec
    raft: RaftNodeRuntime | None
    mirror: Any  # mirror_groups.MirrorGroups | None
    group_queues: QueueGroups
    group_incarnations: dict[GroupId, int]
    tracker: ProposalTracker
    stats: dict[str, int]
    unsafe_confirm_before_commit: bool
    _quarantined: dict[GroupId, int]

    if TYPE_CHECKING:
        def dispatch(self, effects: Iterable[Any]) -> None: ...

    def _on_propose(self, effect: Any) -> None:
        """A `ProposeQueue` effect (called inside a dispatch: effects go through `apply_effects`)."""
        tracked_as = queue_key(effect.vhost, effect.queue)  # the tracker follows the queue across incarnations
        group = self.group_queues.group_of(tracked_as)
        incarnation = 0 if group is None else self.group_incarnations.get(group, 0)  # (set again when sent)
        envelope = Envelope(incarnation, self.name, effect.proposal_id, effect.command)
        data = self.envelopes.encode(envelope)
        pending = Pending(effect.proposal_id, tracked_as, effect.vhost, effect.queue, data, wall_ms(),
                          barrier=isinstance(effect.command, Detach), envelope=envelope)
        if self.tracker.full():
            log.warning("cluster: %d proposals in flight; refusing one for %s", len(self.tracker), tracked_as)
            self.stats["abandoned"] += 1
            self.node.apply_effects(self.broker.proposal_abandoned(effect.vhost, effect.queue, envelope))
            return
        self.tracker.add(pending)
        self.stats["proposed"] += 1
        if self.tracker.held_back(pending):
            self.stats["barriers_held"] += 1  # sent once the earlier proposals of the group applied (_release)
            return
        if self.raft is not None and group is not None and group not in self._quarantined:
            pending.sent_ms = pending.first_ms
            self._propose_raw(group, pending)
            if self.unsafe_confirm_before_commit and isinstance(effect.command, (Enqueue, EnqueueMany)):
                self._apply_before_commit(effect.vhost, effect.queue, envelope)

    def _apply_before_commit(self, vhost: str, queue: str, envelope: Envelope) -> None:
        """test_unsafe_confirm_before_commit: the local replica applies the proposal now (so the publish is
        confirmed); the committed entry is later skipped by the replica's dedup of its proposal id. Still tracked
        and re-sent until it commits. Unsafe: the message exists only here until then, and this replica's message
        ids can differ from the others' (it applied the entry out of log order)."""
        self.stats["applied_before_commit"] += 1
        try:
            effects = self.broker.apply_committed(vhost, queue, (envelope,))
        except Exception:
            log.exception("cluster: applying a proposal before its commit failed")
            return
        self.node.apply_effects(effects)

    def _send_group(self, group: GroupId, now_ms: int) -> None:
        """(Re)send every unapplied proposal for the queue of the group, oldest first."""
        key = self.group_queues.get(group)
        if key is not None:
            self._send_queue(queue_key(*key), now_ms)

    def _send_queue(self, tracked_as: str, now_ms: int) -> None:
        """(Re)send every unapplied proposal for the queue (its `queue_key`) to its current group, oldest first."""
        group = self.group_queues.group_of(tracked_as)
        if self.raft is None or group is None or group in self._quarantined:
            return
        for pending in self.tracker.sendable(tracked_as):
            if pending.sent_ms is not None:
                self.stats["resent"] += 1
            pending.sent_ms = now_ms
            self._propose_raw(group, pending)

    def _propose_raw(self, group: GroupId, pending: Pending) -> None:
        """Hand a proposal to Raft, for the group's incarnation (one that waited for the queue's next declaration
        is re-framed for it first)."""
        assert self.raft is not None
        incarnation = self.group_incarnations.get(group, 0)
        envelope = pending.envelope
        if envelope is not None and envelope.incarnation != incarnation:
            pending.data = self.envelopes.reframed(pending.data, incarnation)
            pending.envelope = dataclasses.replace(envelope, incarnation=incarnation)
        if self.mirror is not None and group in self.mirror.groups:
            self.mirror.propose(group, pending.data)  # (a seal here: the way back, node/runtime/cluster/mirror_back.py)
        else:
            self.raft.propose(group, pending.data)

    def _release(self, tracked_as: str) -> None:
        """Send the queue's barriers (Detach) whose earlier proposals have all been applied or given up now."""
        group = self.group_queues.group_of(tracked_as)
        if self.raft is None or group is None or group in self._quarantined:
            return
        now = wall_ms()
        for pending in self.tracker.released(tracked_as):
            pending.sent_ms = now
            self._propose_raw(group, pending)

    def _abandon(self, pending: Pending) -> None:
        self.stats["abandoned"] += 1
        log.info("cluster: proposal %d for %s/%s not applied in time; abandoned", pending.proposal_id,
                 pending.vhost, pending.queue)
        if pending.envelope is not None:
            self.dispatch(self.broker.proposal_abandoned(pending.vhost, pending.queue, pending.envelope))

    async def _retry_timer(self) -> None:
        while True:
            await trio.sleep(RETRY_POLL_S)
            now = wall_ms()
            expired = self.tracker.expired(now)
            for pending in expired:
                self._abandon(pending)
            for tracked_as in {pending.group for pending in expired}:
                self._release(tracked_as)
            for tracked_as in self.tracker.groups_due(now):
                self.tracker.retried(tracked_as)  # the leader is unchanged: the next resend backs off (proposals.py)
                self._send_queue(tracked_as, now)
