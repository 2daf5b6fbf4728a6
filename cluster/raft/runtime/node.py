"""The trio driver of one node's MultiRaft: timers, inbound batches, proposals, and the Ready cycle.

One task owns the MultiRaft. It wakes when a batch arrives, a command is queued or a tick is due; it then adds and
removes the groups the host asked for (group_hosting.py; `add_group`/`remove_group` work before and during `run`; a new group's initial
membership is committed before it runs and a restarted group keeps its stored one; a removed group's stream is
deleted in a worker thread; a new group added with a `Bootstrap` starts from `raft.bootstrap_state`, stored with its
membership in one record that rides with its first Ready (with a seed: from a snapshot, made durable before it runs),
and its named leader leads term 1 at once when the host says it may; the groups added are reported to `on_leader_change` in the same turn), steps every inbound batch, routes
queued commands (held ones again, before fresh ones, whenever a group may have got a leader, so a group's commands
keep their order; routing.py: a proposal, membership change or leadership transfer goes to the local leader core, is
forwarded to the known leader as a `Forward` frame, or is held up to `forward_hold_ms` while no leader is known) and
runs the Ready cycle: write every group's records, `commit()` them in the long-lived fsync thread (sync_thread.py;
one fsync for all groups), send the batches, apply committed entries (`on_apply(group, entry)` per entry or, when
given, `on_apply_many(group, entries)` once per group per cycle), `advance`. After the cycles it reports groups whose
known leader changed to `on_leader_change` (the groups stepped or touched by the cycles, and every group each
`LEADER_SCAN_TICKS` ticks). Replication telemetry (telemetry.py) is written after each fsync and sampled on the
timer. A peer the transport reports refusing connections after its link was lost (its process is gone) is handed to
`MultiRaft.peer_refused` once the turn's inbox is stepped, so the groups it led elect a new leader at once (docs/raft.md
"Fast failover on refused connections"); `refusal_listeners` hear of each such refusal too (the cluster runtime's mirrored
queues and metadata group). Inbound batches, commands and group changes wait in bounded queues (beyond the bound, batches are dropped,
commands refused and group changes raise `OverflowError`).

Automatic compaction (when the host gives a `SnapshotHost`): compaction.py's `Compactor` snapshots a group whose
applied log has grown past `CompactionConfig`'s thresholds, after `advance` and only while no fsync runs.
`host.restore(group, data)` rebuilds the state machine from a snapshot: at start for every group whose storage
holds one, and whenever a Ready carries a snapshot received from the leader (before that Ready's committed entries
are applied).
"""

from __future__ import annotations

import logging
import pathlib
import random
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import trio

from cluster.raft.core.multiraft import MultiRaft, MultiRaftConfig, NodeBatch, NodeReady
from cluster.raft.core.types import (
    ConfChange,
    Entry,
    GroupId,
    Index,
    Membership,
    NodeId,
    Role,
)
from cluster.raft.runtime.codec import Command, Forward
from cluster.raft.runtime.compaction import CompactionConfig, Compactor, SnapshotHost
from cluster.raft.runtime.group_hosting import Bootstrap, GroupHosting, NodeStats
from cluster.raft.runtime.ready_pipeline import QUEUED_READIES_MAX, ReadyPipeline
from cluster.raft.runtime.routing import FORWARD_HOLD_MS, CommandRouter
from cluster.raft.runtime.storage import RaftStorage
from cluster.raft.runtime.sync_thread import SyncThread
from cluster.raft.runtime.telemetry import TelemetryWriter
from cluster.raft.runtime.timing import StageTimings
from cluster.raft.runtime.transport import Transport

INBOX_BATCHES_MAX = 4096
PROPOSALS_QUEUED_MAX = 65536  # commands waiting to be routed or held (all groups)
LEADER_SCAN_TICKS = 10  # every group's known leader is compared this often (others: when touched)
log = logging.getLogger(__name__)




class RaftNodeRuntime(GroupHosting):
    def __init__(
        self,
        node_id: NodeId,
        data_dir: pathlib.Path,
        listen: tuple[str, int],
        peers: dict[NodeId, tuple[str, int]],
        secret: bytes,
        on_apply: Callable[[GroupId, Entry], None],
        config: MultiRaftConfig | None = None,
        tick_ms: int = 50,
        telemetry: bool = True,
        snapshots: SnapshotHost | None = None,
        compaction: CompactionConfig | None = None,
        on_leader_change: Callable[[GroupId, NodeId | None], None] | None = None,
        forward_hold_ms: int = FORWARD_HOLD_MS,
        on_apply_many: Callable[[GroupId, tuple[Entry, ...]], None] | None = None,
        readies_behind_fsync_max: int = QUEUED_READIES_MAX,
    ) -> None:
        self.node_id = node_id
        self.data_dir = data_dir
        self.listen = listen
        self.tick_ms = tick_ms
        self.stats = NodeStats()
        self._on_apply = on_apply
        self._on_apply_many = on_apply_many  # when given: one call per group per cycle, instead of on_apply
        self._config = config or MultiRaftConfig()
        self._inbox: deque[NodeBatch] = deque()
        self.router = CommandRouter(node_id, forward_hold_ms, PROPOSALS_QUEUED_MAX)
        self._wake = trio.Event()
        self.transport = Transport(node_id, peers, secret, self._receive, on_forward=self._receive_forward,
                                   on_refused=self._peer_refused)
        self._refused: set[NodeId] = set()  # peers whose port refused us since the last turn (transport.py)
        self.refusal_listeners: list[Callable[[NodeId], None]] = []  # also told of each refusal (the host's)
        self.storage: RaftStorage | None = None
        self.multi: MultiRaft | None = None
        self._groups: dict[GroupId, Membership] = {}
        self._telemetry_enabled = telemetry
        self.telemetry: TelemetryWriter | None = None
        self._snapshots = snapshots
        self._compactor = Compactor(snapshots, compaction or CompactionConfig())
        self._on_leader_change = on_leader_change
        self._known_leaders: dict[GroupId, NodeId | None] = {}  # as last reported to on_leader_change
        self._group_changes: deque[tuple[GroupId, Membership | None, Bootstrap | None]] = deque()  # None: remove
        self._bootstraps: dict[GroupId, Bootstrap] = {}  # groups declared before `run` with a named first leader
        self._bootstrapped: list[tuple[GroupId, bool]] = []  # created from a bootstrap state, not started yet
        self._recheck_held = False
        self._sync_thread: SyncThread | None = None  # the Ready loop's fsyncs (created by `run`)
        self.timing = StageTimings.from_environment(node_id)  # None unless RAFTMQ_RAFT_TIMING is set (timing.py)
        self.transport.timing = self.timing
        self._inbox_times: deque[float] = deque()  # arrival of each inbox batch (only when timing)
        self._fresh_since = 0.0  # when the oldest unrouted command was queued (only when timing)
        self.pipeline: ReadyPipeline | None = None  # the Ready pipeline (created by `run`)
        self._readies_behind_fsync_max = readies_behind_fsync_max  # 0: no Ready taken while an fsync runs
        self._volatile: set[GroupId] = set()  # groups whose entries need no fsync (add_group's `volatile`)
        self._commits: dict[GroupId, int] = {}  # a leader's last commit index seen (only when timing)
        self._frames_queued_seen = 0  # transport.stats.frames_queued when the loop last let the writers run

    # --- commands --------------------------------------------------------------------------------------------

    def _receive(self, batch: NodeBatch) -> None:
        if len(self._inbox) < INBOX_BATCHES_MAX:
            self._inbox.append(batch)
            if self.timing is not None:
                self._inbox_times.append(self.timing.now_s())
            self._wake.set()

    def _peer_refused(self, peer: NodeId) -> None:
        self._refused.add(peer)
        self._wake.set()
        for listener in self.refusal_listeners:  # (the cluster runtime: mirrored queues, the metadata group)
            listener(peer)

    def _apply_refusals(self, multi: MultiRaft) -> list[GroupId]:
        """Peers that refused our connections after their link was lost (transport.py): the groups they led elect
        a new leader at once (`MultiRaft.peer_refused`); returns those groups."""
        woken: list[GroupId] = []
        refused, self._refused = sorted(self._refused), set()
        for peer in refused:
            groups = multi.peer_refused(peer)
            if groups:
                log.info("raft: %s refuses connections: %d groups it led elect a new leader now", peer, len(groups))
            woken.extend(groups)
        return woken

    def _receive_forward(self, forward: Forward) -> None:
        if self.timing is not None:
            if not self.router.has_fresh():
                self._fresh_since = self.timing.now_s()
            for command in forward.commands:
                self.timing.event("fwd_recv", command.group, 0, zlib.crc32(command.data))
        self.router.offer_forwarded(forward)
        self._wake.set()

    def _offer(self, command: Command) -> bool:
        if self.timing is not None and not self.router.has_fresh():
            self._fresh_since = self.timing.now_s()
        if not self.router.offer(command):
            self.stats.proposals_refused += 1
            return False
        self._wake.set()
        return True

    def propose(self, group: GroupId, data: bytes) -> bool:
        """Queue a command for the group's leader, wherever it is (best-effort; see routing.py).
        False: refused now (too many commands queued)."""
        if self.timing is not None:
            self.timing.event("propose", group, 0, zlib.crc32(data))
        return self._offer(Command("propose", group, data))

    def change_membership(self, group: GroupId, change: ConfChange) -> bool:
        """Ask the group's leader (here or forwarded) to propose a membership change. Best-effort, like
        `propose`: watch `membership_of` for the outcome (the leader refuses a change while one is pending)."""
        return self._offer(Command("conf", group, change.encode()))

    def transfer_leadership(self, group: GroupId, node: NodeId) -> bool:
        """Ask the group's leader (here or forwarded) to hand leadership to `node`. Best-effort."""
        return self._offer(Command("transfer", group, node.encode()))

    # --- reading the state -----------------------------------------------------------------------------------

    def is_leader(self, group: GroupId) -> bool:
        return self.leader_of(group) == self.node_id

    def leader_of(self, group: GroupId) -> NodeId | None:
        """The leader this node knows for the group (None: unknown, or the group is not hosted)."""
        core = None if self.multi is None else self.multi.groups.get(group)
        return None if core is None else core.lead

    def membership_of(self, group: GroupId) -> Membership | None:
        if self.multi is None:
            return self._groups.get(group)
        core = self.multi.groups.get(group)
        return None if core is None else core.membership

    def group_status(self, group: GroupId) -> dict[str, Any]:
        """term, role, leader, voters, learners, commit, applied, last_index, and (leader) match per member.
        KeyError if the group is not hosted (or not running yet)."""
        if self.multi is None:
            raise KeyError(group)
        core = self.multi.groups[group]
        status: dict[str, Any] = {
            "group": group, "term": core.term, "leader": core.lead,
            "role": "learner" if self.node_id in core.membership.learners else core.role.value,
            "voters": sorted(core.membership.voters), "learners": sorted(core.membership.learners),
            "commit": core.log.committed, "applied": core.applied_handed, "last_index": core.log.last_index(),
        }
        if core.role is Role.LEADER:
            status["match"] = {node: progress.match for node, progress in sorted(core.prs.items())}
        return status

    def connected_peers(self) -> frozenset[NodeId]:
        return self.transport.connected_peers()

    def _notice_leaders(self, multi: MultiRaft, groups: list[GroupId]) -> bool:
        """Report groups whose known leader changed (a group's first report is its first known leader)."""
        changed = False
        for group in groups:
            core = multi.groups.get(group)
            if core is None:
                continue
            leader = core.lead
            if self._known_leaders.get(group) == leader:
                continue  # unchanged, or still never known (get() gives None for both)
            self._known_leaders[group] = leader
            changed = True
            self.stats.leader_changes += 1
            if self._on_leader_change is not None:
                self._on_leader_change(group, leader)
        return changed

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.storage = await trio.to_thread.run_sync(RaftStorage.open, self.data_dir)
        if self._telemetry_enabled:
            self.telemetry = TelemetryWriter(self.data_dir, self.node_id, lambda: int(time.time() * 1000))
        incarnation = random.getrandbits(31)
        multi = self.multi = MultiRaft(self.node_id, self._config, random.Random().randrange, incarnation)
        for group, membership in list(self._groups.items()):  # from now on add_group queues a change
            await self._load_group(multi, self.storage, group, membership, self._bootstraps.pop(group, None))
        await self._apply_group_changes(multi, self.storage)  # removals asked for before run, adds since
        self._sync_thread = SyncThread()
        async with trio.open_nursery() as nursery:
            await nursery.start(self.transport.serve, *self.listen)
            nursery.start_soon(self._ticker)
            if self.timing is not None:
                nursery.start_soon(self._lag_probe, self.timing)
            task_status.started()
            try:
                await self._loop(multi, self.storage)
            finally:
                nursery.cancel_scope.cancel()
                self._sync_thread.close()
                if self.telemetry is not None:
                    self.telemetry.close()

    async def _ticker(self) -> None:
        while True:
            await trio.sleep(self.tick_ms / 1000)
            self._tick_due = True
            self._wake.set()

    @staticmethod
    async def _lag_probe(timing: StageTimings) -> None:
        """Timing only: how late a 5 ms sleep wakes (the trio thread blocked: long callbacks, GC, the GIL)."""
        timing.watch_gc()
        while True:
            started = timing.now_s()
            await trio.sleep(0.005)
            timing.record("loop_lag", (timing.now_s() - started) * 1000 - 5)

    _tick_due = False
    _ticks = 0

    async def _loop(self, multi: MultiRaft, storage: RaftStorage) -> None:
        assert self._sync_thread is not None
        pipeline = ReadyPipeline(self._sync_thread, self.transport.send, self._apply_taken, self._on_durable,
                                 self._wake_up, self.timing, self._readies_behind_fsync_max, self._volatile)
        self.pipeline = pipeline
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            turn_started = 0.0 if self.timing is None else self.timing.now_s()
            touched: set[GroupId] = set()
            if pipeline.finish_if_done(multi):
                self._lap("turn_settle", turn_started)
                if self.timing is not None:
                    self._mark_commits(multi, multi.groups, self.timing)
            ticked = self._tick_due
            if ticked:
                lap_started = self._lap_start()
                self._tick_due = False
                multi.tick()
                if self.telemetry is not None:
                    self.telemetry.sample(multi.groups)
                self._lap("turn_tick", lap_started)
            if self._group_changes:
                lap_started = self._lap_start()
                await pipeline.drain(multi, storage)  # storage is ours alone while groups come and go
                lap_started = self._lap("turn_drain", lap_started)
                touched.update(await self._apply_group_changes(multi, storage))  # their leaders are noticed
                self._lap("turn_group_changes", lap_started)
            lap_started = self._lap_start()
            stepped, leader_learned = self._step_inbox(multi)
            touched.update(stepped)
            if self._refused:  # after the inbox: whatever the peer sent before its link was lost is stepped
                touched.update(self._apply_refusals(multi))
            self._route(multi, retry_held=ticked or self._recheck_held or leader_learned)
            lap_started = self._lap("turn_step_route", lap_started)
            await self._take_and_flush(multi, storage, pipeline, touched)
            self._lap("turn_take_flush", lap_started)
            if ticked:
                self._ticks += 1
            full_scan = ticked and self._ticks % LEADER_SCAN_TICKS == 0  # catches changes that send nothing
            if self._notice_leaders(multi, sorted(multi.groups) if full_scan else sorted(touched)):
                self._recheck_held = True
                if self.router.held_count:
                    self._wake.set()  # held commands may have a leader to go to now
            if self._compactor.pending and not pipeline.fsync_running:
                await self._compact_due(multi, storage, [], pipeline.unsettled_groups())
                if self._compactor.pending:
                    self._wake.set()  # the rest next time round (never more than the allowance per wake)
            if self.timing is not None:
                self.timing.since("loop_turn", turn_started)
                self.timing.maybe_dump()

    async def _take_and_flush(self, multi: MultiRaft, storage: RaftStorage, pipeline: ReadyPipeline,
                              touched: set[GroupId]) -> None:
        """Take the Readies there are (their early messages sent at once, even while an fsync runs); when no fsync
        runs, compact what is due and start one fsync for every queued Ready; then let the transport write what
        this turn queued, and apply the taken Readies' committed entries."""
        await self._take_and_start_fsync(multi, storage, pipeline, touched)
        if self.transport.stats.frames_queued != self._frames_queued_seen:
            # The frames this turn queued (a leader's appends and commit notices, acknowledgements, forwards)
            # are written by the transport's tasks: let them run now, not after the apply (the host's work, often
            # the longest part of a turn), so the next node starts on them while this one applies.
            self._frames_queued_seen = self.transport.stats.frames_queued
            await trio.lowlevel.cancel_shielded_checkpoint()
        pipeline.apply_taken()  # durable on a majority already: no need to wait for our own fsync

    async def _take_and_start_fsync(self, multi: MultiRaft, storage: RaftStorage, pipeline: ReadyPipeline,
                                    touched: set[GroupId]) -> None:
        """A few rounds: advancing Readies that had nothing to write can produce more (commit notices)."""
        for _ in range(4):
            if multi.has_ready() and pipeline.can_take():
                touched.update(pipeline.take(multi))
            if pipeline.fsync_running:
                return  # the records wait for the running fsync
            if self._snapshots is not None and touched:
                await self._compact_due(multi, storage, sorted(touched), pipeline.unsettled_groups())
            if pipeline.flush(multi, storage):
                self.stats.ready_cycles += 1
                return  # the fsync runs; its Readies are advanced when it is done (the loop is woken)
            if not multi.has_ready():
                return

    def _lap_start(self) -> float:
        return 0.0 if self.timing is None else self.timing.now_s()

    def _lap(self, stage: str, started_s: float) -> float:
        """Timing only: record the time since `started_s` under `stage`; the new start."""
        if self.timing is None:
            return 0.0
        self.timing.since(stage, started_s)
        return self.timing.now_s()

    def _wake_up(self) -> None:
        self._wake.set()

    def _on_durable(self, node_ready: NodeReady) -> None:
        if self.timing is not None:
            for group, ready in node_ready.groups:
                if ready.entries:
                    self.timing.event("durable", group, ready.entries[-1].index)
        if self.telemetry is not None:
            assert self.multi is not None
            for group, ready in node_ready.groups:
                self.telemetry.on_durable(group, self.multi.groups[group], ready)

    def _step_inbox(self, multi: MultiRaft) -> tuple[set[GroupId], bool]:
        """Step every inbound batch: the groups they touched, and whether one of them got a new known leader while
        commands were held (then the held ones must be routed again, before any fresh one)."""
        touched: set[GroupId] = set()
        leader_learned = False
        while self._inbox:
            batch = self._inbox.popleft()
            if self.timing is not None and self._inbox_times:
                self.timing.since("inbox_wait", self._inbox_times.popleft())
            watch = self.router.held_count > 0 and not leader_learned
            leads_before = [(group, self._lead(multi, group)) for group, _ in batch.messages] if watch else []
            multi.step(batch)
            touched.update(group for group, _ in batch.messages)
            if self.timing is not None:
                self._mark_commits(multi, {group for group, _ in batch.messages}, self.timing)
            if watch:
                leader_learned = any(self._lead(multi, group) not in (None, lead) for group, lead in leads_before)
        return touched, leader_learned

    def _mark_commits(self, multi: MultiRaft, groups: Iterable[GroupId], timing: StageTimings) -> None:
        """Timing only: a leader's commit index moved (acknowledgements stepped, or its own fsync settled)."""
        for group in groups:
            core = multi.groups.get(group)
            if core is not None and core.role is Role.LEADER and core.log.committed > self._commits.get(group, 0):
                self._commits[group] = core.log.committed
                timing.event("commit", group, core.log.committed)

    @staticmethod
    def _lead(multi: MultiRaft, group: GroupId) -> NodeId | None:
        core = multi.groups.get(group)
        return None if core is None else core.lead

    def _route(self, multi: MultiRaft, retry_held: bool) -> None:
        """Route the queued commands, the held ones first when `retry_held`.

        A group's commands keep their order (per group FIFO) because held commands are retried whenever one of
        their groups may have a leader to go to, before the fresh ones: on a tick (an election of this node), a
        recheck (a group added, a leader change noticed after the cycles) and a leader learned from a batch
        stepped in this very turn (`_step_inbox`; without it the fresh commands of that turn were forwarded while
        the earlier, held ones waited for the next turn: tests/cluster/test_ack_close.py). Otherwise no held
        command has a leader yet, so a fresh one of its group is held behind it."""
        if not (self.router.has_fresh() or (retry_held and self.router.held_count)):
            return
        self._recheck_held = False
        if self.timing is not None and self.router.has_fresh():
            self.timing.since("route_wait", self._fresh_since)
        for forward in self.router.route(multi, trio.current_time() * 1000, retry_held):
            if self.timing is not None:
                for command in forward.commands:
                    self.timing.event("fwd", command.group, 0, zlib.crc32(command.data))
            self.transport.send_forward(forward)

    def _apply_taken(self, node_ready: NodeReady) -> None:
        assert self.multi is not None
        if self.timing is not None:
            self._mark_appended(self.multi, node_ready, self.timing)
        self._apply_ready(node_ready, self.timing)

    def _apply_ready(self, node_ready: NodeReady, timing: StageTimings | None) -> None:
        """Restore received snapshots, then apply each group's committed entries in order, as soon as the Ready is
        taken (before its fsync: docs/raft.md "Pipelined Ready cycles"); the core marks them applied at `advance`."""
        apply_started = 0.0 if timing is None else timing.now_s()
        for group, ready in node_ready.groups:
            if ready.snapshot is not None:
                self._compactor.restored(group)
                if self._snapshots is not None:
                    self._snapshots.restore(group, ready.snapshot.data)
                    self.stats.restores += 1
            committed = ready.committed_entries
            if not committed:
                continue
            if timing is not None:
                timing.event("apply", group, committed[-1].index)
            if self._on_apply_many is not None:
                self._on_apply_many(group, committed)
            else:
                on_apply = self._on_apply
                for entry in committed:
                    on_apply(group, entry)
            self._compactor.applied(group, committed)
            self.stats.applied_entries += len(committed)
            if timing is not None:
                timing.event("applied", group, committed[-1].index)
                timing.reached("append_to_apply_leader", group, committed[-1].index)
                timing.reached("append_to_apply_follower", group, committed[-1].index)
        if timing is not None:
            timing.since("apply", apply_started)

    @staticmethod
    def _mark_appended(multi: MultiRaft, node_ready: NodeReady, timing: StageTimings) -> None:
        """Timing only: when this node handed new entries to storage (leader: its proposals; follower: appends)."""
        for group, ready in node_ready.groups:
            if ready.entries:
                leader = multi.groups[group].role is Role.LEADER
                timing.mark(f"append_to_apply_{'leader' if leader else 'follower'}", group, ready.entries[-1].index)
                for entry in ready.entries:
                    timing.event("append", group, entry.index, zlib.crc32(entry.data) if leader else 0)

    async def _compact_due(self, multi: MultiRaft, storage: RaftStorage, touched: list[GroupId],
                           unsettled: set[GroupId]) -> None:
        """Snapshot the groups due one (compaction.py), not the `unsettled` ones."""
        compacted = await self._compactor.compact_due(multi, storage, touched, unsettled, self.timing)
        self.stats.compactions += compacted

    def last_index(self, group: GroupId) -> Index:
        assert self.multi is not None
        return self.multi.groups[group].log.last_index()
