"""An env-switched trace of a mirrored queue's failover (RAFTMQ_MIRROR_TRACE=1): where the time after a kill goes.

What it is for: `raftmq bench mirrored` reads the survivors' logs to split a failover into stages
(bench/mirrored.py `failover_timeline`). The stages every node logs anyway (a node refusing connections, a replica
reported down, the committed record reaching a node) are in mirror_groups.py; with RAFTMQ_MIRROR_TRACE=1 a node
also logs when it sees another metadata leader (`watch_metadata_leader`, polled every `LEADER_POLL_S`) and when the
outcome of each of its `MirrorReplicaDown` reports came back, with how long the metadata group took
(`apply_traced`). Off by default: the leader poll wakes the node 100 times a second.

How it works: log lines "cluster: mirror trace: ..." at INFO, with the logger's millisecond timestamps.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable

import trio

from cluster.metadata.membership import NodeEndpoints
from cluster.metadata.mirror import MirrorReplicaDown
from cluster.metadata.model import Command, Outcome

log = logging.getLogger("raftmq.cluster")

TRACE_ENV = "RAFTMQ_MIRROR_TRACE"
LEADER_POLL_S = 0.01


def tracing() -> bool:
    return os.environ.get(TRACE_ENV, "") not in ("", "0")


async def watch_metadata_leader(leader: Callable[[], str | None], names: dict[str, str]) -> None:
    """Log every change of the metadata leader this node sees (`names`: metadata address -> node name)."""
    seen: str | None = "?"
    while True:
        now = leader()
        if now != seen:
            seen = now
            log.info("cluster: mirror trace: metadata leader %s", names.get(now, now) if now else "-")
        await trio.sleep(LEADER_POLL_S)


async def apply_traced(apply: Callable[[Command], Awaitable[Outcome | None]], command: Command) -> None:
    """`apply(command)`, logging a `MirrorReplicaDown`'s outcome and how long it took."""
    started = time.monotonic()
    outcome = await apply(command)
    if isinstance(command, MirrorReplicaDown):
        log.info("cluster: mirror trace: %s/%s: MirrorReplicaDown committed in %.0f ms: %s", command.vhost,
                 command.name, (time.monotonic() - started) * 1000, _said(outcome))


def _said(outcome: Outcome | None) -> str:
    if outcome is None:
        return "no outcome"
    return f"refused ({outcome.refused})" if outcome.refused else "ok"


def metadata_names(members: Iterable[NodeEndpoints]) -> dict[str, str]:
    """Metadata address ("host:port") -> node name, for the cluster's members."""
    return {m.metadata_address: m.name for m in members}
