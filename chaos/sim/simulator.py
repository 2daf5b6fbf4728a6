"""The deterministic simulator: real MultiRaft cores, a simulated clock, network and disk, one seed.

One `random.Random(seed)` owns every choice: the run's fault profile (loss, duplication, delay spread, crash and
partition rates, message size, compaction interval, fsync latency), every fault and proposal, and the cores'
randomised election timeouts (the cores receive its `randrange`). Each tick: maybe inject a fault, maybe propose,
deliver due batches to inboxes, then for every live node finish a pending fsync (sync, send, apply, advance) or
tick it, step its inbox and start its next Ready (persist, then wait 0..N ticks for the fsync). The checkers
(checkers.py) run after every step. After `chaos_ticks` everything heals (partitions removed, crashed nodes
restarted, a clean network) and every group must commit and apply a fresh proposal on every node within
`liveness_ticks_max`. A failing seed replays exactly: `python -m chaos.sim --seed N --trace`.

With `refusals` (opt-in, so older seeds keep their meaning) the simulator also plays the transport's refusal
detection: when a node crashes, every live node is told `peer_refused` 0..2 ticks later (each on its own delay), so
the groups it led elect at once (`RaftCore.leader_refused`); and, as a fault proxy that closes its listener would,
a partition sometimes makes the nodes of one side see the other side as refusing although it is alive.
"""

from __future__ import annotations

import random
from dataclasses import replace

from chaos.sim.checkers import AppliedState, GroupChecker, SafetyViolation
from chaos.sim.disk import SimDisk
from chaos.sim.network import NetworkFaults, SimNetwork
from chaos.sim.sim_types import FaultProfile, SimConfig, SimNode, SimResult
from chaos.sim.trace import describe_batch
from cluster.raft.core.multiraft import MultiRaft, MultiRaftConfig, NodeBatch, NodeReady, split_early
from cluster.raft.core.raft import RaftConfig, RaftCore, bootstrap_state
from cluster.raft.core.types import (
    AppendResp,
    ConfChange,
    ConfOp,
    Entry,
    GroupId,
    Index,
    Membership,
    NodeId,
    Ready,
    Role,
)

INBOX_MAX = 1_000
PROPOSALS_QUEUED_MAX = 100
LIVENESS_TICKS_PER_BACKLOG_ENTRY = 10  # one entry per append, one append in flight, 15 % loss: ~8 ticks each
DRIVE_ROUNDS_MAX = 8


class Simulation:
    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        profile = FaultProfile.draw(self.rng, config.nodes)
        if config.membership:  # drawn after the rest, so a seed's other faults do not depend on this option
            profile = replace(profile, membership_rate=self.rng.choice([0.01, 0.03, 0.08]))
        self.profile = replace(profile, **dict(config.profile_overrides))
        loss, dup, delay_max = self.profile.network
        self.net = SimNetwork(self.rng, NetworkFaults(loss, dup, 1, delay_max))
        raft = RaftConfig(
            election_ticks=10,
            heartbeat_ticks=2,
            quiesce=config.quiesce,
            pre_vote=self.profile.pre_vote,
            check_quorum=self.profile.check_quorum,
            msg_size_bytes_max=self.profile.msg_size_bytes_max,
            inflight_msgs_max=self.profile.inflight_msgs_max,
            uncommitted_entries_max=200,
            # a rank's head start must outlast a hop (1..delay_max ticks here, far shorter than a tick in the runtime)
            refused_campaign_ticks=2 * delay_max + 1,
        )
        self.mr_config = MultiRaftConfig(raft=raft, node_heartbeat_ticks=2, node_timeout_ticks=12)
        node_ids = [NodeId(f"n{i}") for i in range(1, self.profile.node_count + 1)]
        self.group_ids = [GroupId(f"g{i}") for i in range(config.groups)]
        voters = Membership(frozenset(node_ids))
        self.memberships = dict.fromkeys(self.group_ids, voters)
        self.nodes = {node: SimNode(node, SimDisk(node)) for node in node_ids}
        self.checkers = {group: GroupChecker(group) for group in self.group_ids}
        self.now = 0
        self.trace: list[str] = []
        self.stats = {"crashes": 0, "restarts": 0, "partitions": 0, "proposals": 0, "transfers": 0,
                      "conf_changes": 0}
        if config.refusals:
            self.stats.update(refusals=0, false_refusals=0, refused_campaigns=0)
        self._refusals_due: list[tuple[int, NodeId, NodeId, bool]] = []  # (tick, told, refusing peer, crashed)
        self._proposal_seq = 0
        self._marker_index: dict[GroupId, Index] = {}
        self._leader_terms_seen: dict[GroupId, int] = {}
        self.bootstrap_leaders: dict[GroupId, NodeId] = {}
        bootstrap_start = "up"
        if config.bootstrap:  # drawn after everything else, so the other options' seeds keep their meaning
            self.bootstrap_leaders = {group: self.rng.choice(node_ids) for group in self.group_ids}
            bootstrap_start = config.bootstrap_start or self.rng.choice(["up", "up", "down", "isolated"])
            self._log(f"bootstrap leaders {self.bootstrap_leaders} start {bootstrap_start}")
        for node in self.nodes.values():
            self._start(node, fresh=True)
        if self.bootstrap_leaders and bootstrap_start != "up":
            first = self.nodes[self.bootstrap_leaders[self.group_ids[0]]]
            if bootstrap_start == "down":
                self._crash(first)
            else:
                self.net.partition([{first.id}, {other for other in self.nodes if other != first.id}])
                self.stats["partitions"] += 1
                self._log(f"partition isolate-bootstrap-leader {first.id}")

    # --- the run -------------------------------------------------------------------------------------------
    def run(self) -> SimResult:
        violation: str | None = None
        try:
            for tick in range(self.config.chaos_ticks):
                self._tick(tick, chaos=True)
            self._heal()
            violation = self._run_liveness()
        except SafetyViolation as error:
            violation = str(error)
            self._log(f"VIOLATION {violation}")
        except AssertionError as error:  # a core's own invariant (e.g. never truncate a committed entry)
            violation = f"assertion: {error}"
            self._log(f"VIOLATION {violation}")
        except (KeyError, IndexError, ValueError, TypeError) as error:  # a core crashed: a bug, report the seed
            violation = f"crash: {type(error).__name__}: {error}"
            self._log(f"VIOLATION {violation}")
        stats = dict(self.stats)
        stats["messages_sent"] = self.net.sent
        stats["messages_dropped"] = self.net.dropped
        stats["fsyncs"] = sum(node.disk.fsyncs for node in self.nodes.values())
        stats["leaders"] = sum(len(checker.leaders) for checker in self.checkers.values())
        stats["committed"] = sum(len(checker.committed) for checker in self.checkers.values())
        return SimResult(self.config.seed, violation is None, violation, self.now, stats, self.trace,
                         repr(self.profile))

    def _backlog_entries(self) -> int:
        """Entries some node holds beyond what some other node has applied: work the liveness bound allows for."""
        last = max((core.log.last_index() for node in self.nodes.values() if node.mr is not None
                    for core in node.mr.groups.values()), default=0)
        applied = min((state.index for node in self.nodes.values() for state in node.applied.values()), default=0)
        return max(0, last - applied)

    def _run_liveness(self) -> str | None:
        start = self.config.chaos_ticks
        ticks_max = self.config.liveness_ticks_max + LIVENESS_TICKS_PER_BACKLOG_ENTRY * self._backlog_entries()
        for tick in range(start, start + ticks_max):
            if (tick - start) % 20 == 0:
                self._propose_markers()
            self._tick(tick, chaos=False)
            if self._converged():
                self._log("converged")
                return None
        return f"liveness: no progress within {ticks_max} ticks after healing"

    def _converged(self) -> bool:
        for group in self.group_ids:
            marker = self._marker_index.get(group)
            members = self._members(group)
            if marker is None or members is None:
                return False
            for node in members:
                if self.nodes[node].applied[group].index < marker:
                    return False
        return True

    def _members(self, group: GroupId) -> frozenset[NodeId] | None:
        """The nodes that must apply the marker: every node, or with membership changes, the members in the view
        of the newest leader (removed nodes are not replicated to); None while there is no leader to ask."""
        if not self.config.membership:
            return frozenset(self.nodes)
        leaders = self._leaders(group, include_busy=True)
        if not leaders:
            return None
        return max(leaders, key=lambda item: item[1].term)[1].membership.members

    def _tick(self, tick: int, chaos: bool) -> None:
        self.now = tick
        if chaos:
            self._maybe_fault()
            self._maybe_propose()
        if self._refusals_due:
            self._deliver_refusals(tick)
        for batch in self.net.due(tick):
            node = self.nodes[batch.dst]
            if node.mr is not None and len(node.inbox) < INBOX_MAX:
                node.inbox.append(batch)
                if self.config.trace:
                    self._log(f"deliver {describe_batch(batch)}")
        for node in self.nodes.values():
            if node.mr is None or not self._take_turn(node, tick):
                continue
            node.mr.tick()
            self._check(node)
            while node.inbox:
                node.mr.step(node.inbox.popleft())
                self._check(node)
            self._propose_queued(node)
            self._drive(node)
        for group in self.group_ids:
            cores = {node.id: node.mr.groups[group] for node in self.nodes.values() if node.mr is not None}
            self.checkers[group].check_electable(cores)
        if chaos and self.profile.new_leader_isolate_rate:
            self._isolate_new_leaders()

    def _take_turn(self, node: SimNode, tick: int) -> bool:
        """Whether `node` runs this tick: not while its fsync is pending; once it is due, it completes first."""
        if node.pending is not None:
            if tick < node.pending[1]:
                return False
            self._complete(node)
        return True

    def _isolate_new_leaders(self) -> None:
        for group in self.group_ids:
            for node, core in self._leaders(group):
                if core.term > self._leader_terms_seen.get(group, 0):
                    self._leader_terms_seen[group] = core.term
                    if self.rng.random() < self.profile.new_leader_isolate_rate:
                        self.net.partition([{node.id}, {other for other in self.nodes if other != node.id}])
                        self.stats["partitions"] += 1
                        self._log(f"partition isolate-new-leader {node.id} term {core.term}")

    # --- a node's Ready cycle ------------------------------------------------------------------------------
    def _drive(self, node: SimNode) -> None:
        for _ in range(DRIVE_ROUNDS_MAX):
            mr = node.mr
            if mr is None or node.pending is not None or not mr.has_ready():
                return
            node_ready = mr.ready()
            for group, ready in node_ready.groups:
                node.disk.write_ready(group, ready)
                self.checkers[group].on_persist(node.id, mr.groups[group], ready)
            nothing_to_sync = node.disk.unsynced_count() == 0
            delay = 0 if nothing_to_sync else self.rng.randint(0, self.profile.sync_delay_ticks_max)
            node_ready = self._send_early(node, node_ready)
            node.pending = (node_ready, self.now + delay)
            if delay:
                return
            self._complete(node)

    def _send_early(self, node: SimNode, node_ready: NodeReady) -> NodeReady:
        """As the runtime does: what may leave before the fsync leaves now; the rest waits for `_complete`."""
        waiting: list[NodeBatch] = []
        for batch in node_ready.batches:
            early, late = split_early(batch)
            if early is not None:
                self.net.send(self.now, early)
            if late is not None:
                waiting.append(late)
        return NodeReady(node_ready.groups, tuple(waiting))

    def _complete(self, node: SimNode) -> None:
        assert node.pending is not None and node.mr is not None
        node_ready, _ = node.pending
        node.pending = None
        node.disk.sync()
        for batch in node_ready.batches:
            self.net.send(self.now, batch)
            for group, message in batch.messages:
                if isinstance(message, AppendResp):
                    self.checkers[group].on_send(node.id, message.term, message)
        for group, ready in node_ready.groups:
            self._apply(node, group, ready)
        node.mr.advance(node_ready)
        self._maybe_compact(node)
        node.disk.maybe_consolidate(self.memberships)
        self._check(node)

    def _apply(self, node: SimNode, group: GroupId, ready: Ready) -> None:
        checker = self.checkers[group]
        state = node.applied[group]
        if ready.snapshot is not None:
            state = self._restore_applied(node, group, ready.snapshot.data)
            assert state.index == ready.snapshot.index
            checker.on_restore(node.id, state)
        for entry in ready.committed_entries:
            state = checker.on_apply(node.id, state, entry)
            if entry.data == self._marker(group):
                self._marker_index.setdefault(group, entry.index)
            else:
                self._on_applied(node, group, entry)
        node.applied[group] = state
        self._after_apply(node, group, state)

    # --- what the groups replicate (a subclass puts a real state machine here: chaos/sim/queue_sim.py) -------
    def _restore_applied(self, node: SimNode, group: GroupId, data: bytes) -> AppliedState:
        """The applied state a snapshot's data restores (the data `_snapshot_data` wrote)."""
        return AppliedState.decode(data)

    def _snapshot_data(self, node: SimNode, group: GroupId) -> bytes:
        return node.applied[group].encode()

    def _on_applied(self, node: SimNode, group: GroupId, entry: Entry) -> None:
        """One committed entry applied by `node` (markers excluded)."""

    def _after_apply(self, node: SimNode, group: GroupId, state: AppliedState) -> None:
        """`node` applied a Ready's committed entries of `group`, up to `state.index`."""

    def _maybe_compact(self, node: SimNode) -> None:
        every = self.profile.compact_every
        if not every or node.mr is None:
            return
        for group, core in node.mr.groups.items():
            if core.log.applied - core.log.snapshot.index >= every:
                assert node.applied[group].index == core.log.applied
                snapshot = core.compact(self._snapshot_data(node, group))
                node.disk.write_compaction(group, snapshot)

    def _check(self, node: SimNode) -> None:
        assert node.mr is not None
        for group, core in node.mr.groups.items():
            self.checkers[group].check_core(node.id, core)

    # --- lifecycle -----------------------------------------------------------------------------------------
    def _start(self, node: SimNode, fresh: bool) -> None:
        node.mr = MultiRaft(node.id, self.mr_config, self.rng.randrange, node.incarnation)
        states = node.disk.load(self.memberships)
        for group in self.group_ids:
            persisted = None if fresh else states[group]
            membership = self.memberships[group] if fresh else None
            leader = self.bootstrap_leaders.get(group)
            # As the runtime: a group with nothing on disk (new, or its unsynced bootstrap record lost in a crash)
            # starts from the bootstrap state again, but only the first start of the named leader may lead term 1
            # (the broken host of the tests leads again after every restart).
            again = self.config.bootstrap_again_on_restart and leader == node.id
            create = leader is not None and (fresh or again or not node.disk.holds(group))
            if leader is not None and create:
                persisted = bootstrap_state(self.memberships[group], leader)
                membership = None
                node.disk.write_bootstrap(group, persisted.hard_state)  # synced with the first Ready
            node.mr.add_group(group, membership, persisted, self.config.broken)
            if leader is not None and create:
                led = node.mr.start_bootstrapped(group, lead=node.id == leader and (fresh or again))
                self._log(f"bootstrap {node.id} {group} leader {leader}{' (leads term 1)' if led else ''}")
            node.applied[group] = self._restore_applied(node, group, states[group].snapshot.data)
            self.checkers[group].on_restore(node.id, node.applied[group])
            self.checkers[group].forget_node_progress(node.id)

    def _crash(self, node: SimNode) -> None:
        outcome = node.disk.crash(self.rng)
        node.mr = None
        node.pending = None
        node.inbox.clear()
        node.proposals.clear()
        node.applied = {}
        self.stats["crashes"] += 1
        self._log(f"crash {node.id} {outcome}")
        if self.config.refusals:
            self._report_refusing({node.id}, [other for other in sorted(self.nodes) if other != node.id])

    def _report_refusing(self, refusing: set[NodeId], told: list[NodeId]) -> None:
        """Tell each of `told`, 0..2 ticks from now, that the nodes `refusing` refuse its connections."""
        for peer in sorted(refusing):
            crashed = self.nodes[peer].mr is None
            for other in told:
                self._refusals_due.append((self.now + self.rng.randint(0, 2), other, peer, crashed))

    def _deliver_refusals(self, tick: int) -> None:
        """As a transport would see them: a crashed node's refusal comes after everything it sent on that link (a
        refusal follows the link's loss, which follows its last data), and not at all once it has restarted."""
        due = [item for item in self._refusals_due if item[0] <= tick]
        self._refusals_due = [item for item in self._refusals_due if item[0] > tick]
        for _, told, peer, crashed in due:
            node = self.nodes[told]
            if node.mr is None or (crashed and self.nodes[peer].mr is not None):
                continue
            if crashed and self.net.in_flight_on(peer, told):
                self._refusals_due.append((tick + 1, told, peer, crashed))
                continue
            woken = node.mr.peer_refused(peer)
            self.stats["refusals"] += 1
            self.stats["refused_campaigns"] += len(woken)
            self._log(f"refused {told} sees {peer} refusing: {len(woken)} groups campaign soon")

    def _restart(self, node: SimNode) -> None:
        node.incarnation += 1
        self._start(node, fresh=False)
        self.stats["restarts"] += 1
        self._log(f"restart {node.id} incarnation={node.incarnation}")

    def _heal(self) -> None:
        self.net.heal()
        self.net.faults = NetworkFaults(0.0, 0.0, 1, 3)
        for node in self.nodes.values():
            if node.mr is None:
                self._restart(node)
        self._log("heal: partitions removed, crashed nodes restarted, clean network")

    # --- faults and load -----------------------------------------------------------------------------------
    def _maybe_fault(self) -> None:
        rng, profile = self.rng, self.profile
        live = [node for node in self.nodes.values() if node.mr is not None]
        down = [node for node in self.nodes.values() if node.mr is None]
        if live and rng.random() < profile.crash_rate:
            self._crash(rng.choice(live))
        if down and rng.random() < 0.05:
            self._restart(rng.choice(down))
        if rng.random() < profile.partition_rate:
            self._partition()
        if (self.net.blocked or self.net.clogged) and rng.random() < 0.04:
            self.net.heal()
            self._log("net heal")
        if rng.random() < profile.partition_rate / 2:
            ids = sorted(self.nodes)
            link = (rng.choice(ids), rng.choice(ids))
            if link[0] != link[1]:
                self.net.clogged[link] = rng.randint(5, 30)
                self._log(f"clog {link[0]}->{link[1]} +{self.net.clogged[link]} ticks")
        if rng.random() < profile.transfer_rate:
            self._transfer()
        if rng.random() < profile.leader_fault_rate:
            self._fault_a_leader()
        if profile.membership_rate and rng.random() < profile.membership_rate:
            self._change_membership()
        if self.config.refusals and rng.random() < 0.02:  # a spurious refusal: one node told a live peer is gone
            told, peer = rng.sample(sorted(self.nodes), 2)
            self.stats["false_refusals"] += 1
            self._log(f"spurious refusal: {told} will see {peer} refusing")
            self._report_refusing({peer}, [told])

    def _change_membership(self) -> None:
        """A random single-server change through a current leader: add a learner, promote one, or remove a member
        (the core refuses a promotion before the learner caught up, a second pending change, or removing the last
        voter; a refused change is simply logged)."""
        group = self.rng.choice(self.group_ids)
        leaders = self._leaders(group)
        if not leaders:
            return
        node, core = self.rng.choice(leaders)
        members = core.membership
        kinds = [  # an operation first (each as likely), then a node: otherwise removals would dominate
            [ConfChange(ConfOp.ADD_LEARNER, other) for other in sorted(self.nodes) if other not in members.members],
            [ConfChange(ConfOp.PROMOTE, learner) for learner in sorted(members.learners)],
            [ConfChange(ConfOp.REMOVE, member) for member in sorted(members.members)],
        ]
        change = self.rng.choice(self.rng.choice([kind for kind in kinds if kind]))
        assert node.mr is not None
        index = node.mr.propose_conf_change(group, change)
        if index is not None:
            self.stats["conf_changes"] += 1
            key = f"conf_{change.op.value.replace('-', '_')}"
            self.stats[key] = self.stats.get(key, 0) + 1
        self._log(f"conf-change {group} {node.id} {change.op.value} {change.node} -> {index}")
        self._drive(node)

    def _fault_a_leader(self) -> None:
        leaders = self._leaders(self.rng.choice(self.group_ids))
        if not leaders:
            return
        node, _ = self.rng.choice(leaders)
        if self.rng.random() < 0.5:
            self._crash(node)
        else:
            others = {other for other in self.nodes if other != node.id}
            self.net.partition([{node.id}, others])
            self.stats["partitions"] += 1
            self._log(f"partition isolate-leader {node.id}")
            if self.config.refusals and self.rng.random() < 0.5:  # behind a fault proxy: it looks gone
                self.stats["false_refusals"] += 1
                self._report_refusing({node.id}, sorted(others))

    def _partition(self) -> None:
        ids = sorted(self.nodes)
        shuffled = ids[:]
        self.rng.shuffle(shuffled)
        shape = self.rng.choice(["halves", "isolate", "one-way", "bridge"])
        if shape == "halves":
            cut = self.rng.randint(1, len(ids) - 1)
            sides = [set(shuffled[:cut]), set(shuffled[cut:])]
            self.net.partition(sides)
        elif shape == "isolate":
            sides = [{shuffled[0]}, set(shuffled[1:])]
            self.net.partition(sides)
        elif shape == "one-way":
            self.net.block_one_way(shuffled[0], shuffled[1])
            sides = [{shuffled[0]}, {shuffled[1]}]
        else:  # a bridge node sees both halves, the halves do not see each other
            rest = shuffled[1:]
            cut = max(1, len(rest) // 2)
            sides = [set(rest[:cut]), set(rest[cut:])]
            self.net.partition(sides)
        self.stats["partitions"] += 1
        self._log(f"partition {shape} {' | '.join(','.join(sorted(side)) for side in sides)}")
        if self.config.refusals and self.rng.random() < 0.3:  # a fault proxy closing its listener: false refusals
            near, far = sides[0], sides[1]
            self.stats["false_refusals"] += 1
            self._report_refusing(far, sorted(near))

    def _leaders(self, group: GroupId, include_busy: bool = False) -> list[tuple[SimNode, RaftCore]]:
        """Nodes that believe they lead `group` (several, when some are stale); busy = waiting on an fsync."""
        found = []
        for node in self.nodes.values():
            if node.mr is not None and (include_busy or node.pending is None):
                core = node.mr.groups[group]
                if core.role is Role.LEADER:
                    found.append((node, core))
        return found

    def _maybe_propose(self) -> None:
        if self.rng.random() >= self.profile.propose_rate:
            return
        group = self.rng.choice(self.group_ids)
        for node, _ in self._leaders(group, include_busy=True):
            for _ in range(self.rng.randint(1, 3)):
                self._proposal_seq += 1
                if len(node.proposals) < PROPOSALS_QUEUED_MAX:
                    node.proposals.append((group, f"{group}/{self._proposal_seq}".encode()))
            if node.pending is None:
                self._propose_queued(node)
                self._drive(node)

    def _propose_queued(self, node: SimNode) -> None:
        """Hand queued client commands to the cores (only between a Ready's advance and the next ready())."""
        assert node.mr is not None and node.pending is None
        while node.proposals:
            group, data = node.proposals.popleft()
            index = node.mr.propose(group, data)
            self.stats["proposals"] += 1
            if self.config.trace:
                self._log(f"propose {node.id} {group} {data.decode()} -> {index}")

    def _propose_markers(self) -> None:
        for group in self.group_ids:
            if group in self._marker_index:
                continue
            for node, _ in self._leaders(group, include_busy=True):
                node.proposals.append((group, self._marker(group)))
                self._log(f"propose-marker {node.id} {group}")
                if node.pending is None:
                    self._propose_queued(node)
                    self._drive(node)

    def _marker(self, group: GroupId) -> bytes:
        return f"{group}/final".encode()

    def _transfer(self) -> None:
        group = self.rng.choice(self.group_ids)
        for node, core in self._leaders(group):
            target = self.rng.choice(sorted(core.membership.voters))
            assert node.mr is not None
            if node.mr.transfer_leadership(group, target):
                self.stats["transfers"] += 1
                self._log(f"transfer {group} {node.id} -> {target}")
                self._drive(node)

    def _log(self, line: str) -> None:
        if self.config.trace:
            self.trace.append(f"{self.now:05d} {line}")


def run_seed(config: SimConfig) -> SimResult:
    return Simulation(config).run()
