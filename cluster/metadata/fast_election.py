"""A quick metadata election when the leader's process is gone, and follower links that stay up (pysyncobj).

What it is for: pysyncobj elects a new metadata leader only after its election timeout (0.4-1.4 s with our
settings) and has no pre-vote. What waits for the metadata group (a mirrored queue's new leader is committed
there) then waits that long after a kill -9 of the node that led it. The node's Raft transport has better
evidence: a peer that refuses connections after its link was lost has no process (docs/cluster.md "Liveness"; a
paused, slow or partitioned node refuses nothing). `FastElection.leader_refused(address)` takes that evidence for
the metadata leader at `address`: the surviving members, ranked by address, take turns, as the Raft queues' fast
campaign does (cluster/raft/core/election.py `leader_refused`): the first campaigns at once, the one of rank r
after r * `TURN_S` plus a random 0..`TURN_S`/2, so that they rarely split the vote (the vote of the first resets
the others' timers as any vote does). A wrong refusal (a leader that is alive after all) costs one election, as
an election timeout would.

And the links between followers: followers never talk to each other in pysyncobj, and its connection checks its
idle time (`connectionTimeout`) only when it sends: the first message after a quiet spell, a candidate's vote
request, found the link idle, closed it and was lost, so the election waited for a reconnect and a second
timeout (seen after a kill -9 of the leader: a campaign at +0.44 s, the leader at +1.2 s). Every member now sends
each connected member a `KEEPALIVE` message every `KEEPALIVE_S` (pysyncobj ignores message types it does not
know), so no link between live members is ever idle for long.

How it works: `FastElection` lives in the SyncObj (store.py's `_AuditedSyncObj`) and runs in pysyncobj's tick
thread (`before_tick`, called first in every `_onTick`); `leader_refused` (any thread) only records the wish and
wakes that thread. It reads and sets pysyncobj's private election deadline (`_SyncObj__raftElectionDeadline`):
pysyncobj has no public way to campaign now.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any, Final

KEEPALIVE: Final = {"type": "raftmq_keepalive"}
KEEPALIVE_S: Final = 1.0  # below connectionTimeout (3.5 s): no link between live members goes idle
TURN_S: Final = 0.15  # the survivor of rank r campaigns r turns after the first (plus a random half turn)
_FOLLOWER: Final = 0  # pysyncobj's _RAFT_STATE.FOLLOWER


class FastElection:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wanted: tuple[str, float] | None = None  # (the refused leader's address, when to campaign)
        self._next_keepalive = 0.0
        self.campaigns = 0  # fast campaigns started (tests, diagnostics)

    def leader_refused(self, syncobj: Any, address: str, members: list[str], me: str) -> bool:
        """Any thread: the member at `address` refuses connections. If it is our leader, campaign at our turn
        among the other members (`members`, addresses, ours included); whether a campaign was scheduled."""
        if _leader_address(syncobj) != address or me == address:
            return False
        survivors = sorted(m for m in set(members) | {me} if m != address)
        rank = survivors.index(me)
        delay = 0.0 if rank == 0 else rank * TURN_S + random.uniform(0, TURN_S / 2)
        with self._lock:
            self._wanted = (address, time.monotonic() + delay)
        notifier = getattr(syncobj, "_SyncObj__pipeNotifier", None)
        if notifier is not None:
            notifier.notify()  # wake the tick thread (it may sleep in its poll up to autoTickPeriod)
        return True

    def before_tick(self, syncobj: Any) -> None:
        """pysyncobj's tick thread, before each tick: a wished campaign whose turn came; keepalives."""
        now = time.monotonic()
        with self._lock:
            wanted = self._wanted
            if wanted is not None and now >= wanted[1]:
                self._wanted = None
        if (wanted is not None and now >= wanted[1] and _leader_address(syncobj) == wanted[0]
                and getattr(syncobj, "_SyncObj__raftState", None) == _FOLLOWER):
            syncobj._SyncObj__raftElectionDeadline = 0  # this tick campaigns
            self.campaigns += 1
        if now >= self._next_keepalive:
            self._next_keepalive = now + KEEPALIVE_S
            transport = getattr(syncobj, "_SyncObj__transport", None)
            for node in list(getattr(syncobj, "_SyncObj__otherNodes", ())):
                if transport is not None:
                    transport.send(node, KEEPALIVE)  # (False when not connected: nothing happens)


def _leader_address(syncobj: Any) -> str | None:
    node = syncobj._getLeader()
    return None if node is None else str(node.address if hasattr(node, "address") else node)
