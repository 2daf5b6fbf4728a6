"""A mirrored queue becoming classic again, the pure and in-process parts: the group id's generation, the metadata
command (`ConvertToClassic`, cluster/metadata/mirror_convert.py) through the codec, and a Raft group that starts from
a seed (`Bootstrap.seed`, cluster/raft/runtime/node.py): the sealing node leads term 1 holding the queue's state, a
node with its own seed follows from it, a node without one gets it by InstallSnapshot, and a restart keeps it.
The real-cluster test is in test_mirror_cluster.py (`test_a_mirrored_queue_becomes_classic_when_its_policy_goes`)."""

from __future__ import annotations

import pathlib
from types import SimpleNamespace

import pytest
import trio

from cluster.metadata import model
from cluster.metadata.mirror import AlterMirrorIsr, DeclareMirror, TransferMirror
from cluster.metadata.mirror_convert import ConvertToClassic, ConvertToMirror
from cluster.metadata.model import DeclareQueue, MetadataState, PutVhost, QueueRecord
from cluster.queue.group_ids import parse_queue_group_id, queue_group_id
from cluster.raft.core.raft import BOOTSTRAP_TERM, RaftConfig, RaftCore, bootstrap_state
from cluster.raft.core.types import (
    Append,
    Entry,
    GroupId,
    InstallSnapshot,
    NodeId,
    PersistedState,
    Ready,
    Role,
    Snapshot,
)
from cluster.raft.runtime.group_hosting import SEED_INDEX, Bootstrap
from cluster.raft.runtime.node import RaftNodeRuntime
from node.clustering.incarnations import group_of_record
from node.runtime.cluster import mirror_back
from tests.metadata.test_mirror_controller import _apply
from tests.raft.test_core import N1, N2, N3, THREE, first
from tests.raft.test_runtime_cluster import _free_ports

ABC = ("a", "b", "c")
G = GroupId("g")


def test_the_generation_is_part_of_the_group_id_and_parses_back() -> None:
    assert queue_group_id("/", "q", 9, 0) == queue_group_id("/", "q", 9) == "q/%2F/q/i9"
    assert queue_group_id("/", "q", 9, 2) == "q/%2F/q/i9/g2"
    assert queue_group_id("/", "q", 0, 1) == "q/%2F/q/g1"
    assert parse_queue_group_id("q/%2F/q/i9/g2") == ("/", "q", 9)
    assert parse_queue_group_id("q/%2F/q/g1") == ("/", "q", 0)
    for bad in ("q/%2F/q/i9/g0", "q/%2F/q/gx", "q/%2F/q/g1/i9"):
        with pytest.raises(ValueError):
            parse_queue_group_id(bad)
    queue = QueueRecord("/", "q", incarnation=9, generation=3)
    assert group_of_record(queue) == "q/%2F/q/i9/g3"


def _mirrored(s: MetadataState) -> MetadataState:
    for command in (PutVhost("/"), DeclareQueue(QueueRecord("/", "q", leader="a", members=("a",), incarnation=9)),
                    ConvertToMirror("/", "q", 9, "a", ABC)):
        s, outcome = _apply(s, command)
        assert outcome.ok, outcome.refused
    return s


def test_convert_back_makes_the_queue_classic_on_the_sealing_node_and_deletes_the_record() -> None:
    s = _mirrored(MetadataState())
    s, outcome = _apply(s, ConvertToClassic("/", "q", 9, 0, 0, "a"))
    assert outcome.ok and {(c.kind, c.action) for c in outcome.changes} == {("queue", "updated"), ("mirror", "deleted")}
    queue = s.queues[("/", "q")]
    assert (queue.type, queue.members, queue.leader, queue.initial_leader, queue.incarnation, queue.generation) == (
        "classic", ("a",), "a", "a", 9, 1)
    assert ("/", "q") not in s.mirrors
    assert group_of_record(queue) == "q/%2F/q/i9/g1"  # a new Raft group
    again, outcome = _apply(s, ConvertToClassic("/", "q", 9, 0, 0, "a"))  # a repeat: nothing changes
    assert outcome.ok and not outcome.changes and again == s
    # and the round trip: mirrored again (the group id keeps the generation), then classic again as generation 2
    s, outcome = _apply(s, ConvertToMirror("/", "q", 9, "a", ABC))
    assert outcome.ok and s.queues[("/", "q")].generation == 1
    s, outcome = _apply(s, ConvertToClassic("/", "q", 9, 1, 0, "a"))
    assert outcome.ok and s.queues[("/", "q")].generation == 2
    restored = model.restore(model.snapshot(s))  # the field survives the metadata snapshot
    assert restored.queues[("/", "q")].generation == 2


def test_convert_back_is_refused_when_the_record_changed_or_the_queue_is_not_the_sealed_one() -> None:
    s = _mirrored(MetadataState())
    moved, outcome = _apply(s, AlterMirrorIsr("/", "q", "a", 0, ABC))
    moved, outcome = _apply(moved, TransferMirror("/", "q", "b", ABC))  # epoch 1, b leads
    assert outcome.ok and moved.mirrors[("/", "q")].leader == "b", outcome.refused
    for state, command, why in (
            (moved, ConvertToClassic("/", "q", 9, 0, 0, "a"), "changed since the seal"),
            (moved, ConvertToClassic("/", "q", 9, 0, 1, "a"), "changed since the seal"),
            (s, ConvertToClassic("/", "q", 8, 0, 0, "a"), "not the sealed one"),
            (s, ConvertToClassic("/", "q", 9, 1, 0, "a"), "not the sealed one"),
            (s, ConvertToClassic("/", "nope", 9, 0, 0, "a"), "no queue")):
        _, outcome = _apply(state, command)
        assert why in outcome.refused, (command, outcome.refused)
    _, outcome = _apply(moved, ConvertToClassic("/", "q", 9, 0, 1, "b"))  # the current leader may
    assert outcome.ok, outcome.refused
    classic, _ = model.apply(MetadataState(), PutVhost("/"))
    classic, _ = model.apply(classic, DeclareQueue(QueueRecord("/", "c", leader="a", members=("a",), incarnation=4)))
    _, outcome = _apply(classic, ConvertToClassic("/", "c", 4, 0, 0, "a"))
    assert "only a mirrored queue" in outcome.refused
    declared, _ = model.apply(MetadataState(), PutVhost("/"))  # a queue declared mirrored (no conversion first)
    for command in (DeclareQueue(QueueRecord("/", "m", type="mirrored", leader="a", members=ABC, incarnation=5)),
                    DeclareMirror("/", "m", ABC)):
        declared, outcome = model.apply(declared, command)
        assert outcome.ok, outcome.refused
    declared, outcome = _apply(declared, ConvertToClassic("/", "m", 5, 0, 0, "a"))
    assert outcome.ok and declared.queues[("/", "m")].members == ("a",)


def _seeded(node: NodeId, leader: NodeId = N1, data: bytes = b"state") -> RaftCore:
    initial = bootstrap_state(THREE, leader)
    return RaftCore(node, RaftConfig(), first, persisted=PersistedState(
        initial.hard_state, Snapshot(SEED_INDEX, BOOTSTRAP_TERM, THREE, data), ()))


def _drain(raft: RaftCore) -> Ready:
    ready = raft.ready()
    raft.advance(ready)
    return ready


def test_the_way_back_looks_at_its_groups_only_when_what_it_depends_on_changed() -> None:
    """mirror_back's poll scans the mirror groups when the metadata, the state the groups follow (a replica's role
    and epoch change only there) or the count of seals applied here changed, and every FULL_SCAN_MS; else not."""
    rt = SimpleNamespace(store=SimpleNamespace(state=MetadataState()), mirrored=MetadataState(), stats={})
    progress = mirror_back.Progress()
    assert mirror_back._changed(rt, progress, 1_000)  # the first poll
    assert not mirror_back._changed(rt, progress, 1_250)
    rt.store.state = MetadataState()  # a metadata change
    assert mirror_back._changed(rt, progress, 1_500) and not mirror_back._changed(rt, progress, 1_750)
    rt.mirrored = MetadataState()  # the groups followed it (`_sync_groups`)
    assert mirror_back._changed(rt, progress, 2_000) and not mirror_back._changed(rt, progress, 2_250)
    rt.stats["seals_applied"] = 1  # a seal applied here (`mirror_conversion.cut`)
    assert mirror_back._changed(rt, progress, 2_500) and not mirror_back._changed(rt, progress, 2_750)
    assert mirror_back._changed(rt, progress, 2_500 + mirror_back.FULL_SCAN_MS)  # and now and then anyway


def test_a_seeded_leader_leads_term_1_and_an_empty_follower_gets_the_seed_as_a_snapshot() -> None:
    nodes = {N1: _seeded(N1), N2: _seeded(N2), N3: RaftCore(N3, RaftConfig(), first,
                                                            persisted=bootstrap_state(THREE, N1))}
    assert nodes[N1].start_bootstrapped(lead=True)
    assert (nodes[N1].role, nodes[N1].term) == (Role.LEADER, BOOTSTRAP_TERM)
    assert not nodes[N2].start_bootstrapped(lead=False) and nodes[N2].lead == N1
    assert not nodes[N3].start_bootstrapped(lead=False) and nodes[N3].lead == N1
    assert nodes[N1].propose(b"after the seed") == 3  # the seed is index 1, the leader's no-op 2
    snapshots: list[InstallSnapshot] = []
    for _ in range(8):
        for raft in nodes.values():
            for message in _drain(raft).messages:
                if isinstance(message, InstallSnapshot):
                    snapshots.append(message)
                nodes[message.dst].step(message)
    assert [(m.dst, m.snapshot.data) for m in snapshots] == [(N3, b"state")]  # only the node without a seed
    assert all(raft.log.committed == 3 and raft.term == 1 for raft in nodes.values())
    assert nodes[N3].log.snapshot.index == SEED_INDEX


def test_a_core_with_entries_after_its_seed_does_not_lead_term_1() -> None:
    raft = _seeded(N1)
    raft.step(Append(N2, N1, BOOTSTRAP_TERM, SEED_INDEX, BOOTSTRAP_TERM, (Entry(BOOTSTRAP_TERM, 2, b""),), 1))
    assert not raft.start_bootstrapped(lead=True) and raft.role is Role.FOLLOWER


class _Host:
    def __init__(self) -> None:
        self.restored: list[bytes] = []

    def snapshot(self, group: GroupId) -> bytes:
        return b"later"

    def restore(self, group: GroupId, data: bytes) -> None:
        self.restored.append(data)


async def test_runtimes_start_a_group_from_the_seed_and_a_restart_keeps_it(tmp_path: pathlib.Path) -> None:
    """Three runtimes: N1 (the sealing node, leads), N2 (its own seed), N3 (none: InstallSnapshot). A proposal
    after the seed is applied everywhere; each host restored the seed once; a restarted N1 restores it from disk."""
    ports = dict(zip((N1, N2, N3), _free_ports(3), strict=True))
    applied: dict[NodeId, list[bytes]] = {node: [] for node in ports}
    hosts = {node: _Host() for node in ports}

    def runtime(node: NodeId) -> RaftNodeRuntime:
        peers = {peer: ("127.0.0.1", port) for peer, port in ports.items() if peer != node}

        def on_apply(group: GroupId, entry: Entry) -> None:
            if entry.data:
                applied[node].append(entry.data)

        return RaftNodeRuntime(node, tmp_path / node, ("127.0.0.1", ports[node]), peers, b"s3cret", on_apply,
                               telemetry=False, snapshots=hosts[node])

    runtimes = {node: runtime(node) for node in ports}
    seeds = {N1: Bootstrap(N1, lead=True, seed=b"seed"), N2: Bootstrap(N1, seed=b"seed"), N3: Bootstrap(N1)}
    async with trio.open_nursery() as nursery:
        for node, rt in runtimes.items():
            await nursery.start(rt.run)
            rt.add_group(G, THREE, seeds[node])
        runtimes[N2].propose(G, b"after")
        with trio.fail_after(30):
            while not all(entries == [b"after"] for entries in applied.values()):
                await trio.sleep(0.01)
        assert runtimes[N1].leader_of(G) == N1
        nursery.cancel_scope.cancel()
    assert [hosts[node].restored for node in ports] == [[b"seed"]] * 3
    again = _Host()
    hosts[N1] = again
    restarted = runtime(N1)
    restarted.add_group(G, THREE, Bootstrap(N1, lead=True, seed=b"other"))  # a stream exists: the seed is ignored
    async with trio.open_nursery() as nursery:
        await nursery.start(restarted.run)
        with trio.fail_after(10):
            while not again.restored:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert again.restored == [b"seed"]
