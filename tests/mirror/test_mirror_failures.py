"""A mirrored queue's failover steps in `MirrorGroups` (node/runtime/cluster/mirror_failures.py, mirror_groups.py),
in one process: a node refusing connections is reported down for the queues it leads, once per epoch, and leaves
the ISR of the queues led here at once; and a
follower that learnt the new epoch before its new leader did is answered once the leader learns it (two nodes on
loopback with their real fetch transports; the follower's own resend is switched off, so only that answer can end
its truncation)."""

from __future__ import annotations

import pathlib

import pytest
import trio

from cluster.metadata.mirror import AlterMirrorIsr, MirrorRecord, MirrorReplicaDown
from cluster.raft.core.types import Entry, GroupId, NodeId
from node.runtime.cluster import mirror_groups
from node.runtime.cluster.mirror_groups import MirrorGroups
from tests.metadata.helpers import free_addresses, wait_until

GROUP = GroupId("q/%2F/ha.x/i1")
ABC = ("a", "b", "c")


def _nothing(*_args: object) -> None:
    return None


def _leader_change(_group: GroupId, _leader: NodeId | None) -> None:
    return None


def test_a_refusing_leader_is_reported_once_per_epoch_and_a_follower_not_at_all(tmp_path: pathlib.Path) -> None:
    submitted: list[object] = []
    peers = {"a": ("127.0.0.1", 1), "c": ("127.0.0.1", 2)}
    groups = MirrorGroups("b", tmp_path, peers, b"secret", _nothing, _leader_change, submitted.append)
    groups.add_group(GROUP, "/", "ha.x", ABC, "leader-epoch", MirrorRecord("/", "ha.x", ABC, "a", 3, ABC))
    groups.peer_refused("c")  # a follower: the leader's lag check (or the liveness) takes it out of the ISR
    assert submitted == []
    groups.peer_refused("a")
    groups.peer_refused("a")  # the transport reports every refused redial
    assert submitted == [MirrorReplicaDown("/", "ha.x", "a", 3, ("b", "c"))]
    groups.on_record(GROUP, MirrorRecord("/", "ha.x", ABC, "c", 4, ("b", "c")))
    groups.peer_refused("c")
    assert submitted[1:] == [MirrorReplicaDown("/", "ha.x", "c", 4, ("a", "b"))]


def test_a_leader_drops_a_refusing_follower_from_its_isr_at_once(tmp_path: pathlib.Path) -> None:
    submitted: list[object] = []
    peers = {"b": ("127.0.0.1", 1), "c": ("127.0.0.1", 2)}
    groups = MirrorGroups("a", tmp_path, peers, b"secret", _nothing, _leader_change, submitted.append)
    groups.add_group(GROUP, "/", "ha.x", ABC, "leader-epoch", MirrorRecord("/", "ha.x", ABC, "a", 3, ABC))
    groups.peer_refused("c")
    assert groups.groups[GROUP].replica.isr == {"a", "b"}
    assert submitted == [AlterMirrorIsr("/", "ha.x", "a", 3, ("a", "b"))]  # (not reported down: it leads nothing)


async def test_a_request_in_an_epoch_the_leader_has_not_learnt_yet_is_answered_when_it_does(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mirror_groups, "FETCH_TIMEOUT_MS", 10**9)  # no resend: only the kept request can be answered
    ports = [int(address.rpartition(":")[2]) for address in free_addresses(2)]
    names = ("a", "b")
    applied: dict[str, list[Entry]] = {name: [] for name in names}
    nodes = {name: MirrorGroups(name, tmp_path / name, {n: ("127.0.0.1", p) for n, p in zip(names, ports, strict=True)
                                                        if n != name}, b"secret",
                                lambda _g, entries, name=name: applied[name].extend(entries), _leader_change,
                                _nothing, telemetry=False)
             for name in names}
    async with trio.open_nursery() as nursery:
        for node, port in zip(nodes.values(), ports, strict=True):
            await nursery.start(node.run, "127.0.0.1", port)
        first = MirrorRecord("/", "ha.x", names, "a", 0, names)
        for node in nodes.values():
            node.add_group(GROUP, "/", "ha.x", names, "leader-epoch", first)
        assert nodes["a"].propose(GROUP, b"m0")
        await wait_until(lambda: len(applied["b"]) == 1, timeout_s=10, what="m0 replicated")
        second = MirrorRecord("/", "ha.x", names, "b", 1, names)
        nodes["a"].on_record(GROUP, second)  # a follows b in epoch 1 and asks it where epoch 0 ends ...
        await wait_until(lambda: bool(nodes["b"].groups[GROUP].early), timeout_s=10, what="b to get the question")
        nodes["b"].on_record(GROUP, second)  # ... before b knows it leads: b answers now
        follower = nodes["a"].groups[GROUP].replica
        await wait_until(lambda: follower.role == "follower" and not follower.truncating, timeout_s=10,
                         what="a's truncation to end")
        assert nodes["b"].propose(GROUP, b"m1")
        await wait_until(lambda: len(applied["a"]) == 2, timeout_s=10, what="m1 committed on a")
        nursery.cancel_scope.cancel()
