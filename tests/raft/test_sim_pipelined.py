"""The simulator driving the cores as the runtime does since issue 7's latency work (docs/raft.md, "Pipelined Ready
cycles"): a node keeps ticking, stepping and proposing while its fsync is pending, takes further Readies before
the earlier ones are durable (up to `outstanding_max`), sends what may leave early at once, applies each Ready's
committed entries as soon as it has it (before its fsync), and sends the rest and `advance`s every Ready, in
order, only after the fsync.

Every checker of chaos/sim runs, plus one for the rule that makes early applying safe: an entry is applied only
when a majority of the voters hold it durably (a synced record, or a synced snapshot covering it). A driver that
breaks the rule (it advances a Ready before its fsync, so a leader counts itself too early and acks leave before
their entries are durable) must be caught.

The subclass overrides the simulator's per-node driving (`_tick`, `_drive`, `_crash`); the rest of chaos/sim (fault
profile, network, disk, checkers, liveness) is used as it is.
"""

from __future__ import annotations

import pytest

from chaos.sim.sim_types import SimConfig, SimNode
from chaos.sim.simulator import DRIVE_ROUNDS_MAX, Simulation
from cluster.raft.core.image import GroupImage
from cluster.raft.core.multiraft import NodeReady
from cluster.raft.core.types import AppendResp, Entry, GroupId, Index, NodeId, Ready, Term
from tests.sim.test_sweep import FIGURE8_PROFILE

SEEDS = range(0, 60)


class PipelinedSimulation(Simulation):
    def __init__(self, config: SimConfig, outstanding_max: int, advance_before_sync: bool = False) -> None:
        self.outstanding_max = outstanding_max
        self.advance_before_sync = advance_before_sync  # the deliberately broken driver
        self.flight: dict[NodeId, tuple[list[NodeReady], int]] = {}  # Readies taken, not yet durable; sync tick
        self._durable_cache: dict[tuple[NodeId, GroupId], tuple[tuple[int, int], set[tuple[Index, Term]], Index]]
        self._durable_cache = {}
        super().__init__(config)

    # --- driving ---------------------------------------------------------------------------------------------
    def _take_turn(self, node: SimNode, tick: int) -> bool:
        """Every tick, fsync or not (proposals go in at once too: node.pending stays None); a flight whose fsync is
        due completes first."""
        flight = self.flight.get(node.id)
        if flight is not None and tick >= flight[1]:
            self._complete_flight(node)
        return True

    def _drive(self, node: SimNode) -> None:
        for _ in range(DRIVE_ROUNDS_MAX):
            mr = node.mr
            if mr is None or not mr.has_ready():
                return
            readies, due = self.flight.get(node.id, ([], -1))
            if len(readies) >= self.outstanding_max:
                return
            node_ready = mr.ready()
            for group, ready in node_ready.groups:
                node.disk.write_ready(group, ready)
                self.checkers[group].on_persist(node.id, mr.groups[group], ready)
            node_ready = self._send_early(node, node_ready)
            for group, ready in node_ready.groups:
                self._check_majority_durable(node, group, ready)
                self._apply(node, group, ready)  # before the fsync, as the runtime does
            if self.advance_before_sync:
                mr.advance(node_ready)
            readies.append(node_ready)
            if due < 0:
                synced = node.disk.unsynced_count() == 0
                due = self.now + (0 if synced else self.rng.randint(0, self.profile.sync_delay_ticks_max))
            self.flight[node.id] = (readies, due)
            if due <= self.now:
                self._complete_flight(node)

    def _complete_flight(self, node: SimNode) -> None:
        assert node.mr is not None
        readies, _ = self.flight.pop(node.id)
        node.disk.sync()
        for node_ready in readies:  # in the order they were taken
            for batch in node_ready.batches:
                self.net.send(self.now, batch)
                for group, message in batch.messages:
                    if isinstance(message, AppendResp):
                        self.checkers[group].on_send(node.id, message.term, message)
            if not self.advance_before_sync:
                node.mr.advance(node_ready)
        self._maybe_compact(node)
        node.disk.maybe_consolidate(self.memberships)
        self._check(node)

    def _crash(self, node: SimNode) -> None:
        self.flight.pop(node.id, None)
        super()._crash(node)

    # --- the extra checker -----------------------------------------------------------------------------------
    def _durable(self, node: SimNode, group: GroupId) -> tuple[set[tuple[Index, Term]], Index]:
        """(index, term) of the entries `node` holds durably for `group`, and its durable snapshot index."""
        disk = node.disk
        key = (id(disk.records), disk.synced)
        cached = self._durable_cache.get((node.id, group))
        if cached is not None and cached[0] == key:
            return cached[1], cached[2]
        image = GroupImage.empty(self.memberships[group])
        for record in disk.records[: disk.synced]:
            if record.group == group:
                image.apply(record)
        state = image.persisted_state()
        held = {(entry.index, entry.term) for entry in state.entries}
        self._durable_cache[(node.id, group)] = (key, held, state.snapshot.index)
        return held, state.snapshot.index

    def _check_majority_durable(self, node: SimNode, group: GroupId, ready: Ready) -> None:
        if self.config.membership or not ready.committed_entries:
            return  # with a membership nemesis the voter set moves; the checkers above still run
        voters = list(self.nodes.values())
        needed = len(voters) // 2 + 1
        entry: Entry = ready.committed_entries[-1]  # log matching: holding the last one means holding the rest
        holders = 0
        for voter in voters:
            held, snapshot_index = self._durable(voter, group)
            if (entry.index, entry.term) in held or snapshot_index >= entry.index:
                holders += 1
        if holders < needed:
            self.checkers[group].fail(
                "apply-before-durable", f"{node.id} applies {entry.index} held durably by {holders} of {len(voters)}")


def run_pipelined(seed: int, outstanding_max: int, **options: object) -> tuple[bool, str | None]:
    broken = bool(options.pop("advance_before_sync", False))
    sim = PipelinedSimulation(SimConfig(seed=seed, **options), outstanding_max, broken)  # type: ignore[arg-type]
    result = sim.run()
    return result.ok, result.violation


@pytest.mark.parametrize("outstanding_max", [1, 4])
def test_pipelined_ready_cycles_pass_every_checker(outstanding_max: int) -> None:
    failures = [(seed, violation) for seed in SEEDS
                for ok, violation in [run_pipelined(seed, outstanding_max)] if not ok]
    assert not failures, failures


def test_pipelined_multigroup_and_figure8_profiles_pass() -> None:
    failures = [(seed, violation) for seed in range(1000, 1006)
                for ok, violation in [run_pipelined(seed, 4, groups=4)] if not ok]
    failures += [(seed, violation) for seed in range(2000, 2030)
                 for ok, violation in [run_pipelined(seed, 4, profile_overrides=FIGURE8_PROFILE)] if not ok]
    assert not failures, failures


def test_pipelined_with_membership_changes_passes() -> None:
    failures = [(seed, violation) for seed in range(5000, 5015)
                for ok, violation in [run_pipelined(seed, 4, membership=True)] if not ok]
    assert not failures, failures


def test_advancing_before_the_fsync_is_caught() -> None:
    caught = [violation for seed in range(0, 40)
              for ok, violation in [run_pipelined(seed, 4, advance_before_sync=True)] if not ok]
    assert caught, "a driver that advances Readies before their fsync must break a checker"
    assert any("apply-before-durable" in (violation or "") for violation in caught), caught[:3]
