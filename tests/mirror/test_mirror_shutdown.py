"""`MirrorGroups.shutdown_transfers` (ha-promote-on-shutdown) in one process, without the network: which replica an
orderly shutdown hands each queue led here to. The real SIGTERM is in test_mirror_cluster.py."""

from __future__ import annotations

import pathlib
from collections.abc import Callable

from cluster.metadata.mirror import MirrorRecord, TransferMirror
from cluster.raft.core.types import GroupId, NodeId
from node.runtime.cluster.mirror_groups import MirrorGroups

GROUP = GroupId("q/%2F/ha.x/i1")
ABC = ("a", "b", "c")


def _leading(tmp_path: pathlib.Path, isr: tuple[str, ...]) -> MirrorGroups:
    def nothing(*_args: object) -> None:
        return None

    def leader_change(_group: GroupId, _leader: NodeId | None) -> None:
        return None

    peers = {"b": ("127.0.0.1", 1), "c": ("127.0.0.1", 2)}
    groups = MirrorGroups("a", tmp_path, peers, b"secret", nothing, leader_change, nothing)
    groups.add_group(GROUP, "/", "ha.x", ABC, "leader-epoch", MirrorRecord("/", "ha.x", ABC, "a", 3, isr))
    groups.groups[GROUP].replica.follower_leo.update({"b": 5, "c": 9})
    return groups


def _promote(mode: str) -> Callable[[str, str], str]:
    return lambda _vhost, _name: mode


def test_the_synced_replica_furthest_along_takes_over(tmp_path: pathlib.Path) -> None:
    groups = _leading(tmp_path, ABC)
    assert groups.shutdown_transfers(_promote("when-synced")) == [TransferMirror("/", "ha.x", "c", ABC)]
    groups.node_down("c", ("a", "b"))
    assert groups.shutdown_transfers(_promote("when-synced")) == [TransferMirror("/", "ha.x", "b", ("a", "b"))]


def test_an_out_of_sync_replica_only_with_always(tmp_path: pathlib.Path) -> None:
    groups = _leading(tmp_path, ("a",))
    assert groups.shutdown_transfers(_promote("when-synced")) == []
    assert groups.shutdown_transfers(_promote("always")) == [TransferMirror("/", "ha.x", "c", ABC, unclean=True)]


def test_a_follower_hands_nothing_over(tmp_path: pathlib.Path) -> None:
    groups = _leading(tmp_path, ABC)
    groups.on_record(GROUP, MirrorRecord("/", "ha.x", ABC, "b", 4, ABC))
    assert groups.shutdown_transfers(_promote("always")) == []
