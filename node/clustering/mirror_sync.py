"""`ha-sync-mode: manual` for mirrored queues in a cluster: when a new mirror is held out, and when it is released.

What it is for: RabbitMQ's default sync mode leaves a mirror added to a queue that holds messages unsynchronised
until an operator's `sync_queue` or until every message older than the mirror has been consumed; an
unsynchronised mirror adds no redundancy (it does not count for confirms) and `ha-promote-on-failure: when-synced`
never promotes it. Here every node holds the whole mirror log and the queue machine, so a new mirror always has
every message by fetching: "synchronising" costs nothing to do, only to allow. The metadata's `MirrorRecord`
keeps the held-out replicas with their join point (cluster/metadata/mirror.py); this module decides the join
point and the release (pure).

How it works:
- The join point is a message id: the queue machine's next id when the mirror was added (ids only grow, so
  "every message enqueued before the join is gone" is "the oldest message still ready or unacked has an id at or
  above it"). `hold_from` gives it to the command that adds mirrors (`AlterMirrorReplicas` from the policy plan,
  `ConvertToMirror` from the conversion), from the proposing node's copy of the queue; 0, i.e. not held out, under
  `automatic` or when the queue holds no message (nothing below the join: synchronised at once).
- `sync_plan`, run by the node leading each mirrored queue (node/runtime/cluster/mirror_syncing.py): `SyncMirror`
  for the held-out replicas whose join point the queue's oldest message has reached (or all of them once the
  policy says `automatic`), and for as many as the ISR lacks to reach `ha-min-insync` (otherwise the queue would
  take no command at all, acks included, so its backlog could never drain: RabbitMQ's manual mode never stops a
  queue). The operator's `sync_queue` proposes `SyncMirror` for all at once.
"""

from __future__ import annotations

from collections.abc import Callable

from cluster.metadata import model as md
from cluster.metadata.mirror import SyncMirror
from node.broker.ha_policy import HaSpec
from node.clustering.definitions import mirror_spec_in

# (vhost, queue) -> (the queue machine's next message id, its oldest message still in the queue or None);
# None: the queue is not hosted here
MsgIdSpan = Callable[[str, str], tuple[int, int | None] | None]


def hold_from(spec: HaSpec | None, span: tuple[int, int | None] | None) -> int:
    """The join point new mirrors are held out with (0: not held out)."""
    if spec is None or spec.sync_mode != "manual" or span is None:
        return 0
    next_id, oldest = span
    return next_id if oldest is not None else 0


def sync_plan(state: md.MetadataState, me: str, span: MsgIdSpan) -> list[SyncMirror]:
    """The `SyncMirror` commands this node, as the leader of mirrored queues, proposes now."""
    commands: list[SyncMirror] = []
    for key in sorted(state.mirrors):
        record = state.mirrors[key]
        if record.leader != me or not record.held_out:
            continue
        spec = mirror_spec_in(state, *key)
        if spec is not None and spec.sync_mode == "automatic":
            synced = sorted(record.held_out)
        else:
            now = span(*key)
            if now is None:
                continue
            oldest = now[1]
            drained = {r for r, join in record.held_out.items() if oldest is None or oldest >= join}
            # ha-min-insync above the synchronised replicas: every command (publish, ack, get) waits for the HW,
            # so the backlog could never drain; the mirrors needed to reach it are synchronised (in replica order)
            short = max(0, record.min_insync - len(record.isr))
            needed = [r for r in record.replicas if r in record.held_out][:short]
            synced = sorted(drained | set(needed))
        if synced:
            commands.append(SyncMirror(record.vhost, record.name, tuple(synced)))
    return commands
