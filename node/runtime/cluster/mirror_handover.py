"""ha-promote-on-shutdown: an orderly shutdown of a cluster node moves its mirrored queues' leadership first.

What it is for: RabbitMQ's `ha-promote-on-shutdown` decides whether a stopping master hands its queue to a mirror
(`when-synced`: only a synchronised one; `always`: any). Here `hand_over_mirrors` runs after the AMQP listeners
closed and before the cluster runtime stops (node/runtime/main.py): `MirrorGroups.shutdown_transfers` picks, for each
queue led here, the live ISR member furthest along (with `always`, the live replica furthest along when no ISR
member is live) and each `TransferMirror` is committed in the metadata group, all at once, bounded by
`HANDOVER_TIMEOUT_S`. A queue left without a move is elected as after a crash (docs/mirrored_queues.md).
"""

from __future__ import annotations

import logging
from typing import Any, Final

import trio

from node.clustering.definitions import mirror_spec_in

log = logging.getLogger("raftmq.cluster")

HANDOVER_TIMEOUT_S: Final = 2.0  # an orderly shutdown waits this long at most for the leadership moves


async def hand_over_mirrors(cluster: Any) -> None:
    """Commit the leadership moves of the mirrored queues `cluster` (a ClusterRuntime) leads; bounded."""
    if cluster.mirror is None or cluster.store is None:
        return
    state = cluster.store.state

    def promote(vhost: str, name: str) -> str:
        spec = mirror_spec_in(state, vhost, name)
        return spec.promote_on_shutdown if spec is not None else "when-synced"

    moves = cluster.mirror.shutdown_transfers(promote)
    with trio.move_on_after(HANDOVER_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            for move in moves:
                log.info("cluster: mirrored queue %s/%s: shutting down: leadership to %s%s", move.vhost, move.name,
                         move.to, " (out of sync: ha-promote-on-shutdown always)" if move.unclean else "")
                nursery.start_soon(cluster.apply_definition, move)
