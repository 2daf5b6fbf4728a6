"""Cluster mode of `raftmq node`: metadata mirrored into the broker, one Raft group per queue, proposals.

What it is for: with `cluster_nodes` set, the node's `Broker` runs replicated (`BrokerConfig(replicated=True)`):
it never applies a queue command itself but emits `ProposeQueue` effects, and its definitions come from the
cluster metadata. `ClusterRuntime` is the glue (docs/cluster.md, "node/runtime, cluster mode"):

- Metadata (`cluster.metadata.store.MetadataStore`, under <data_dir>/metadata): started first (peers probed with
  the secret, version checked: a refusal stops the node before anything changed). Its committed state is mirrored
  into the broker with `Broker.apply_records` (the diff of whole states, `cluster_defs.mirror_records`) and kept
  mirrored from `store.watch()`. The broker's `Persist` effects (client declares/deletes) become metadata commands
  (a new queue placed by `cluster.metadata.placement`) applied one Persist at a time, in order, and
  `on_persisted(token)` releases the client's reply once they committed; if one was refused or not committed
  within `definition_timeout_ms`, what the Persist created that the metadata lacks is dropped from the broker again
  and `on_persist_failed(token, code, text)` closes the client's channel with an error instead of the ok.
  `ClusterRuntime` is the `Node`'s store: it has `persist`, `commit_loop` and `flush`.
- Queues (`cluster.raft.runtime.RaftNodeRuntime`, under <data_dir>/raft): one group per queue declaration (its
  incarnation is in the group id, `node/clustering/incarnations.py`), voters = the queue's members, every other
  cluster node a learner; added after the broker has the queue's definition and removed after it lost it. A group's
  committed entries of one Ready cycle are read by the broker's `envelope_codec` (`cluster.queue.envelope`, which
  skips other incarnations' entries: this runtime never reads an entry's bytes) and go to `Broker.apply_committed`
  in one call; leader changes to `Broker.set_queue_leader`; snapshots to `queue_snapshot`/`queue_restore`.
- Proposals (node/runtime/cluster/proposing.py): a `ProposeQueue` (numbered by the broker) becomes an `Envelope`,
  encoded by `envelope_codec`, proposed through Raft and tracked (`node.clustering.proposals.ProposalTracker`)
  until this node's replica applied it; a group's proposals are sent again `RETRY_MS` after the last send
  (doubling per resend while its leader is unchanged) and at once when its leader changes; after
  `proposal_timeout_ms` the broker is told (`proposal_abandoned`: a waiting publish is nacked).
- Start: the queues that died with this node's earlier life (its connections' exclusive queues, its non-durable
  classic queues) are deleted from the metadata before anything is mirrored or served (`died_with_earlier_life`,
  node/runtime/cluster/definition_replies.py, with the channel errors of failed definition changes).
- Liveness (and queue group membership: node/runtime/cluster/liveness.py): a peer without a Raft connection for
  `node_down_after_ms`, or at once one that refuses connections (the Raft transport's `refusing_peers()`: its
  process is gone), is reported to the broker (`Broker.node_down`); the metadata leader records it
  (`SetNodeState`) and deletes the exclusive queues it owned.

Everything runs on the trio thread; effects go through `Node.dispatch` (or `Node.apply_effects` when called from
inside a dispatch), exactly as the single-node path does.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import uuid
from collections import deque
from collections.abc import Iterable
from functools import partial
from typing import Any

import trio

from cluster.metadata import model as md
from cluster.metadata.store import MetadataError, MetadataStore, MetadataTimeout, StoreConfig
from cluster.queue.envelope import EnvelopeCodec, frame_snapshot, open_snapshot
from cluster.raft.core.types import Entry, EntryKind, GroupId, Membership, NodeId
from cluster.raft.runtime.group_hosting import Bootstrap
from cluster.raft.runtime.node import RaftNodeRuntime
from cluster.raft.runtime.ready_pipeline import QUEUED_READIES_MAX
from node.broker import records as br
from node.broker.auth import hash_password
from node.clustering.definitions import (
    client_local_placement,
    commands_for,
    mirror_records,
    mirror_spec_in,
    missing_bootstrap,
)
from node.clustering.incarnations import (
    QueueGroups,
    deleted_queues,
    group_of_record,
    queue_key,
    queues_pending_creation,
    redeclared,
    without_queue_deletions,
    without_queues,
)
from node.clustering.proposals import (
    PROPOSAL_IDS_PER_BOOT,
    PeerLiveness,
    ProposalTracker,
    incarnation_of_cid,
    stale_groups,
)
from node.runtime.cluster import mirror_back, mirror_conversion, mirror_polling, mirror_trace
from node.runtime.cluster.definition_replies import (
    INTERNAL_ERROR,
    died_with_earlier_life,
    dies_with_its_node,
    not_committed_text,
    refusal_reply,
    uncommitted_creations,
)
from node.runtime.cluster.forward import Forwarder
from node.runtime.cluster.incarnation_file import IncarnationFile, IncarnationRecording
from node.runtime.cluster.liveness import MembershipAndLiveness
from node.runtime.cluster.members import adopt_metadata_layout, watch_membership
from node.runtime.cluster.mirror_groups import MirrorGroups, mirror_port
from node.runtime.cluster.proposing import RETRY_MS, QueueProposals
from node.runtime.config import ClusterLayout, NodeConfig
from node.runtime.dispatch import wall_ms

log = logging.getLogger("raftmq.cluster")

PERSIST_QUEUED_MAX = 10_000  # Persist effects waiting for the metadata group; beyond: released with an error
OVERLOADED_TEXT = "INTERNAL_ERROR - too many definition changes waiting for the cluster metadata"
FLUSH_TIMEOUT_S = 5.0


def _readies_behind_fsync_max() -> int:
    """Readies the Raft loop may take while an fsync runs (docs/raft.md, "Pipelined Ready cycles"); 0 takes none
    (the loop still steps and routes meanwhile). `RAFTMQ_RAFT_BEHIND_FSYNC_MAX` overrides it, for A/B runs."""
    value = os.environ.get("RAFTMQ_RAFT_BEHIND_FSYNC_MAX", "")
    return int(value) if value.isdigit() else QUEUED_READIES_MAX


class ClusterRuntime(QueueProposals, MembershipAndLiveness, IncarnationRecording):
    """The cluster layer of one node; create it, `attach(node)`, `await start()`, then run `run` in a nursery."""

    def __init__(self, config: NodeConfig, layout: ClusterLayout, broker: Any, boot_id: int) -> None:
        self.config = config
        self.layout = layout
        self.broker = broker
        self.envelopes: EnvelopeCodec = broker.envelope_codec  # the one reader and writer of queue log entries
        self.name = layout.self_name
        self.boot_id = boot_id
        self.data_dir = config.resolved_data_dir()
        self.node: Any = None
        self.store: MetadataStore | None = None
        self.raft: RaftNodeRuntime | None = None
        self.mirror: MirrorGroups | None = None  # the mirrored queues' groups (mirror_groups.py)
        self._mirror_backlog: list[Any] = []  # their metadata commands from before `run`
        self.seeds: dict[GroupId, bytes] = {}  # Raft groups of queues back from a mirror log: seeds (mirror_back.py)
        self.mirrored = md.MetadataState()
        self.forwarder = Forwarder(self)  # publishes to exclusive queues owned on other nodes (forward.py)
        self.group_queues = QueueGroups()  # group -> (vhost, name), and the queue's current group (group_of)
        self.group_incarnations: dict[GroupId, int] = {}  # the incarnation each hosted group serves
        self.incarnation_file = IncarnationFile(self.data_dir)
        self.recorded_incarnations: dict[str, int] = {}  # what the file says (kept in step with it)
        self._incarnations_version = 0  # bumped at each change of recorded_incarnations (the file's `save`)
        self._incarnations_wake: trio.Event | None = None  # set: `_write_incarnations` runs (and is woken by it)
        self._deferred_groups: set[GroupId] = set()  # stale here at start: added once their old state is deleted
        self._declared_here: set[GroupId] = set()  # groups of queues this node is declaring now (see _bootstrap)
        self._raft_running = False
        # group -> first proposal id after a local client deleted its queue: until the metadata settled that
        # deletion, the group takes no proposal and feeds no entry to the broker (node/clustering/incarnations.py)
        self._quarantined: dict[GroupId, int] = {}
        self.tracker = ProposalTracker(first_id=boot_id * PROPOSAL_IDS_PER_BOOT, retry_ms=RETRY_MS,
                                       timeout_ms=config.proposal_timeout_ms)
        self.place = client_local_placement(self.name, config.quorum_initial_group_size, layout.names)
        self._persists: deque[tuple[int, tuple[Any, ...]]] = deque()
        self._persist_wake = trio.Event()
        self._persist_idle = trio.Event()
        self._persist_idle.set()
        self._metadata_tasks: trio.Nursery | None = None
        self.liveness = PeerLiveness(tuple(m.name for m in layout.peers), config.node_down_after_ms, wall_ms())
        self._replacing: set[tuple[str, str]] = set()  # queues whose member replacement is running
        self._last_steps: dict[GroupId, object] = {}  # the membership step last asked for, per led group (logging)
        self._leader_recorded_ms: dict[GroupId, int] = {}  # last SetQueueLeader attempt per group (rate limit)
        self._mirror_proposed: dict[tuple[str, str], tuple[Any, int]] = {}  # (liveness.py: _reconcile_mirrors)
        self.stats = {"proposed": 0, "resent": 0, "abandoned": 0, "applied": 0, "definitions": 0,
                      "applied_before_commit": 0, "barriers_held": 0, "stale_entries": 0, "stale_groups_deleted": 0}
        self.unsafe_confirm_before_commit = config.test_unsafe_confirm_before_commit
        if self.unsafe_confirm_before_commit:
            log.warning("TEST-ONLY UNSAFE MODE test_unsafe_confirm_before_commit: this node applies its own publishes "
                        "to its replica BEFORE Raft commits them; publisher confirms do not mean a majority has the "
                        "message, and a kill -9 can lose confirmed messages. Never use it in production.")

    def attach(self, node: Any) -> None:
        """The `Node` whose dispatch carries out effects; `ProposeQueue` effects are routed here."""
        self.node = node
        from node.broker.effects import ForwardPublish, ProposeQueue
        node.effect_sinks[ProposeQueue] = self._on_propose
        node.effect_sinks[ForwardPublish] = self.forwarder.submit  # node-local exclusive queues (forward.py)
        node.catch_up_definitions = self.catch_up_definitions  # a refused login or vhost is asked again after it

    # ------------------------------------------------------------------------------------------ start-up

    async def start(self, bootstrap: Iterable[Any] = ()) -> None:
        """Join the metadata group (raises ClusterSecretError / IncompatibleVersionError / MetadataError: the
        node must stop), mirror the definitions, add our bootstrap definitions the cluster lacks, and declare a
        Raft group per known queue. The Raft runtime itself starts in `run`."""
        me = self.layout.me
        store = self.store = MetadataStore(StoreConfig(
            node_name=self.name, address=me.metadata_address,
            peers=tuple(p.metadata_address for p in self.layout.peers),
            secret=self.layout.secret, data_dir=self.data_dir / "metadata"))
        await store.start()
        adopt_metadata_layout(self)  # the metadata's members, before any group is declared (members.py)
        for queue in died_with_earlier_life(store.state, self.name):  # before any client can see them
            log.info("cluster: deleting %s/%s, a queue of this node's earlier life", queue.vhost, queue.name)
            await self.apply_definition(md.DeleteQueue(queue.vhost, queue.name))
        for rec in missing_bootstrap(list(bootstrap), store.state):
            for command in commands_for([rec], store.state, self.place):
                await self.apply_definition(command)
        self._mirror(store.state)
        peers = {NodeId(p.name): (p.host, p.raft_port) for p in self.layout.peers}
        self.raft = RaftNodeRuntime(
            NodeId(self.name), self.data_dir / "raft", (me.host, me.raft_port), peers,
            self.layout.secret.encode(), self._on_apply, snapshots=self, on_leader_change=self._on_leader_change,
            on_apply_many=self._on_apply_many, readies_behind_fsync_max=_readies_behind_fsync_max())
        self.raft.refusal_listeners.append(self._peer_refused)  # (liveness.py)
        self.mirror = MirrorGroups(
            self.name, self.data_dir, {p.name: (p.host, mirror_port(p.amqp_port)) for p in self.layout.peers},
            self.layout.secret.encode(), self._on_apply_many, self._on_mirror_leader_change, self._submit_mirror,
            snapshots=self, trim_records=self.config.mirror_trim_records, flush=self.config.mirror_flush,
            hw_checkpoint_ms=self.config.mirror_hw_checkpoint_ms)
        self.mirror.connected = self.raft.connected_peers
        self._drop_stale_groups(self.mirrored)
        self._sync_groups(self.mirrored)

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """The Raft runtime, the metadata watcher, the proposal retry timer and the liveness watch."""
        assert self.raft is not None and self.store is not None
        try:
            async with trio.open_nursery() as nursery:
                self._metadata_tasks = nursery
                await nursery.start(self.raft.run)
                await nursery.start(self.forwarder.run)
                if self.mirror is not None:
                    me = self.layout.me
                    await nursery.start(partial(self.mirror.run, me.host, mirror_port(me.amqp_port)))
                    for command in self._mirror_backlog:
                        nursery.start_soon(self.apply_definition, command)
                    self._mirror_backlog.clear()
                    nursery.start_soon(mirror_polling.run, self)  # queues becoming mirrored, classic; syncs
                self._incarnations_wake = trio.Event()
                nursery.start_soon(self._write_incarnations)
                self._raft_started()
                nursery.start_soon(self._watch_metadata)
                nursery.start_soon(self._retry_timer)
                nursery.start_soon(self._liveness_watch)
                nursery.start_soon(self._reconcile_groups)
                nursery.start_soon(watch_membership, self)  # online membership (members.py)
                if mirror_trace.tracing():  # RAFTMQ_MIRROR_TRACE=1: a failover's stages in the log
                    nursery.start_soon(mirror_trace.watch_metadata_leader, self.store.leader,
                                       mirror_trace.metadata_names(self.layout.members))
                task_status.started()
        finally:
            self.close()

    def close(self) -> None:
        self._save_unwritten_incarnations()
        if self.store is not None:
            self.store.close()

    # ------------------------------------------------------------------------------------------ dispatch

    def dispatch(self, effects: Iterable[Any]) -> None:
        """Effects from a timer or callback (not from inside a dispatch); a failure never kills the caller."""
        try:
            self.node.dispatch(effects)
        except Exception:
            log.exception("cluster: carrying out effects failed")
            self.node._clear_dirty()

    # ------------------------------------------------------------------------------------------ metadata

    def _mirror(self, state: md.MetadataState) -> None:
        """Bring the broker's definitions (and the Raft groups) to `state`: definitions first, so a queue is
        known to the broker before its group applies anything, and forgotten by it before its group goes."""
        records = mirror_records(self.mirrored, state)
        reborn = redeclared(self.mirrored, state)
        if reborn:  # deleted and declared again in one watch step: the broker drops the old queue first
            between = without_queues(self.mirrored, reborn)
            records = mirror_records(self.mirrored, between) + mirror_records(between, state)
        records = without_queue_deletions(records, queues_pending_creation(self._persists))
        if records:
            self.dispatch(self.broker.apply_records(records))
        self.mirrored = state
        if self.raft is not None:
            self._sync_groups(state)

    def _membership(self, queue: md.QueueRecord) -> Membership:
        names = set(self.layout.names)
        voters = frozenset(NodeId(m) for m in queue.members if m in names) or frozenset({NodeId(queue.leader)})
        learners = frozenset(NodeId(n) for n in names if n not in voters)
        return Membership(voters, learners)

    def _sync_groups(self, state: md.MetadataState) -> None:
        """Host a group per queue of `state` and no other queue group. A redeclared queue's group id differs from
        the old one's (its incarnation is in it): the old group is removed first, then the new one added."""
        assert self.raft is not None
        wanted = {group_of_record(q): q for q in state.queues.values() if not q.exclusive_owner}  # (node-local)
        if self.mirror is not None:
            mirror_conversion.switch(self, wanted)  # Raft groups of queues now mirrored: re-added below
            mirror_back.switch(self, wanted)  # and mirror groups of queues classic again
        for group in [g for g in self.group_queues if g not in wanted]:
            self._remove_group(group)
            self._record_incarnation(group, None)
        for group, queue in wanted.items():
            if group in self.group_queues:
                continue
            if group in self._deferred_groups and not self._raft_running:
                continue  # its old state is deleted when Raft starts; added right after (_raft_started)
            self._record_incarnation(group, queue.incarnation, durable_first=not dies_with_its_node(queue))
            self.group_queues[group] = (queue.vhost, queue.name)
            self.group_incarnations[group] = queue.incarnation
            if queue.type == "mirrored" and self.mirror is not None:
                spec = mirror_spec_in(state, queue.vhost, queue.name)
                self.mirror.add_group(group, queue.vhost, queue.name, tuple(queue.members),
                                      spec.truncation if spec is not None else "leader-epoch",
                                      state.mirrors.get((queue.vhost, queue.name)))
            else:
                self.raft.add_group(group, self._membership(queue), self._bootstrap(group, queue),
                                    volatile=dies_with_its_node(queue))
            self._send_queue(queue_key(queue.vhost, queue.name), wall_ms())
        if self.mirror is not None:
            for group in list(self.mirror.groups):
                key = self.group_queues.get(group)
                if key is not None:
                    self.mirror.on_record(group, state.mirrors.get(key))

    def _bootstrap(self, group: GroupId, queue: md.QueueRecord) -> Bootstrap | None:
        """How a new group of `queue` starts: with its term-1 vote cast for the queue's initial leader (fixed at
        declaration), which leads at once only on the node that declared it, in this life (`_declared_here`,
        one-shot: a node whose data was wiped, or that adds the group again, must never lead term 1 twice)."""
        lead = group in self._declared_here
        self._declared_here.discard(group)
        seeded = mirror_back.bootstrap(self, group, queue)  # (a queue back from a mirror log)
        if seeded is not None:
            return seeded
        if not queue.initial_leader:
            return None
        return Bootstrap(NodeId(queue.initial_leader), lead=lead and queue.initial_leader == self.name)

    def _remove_group(self, group: GroupId) -> None:
        """Stop hosting a queue group; its proposals are abandoned, except those made for the queue a local client
        declared again after deleting it (quarantine): they wait for the group's next incarnation."""
        assert self.raft is not None
        vhost, name = self.group_queues.pop(group)
        self.group_incarnations.pop(group, None)
        if self.mirror is not None and group in self.mirror.groups:
            self.mirror.remove_group(group)
        else:
            self.raft.remove_group(group)
        keep_from = self._quarantined.pop(group, None)
        for pending in self.tracker.drop_group(queue_key(vhost, name)):
            if keep_from is not None and pending.proposal_id >= keep_from:
                pending.sent_ms = None
                self.tracker.add(pending)
            else:
                self._abandon(pending)

    # ------------------------------------------------------------------------------------------ incarnations

    def _drop_stale_groups(self, state: md.MetadataState) -> None:
        """Before Raft starts: delete the local state of every queue group recorded here that the metadata no longer
        has (the queue was deleted, maybe declared again under a new group id, while this node was down), so no
        stream is left behind. (A recorded group whose id is wanted again is added once Raft has started; with the
        incarnation in the id that is only a group recorded by an older build under its legacy id.)"""
        assert self.raft is not None
        self.recorded_incarnations = self.incarnation_file.load()
        wanted: dict[str, int] = {group_of_record(q): q.incarnation for q in state.queues.values()
                                  if not q.exclusive_owner}
        for group in stale_groups(self.recorded_incarnations, wanted):
            log.warning("cluster: queue group %s: local state of incarnation %d is stale (the metadata has no such "
                        "group); deleting it", group, self.recorded_incarnations[group])
            self.stats["stale_groups_deleted"] += 1
            self.raft.remove_group(GroupId(group))  # before run: its stream is deleted when Raft starts
            self._deferred_groups.add(GroupId(group))
        mirror_conversion.drop_raft_streams(self, state)  # (left by a conversion while this node was down)

    def _raft_started(self) -> None:
        """The stale groups' state is gone now (deleted as Raft started): forget them, add the redeclared ones."""
        self._raft_running = True
        deferred, self._deferred_groups = self._deferred_groups, set()
        for group in deferred:
            self._record_incarnation(group, None)
        self._sync_groups(self.mirrored)

    async def _watch_metadata(self) -> None:
        assert self.store is not None
        while True:
            state, changes = self.store.watch()
            self._mirror(state)
            async with changes:
                async for _ in changes:
                    self._mirror(self.store.state)
            log.warning("cluster: metadata watch fell behind; re-reading the whole state")

    # -------------------------------------------------------------------- definitions (the Node's store)

    def persist(self, token: int, records: Iterable[Any]) -> None:
        """A broker `Persist`: its definition records go to the metadata group, in order, then on_persisted."""
        if len(self._persists) >= PERSIST_QUEUED_MAX:
            log.error("cluster: %d definition changes waiting; failing token %d unreplicated", PERSIST_QUEUED_MAX,
                      token)
            self.node.apply_effects(self.broker.on_persist_failed(token, INTERNAL_ERROR, OVERLOADED_TEXT))
            return
        records = tuple(records)
        for vhost, name in deleted_queues(records):
            group = self.group_queues.group_of(queue_key(vhost, name))
            if group is not None:
                self._quarantined.setdefault(group, self.tracker.peek_id())
        self._persists.append((token, records))
        self._persist_idle = trio.Event()
        self._persist_wake.set()

    async def commit_loop(self, node: Any) -> None:
        """Apply the queued Persists one after the other (definition order matters: a queue before its binding)."""
        while True:
            await self._persist_wake.wait()
            self._persist_wake = trio.Event()
            while self._persists:
                token, records = self._persists[0]
                failure = await self.replicate_now(records)
                self._persists.popleft()
                if self.store is not None:  # the client's answer follows: the broker must show the result now
                    self._mirror(self.store.state)  # (the watcher may still hold an older step, e.g. a delete)
                for vhost, name in deleted_queues(records):  # the metadata refused or lost the deletion
                    group = self.group_queues.group_of(queue_key(vhost, name))
                    if group is not None:
                        self._quarantined.pop(group, None)
                if failure is None:
                    self.dispatch(self.broker.on_persisted(token))
                    continue
                if self.store is not None:  # a redeclare must not find a queue the cluster never recorded
                    undo = uncommitted_creations(records, self.store.state)
                    if undo:
                        self.dispatch(self.broker.apply_records(undo))
                self.dispatch(self.broker.on_persist_failed(token, *failure))
            self._persist_idle.set()

    async def flush(self) -> None:
        with trio.move_on_after(FLUSH_TIMEOUT_S):
            await self._persist_idle.wait()

    async def replicate_now(self, records: tuple[Any, ...]) -> tuple[int, str] | None:
        """Apply one Persist's commands in order; None when all committed, else the channel error (reply code,
        text) for the client, after the first command refused or not committed in time (the rest are skipped:
        they depend on it). Bounded: each command gives up after `definition_timeout_ms`."""
        assert self.store is not None
        for command in commands_for(records, self.store.state, self.place):
            outcome = await self.apply_definition(command)
            if outcome is None:
                return INTERNAL_ERROR, not_committed_text(command, self.config.definition_timeout_ms / 1000)
            if not outcome.ok:
                return refusal_reply(command, outcome.refused)
        return None

    async def catch_up_definitions(self) -> bool:
        """Wait until this node's metadata replica applied every command committed before the call (a shared
        `Barrier`, `MetadataStore.caught_up`) and the broker has it: a management read (view.py) or a refused AMQP
        login or vhost (node/runtime/server.py `_recheck`) then sees what was just done through another node.
        Bounded by `management_read_barrier_ms` (0: off); False when it timed out (no metadata majority)."""
        timeout_s = self.config.management_read_barrier_ms / 1000
        store = self.store
        if store is None or timeout_s <= 0:
            return True
        if not await store.caught_up(timeout_s):
            return False
        if self.mirrored is not store.state:  # (the metadata watcher has not run since)
            self._mirror(store.state)
        return True

    async def apply_definition(self, command: md.Command) -> md.Outcome | None:
        """Apply one metadata command with a fixed command id (retries are idempotent); bounded in time."""
        assert self.store is not None
        command = dataclasses.replace(command, cid=uuid.uuid4().hex)
        if isinstance(command, md.DeclareQueue) and not command.queue.incarnation:
            command = dataclasses.replace(command, queue=dataclasses.replace(
                command.queue, incarnation=incarnation_of_cid(command.cid)))
        self.stats["definitions"] += 1
        declared = None
        if (isinstance(command, md.DeclareQueue) and command.queue.initial_leader == self.name
                and not command.queue.exclusive_owner):
            declared = group_of_record(command.queue)  # a new group: may lead term 1 here (_bootstrap)
            self._declared_here.add(declared)
        try:
            return await self._apply_definition(command)
        finally:
            if declared is not None and not self._committed_group(declared, command):
                self._declared_here.discard(declared)  # refused, an existing queue, or not committed

    def _committed_group(self, group: GroupId, command: Any) -> bool:
        """Whether the metadata now holds the queue of a DeclareQueue `command` under `group` (its incarnation)."""
        queue = None if self.store is None else self.store.state.queues.get((command.queue.vhost, command.queue.name))
        return queue is not None and group_of_record(queue) == group

    async def _apply_definition(self, command: md.Command) -> md.Outcome | None:
        assert self.store is not None
        timeout_s = self.config.definition_timeout_ms / 1000
        with trio.move_on_after(timeout_s):
            while True:
                try:
                    outcome = await self.store.apply(command, timeout_s=timeout_s)
                except MetadataTimeout:
                    continue
                except MetadataError as exc:
                    log.error("cluster: %s failed: %s", type(command).__name__, exc)
                    return None
                if not outcome.ok:
                    log.warning("cluster: metadata refused %s: %s", type(command).__name__, outcome.refused)
                return outcome
        log.error("cluster: %s not committed within %.0f s (no metadata majority?)", type(command).__name__,
                  timeout_s)
        return None

    # ------------------------------------------------------------------------------------------ Raft host

    def snapshot(self, group: GroupId) -> bytes:
        key = self.group_queues.get(group)
        if key is None:
            return b""
        return frame_snapshot(self.group_incarnations.get(group, 0), bytes(self.broker.queue_snapshot(*key)))

    def restore(self, group: GroupId, data: bytes) -> None:
        key = self.group_queues.get(group)
        if key is None:
            return
        incarnation, data = open_snapshot(data)
        if incarnation != self.group_incarnations.get(group, 0):
            log.error("cluster: queue %s: snapshot of incarnation %d ignored (this queue is %d)", group,
                      incarnation, self.group_incarnations.get(group, 0))
            return
        self.dispatch(self.broker.queue_restore(key[0], key[1], data))

    def _on_apply(self, group: GroupId, entry: Entry) -> None:
        """Per-entry callback the Raft runtime requires; it calls `_on_apply_many` instead, as this does."""
        self._on_apply_many(group, (entry,))

    def _on_apply_many(self, group: GroupId, entries: tuple[Entry, ...]) -> None:
        """One Ready cycle's committed entries of a group: one broker call (confirms coalesce), one dispatch."""
        key = self.group_queues.get(group)
        if key is None:
            return
        if group in self._quarantined:  # the old queue's entries; the broker's queue may be a new one already
            self.stats["stale_entries"] += len(entries)
            return
        read = self.envelopes.read_batch(
            [entry.data for entry in entries if entry.kind is EntryKind.NORMAL and entry.data],
            self.group_incarnations.get(group, 0))
        envelopes = read.envelopes
        if self.mirror is not None:  # nothing after the seal of a Raft or mirror log
            envelopes = mirror_conversion.cut(self, group, key, envelopes)
        if read.stale:  # written into the group by an earlier declaration of the queue
            self.stats["stale_entries"] += read.stale
        if read.undecodable:
            log.error("cluster: group %s: %d undecodable entries in %d..%d skipped", group, read.undecodable,
                      entries[0].index, entries[-1].index)
        timing = None if self.raft is None else self.raft.timing  # RAFTMQ_RAFT_TIMING only (timing.py)
        for envelope in envelopes:
            if envelope.origin == self.name:
                pending = self.tracker.applied(envelope.proposal_id)
                if pending is not None and timing is not None:
                    timing.record("proposal_to_apply", wall_ms() - pending.first_ms)
        tracked_as = queue_key(*key)
        if self.tracker.has_barriers(tracked_as):
            self._release(tracked_as)
        if not envelopes:
            return
        self.stats["applied"] += len(envelopes)
        try:
            effects = self.broker.apply_committed(key[0], key[1], envelopes)
        except Exception:
            log.exception("cluster: group %s: applying entries %d..%d failed; one by one", group,
                          entries[0].index, entries[-1].index)
            effects = []
            for envelope in envelopes:  # the replica skips the proposal ids it applied already
                try:
                    effects.extend(self.broker.apply_committed(key[0], key[1], (envelope,)))
                except Exception:
                    log.exception("cluster: group %s: an entry failed", group)
        self.dispatch(effects)

    def _on_leader_change(self, group: GroupId, leader: NodeId | None) -> None:
        key = self.group_queues.get(group)
        if key is None:
            return
        log.info("cluster: queue %s: leader %s (group %s)", queue_key(*key), leader, group)
        membership = self.raft.membership_of(group) if leader == self.name and self.raft is not None else None
        alone = membership is not None and membership.voters == frozenset({self.name})
        self.dispatch(self.broker.set_queue_leader(key[0], key[1], leader == self.name, alone))
        if leader is not None:
            self.tracker.leader_changed(queue_key(*key))  # its resend interval starts again at RETRY_MS
            self._send_group(group, wall_ms())  # a new leader: what the old one may have dropped, now

    def _on_mirror_leader_change(self, group: GroupId, leader: NodeId | None) -> None:
        key = self.group_queues.get(group)
        if key is not None:
            self.broker.keep_transient(*key)  # (the replicas hold them: a failover keeps them)
        self._on_leader_change(group, leader)

    def _submit_mirror(self, command: Any) -> None:
        """A mirrored queue's controller command (ISR change, replica down/up) into the metadata group."""
        if self._metadata_tasks is None:
            self._mirror_backlog.append(command)
        elif mirror_trace.tracing():
            self._metadata_tasks.start_soon(mirror_trace.apply_traced, self.apply_definition, command)
        else:
            self._metadata_tasks.start_soon(self.apply_definition, command)


def bootstrap_records(config: NodeConfig) -> list[Any]:
    """The configured users (and their vhosts and permissions) as broker records, for the metadata group."""
    records: list[Any] = [br.VHostRecord(config.default_vhost)]
    for user in config.all_users():
        records.append(br.VHostRecord(user.vhost))
        records.append(br.UserRecord(user.name, hash_password(user.password, os.urandom(4)), tuple(user.tags)))
        records.append(br.PermissionRecord(user.name, user.vhost, user.configure, user.write, user.read))
    return records
