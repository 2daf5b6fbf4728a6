"""Queue group membership and node liveness of `ClusterRuntime` (a mixin: node/runtime/cluster/runtime.py).

- Membership (`_reconcile_groups`): every `RECONCILE_POLL_S`, for each queue group this node leads, one Raft
  membership step towards the metadata's members (`node.clustering.reconcile.next_step`; a leadership transfer
  goes to the reachable candidate whose log is furthest), and the metadata's recorded leader brought in step with
  the Raft leader (`SetQueueLeader`, rate-limited by `leader_to_record`).
- Liveness (`_liveness_watch`): a peer without a Raft connection for `node_down_after_ms`, or at once one that
  refuses connections, is reported to the broker (`Broker.node_down`); on the metadata leader each node's
  recorded state is brought in step (`SetNodeState`), the exclusive queues of down nodes are deleted and quorum
  members down longer than `member_replace_after_ms` are replaced (node/runtime/cluster/members.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import trio

from cluster.metadata import model as md
from cluster.metadata import placement
from cluster.metadata.store import MetadataStore
from cluster.raft.core.types import GroupId, NodeId
from cluster.raft.runtime.node import RaftNodeRuntime
from node.clustering.incarnations import QueueGroups
from node.clustering.mirror_policy import mirror_plan, same_plan
from node.clustering.proposals import PeerLiveness
from node.clustering.reconcile import RECONCILE_POLL_S, Transfer, leader_to_record, next_step
from node.runtime.cluster.definition_replies import owned_by
from node.runtime.cluster.members import replace_member
from node.runtime.config import ClusterLayout, NodeConfig
from node.runtime.dispatch import wall_ms

log = logging.getLogger("raftmq.cluster")

LIVENESS_POLL_S = 0.25
MIRROR_RESEND_MS = 5_000  # an AlterMirrorReplicas that changed nothing (a leader waiting for a synced successor)


class MembershipAndLiveness:
    """The membership and liveness tasks of `ClusterRuntime`, which sets these attributes."""

    config: NodeConfig
    layout: ClusterLayout
    broker: Any
    name: str
    store: MetadataStore | None
    raft: RaftNodeRuntime | None
    mirror: Any  # mirror_groups.MirrorGroups | None
    mirrored: md.MetadataState
    group_queues: QueueGroups
    liveness: PeerLiveness
    _metadata_tasks: trio.Nursery | None
    _replacing: set[tuple[str, str]]
    _last_steps: dict[GroupId, object]
    _leader_recorded_ms: dict[GroupId, int]
    _mirror_proposed: dict[tuple[str, str], tuple[Any, int]]  # queue -> (AlterMirrorReplicas, when) last sent

    if TYPE_CHECKING:
        def dispatch(self, effects: Iterable[Any]) -> None: ...

        async def apply_definition(self, command: md.Command) -> md.Outcome | None: ...

    async def _reconcile_groups(self) -> None:
        """Every RECONCILE_POLL_S: for each queue group this node leads, one Raft membership step towards the
        metadata's members, and the metadata's leader brought in step with the Raft leader (`node.clustering.reconcile`)."""
        while True:
            await trio.sleep(RECONCILE_POLL_S)
            try:
                self._reconcile_round(wall_ms())
            except Exception:
                log.exception("cluster: membership reconciliation failed")

    def _reconcile_round(self, now_ms: int) -> None:
        raft = self.raft
        if raft is None:
            return
        me = NodeId(self.name)
        for group, key in list(self.group_queues.items()):
            record = self.mirrored.queues.get(key)
            membership = raft.membership_of(group)
            if raft.leader_of(group) != me or record is None or membership is None:
                self._last_steps.pop(group, None)
                continue
            step = next_step(me, record.members, self.layout.names, membership)
            if step != self._last_steps.get(group) and step is not None:
                log.info("cluster: queue %s: membership %s/%s -> members %s: %s", group, sorted(membership.voters),
                         sorted(membership.learners), list(record.members), step)
            self._last_steps[group] = step
            if isinstance(step, Transfer):
                raft.transfer_leadership(group, self._transfer_target(group, step.candidates))
            elif step is not None:
                raft.change_membership(group, step)
            if leader_to_record(me, me, record.leader, record.members, self._leader_recorded_ms.get(group), now_ms):
                self._leader_recorded_ms[group] = now_ms
                if self._metadata_tasks is not None:
                    log.info("cluster: queue %s: recording Raft leader %s (metadata said %s)", group, me,
                             record.leader)
                    self._metadata_tasks.start_soon(self.apply_definition,
                                                    md.SetQueueLeader(record.vhost, record.name, self.name))

    def _transfer_target(self, group: GroupId, candidates: tuple[NodeId, ...]) -> NodeId:
        """The reachable candidate whose log matches the leader's furthest (the first candidate if none known)."""
        assert self.raft is not None
        try:
            match: dict[Any, int] = self.raft.group_status(group).get("match") or {}
        except KeyError:
            match = {}
        connected = self.raft.connected_peers()
        ranked = sorted(candidates, key=lambda n: (n not in connected, -int(match.get(n, 0)), n))
        return ranked[0]

    # ------------------------------------------------------------------------------------------ liveness
    def _is_metadata_leader(self) -> bool:
        me = self.layout.me
        return self.store is not None and self.store.leader() == me.metadata_address

    async def _liveness_watch(self) -> None:
        assert self.raft is not None
        self.liveness.start_ms = wall_ms()  # peers get node_down_after_ms from now to connect
        while True:
            await trio.sleep(LIVENESS_POLL_S)
            refusing = self.raft.transport.refusing_peers()
            went_down, came_up = self.liveness.observe(self.raft.connected_peers(), wall_ms(), refusing)
            for peer in went_down:
                if peer in refusing:
                    log.warning("cluster: node %s refuses connections (its process is gone): down", peer)
                else:
                    log.warning("cluster: node %s unreachable for %d ms: down", peer, self.config.node_down_after_ms)
                self.dispatch(self.broker.node_down(peer))
                if self.mirror is not None:  # mirrored queues: the metadata group elects from the ISR
                    self.mirror.node_down(peer, set(self.layout.names) - set(self.liveness.down))
            for peer in came_up:
                log.info("cluster: node %s is back", peer)
                if self.mirror is not None:
                    self.mirror.node_up(peer)
            if not self._reconciling and self._metadata_tasks is not None and self._is_metadata_leader():
                self._reconciling = True
                self._metadata_tasks.start_soon(self._reconcile_node_states)

    def _peer_refused(self, peer: str) -> None:
        """The Raft transport saw `peer` refuse a connection after its link was lost (its process is gone), as its
        Raft groups elect at once: if it led the metadata group, that campaigns now too (cluster/metadata/
        fast_election.py), and the mirrored queues it leads are reported down at once (mirror_failures.py)."""
        member = next((m for m in self.layout.members if m.name == peer), None)
        if member is not None and self.store is not None:
            self.store.leader_refused(member.metadata_address)
        if self.mirror is not None:
            self.mirror.peer_refused(peer)

    _reconciling = False

    async def _reconcile_node_states(self) -> None:
        """On the metadata leader: make each node's recorded state match this node's view (SetNodeState), and
        delete the exclusive queues of nodes recorded down (their owning connections are gone)."""
        try:
            assert self.store is not None
            for name, record in sorted(self.store.state.nodes.items()):
                wanted = "down" if name in self.liveness.down else "up"
                if record.state != wanted and name in self.layout.names:
                    log.info("cluster: recording node %s %s", name, wanted)
                    await self.apply_definition(md.SetNodeState(name, wanted))
            state = self.store.state
            down = {name for name, record in state.nodes.items() if record.state == "down"}
            for queue in list(state.queues.values()):
                if any(owned_by(queue.exclusive_owner, node) for node in down):
                    log.info("cluster: deleting exclusive queue %s/%s of a down node", queue.vhost, queue.name)
                    await self.apply_definition(md.DeleteQueue(queue.vhost, queue.name))
            self._plan_replacements()
            await self._reconcile_mirrors()
        finally:
            self._reconciling = False

    async def _reconcile_mirrors(self) -> None:
        """On the metadata leader: each mirrored queue's replicas to what its policy asks for now
        (node/clustering/mirror_policy.py); the same command is not sent again within MIRROR_RESEND_MS."""
        assert self.store is not None
        now = wall_ms()
        up = set(self.layout.names) - set(self.liveness.down)
        for gone in [key for key in self._mirror_proposed if key not in self.store.state.mirrors]:
            del self._mirror_proposed[gone]  # (a deleted queue's last command: bounded by the mirrored queues)
        for command in mirror_plan(self.store.state, up, self.liveness.down_since_ms, now,
                                   self.config.mirror_replace_after_ms, self.broker.queue_msg_id_span):
            key = (command.vhost, command.name)
            last = self._mirror_proposed.get(key)
            if last is not None and same_plan(last[0], command) and now - last[1] < MIRROR_RESEND_MS:
                continue
            self._mirror_proposed[key] = (command, now)
            log.info("cluster: mirrored queue %s/%s: replicas %s -> %s (policy)", command.vhost, command.name,
                     ",".join(self.store.state.mirrors[key].replicas), ",".join(command.replicas))
            await self.apply_definition(command)

    def _plan_replacements(self) -> None:
        """Start a replacement for each quorum member down longer than member_replace_after_ms (0 = never)."""
        replace_after_ms = self.config.member_replace_after_ms
        if not replace_after_ms or self.store is None or self._metadata_tasks is None:
            return
        plan = placement.replacement_plan(self.store.state, self.liveness.down_since_ms, wall_ms(), replace_after_ms)
        for vhost, queue, old, new in plan:
            if (vhost, queue) not in self._replacing:
                self._replacing.add((vhost, queue))
                self._metadata_tasks.start_soon(self._replace, vhost, queue, old, new)

    async def _replace(self, vhost: str, queue: str, old: str, new: str) -> None:
        try:
            if await replace_member(self, vhost, queue, old, new):
                log.warning("cluster: queue %s/%s: member %s replaced by %s", vhost, queue, old, new)
        finally:
            self._replacing.discard((vhost, queue))
