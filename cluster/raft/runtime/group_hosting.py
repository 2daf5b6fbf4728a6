"""Which Raft groups a node hosts: adding and removing them while the node runs (a mixin of `RaftNodeRuntime`).

`add_group`/`remove_group` queue a change (before `run` they only edit the initial set); the driver's loop carries
the changes out at the start of a turn (`_apply_group_changes`): a removed group is forgotten and its stream deleted;
an added group is loaded from its stream, or created with its initial membership (made durable before it runs), or
from a `Bootstrap` (`raft.bootstrap_state`: its named first leader leads term 1 at once where the host allows it;
with a seed, the group starts from a snapshot made durable before it runs, which the host restores at once).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import trio

from cluster.raft.core.multiraft import MultiRaft
from cluster.raft.core.raft import BOOTSTRAP_TERM, bootstrap_state
from cluster.raft.core.types import GroupId, Index, Membership, NodeId, PersistedState, Snapshot
from cluster.raft.runtime.compaction import Compactor, SnapshotHost
from cluster.raft.runtime.storage import RaftStorage, committed_membership
from cluster.raft.runtime.telemetry import TelemetryWriter

GROUP_CHANGES_QUEUED_MAX = 65536


@dataclass(frozen=True, slots=True)
class Bootstrap:
    """A new group's first leader, named in advance (`raft.bootstrap_state`). Every node adding the group must name
    the same `leader`; `lead` may be True only on that node, and only if it never hosted the group before in any
    life (the host knows: it created the group in this life). Ignored for a group that has a stream already."""

    leader: NodeId
    lead: bool = False
    # A group that starts holding a state (a queue whose mirror log moved back to Raft: node/runtime/cluster/
    # mirror_back.py): its stream is created with this snapshot at SEED_INDEX (term 1, committed and applied) and
    # made durable before the group runs; the host restores it at once. Without one the group starts empty (and a
    # seeded leader sends its snapshot by InstallSnapshot).
    seed: bytes | None = None


SEED_INDEX = Index(1)


@dataclass
class NodeStats:
    """What the driver counts (`RaftNodeRuntime.stats`)."""

    ready_cycles: int = 0
    applied_entries: int = 0
    proposals_refused: int = 0
    compactions: int = 0
    restores: int = 0
    leader_changes: int = 0


class GroupHosting:
    """The group-hosting half of `RaftNodeRuntime` (which sets these attributes and the timing laps)."""

    multi: MultiRaft | None
    stats: NodeStats
    telemetry: TelemetryWriter | None
    _wake: trio.Event
    _volatile: set[GroupId]
    _groups: dict[GroupId, Membership]
    _bootstraps: dict[GroupId, Bootstrap]
    _bootstrapped: list[tuple[GroupId, bool]]
    _group_changes: deque[tuple[GroupId, Membership | None, Bootstrap | None]]
    _snapshots: SnapshotHost | None
    _known_leaders: dict[GroupId, NodeId | None]
    _compactor: Compactor
    _recheck_held: bool

    def _lap_start(self) -> float:
        raise NotImplementedError

    def _lap(self, stage: str, started_s: float) -> float:
        raise NotImplementedError

    def add_group(self, group: GroupId, membership: Membership, bootstrap: Bootstrap | None = None,
                  volatile: bool = False) -> None:
        """Host a group: before `run` it is loaded at start; while running, at the next cycle. Loaded from storage
        if it has a stream (then its stored membership wins over `membership`: storage.py), else created with
        `membership` (and, with `bootstrap`, from `raft.bootstrap_state`), made durable before the group runs.
        Adding a hosted group does nothing. `volatile`: the host drops the group's state whenever its voters
        restart (a non-durable queue on one node), so its entries need no fsync (`image.must_sync`)."""
        if volatile:
            self._volatile.add(group)
        else:
            self._volatile.discard(group)
        if self.multi is None:
            self._groups[group] = membership
            if bootstrap is None:
                self._bootstraps.pop(group, None)
            else:
                self._bootstraps[group] = bootstrap
            self._group_changes = deque(change for change in self._group_changes if change[0] != group)
            return
        self._queue_group_change(group, membership, bootstrap)

    def remove_group(self, group: GroupId) -> None:
        """Stop hosting a group and delete its stream (at the next cycle, or at start if not running yet)."""
        self._volatile.discard(group)
        if self.multi is None:
            self._groups.pop(group, None)
            self._bootstraps.pop(group, None)
        self._queue_group_change(group, None, None)

    def _queue_group_change(self, group: GroupId, membership: Membership | None, bootstrap: Bootstrap | None) -> None:
        if len(self._group_changes) >= GROUP_CHANGES_QUEUED_MAX:
            raise OverflowError("too many group changes queued")
        self._group_changes.append((group, membership, bootstrap))
        self._wake.set()

    async def _apply_group_changes(self, multi: MultiRaft, storage: RaftStorage) -> list[GroupId]:
        """Carry out the queued group changes; the groups added."""
        added: list[GroupId] = []
        sync = False
        while self._group_changes:
            group, membership, bootstrap = self._group_changes.popleft()
            lap_started = self._lap_start()
            if membership is None:
                await self._drop_group(multi, storage, group)
                self._lap("group_drop", lap_started)
            elif group not in multi.groups:
                sync |= await self._load_group(multi, storage, group, membership, bootstrap)
                added.append(group)
                self._lap("group_load", lap_started)
        if sync and storage.bytes_queued:  # new groups' initial memberships: durable before they send anything
            lap_started = self._lap_start()
            await trio.to_thread.run_sync(storage.commit)
            self._lap("group_commit", lap_started)
        self._start_bootstrapped(multi)
        self._recheck_held = True  # held commands may be for a group that is here now
        return added

    def _start_bootstrapped(self, multi: MultiRaft) -> None:
        """Groups created from a bootstrap state (durable now): the named leader leads term 1 (when the host said it
        may), the others know it as their leader."""
        started, self._bootstrapped = self._bootstrapped, []
        for group, lead in started:
            if group in multi.groups:
                multi.start_bootstrapped(group, lead)

    async def _load_group(self, multi: MultiRaft, storage: RaftStorage, group: GroupId,
                          membership: Membership, bootstrap: Bootstrap | None = None) -> bool:
        """Load or create a group; whether what it queued must be durable before the group runs. A group created
        from a bootstrap state need not wait: its first record goes with its first Ready's fsync (before any message
        that depends on it), and losing it in a crash loses nothing, as the group is then created again from the
        same state (the node's term-1 vote was for the named leader either way, and that leader leads term 1 only
        in the life the host created the group in)."""
        initial = None if bootstrap is None else bootstrap_state(membership, bootstrap.leader)
        bootstrap_hard_state = None if initial is None else initial.hard_state
        if storage.exists(group):
            persisted = await trio.to_thread.run_sync(storage.load, group, membership, bootstrap_hard_state)
        else:  # a new group: only its first record is queued, no file is read (a thread hop costs more)
            persisted = storage.load(group, membership, bootstrap_hard_state)
        self._groups[group] = membership if persisted is None else committed_membership(persisted)
        if persisted is None and initial is not None and bootstrap is not None and bootstrap.seed is not None:
            seed = Snapshot(SEED_INDEX, BOOTSTRAP_TERM, membership, bootstrap.seed)
            await trio.to_thread.run_sync(storage.compact, group, seed)  # durable (membership record too) first
            multi.add_group(group, None, PersistedState(initial.hard_state, seed, ()))
            self._bootstrapped.append((group, bootstrap.lead))
            if self._snapshots is not None:
                self._snapshots.restore(group, seed.data)
                self.stats.restores += 1
            return False
        if persisted is None and initial is not None and bootstrap is not None:
            multi.add_group(group, None, initial)
            self._bootstrapped.append((group, bootstrap.lead))
            sync = False
        else:
            multi.add_group(group, membership if persisted is None else None, persisted)  # stored membership wins
            sync = True
        if persisted is not None and persisted.snapshot.index > 0 and self._snapshots is not None:
            self._snapshots.restore(group, persisted.snapshot.data)
            self.stats.restores += 1
        return sync

    async def _drop_group(self, multi: MultiRaft, storage: RaftStorage, group: GroupId) -> None:
        """Forget the group and delete its stream (a checkpoint of the whole node log, which the loop waits for;
        deleting it beside the loop slowed the next declaration's metadata commit instead: a cheaper deletion
        belongs in cluster/log)."""
        self._groups.pop(group, None)
        multi.remove_group(group)
        storage.forget(group)
        if self.telemetry is not None:
            self.telemetry.forget(group)
        self._known_leaders.pop(group, None)
        self._compactor.forget(group)
        await trio.to_thread.run_sync(storage.delete, group)

    def groups(self) -> list[GroupId]:
        """The groups hosted (or, before `run`, declared), sorted."""
        return sorted(self._groups if self.multi is None else self.multi.groups)
