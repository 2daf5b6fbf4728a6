"""The one poll loop of the mirrored queues' leader-side steps, a task of `ClusterRuntime`'s nursery.

What it is for: three steps look, every POLL_S, for work that only the node leading a queue does:
mirror_conversion.py (a classic queue an `ha-mode` policy now applies to becomes mirrored), mirror_back.py (a
mirrored queue no policy mirrors any more becomes classic again) and mirror_syncing.py (`ha-sync-mode: manual`:
held-out mirrors released). One task runs them all.

How it works: each step is `step(rt, progress)` with its own `Progress` (what it remembers between polls); they
run one after the other, each poll, in that order. A step that fails is logged and the next one still runs. A step
awaiting a metadata commit holds up the others until the next poll only: every one of them waits for the metadata
group in the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

import trio

from node.runtime.cluster import mirror_back, mirror_conversion, mirror_syncing

log = logging.getLogger("raftmq.cluster")

POLL_S: Final = 0.25


async def run(rt: Any) -> None:
    """Every POLL_S: the conversion to mirrored, the way back to classic and the release of held-out mirrors."""
    steps: list[tuple[str, Callable[[Any, Any], Awaitable[None]], Any]] = [
        ("converting classic queues to mirrored", mirror_conversion.step, mirror_conversion.Progress()),
        ("converting mirrored queues back to classic", mirror_back.step, mirror_back.Progress()),
        ("synchronising mirrored queues", mirror_syncing.step, mirror_syncing.Progress()),
    ]
    while True:
        await trio.sleep(POLL_S)
        for what, step, progress in steps:
            try:
                await step(rt, progress)
            except Exception:
                log.exception("cluster: %s failed", what)
