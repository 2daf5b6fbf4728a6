"""The Ready loop's ordering rules on real runtimes (issue 7: entries are applied while their cycle's fsync runs):
an append acknowledgement or a vote never leaves before the entries and hard state it vouches for are fsynced,
and an entry is applied only once committed, exactly once and in order, on every node."""

from __future__ import annotations

import pathlib
import threading

import pytest
import trio

from cluster.raft.core.multiraft import MultiRaftConfig, NodeBatch
from cluster.raft.core.raft import RaftConfig
from cluster.raft.core.types import (
    AppendResp,
    Entry,
    GroupId,
    Index,
    Membership,
    NodeId,
    Ready,
    Vote,
    VoteResp,
)
from cluster.raft.runtime import node as node_module
from cluster.raft.runtime.node import RaftNodeRuntime
from cluster.raft.runtime.storage import RaftStorage
from tests.raft.test_runtime_cluster import _free_ports

NODES = [NodeId("n1"), NodeId("n2"), NodeId("n3")]
GROUP = GroupId("g0")
CONFIG = MultiRaftConfig(raft=RaftConfig(election_ticks=20, quiesce=True), node_heartbeat_ticks=2,
                         node_timeout_ticks=10)
PROPOSALS = 400


class DurabilityLedger:
    """What each node wrote and what its fsyncs made durable (last entry index and term/vote per group)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.written: dict[tuple[int, GroupId], tuple[Index, int, NodeId | None]] = {}
        self.durable: dict[tuple[int, GroupId], tuple[Index, int, NodeId | None]] = {}


LEDGER = DurabilityLedger()


class RecordingStorage(RaftStorage):
    """RaftStorage that records, per node and group, what each fsync made durable."""

    def write_ready(self, group: GroupId, ready: Ready, volatile: bool = False) -> bool:
        key = (id(self), group)
        index, term, vote = LEDGER.written.get(key, (Index(0), 0, None))
        if ready.snapshot is not None:
            index = ready.snapshot.index
        if ready.entries:
            index = ready.entries[-1].index  # a conflicting tail is replaced: the new end is the end
        if ready.hard_state is not None:
            term, vote = ready.hard_state.term, ready.hard_state.vote
        LEDGER.written[key] = (index, term, vote)
        return super().write_ready(group, ready, volatile)

    def commit(self) -> None:
        with LEDGER.lock:
            written = {key: value for key, value in LEDGER.written.items() if key[0] == id(self)}
        super().commit()
        with LEDGER.lock:
            LEDGER.durable.update(written)


@pytest.fixture(autouse=True)
def recording_storage(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node_module, "RaftStorage", RecordingStorage)
    LEDGER.written.clear()
    LEDGER.durable.clear()


@pytest.mark.parametrize("behind_fsync_max", [64, 0])
async def test_acks_and_votes_follow_their_fsync_and_only_committed_entries_apply(
        tmp_path: pathlib.Path, behind_fsync_max: int) -> None:
    ports = dict(zip(NODES, _free_ports(3), strict=True))
    applied: dict[NodeId, list[Entry]] = {node: [] for node in NODES}
    violations: list[str] = []
    runtimes: dict[NodeId, RaftNodeRuntime] = {}

    def check_sent(node: NodeId, batch: NodeBatch) -> None:
        with LEDGER.lock:
            index, term, vote = LEDGER.durable.get((id(runtimes[node].storage), GROUP), (Index(0), 0, None))
        for _, message in batch.messages:
            if isinstance(message, AppendResp) and not message.reject and message.index > index:
                violations.append(f"{node} acked {message.index} with only {index} durable")
            if isinstance(message, VoteResp) and not message.reject and (term, vote) != (message.term, message.dst):
                violations.append(f"{node} granted a vote in term {message.term} before it was durable")
            if isinstance(message, Vote) and (term, vote) != (message.term, node):
                violations.append(f"{node} asked for votes in term {message.term} before voting for itself durably")

    for node in NODES:
        peers = {peer: ("127.0.0.1", port) for peer, port in ports.items() if peer != node}

        def on_apply_many(group: GroupId, entries: tuple[Entry, ...], node: NodeId = node) -> None:
            log = runtimes[node].multi.groups[group].log  # type: ignore[union-attr]
            for entry in entries:
                if entry.index > log.committed:
                    violations.append(f"{node} applied {entry.index} beyond commit {log.committed}")
            applied[node].extend(entries)

        runtime = RaftNodeRuntime(node, tmp_path / node, ("127.0.0.1", ports[node]), peers, b"s",
                                  lambda group, entry: None, CONFIG, tick_ms=10, on_apply_many=on_apply_many,
                                  readies_behind_fsync_max=behind_fsync_max)
        send = runtime.transport.send

        def checked_send(batch: NodeBatch, node: NodeId = node, send: object = send) -> None:
            check_sent(node, batch)
            send(batch)  # type: ignore[operator]

        runtime.transport.send = checked_send  # type: ignore[method-assign]
        runtime.add_group(GROUP, Membership(frozenset(NODES)))
        runtimes[node] = runtime

    expected = {f"m{i}".encode() for i in range(PROPOSALS)}
    async with trio.open_nursery() as nursery:
        for runtime in runtimes.values():
            await nursery.start(runtime.run)
        with trio.fail_after(120):
            sent = 0
            while not all({e.data for e in applied[node]} >= expected for node in NODES):
                if sent < PROPOSALS:  # from every node, in bursts, so cycles overlap with fsyncs
                    for runtime in runtimes.values():
                        for _ in range(20):
                            if sent < PROPOSALS:
                                runtime.propose(GROUP, f"m{sent}".encode())
                                sent += 1
                elif all(runtime.leader_of(GROUP) is not None for runtime in runtimes.values()):
                    leader = runtimes[runtimes[NODES[0]].leader_of(GROUP)]  # type: ignore[index]
                    have = {e.data for e in applied[leader.node_id]}
                    for data in sorted(expected - have)[:50]:  # lost before a leader was known: again
                        leader.propose(GROUP, data)
                    await trio.sleep(0.2)
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert not violations, violations[:5]
    histories = {node: [(e.index, e.term, e.data) for e in applied[node]] for node in NODES}
    for node in NODES:
        indexes = [index for index, _, _ in histories[node]]
        assert indexes == list(range(indexes[0], indexes[0] + len(indexes))), "applied once each, in order"
    shortest = min(len(history) for history in histories.values())
    assert histories[NODES[0]][:shortest] == histories[NODES[1]][:shortest] == histories[NODES[2]][:shortest]
