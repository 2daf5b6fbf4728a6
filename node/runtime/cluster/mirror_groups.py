"""Mirrored queues in a cluster node: the queue's log is a mirror log (leader, ISR, HW) instead of a Raft group.

What it is for: a classic queue declared under an `ha-mode` policy is a "mirrored" queue in the metadata
(node/clustering/definitions.py) with a controller record (cluster/metadata/mirror.py). Its queue machine is the
broker's replicated one, fed exactly as a Raft group feeds it (`ClusterRuntime._on_apply_many`): a proposal (the
same bytes the runtime would give Raft) is appended to the mirror leader's log, the followers fetch it, and every
node applies the records below the high watermark, in order. So confirms (the publishing node's replica applied
the Enqueue), deliveries (each node to its own consumers), acks and requeues work as with Raft, but a record
commits when every ISR member has it (and the ISR has at least `ha-min-insync` members) instead of on a majority.

How it works: `MirrorGroups` hosts one pure `Replica` (cluster/mirror_queues/core) per mirrored queue group over
its files (`ReplicaStore`), and one `MirrorTransport` per node (port:
`mirror_port`, the node's AMQP port + 22000) carrying every queue's messages wrapped in `Routed(group, ...)`. The loop is
the one of cluster/mirror_queues/runtime/node.py: every core call goes through `_run` (files first, then the
effects), a follower fetches again when a reply comes, a leader parks a fetch with nothing new (fetch.max.wait)
and a 10 ms timer ticks the cores (ISR lag check, HW checkpoint) and resends unanswered requests (it sleeps while
the node hosts no mirrored queue).
- Leader, epoch and ISR come from the committed `MirrorRecord` (`on_record`, from the metadata watch): newer epoch
  -> `become_leader`/`become_follower`; the leader's `IsrChanged` is committed as `AlterMirrorIsr` (`submit`).
  A node that is not a replica follows too, as an observer: the leader serves it only records below the HW and
  never counts it in the ISR.
- `propose`: on the leader, appended; elsewhere forwarded to the leader (`Forward`); without a leader, dropped
  (the runtime's tracker resends, then abandons: the publish is nacked). A publish while the ISR is below
  min-insync is refused by the core and retried the same way until the proposal times out (nack).
- Failures (mirror_failures.py, a mixin): the Raft transport's first refusal of a lost peer (`peer_refused`) and
  the node liveness (`node_down`) report it as `MirrorReplicaDown`: the metadata group elects from the ISR (or
  uncleanly with `ha-promote-on-failure: always`). A node starting with a queue nobody can lead says
  `MirrorReplicaUp`. A fetch or epoch question in an epoch this node has not learnt yet (the follower got the
  record first) is kept and answered once the record makes this node its leader.
- Policy changes (node/clustering/mirror_policy.py): a committed record with other replicas changes `replicas`
  (whose fetches the leader serves as a replica's, the others' as an observer's: a new replica catches up from
  where its observer log stood and joins the ISR through the leader; a removed one goes on as an observer) and
  `min_insync`. An orderly shutdown moves the leadership of the queues led here first (`shutdown_transfers`).
- Files off the event loop: `_run` plans the files' operations (`ReplicaStore.plan`, no I/O) and queues them with
  the core's effects; the writer task runs every queued plan of every group in one worker thread call
  (`ReplicaStore.execute`; adjacent appends of a group share one fsync), then releases the effects in order. So
  nothing leaves the node (a fetch reply, a fetch that reports a LEO, an ISR change) and nothing is applied to
  the broker (confirms) before the files under it are durable: the broker is fed records below
  min(HW, what this node's files hold). Until the writer runs (and in tests without it) `_run` writes at once.
- The log is bounded as a Raft group's is: once `TRIM_RECORDS` applied records sit above the log start, the
  replica takes the broker's queue snapshot at its applied offset (at most the HW; `SnapshotHost.snapshot`, the
  Raft groups' host) and `Replica.trim`s the prefix (the files: the snapshot, then the log rewritten from the new
  start). Each replica trims on its own; a follower that fetches below the leader's log start gets the leader's
  snapshot and the broker restores the queue from it (`SnapshotInstalled`). A restarting node restores its
  snapshot and replays only the records above it. A truncation below what the broker applied (an unsafe setting,
  or a follower that starts over from the leader's snapshot) restores the replica's own snapshot and replays from
  it rather than applying records twice.
- Records hold the proposal bytes as a latin-1 `str` (the core's `msg` is a `str`); so do snapshots.
- `flush` (the node's `mirror_flush`): `fsync` (the default) as above; `unsynced` (unsafe, for the failure
  scenarios) keeps appends in the replica (the core's unflushed tail, Kafka's page cache) and writes them back
  every `WRITEBACK_MS`: a follower reports them at once, the broker applies records below the HW whether written
  or not, and a kill -9 loses the tail, confirmed messages included; a node restarting from such files says it is
  `unclean` when it reports itself up.
- Telemetry (`MirrorTelemetry`, one writer for every hosted queue, under <data_dir>/mirror/telemetry/): `append`
  once a batch is durable (the writer releases it), `commit`/`isr` after each core call, `truncate` per
  truncation, a `state` sample per queue every second, as the replica processes write them (docs/telemetry.md).
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import trio

from cluster.metadata.mirror import (
    AlterMirrorIsr,
    MirrorRecord,
    MirrorReplicaUp,
)
from cluster.mirror_queues.core.replica import DurableImage, Replica
from cluster.mirror_queues.core.types import (
    Effect,
    EpochEndRequest,
    EpochEndResponse,
    FetchRequest,
    FetchResponse,
    Flush,
    IsrChanged,
    Message,
    Nacked,
    Record,
    Send,
    Settings,
    Snapshot,
    SnapshotInstalled,
    Truncated,
)
from cluster.mirror_queues.runtime.storage import ReplicaStore
from cluster.mirror_queues.runtime.telemetry import MirrorTelemetry
from cluster.mirror_queues.runtime.transport import MirrorTransport
from cluster.mirror_queues.runtime.wire import Forward, Routed, WireError, WireMessage, decode, encode
from cluster.raft.core.types import Entry, GroupId, Index, NodeId, Term
from cluster.raft.runtime.compaction import SnapshotHost
from node.runtime.cluster.mirror_failures import MirrorFailures
from node.runtime.cluster.mirror_trace import tracing

log = logging.getLogger(__name__)

MIRROR_PORT_OFFSET: Final = 22_000  # a node's mirror fetch port: its AMQP port + this
TICK_S: Final = 0.01
FETCH_TIMEOUT_MS: Final = 500
FETCH_MAX_WAIT_MS: Final = 200
LAG_MAX_MS: Final = 3_000  # a follower this far behind leaves the ISR (Kafka's replica.lag.time.max.ms)
HW_CHECKPOINT_MS: Final = 1_000
WRITEBACK_MS: Final = 1_000  # flush = "unsynced": the "page cache" is written back this often
SEED_OFFSET: Final = 1  # a converted queue's mirror log starts here, after its seed (`seed`)
TRACE: Final = tracing()  # RAFTMQ_MIRROR_TRACE=1 (node/runtime/cluster/mirror_trace.py)
TRIM_RECORDS: Final = 2_000  # applied records above the log start before the replica snapshots and trims


def mirror_port(amqp_port: int) -> int:
    """A node's mirror fetch port: its AMQP port + MIRROR_PORT_OFFSET, or - MIRROR_PORT_OFFSET past 65535."""
    port = amqp_port + MIRROR_PORT_OFFSET
    return port if port <= 65535 else amqp_port - MIRROR_PORT_OFFSET


def _execute_all(work: list[tuple[ReplicaStore, Any]]) -> None:
    """(In a worker thread) each store's plans, in order."""
    for store, plan in work:
        store.execute(plan)


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(slots=True)
class _Group:
    group: GroupId
    vhost: str
    name: str
    replicas: tuple[str, ...]
    replica: Replica
    store: ReplicaStore
    applied: int = 0  # records below this offset went to the broker
    leader: str = ""  # as the last committed record says ("" = none)
    record: MirrorRecord | None = None
    awaiting_since: int | None = None
    fetch_now: bool = False
    parked: dict[str, tuple[FetchRequest, int, int, int]] = field(default_factory=dict)  # (req, since, leo, hw)
    hw_sent: dict[str, int] = field(default_factory=dict)
    said_up_epoch: int = -1  # the epoch in which this replica last said it is up to a queue without a leader
    refused_reported: int = -1  # the epoch whose leader this node reported gone on a refusal (`peer_refused`)
    early: dict[str, FetchRequest | EpochEndRequest] = field(default_factory=dict)  # in an epoch not known here yet
    trace_until: int = 0  # RAFTMQ_MIRROR_TRACE=1: its traffic is logged until then (a second after a role change)
    unclean: bool = False  # restarted from files whose unflushed tail a crash may have lost (flush = "unsynced")
    durable: int = 0  # the offset after the last record this node's files hold (written and fsynced)


class MirrorGroups(MirrorFailures):
    """The mirrored queue groups this node hosts (see the module docstring)."""

    def __init__(self, name: str, data_dir: pathlib.Path, peers: dict[str, tuple[str, int]], secret: bytes,
                 on_apply_many: Callable[[GroupId, tuple[Entry, ...]], None],
                 on_leader_change: Callable[[GroupId, NodeId | None], None],
                 submit: Callable[[Any], None], snapshots: SnapshotHost | None = None,
                 trim_records: int = TRIM_RECORDS, telemetry: bool = True, flush: str = "fsync",
                 hw_checkpoint_ms: int = HW_CHECKPOINT_MS) -> None:
        self.name = name
        self.data_dir = data_dir
        self.transport = MirrorTransport(name, secret, peers, self._on_message)
        self.on_apply_many = on_apply_many
        self.on_leader_change = on_leader_change
        self.submit = submit
        self.snapshots = snapshots  # without one the log is never trimmed
        self.trim_records = trim_records
        self.flush: Flush = "unsynced" if flush == "unsynced" else "fsync"  # the node's `mirror_flush`
        self.hw_checkpoint_ms = hw_checkpoint_ms  # the node's `mirror_hw_checkpoint_ms`
        self._last_writeback_ms = wall_ms()
        self.groups: dict[GroupId, _Group] = {}
        self.live: frozenset[str] = frozenset(peers) | {name}
        # The peers this node has a working link to (the runtime's Raft transport); without a runtime, `live`.
        self.connected: Callable[[], frozenset[str]] = lambda: self.live
        self.stats = {"appended": 0, "forwarded": 0, "refused": 0, "truncations": 0, "trims": 0,
                      "snapshots_installed": 0, "write_batches": 0}
        # (group, (plan, the files' end after it), effects | None = remove the group's files)
        self._writes: list[tuple[_Group, tuple[Any, int, list[Record]], list[Effect] | None]] = []
        self._writes_wanted = trio.Event()
        self._writer_running = False
        self._groups_wanted = trio.Event()  # set by add_group: the timer sleeps while no group is hosted
        # LEO, HW, ISR and truncations of every hosted queue under <data_dir>/mirror/telemetry/ (docs/telemetry.md)
        self.telemetry = MirrorTelemetry(data_dir, name, wall_ms) if telemetry else None

    async def run(self, host: str, port: int, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        try:
            await self._run_tasks(host, port, task_status)
        finally:
            telemetry, self.telemetry = self.telemetry, None
            if telemetry is not None:
                telemetry.close()  # after the writer task (it writes `append` records); none from now on

    async def _run_tasks(self, host: str, port: int, task_status: Any) -> None:
        async with trio.open_nursery() as nursery:
            try:
                await nursery.start(self.transport.serve, host, port)
            except OSError as exc:
                log.error("cluster: mirrored queues: cannot listen on %s:%d (%s); this node's mirrored queues "
                          "will not replicate", host, port, exc)
            self._writer_running = True  # from now on writes queue for the writer
            nursery.start_soon(self._writer)
            task_status.started()
            while True:
                if not self.groups:  # nothing to tick (a node without mirrored queues): no 100 Hz wakeups
                    self._groups_wanted = trio.Event()
                    await self._groups_wanted.wait()
                await trio.sleep(TICK_S)
                try:
                    self._tick(wall_ms())
                except Exception:
                    log.exception("cluster: mirrored queues: tick failed")

    # --- hosting ----------------------------------------------------------------------------------------------

    def add_group(self, group: GroupId, vhost: str, name: str, replicas: tuple[str, ...], truncation: str,
                  record: MirrorRecord | None) -> None:
        if group in self.groups:
            return
        settings = Settings(min_insync=record.min_insync if record is not None else 1,
                            replica_lag_max_ms=LAG_MAX_MS, hw_checkpoint_interval_ms=self.hw_checkpoint_ms,
                            truncation="hw" if truncation == "hw" else "leader-epoch", flush=self.flush)
        store = ReplicaStore(self.directory_of(group))
        now = wall_ms()
        recovered = store.exists()
        replica = (Replica.recover(self.name, settings, store.load(), now) if recovered
                   else Replica(self.name, settings, now))
        store.persist(replica)
        g = _Group(group, vhost, name, replicas, replica, store, durable=store.written,
                   unclean=recovered and self.flush == "unsynced")
        if replica.snapshot is not None and self.snapshots is not None:  # restart: the snapshot, then the records
            self.snapshots.restore(group, replica.snapshot.data.encode("latin-1"))
            g.applied = replica.log_start
        self.groups[group] = g
        self._groups_wanted.set()
        log.info("cluster: mirrored queue %s/%s: replica here (replicas %s, log end %d, HW %d)", vhost, name,
                 ",".join(replicas), replica.leo, replica.hw)
        if record is not None:
            self.on_record(group, record)

    def directory_of(self, group: GroupId) -> pathlib.Path:
        return self.data_dir / "mirror" / group.replace("/", "~")

    def seed(self, group: GroupId, data: bytes) -> None:
        """Before the queue's replica is added here: its files start with `data` (the queue's state at the seal
        of its Raft log, node/runtime/cluster/mirror_conversion.py) as the snapshot at SEED_OFFSET, epoch 0, so
        `add_group` restores it and fetches from there. Any earlier files of the group are replaced."""
        directory = self.directory_of(group)
        if directory.exists():
            for path in directory.iterdir():
                path.unlink(missing_ok=True)
        store = ReplicaStore(directory)
        try:
            image = DurableImage((), ((0, SEED_OFFSET),), SEED_OFFSET, Snapshot(SEED_OFFSET, 0, data.decode("latin-1")))
            store.persist(Replica.recover(self.name, Settings(flush=self.flush), image, wall_ms()))
        finally:
            store.close()

    def remove_group(self, group: GroupId) -> None:
        g = self.groups.pop(group, None)
        if g is None:
            return
        if self.telemetry is not None:
            self.telemetry.forget_mirror(group)
        if self._writer_running:  # after the writes queued before it
            self._writes.append((g, ([], 0, []), None))
            self._writes_wanted.set()
            return
        self._drop_files(g)

    @staticmethod
    def _drop_files(g: _Group) -> None:
        g.store.close()
        directory = g.store.directory  # the queue is gone (a redeclared one has another group id)
        if directory.exists():
            for path in directory.iterdir():
                path.unlink(missing_ok=True)
            directory.rmdir()

    def on_record(self, group: GroupId, record: MirrorRecord | None) -> None:
        """The committed leader, epoch and ISR of the queue (None: not recorded yet)."""
        g = self.groups.get(group)
        if g is None or record is None or record == g.record:
            return
        g.record = record
        r = g.replica
        now = wall_ms()
        if record.replicas != g.replicas:  # AlterMirrorReplicas: a removed replica goes on as an observer
            log.info("cluster: mirrored queue %s/%s: replicas %s -> %s", g.vhost, g.name, ",".join(g.replicas),
                     ",".join(record.replicas))
            g.replicas = record.replicas
        if record.min_insync != r.settings.min_insync:
            r.settings = dataclasses.replace(r.settings, min_insync=record.min_insync)
        released = r.held_out - frozenset(record.held_out)
        r.held_out = frozenset(record.held_out)  # ha-sync-mode manual: not synchronised, kept out of the ISR
        if record.leader and (record.epoch > r.epoch or r.role == "none"):
            early, g.early = g.early, {}
            g.trace_until = now + 1_000 if TRACE else 0
            if record.leader == self.name:
                self._run(g, r.become_leader(record.epoch, frozenset(record.isr), now))
                for src, request in early.items():  # asked before the record reached this node: answered now
                    if request.epoch == r.epoch:
                        self._on_request(g, src, request, now)
            else:
                self._run(g, r.become_follower(record.leader, record.epoch))
                g.awaiting_since = None
                self._poll(g, now)
        elif record.epoch == r.epoch and r.role == "leader" and record.leader == self.name:
            self._run(g, r.update_isr(frozenset(record.isr), now))
        for src in released & set(g.parked):  # synchronised: a caught-up fetch parked here joins the ISR now
            self._run(g, r.handle(g.parked.pop(src)[0], now))
        leader = record.leader if record.epoch == r.epoch or not record.leader else g.leader
        if not record.leader and self.name in record.replicas and g.said_up_epoch != record.epoch:
            g.said_up_epoch = record.epoch  # nobody can lead: say this replica is up (it may be electable);
            # live as far as it knows for sure: a peer it has no link to (paused, or gone while this node was
            # down) would otherwise stay in the new ISR, and hold the HW, until the lag limit
            reachable = (self.live & self.connected()) | {self.name}
            self.submit(MirrorReplicaUp(g.vhost, g.name, self.name, record.epoch, tuple(sorted(reachable)),
                                        g.unclean, {self.name: [r.latest_epoch(), r.leo]}))
        if leader != g.leader:
            g.leader = leader
            log.info("cluster: mirrored queue %s/%s: leader %s, epoch %d, ISR %s", g.vhost, g.name, leader or "-",
                     record.epoch, ",".join(record.isr))
            self.on_leader_change(group, NodeId(leader) if leader else None)

    def leader_of(self, group: GroupId) -> str | None:
        g = self.groups.get(group)
        return g.leader or None if g is not None else None

    # --- proposals --------------------------------------------------------------------------------------------

    def propose(self, group: GroupId, data: bytes) -> bool:
        g = self.groups.get(group)
        if g is None:
            return False
        if g.replica.role == "leader":
            self._publish(g, data)
            return True
        if g.leader and g.leader != self.name:
            if wall_ms() < g.trace_until:
                self._trace(g, f"forwarding a proposal to {g.leader}")
            self.stats["forwarded"] += 1
            self._send(g, g.leader, Forward(data))
            return True
        return False

    def _trace(self, g: _Group, what: str) -> None:
        r = g.replica
        log.info("cluster: mirror trace: %s/%s: %s (%s, epoch %d, LEO %d, HW %d, applied %d)", g.vhost, g.name, what,
                 r.role, r.epoch, r.leo, r.hw, g.applied)

    def _publish(self, g: _Group, data: bytes) -> None:
        effects = g.replica.publish(data.decode("latin-1"))
        if effects and all(isinstance(e, Nacked) for e in effects):
            self.stats["refused"] += 1  # not leader, or the ISR below min-insync: the tracker resends
        else:
            self.stats["appended"] += 1
        self._run(g, effects)

    # --- the loop ---------------------------------------------------------------------------------------------

    def _send(self, g: _Group, dst: str, message: WireMessage) -> None:
        self.transport.send(dst, Routed(g.group, encode(message)))

    def _run(self, g: _Group, effects: list[Effect]) -> None:
        """Files first (the core's crash image), then the effects, then the newly committed records: planned now,
        written by the writer task (or at once without it), released in order after."""
        plan = g.store.plan(g.replica, effects)
        written, appended = g.store.written, g.store.planned_appended
        if self._writer_running:
            self._writes.append((g, (plan, written, appended), effects))
            self._writes_wanted.set()
            return
        g.store.execute(plan)
        g.durable = written
        self._after_write(g, effects, appended)

    async def _writer(self) -> None:
        """Runs every queued plan in one worker thread call, then releases their effects in order."""
        try:
            while True:
                await self._writes_wanted.wait()
                self._writes_wanted = trio.Event()
                batch, self._writes = self._writes, []
                work = [(g.store, planned[0]) for g, planned, effects in batch if effects is not None and planned[0]]
                if work:
                    self.stats["write_batches"] += 1
                    await trio.to_thread.run_sync(_execute_all, work)
                for g, planned, effects in batch:
                    if effects is None:
                        self._drop_files(g)
                    elif self.groups.get(g.group) is g:
                        g.durable = planned[1]
                        try:
                            self._after_write(g, effects, planned[2])
                        except Exception:  # as the tick: one queue's failure must not stop every queue's writes
                            log.exception("cluster: mirrored queue %s/%s: after a write", g.vhost, g.name)
        finally:
            self._writer_running = False

    def _after_write(self, g: _Group, effects: list[Effect], appended: list[Record] | None = None) -> None:
        if self.telemetry is not None and appended:
            self.telemetry.on_append(g.group, g.replica, appended)
        if effects and wall_ms() < g.trace_until:
            self._trace(g, "written: " + ",".join(type(e).__name__ if not isinstance(e, Send)
                                                   else f"{type(e.message).__name__}>{e.dst}" for e in effects))
        for effect in effects:
            if isinstance(effect, Send):
                if isinstance(effect.message, FetchResponse):
                    g.hw_sent[effect.dst] = effect.message.leader_hw
                self._send(g, effect.dst, effect.message)
            elif isinstance(effect, IsrChanged):
                self.submit(AlterMirrorIsr(g.vhost, g.name, effect.leader, effect.epoch, tuple(sorted(effect.isr))))
            elif isinstance(effect, Truncated):
                self.stats["truncations"] += 1
                log.info("cluster: mirrored queue %s/%s: truncated %d -> %d by %s", g.vhost, g.name,
                         effect.from_leo, effect.to_leo, effect.how)
                if self.telemetry is not None:
                    self.telemetry.on_truncate(g.group, g.replica, effect)
            elif isinstance(effect, SnapshotInstalled):
                self.stats["snapshots_installed"] += 1
                log.info("cluster: mirrored queue %s/%s: installed the leader's snapshot at offset %d", g.vhost,
                         g.name, effect.snapshot.offset)
                if self.snapshots is not None:
                    self.snapshots.restore(g.group, effect.snapshot.data.encode("latin-1"))
                g.applied = effect.snapshot.offset
        if self.telemetry is not None:
            self.telemetry.after(g.group, g.replica)
        self._deliver(g)
        self._maybe_trim(g)

    def _deliver(self, g: _Group) -> None:
        r = g.replica
        if r.leo < g.applied:  # an unsafe setting (ha-truncation: hw), or starting over from the leader's snapshot
            if r.snapshot is not None and self.snapshots is not None:
                log.warning("cluster: mirrored queue %s/%s: log cut below what was applied (%d < %d): restoring "
                            "the snapshot at %d", g.vhost, g.name, r.leo, g.applied, r.log_start)
                self.snapshots.restore(g.group, r.snapshot.data.encode("latin-1"))
                g.applied = r.log_start
            elif r.settings.truncation != "hw":  # no epoch in common with the leader: its snapshot comes next
                log.info("cluster: mirrored queue %s/%s: no common epoch with the leader: starting over from its "
                         "snapshot (applied %d)", g.vhost, g.name, g.applied)
                g.applied = r.leo
            else:
                log.error("cluster: mirrored queue %s/%s: log cut below what was applied (%d < %d)", g.vhost,
                          g.name, r.leo, g.applied)
                g.applied = r.leo
        upto = min(r.hw, r.leo if r.settings.flush == "unsynced" else g.durable)  # unsynced: the page cache counts
        if upto <= g.applied:
            return
        records = r.records(g.applied, upto)
        g.applied = upto
        if wall_ms() < g.trace_until:
            self._trace(g, f"applying {len(records)}")
        self.on_apply_many(g.group, tuple(Entry(Term(rec.epoch), Index(rec.offset + 1), rec.msg.encode("latin-1"))
                                          for rec in records))

    def _maybe_trim(self, g: _Group) -> None:
        """Enough applied records above the log start: snapshot the broker's queue at `applied` and trim."""
        r = g.replica
        if self.snapshots is None or g.applied - r.log_start < self.trim_records or g.applied > r.hw:
            return
        data = self.snapshots.snapshot(g.group)
        if r.trim(g.applied, data.decode("latin-1")):
            self.stats["trims"] += 1
            self._run(g, [])

    def _on_message(self, src: str, message: WireMessage) -> None:
        if not isinstance(message, Routed):
            return
        g = self.groups.get(GroupId(message.group))
        if g is None:
            return
        try:
            inner = decode(message.payload)
        except WireError as exc:
            log.warning("cluster: mirrored queue %s: bad message from %s: %s", message.group, src, exc)
            return
        now = wall_ms()
        r = g.replica
        if now < g.trace_until:
            self._trace(g, f"from {src}: {type(inner).__name__} {getattr(inner, 'epoch', '')}")
        if isinstance(inner, Forward):
            if r.role == "leader":
                self._publish(g, inner.data)
            elif g.leader and g.leader not in (self.name, src):
                self._send(g, g.leader, inner)  # (leadership moved: once more)
        elif isinstance(inner, FetchRequest | EpochEndRequest) and inner.epoch > r.epoch:
            g.early[src] = inner  # a follower that learnt of a newer epoch first: answered once we know it
        elif isinstance(inner, FetchRequest | EpochEndRequest):
            self._on_request(g, src, inner, now)
        elif isinstance(inner, Message):
            if isinstance(inner, FetchResponse | EpochEndResponse) and src == r.leader:
                g.awaiting_since = None
                g.fetch_now = True
            self._run(g, r.handle(inner, now))
            if g.fetch_now:
                self._poll(g, now)
        self._release(g, now)

    def _on_request(self, g: _Group, src: str, request: FetchRequest | EpochEndRequest, now: int) -> None:
        if isinstance(request, FetchRequest) and request.src not in g.replicas:
            self._serve_observer(g, request, now)
        elif isinstance(request, FetchRequest) and self._parks(g, request):
            g.parked[src] = (request, now, g.replica.leo, g.replica.hw)
        else:
            self._run(g, g.replica.handle(request, now))

    def _parks(self, g: _Group, request: FetchRequest) -> bool:
        r = g.replica
        return (r.role == "leader" and request.epoch == r.epoch and request.fetch_offset == r.leo
                and r.follower_leo.get(request.src) == request.fetch_offset and g.hw_sent.get(request.src) == r.hw)

    def _serve_observer(self, g: _Group, request: FetchRequest, now: int) -> None:
        """A node that is not a replica reads the committed log; it never joins the ISR."""
        r = g.replica
        if r.role != "leader" or request.epoch != r.epoch:
            return
        if request.fetch_offset >= r.hw and g.hw_sent.get(request.src) == r.hw and request.fetch_offset <= r.leo:
            g.parked[request.src] = (request, now, r.leo, r.hw)
            return
        out_of_range = request.fetch_offset > r.leo
        start = max(request.fetch_offset, r.log_start)
        end = min(r.hw, start + r.settings.fetch_max_records)
        records = () if out_of_range else tuple(r.records(start, end))
        snapshot = r.snapshot if request.fetch_offset < r.log_start and not out_of_range else None
        g.hw_sent[request.src] = r.hw
        self._send(g, request.src, FetchResponse(self.name, r.epoch, records, r.hw, out_of_range, r.leo,
                                                 snapshot))

    def _release(self, g: _Group, now: int, expired_only: bool = False) -> None:
        r = g.replica
        for src, (request, since, leo, hw) in list(g.parked.items()):
            moved = r.role != "leader" or request.epoch != r.epoch or r.leo != leo or r.hw != hw
            if (moved and not expired_only) or now - since >= FETCH_MAX_WAIT_MS:
                del g.parked[src]
                if request.src not in g.replicas:
                    g.hw_sent.pop(request.src, None)
                    self._serve_observer(g, request, now)
                else:
                    self._run(g, r.handle(request, now))

    def _poll(self, g: _Group, now: int) -> None:
        g.fetch_now = False
        effects = g.replica.poll()
        if effects:
            g.awaiting_since = now
            self._run(g, effects)

    def _tick(self, now: int) -> None:
        writeback = self.flush == "unsynced" and now - self._last_writeback_ms >= WRITEBACK_MS
        if writeback:
            self._last_writeback_ms = now
        for g in list(self.groups.values()):
            if writeback:
                g.replica.flush()
            self._run(g, g.replica.tick(now))
            self._release(g, now)
            if g.replica.role == "follower" and (
                    g.awaiting_since is None or now - g.awaiting_since >= FETCH_TIMEOUT_MS):
                self._poll(g, now)
        if self.telemetry is not None:
            self.telemetry.sample_replicas((g.group, g.replica) for g in list(self.groups.values()))

    # --- status -----------------------------------------------------------------------------------------------

    def status(self, group: GroupId) -> dict[str, Any] | None:
        """Leader, epoch, ISR, HW and the LEOs this node knows (a leader knows every replica's); the HW checkpoint
        as its file holds it."""
        g = self.groups.get(group)
        if g is None:
            return None
        r = g.replica
        record = g.record
        leo = {self.name: r.leo}
        if r.role == "leader":
            leo.update({n: v for n, v in r.follower_leo.items() if n in g.replicas})
        return {"leader": g.leader or None, "epoch": record.epoch if record is not None else r.epoch,
                "replicas": list(g.replicas), "isr": list(record.isr) if record is not None else [],
                "hw": r.hw, "hw_checkpoint": g.store.hw_checkpoint_written, "leo": leo, "role": r.role,
                "min_insync": record.min_insync if record is not None else r.settings.min_insync,
                "promote_on_failure": record.promote_on_failure if record is not None else "when-synced",
                "truncation": r.settings.truncation, "unclean_elections": record.unclean_elections if record else 0,
                "held_out": dict(record.held_out) if record is not None else {}}
