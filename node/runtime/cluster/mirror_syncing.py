"""The leader's side of `ha-sync-mode: manual` (node/clustering/mirror_sync.py) as a task of `ClusterRuntime`.

Every POLL_S, for each mirrored queue this node leads that has held-out (unsynchronised) mirrors: propose
`SyncMirror` for those whose join point the queue's oldest message has passed (read from this node's broker, which
applied the queue's log up to the HW), or all of them once the policy says `automatic`. The same command is not
proposed again within RESEND_MS (a commit clears the hold, so a repeat is a no-op anyway).
"""

from __future__ import annotations

import logging
from typing import Any, Final

import trio

from node.clustering.mirror_sync import sync_plan
from node.runtime.dispatch import wall_ms

log = logging.getLogger("raftmq.cluster")

POLL_S: Final = 0.25
RESEND_MS: Final = 2_000


async def run(rt: Any) -> None:
    last: dict[Any, int] = {}
    while True:
        await trio.sleep(POLL_S)
        try:
            if rt.store is None or rt.mirror is None:
                continue
            state = rt.store.state
            if not any(record.held_out for record in state.mirrors.values()):
                last.clear()
                continue
            now = wall_ms()
            for command in sync_plan(state, rt.name, rt.broker.queue_msg_id_span):
                if now - last.get(command, now - RESEND_MS) < RESEND_MS:
                    continue
                last[command] = now
                log.info("cluster: mirrored queue %s/%s: %s synchronised (ha-sync-mode manual: the messages "
                         "older than their join are gone, or the policy says automatic)", command.vhost,
                         command.name, ",".join(command.replicas))
                await rt.apply_definition(command)
            for stale in [c for c, at in last.items() if now - at >= 10 * RESEND_MS]:
                del last[stale]
        except Exception:
            log.exception("cluster: synchronising mirrored queues failed")
