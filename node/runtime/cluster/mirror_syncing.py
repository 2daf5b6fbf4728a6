"""The leader's side of `ha-sync-mode: manual` (node/clustering/mirror_sync.py), a step of the mirror poll loop.

At every poll (mirror_polling.py), for each mirrored queue this node leads that has held-out (unsynchronised)
mirrors: propose `SyncMirror` for those whose join point the queue's oldest message has passed (read from this
node's broker, which applied the queue's log up to the HW), or all of them once the policy says `automatic`. The
same command is not proposed again within RESEND_MS (a commit clears the hold, so a repeat is a no-op anyway).
"""

from __future__ import annotations

import logging
from typing import Any, Final

from node.clustering.mirror_sync import sync_plan
from node.runtime.dispatch import wall_ms

log = logging.getLogger("raftmq.cluster")

RESEND_MS: Final = 2_000


class Progress:
    """What `step` remembers between polls."""

    def __init__(self) -> None:
        self.last: dict[Any, int] = {}  # SyncMirror command -> proposed at


async def step(rt: Any, progress: Progress) -> None:
    if rt.store is None or rt.mirror is None:
        return
    last = progress.last
    state = rt.store.state
    if not any(record.held_out for record in state.mirrors.values()):
        last.clear()
        return
    now = wall_ms()
    for command in sync_plan(state, rt.name, rt.broker.queue_msg_id_span):
        if now - last.get(command, now - RESEND_MS) < RESEND_MS:
            continue
        last[command] = now
        log.info("cluster: mirrored queue %s/%s: %s synchronised (ha-sync-mode manual: the messages older than "
                 "their join are gone, or the policy says automatic)", command.vhost, command.name,
                 ",".join(command.replicas))
        await rt.apply_definition(command)
    for stale in [c for c, at in last.items() if now - at >= 10 * RESEND_MS]:
        del last[stale]
