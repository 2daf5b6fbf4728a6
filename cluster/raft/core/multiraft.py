"""Many Raft groups on one node: one node-level tick, batched messages per peer, quiescence and failure detection.

`MultiRaft` owns a `RaftCore` per group. `tick()` advances the node clock and ticks only the *active* groups;
an idle group quiesces (its leader sends one final heartbeat with `quiesce=True` and then nothing), so a node with
thousands of idle groups does no per-group work per tick. Liveness of quiesced groups comes from node-level
failure detection instead (CockroachDB's quiescence, RabbitMQ ra's per-node monitoring): every node sends each
peer a `NodeBatch` at least every `node_heartbeat_ticks` (empty if there is nothing to carry); a peer silent for
`node_timeout_ticks`, or one that came back with a new incarnation, wakes the groups it leads (followers then
campaign) and the groups we lead that include it (so check-quorum can act). Faster, when the host knows that a
peer's process is gone (its transport's connections to the peer are refused after the link was lost, which a paused,
slow or partitioned node never causes): `peer_refused(peer)` makes the followers of the groups it leads campaign
within a few ticks (`RaftCore.leader_refused`); the peer counts as refusing until a batch from it arrives.

`ready()` collects every group's `Ready` and regroups all outgoing messages into one `NodeBatch` per destination
(split at `batch_messages_max`); the host persists every group's entries with one fsync, sends the batches,
applies, then calls `advance(node_ready)`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from cluster.raft.core.raft import BrokenVariant, RaftConfig, RaftCore, Rng
from cluster.raft.core.types import (
    Append,
    ConfChange,
    GroupId,
    Heartbeat,
    HeartbeatResp,
    Index,
    InstallSnapshot,
    Membership,
    Message,
    NodeId,
    PersistedState,
    PreVote,
    Ready,
    Role,
    TimeoutNow,
)


@dataclass(frozen=True, slots=True)
class NodeBatch:
    """One frame from node to node: every group's messages for that peer, and the node-level heartbeat."""

    src: NodeId
    dst: NodeId
    incarnation: int
    messages: tuple[tuple[GroupId, Message], ...]


EARLY_MESSAGE_TYPES = (Append, Heartbeat, InstallSnapshot, TimeoutNow, PreVote, HeartbeatResp)


def split_early(batch: NodeBatch) -> tuple[NodeBatch | None, NodeBatch | None]:
    """(messages that may leave before the Ready's fsync, messages that must wait for it).

    A leader's appends, heartbeats, snapshots and TimeoutNow, and pre-votes and heartbeat answers, carry nothing
    the sender has to have on disk first: the leader's term and vote were made durable before it could win, and a
    leader counts itself toward a commit only once its own entries are durable (etcd sends them the same way).
    Votes and append acknowledgements must wait for the fsync.
    """
    early = tuple(item for item in batch.messages if isinstance(item[1], EARLY_MESSAGE_TYPES))
    late = tuple(item for item in batch.messages if not isinstance(item[1], EARLY_MESSAGE_TYPES))
    first = NodeBatch(batch.src, batch.dst, batch.incarnation, early) if early or not late else None
    second = NodeBatch(batch.src, batch.dst, batch.incarnation, late) if late else None
    return first, second


@dataclass(frozen=True, slots=True)
class NodeReady:
    groups: tuple[tuple[GroupId, Ready], ...]
    batches: tuple[NodeBatch, ...]


@dataclass(frozen=True, slots=True)
class MultiRaftConfig:
    raft: RaftConfig = field(default_factory=lambda: RaftConfig(quiesce=True))
    node_heartbeat_ticks: int = 2
    node_timeout_ticks: int = 10
    batch_messages_max: int = 4096


class MultiRaft:
    def __init__(self, node_id: NodeId, config: MultiRaftConfig, rng: Rng, incarnation: int = 0) -> None:
        self.id = node_id
        self.config = config
        self.incarnation = incarnation
        self._rng = rng
        self.groups: dict[GroupId, RaftCore] = {}
        self._active: set[GroupId] = set()
        self._dirty: set[GroupId] = set()
        self._now = 0
        self._last_heard: dict[NodeId, int] = {}
        self._last_sent: dict[NodeId, int] = {}
        self._peer_incarnation: dict[NodeId, int] = {}
        self.down_peers: set[NodeId] = set()
        self.refusing_peers: set[NodeId] = set()  # `peer_refused` since their last batch

    # --- groups --------------------------------------------------------------------------------------------
    def add_group(
        self,
        group: GroupId,
        membership: Membership | None = None,
        persisted: PersistedState | None = None,
        broken: BrokenVariant | None = None,
    ) -> RaftCore:
        assert group not in self.groups, f"group {group} exists"
        core = RaftCore(self.id, self.config.raft, self._rng, membership, persisted, broken)
        self.groups[group] = core
        self._active.add(group)
        self._dirty.add(group)
        for peer in core.membership.members - {self.id}:
            self._last_heard.setdefault(peer, self._now)
        return core

    def start_bootstrapped(self, group: GroupId, lead: bool) -> bool:
        """`RaftCore.start_bootstrapped` for a group just added from `raft.bootstrap_state`."""
        led = self.groups[group].start_bootstrapped(lead)
        self._touch(group)
        return led

    def remove_group(self, group: GroupId) -> None:
        self.groups.pop(group, None)
        self._active.discard(group)
        self._dirty.discard(group)

    def peers(self) -> list[NodeId]:
        return sorted(self._last_heard)

    def active_group_count(self) -> int:
        return len(self._active)

    # --- input ---------------------------------------------------------------------------------------------
    def tick(self) -> None:
        self._now += 1
        for peer in self.peers():
            silent_ticks = self._now - self._last_heard[peer]
            if peer not in self.down_peers and silent_ticks > self.config.node_timeout_ticks:
                self.down_peers.add(peer)
                self._wake_groups_of(peer)
        for group in sorted(self._active):
            core = self.groups[group]
            core.tick()
            self._dirty.add(group)
            if core.quiesced:
                self._active.discard(group)

    def step(self, batch: NodeBatch) -> None:
        peer = batch.src
        self._last_heard[peer] = self._now
        self.down_peers.discard(peer)
        self.refusing_peers.discard(peer)
        known = self._peer_incarnation.get(peer)
        self._peer_incarnation[peer] = batch.incarnation
        if known is not None and known != batch.incarnation:
            self._wake_groups_of(peer)  # it restarted: whatever it led is leaderless now
        for group, message in batch.messages:
            core = self.groups.get(group)
            if core is None:
                continue  # a group we do not host (yet): the sender will retry
            core.step(message)
            self._touch(group)

    def peer_refused(self, peer: NodeId) -> list[GroupId]:
        """The host saw `peer` refuse connections after its link was lost (its process is gone): the groups it
        leads here schedule a fast campaign (`RaftCore.leader_refused`); returns them. Repeats before the next
        batch from `peer` do nothing."""
        if peer in self.refusing_peers or peer not in self._last_heard:
            return []
        self.refusing_peers.add(peer)
        refusing = frozenset(self.refusing_peers)
        woken = []
        for group in sorted(self.groups):
            core = self.groups[group]
            if core.lead == peer and core.leader_refused(refusing):
                self._touch(group)
                woken.append(group)
        return woken

    def propose(self, group: GroupId, data: bytes) -> Index | None:
        core = self.groups[group]
        index = core.propose(data)
        self._touch(group)
        return index

    def propose_many(self, group: GroupId, datas: Sequence[bytes]) -> int:
        """`RaftCore.propose_many`: how many of `datas` (a prefix) the group's leader core accepted."""
        accepted = self.groups[group].propose_many(datas)
        self._touch(group)
        return accepted

    def propose_conf_change(self, group: GroupId, change: ConfChange) -> Index | None:
        index = self.groups[group].propose_conf_change(change)
        self._touch(group)
        return index

    def transfer_leadership(self, group: GroupId, target: NodeId) -> bool:
        started = self.groups[group].transfer_leadership(target)
        self._touch(group)
        return started

    def _touch(self, group: GroupId) -> None:
        self._dirty.add(group)
        if not self.groups[group].quiesced:
            self._active.add(group)

    def _wake_groups_of(self, peer: NodeId) -> None:
        for group in sorted(self.groups):
            core = self.groups[group]
            if core.role is Role.LEADER and peer in core.membership.members:
                core.wake()
            elif core.lead == peer:
                core.wake(suspect_leader=True)
            else:
                continue
            self._touch(group)

    # --- output --------------------------------------------------------------------------------------------
    def has_ready(self) -> bool:
        return any(self.groups[group].has_ready() for group in self._dirty) or bool(self._heartbeats_due())

    def ready(self) -> NodeReady:
        readies: list[tuple[GroupId, Ready]] = []
        outgoing: dict[NodeId, list[tuple[GroupId, Message]]] = {}
        for group in sorted(self._dirty):
            core = self.groups[group]
            if not core.has_ready():
                continue
            ready = core.ready()
            readies.append((group, ready))
            for message in ready.messages:
                outgoing.setdefault(message.dst, []).append((group, message))
        self._dirty = {group for group, _ in readies}
        for peer in self._heartbeats_due():
            outgoing.setdefault(peer, [])
        batches: list[NodeBatch] = []
        chunk = self.config.batch_messages_max
        for peer in sorted(outgoing):
            messages = outgoing[peer]
            self._last_sent[peer] = self._now
            for start in range(0, max(len(messages), 1), chunk):
                batches.append(NodeBatch(self.id, peer, self.incarnation, tuple(messages[start : start + chunk])))
        return NodeReady(tuple(readies), tuple(batches))

    def _heartbeats_due(self) -> list[NodeId]:
        due_after = self.config.node_heartbeat_ticks
        return [peer for peer in self.peers() if self._now - self._last_sent.get(peer, -due_after) >= due_after]

    def advance(self, node_ready: NodeReady) -> None:
        for group, ready in node_ready.groups:
            core = self.groups.get(group)
            if core is not None:
                core.advance(ready)
                self._touch(group)
