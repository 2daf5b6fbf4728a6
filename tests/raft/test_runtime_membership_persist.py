"""A group's membership comes from its own durable state once it exists, not from whoever re-declares it.

Storage level: a new group's initial membership (voters and learners) is stored; on reopen it wins over a different
declared one (with a WARNING), as do a compacted snapshot's membership and committed membership changes; a stream
written before membership records existed pins the first membership declared for it. Runtime level: a node of a
three-voter group restarted alone and told the group has only itself as voter does not elect itself (the split
brain this guards against), and rejoins its peers afterwards.
"""

from __future__ import annotations

import logging
import pathlib
from collections.abc import Callable

import cbor2
import pytest
import trio

from cluster.raft.core.raft import RaftConfig, RaftCore
from cluster.raft.core.types import ConfChange, ConfOp, Entry, GroupId, Membership, NodeId, Role
from cluster.raft.runtime.node import RaftNodeRuntime
from cluster.raft.runtime.storage import RaftStorage, committed_membership, stream_name
from tests.raft.test_runtime_cluster import CONFIG, NODES, _free_ports

G = GroupId("%2F/orders")
N1, N2, N3 = NODES
TRIO = Membership(frozenset(NODES))
SOLO = Membership(frozenset({N1}))
WITH_LEARNER = Membership(frozenset({N1, N2}), frozenset({N3}))
WAIT_S = 60


def _first_rng(low: int, high: int) -> int:
    return low


def _cycle(core: RaftCore, storage: RaftStorage) -> None:
    ready = core.ready()
    storage.write_ready(G, ready)
    storage.commit()
    core.advance(ready)


def _create(tmp_path: pathlib.Path, membership: Membership) -> None:
    storage = RaftStorage.open(tmp_path)
    assert storage.load(G, membership) is None
    storage.commit()
    storage.close()


def _reopen(tmp_path: pathlib.Path, declared: Membership) -> Membership:
    storage = RaftStorage.open(tmp_path)
    state = storage.load(G, declared)
    storage.close()
    assert state is not None
    return committed_membership(state)


def test_a_new_groups_membership_is_stored_and_wins_on_reopen(tmp_path: pathlib.Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    _create(tmp_path, TRIO)
    with caplog.at_level(logging.WARNING):
        assert _reopen(tmp_path, SOLO) == TRIO
    assert any("differs from its stored membership" in message for message in caplog.messages)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert _reopen(tmp_path, TRIO) == TRIO
    assert not caplog.messages


def test_learners_are_stored_too(tmp_path: pathlib.Path) -> None:
    _create(tmp_path, WITH_LEARNER)
    assert _reopen(tmp_path, SOLO) == WITH_LEARNER
    assert _reopen(tmp_path, TRIO) == WITH_LEARNER


def test_a_restarted_core_gets_the_stored_membership_not_the_declared_one(tmp_path: pathlib.Path) -> None:
    storage = RaftStorage.open(tmp_path)
    assert storage.load(G, TRIO) is None
    core = RaftCore(N1, RaftConfig(), _first_rng, TRIO)
    core.campaign()  # a candidate of three: its term and vote are written
    _cycle(core, storage)
    storage.close()

    reopened = RaftStorage.open(tmp_path)
    state = reopened.load(G, SOLO)
    assert state is not None and state.hard_state.term == core.term
    restarted = RaftCore(N1, RaftConfig(), _first_rng, persisted=state)
    assert restarted.membership == TRIO
    restarted.campaign()
    assert restarted.role is not Role.LEADER  # it needs a second vote: no leader of one
    reopened.close()


def test_committed_membership_changes_replay_on_the_stored_base(tmp_path: pathlib.Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    storage = RaftStorage.open(tmp_path)
    assert storage.load(G, SOLO) is None
    core = RaftCore(N1, RaftConfig(), _first_rng, SOLO)
    core.campaign()
    _cycle(core, storage)
    _cycle(core, storage)
    assert core.propose_conf_change(ConfChange(ConfOp.ADD_LEARNER, N2)) is not None
    _cycle(core, storage)
    _cycle(core, storage)
    storage.close()
    grown = Membership(frozenset({N1}), frozenset({N2}))
    assert core.membership == grown

    with caplog.at_level(logging.WARNING):
        assert _reopen(tmp_path, grown) == grown  # declared as it now is: no warning
    assert not caplog.messages
    assert _reopen(tmp_path, TRIO) == grown


def test_a_compacted_snapshots_membership_wins(tmp_path: pathlib.Path) -> None:
    storage = RaftStorage.open(tmp_path)
    assert storage.load(G, WITH_LEARNER) is None
    leader_of_one = RaftCore(N1, RaftConfig(), _first_rng, SOLO)  # a leader of one, to have committed entries
    leader_of_one.campaign()
    for i in range(5):
        leader_of_one.propose(f"m{i}".encode())
        _cycle(leader_of_one, storage)
        _cycle(leader_of_one, storage)
    storage.compact(G, leader_of_one.compact(b"image"))
    storage.close()
    assert _reopen(tmp_path, TRIO) == SOLO  # the snapshot's membership (what the core had), not the declared one


def test_a_stream_without_a_membership_record_pins_the_first_declared(tmp_path: pathlib.Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    storage = RaftStorage.open(tmp_path)
    storage.log.append(stream_name(G), cbor2.dumps(["f", None, [1, None, 0], 1, 1, 1, b""]))  # an older stream
    storage.commit()
    storage.close()
    with caplog.at_level(logging.WARNING):
        assert _reopen(tmp_path, TRIO) == TRIO
    assert any("no membership record" in message for message in caplog.messages)
    storage = RaftStorage.open(tmp_path)
    state = storage.load(G, SOLO)
    assert state is not None and state.hard_state.term == 1 and len(state.entries) == 1
    assert committed_membership(state) == TRIO
    storage.close()


def test_a_new_groups_membership_is_queued_for_the_next_commit(tmp_path: pathlib.Path) -> None:
    storage = RaftStorage.open(tmp_path)
    assert storage.load(G, TRIO) is None
    assert storage.bytes_queued > 0
    storage.commit()
    assert storage.bytes_queued == 0
    storage.close()


# --- runtime ----------------------------------------------------------------------------------------------------


def _runtime(tmp_path: pathlib.Path, node: NodeId, ports: dict[NodeId, int], applied: list[bytes],
             membership: Membership,
             on_leader_change: Callable[[GroupId, NodeId | None], None] | None = None) -> RaftNodeRuntime:
    peers = {peer: ("127.0.0.1", port) for peer, port in ports.items() if peer != node}

    def on_apply(group: GroupId, entry: Entry) -> None:
        if entry.data:
            applied.append(entry.data)

    runtime = RaftNodeRuntime(node, tmp_path / node, ("127.0.0.1", ports[node]), peers, b"s3cret", on_apply,
                              CONFIG, tick_ms=10, telemetry=False,
                              on_leader_change=on_leader_change)
    runtime.add_group(G, membership)
    return runtime


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await trio.sleep(0.01)


async def test_a_node_restarted_alone_with_a_single_voter_membership_does_not_elect_itself(
        tmp_path: pathlib.Path) -> None:
    ports = dict(zip(NODES, _free_ports(3), strict=True))
    applied: dict[NodeId, list[bytes]] = {node: [] for node in NODES}
    with trio.fail_after(WAIT_S):
        async with trio.open_nursery() as nursery:
            runtimes = {node: _runtime(tmp_path, node, ports, applied[node], TRIO) for node in NODES}
            for runtime in runtimes.values():
                await nursery.start(runtime.run)
            await _until(lambda: any(runtime.is_leader(G) for runtime in runtimes.values()))
            for i in range(3):
                assert runtimes[N1].propose(G, f"before-{i}".encode())
            await _until(lambda: all(len(applied[node]) == 3 for node in NODES))
            nursery.cancel_scope.cancel()

        leaders: list[NodeId | None] = []
        async with trio.open_nursery() as nursery:
            alone = _runtime(tmp_path, N1, ports, [], SOLO,  # the wrong layout: itself as the only voter
                             lambda group, leader: leaders.append(leader))
            await nursery.start(alone.run)
            ticks_max = 20 * CONFIG.raft.election_ticks  # many election timeouts
            await _until(lambda: alone._ticks >= ticks_max)
            assert alone.group_status(G)["role"] != Role.LEADER.value and N1 not in leaders
            assert alone.membership_of(G) == TRIO
            nursery.cancel_scope.cancel()

        async with trio.open_nursery() as nursery:  # with its peers back it rejoins the one history
            restarted = {node: _runtime(tmp_path, node, ports, applied[node], SOLO if node == N1 else TRIO)
                         for node in NODES}
            for runtime in restarted.values():
                await nursery.start(runtime.run)
            await _until(lambda: any(runtime.is_leader(G) for runtime in restarted.values()))
            while not all(b"after" in applied[node] for node in NODES):  # best-effort forwarding: retry
                assert restarted[N2].propose(G, b"after")
                with trio.move_on_after(0.5):
                    await _until(lambda: all(b"after" in applied[node] for node in NODES))
            nursery.cancel_scope.cancel()
    assert all(applied[node][:3] == [b"before-0", b"before-1", b"before-2"] for node in NODES)
