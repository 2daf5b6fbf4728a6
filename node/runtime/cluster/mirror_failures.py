"""A cluster node's mirrored queues when another node fails or this one stops (a mixin of `MirrorGroups`).

What it is for: the metadata group elects a mirrored queue's new leader from the ISR when it is told the leader's
node is gone (`MirrorReplicaDown`, cluster/metadata/mirror.py); this is who tells it, and when. Two signals, the
same the Raft queues fail over on (docs/cluster.md "Liveness"):
- `peer_refused`: the Raft transport saw a node refuse a connection after its link to it was lost, i.e. the
  node's process is gone (a paused, slow or partitioned node refuses nothing). Each queue that node leads is
  reported down at once, once per leader epoch, by every node that sees it (the metadata group takes the first
  report; a later one names an older epoch and changes nothing); and the queues led here drop it from their ISR
  at once instead of after the 3 s lag limit, so their HW (and confirms) no longer wait for it.
- `node_down`: the node liveness (node/runtime/cluster/liveness.py) declared the node down (two refusals 200 ms
  apart, or `node_down_after_ms` without a connection): reported for each queue it leads or is in the ISR of.
And `shutdown_transfers`: an orderly shutdown's leadership moves (node/runtime/cluster/mirror_handover.py).

How it works: `MirrorGroups` (mirror_groups.py) holds the groups, the committed records and `submit`, which
commits a command in the metadata group; the reports name the replicas this node counts live.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from cluster.metadata.mirror import MirrorRecord, MirrorReplicaDown, TransferMirror
from cluster.raft.core.types import GroupId

if TYPE_CHECKING:
    from cluster.mirror_queues.core.types import Effect
    from node.runtime.cluster.mirror_groups import _Group

log = logging.getLogger(__name__.rpartition(".")[0] + ".mirror_groups")


class MirrorFailures:
    """Failure reports and shutdown moves of `MirrorGroups`, which sets these attributes."""

    name: str
    live: frozenset[str]
    groups: dict[GroupId, _Group]
    submit: Callable[[Any], None]

    if TYPE_CHECKING:
        def _run(self, g: _Group, effects: list[Effect]) -> None: ...

    @staticmethod
    def clock_ms() -> int:
        return time.time_ns() // 1_000_000  # (mirror_groups.wall_ms, the clock the replicas run on)

    def node_down(self, node: str, live: Iterable[str]) -> None:
        """The liveness declared `node` down: report it for each queue it leads or is in the ISR of."""
        self.live = frozenset(live) | {self.name}
        for g in self.groups.values():
            record = g.record
            if record is None or node not in record.replicas or (node != record.leader and node not in record.isr):
                continue
            self._report_down(g, record, node, "node down")

    def peer_refused(self, node: str) -> None:
        """The Raft transport saw `node` refuse a connection after its link was lost: its process is gone (the
        evidence the Raft queues fail over on; a paused, slow or partitioned node refuses nothing and waits for the
        liveness's `node_down`). Report it down at once for each queue it leads, once per epoch; and take it out
        of the ISR of each queue led here now, as the lag check would after `replica_lag_max_ms` (the leader may
        always shrink its ISR: the HW then waits for the others only; it rejoins once it has caught up)."""
        for g in self.groups.values():
            r = g.replica
            if r.role == "leader" and node != self.name and node in r.isr:
                log.info("cluster: mirrored queue %s/%s: follower %s refuses connections: out of the ISR", g.vhost,
                         g.name, node)
                now = self.clock_ms()
                r.last_caught_up[node] = now - r.settings.replica_lag_max_ms - 1  # (the core's lag rule does it)
                self._run(g, r.tick(now))
        led = [g for g in self.groups.values() if g.record is not None and g.record.leader == node
               and g.refused_reported != g.record.epoch]
        if led:
            log.info("cluster: mirrored queues: node %s refuses connections: reporting it down as the leader of %d "
                     "queue(s)", node, len(led))
        for g in led:
            assert g.record is not None
            g.refused_reported = g.record.epoch
            self._report_down(g, g.record, node, "refuses connections")

    def _report_down(self, g: _Group, record: MirrorRecord, node: str, why: str) -> None:
        log.info("cluster: mirrored queue %s/%s: reporting %s down (epoch %d, %s)", g.vhost, g.name, node,
                 record.epoch, why)
        self.submit(MirrorReplicaDown(g.vhost, g.name, node, record.epoch,
                                      tuple(sorted(n for n in self.live if n != node))))

    def node_up(self, node: str) -> None:
        self.live = self.live | {node}

    def shutdown_transfers(self, promote_on_shutdown: Callable[[str, str], str]) -> list[TransferMirror]:
        """An orderly shutdown: for each queue led here, the move of its leadership to the live ISR member furthest
        along; with `ha-promote-on-shutdown: always` (`promote_on_shutdown(vhost, name)`) to the live replica
        furthest along when no ISR member is live. None for a queue nobody may take (it is then unavailable until
        this node is back, or a synced replica's election)."""
        moves: list[TransferMirror] = []
        for g in self.groups.values():
            record, r = g.record, g.replica
            if record is None or r.role != "leader" or record.leader != self.name:
                continue
            live = [n for n in record.replicas if n != self.name and n in self.live]
            furthest = sorted(live, key=lambda n: -r.follower_leo.get(n, -1))
            synced = [n for n in furthest if n in record.isr]
            if synced:
                moves.append(TransferMirror(g.vhost, g.name, synced[0], tuple(sorted(self.live))))
            elif furthest and promote_on_shutdown(g.vhost, g.name) == "always":
                moves.append(TransferMirror(g.vhost, g.name, furthest[0], tuple(sorted(self.live)), unclean=True))
        return moves
