"""The metadata group's quick election when its leader's node refuses connections (cluster/metadata/fast_election.py):
three stores in one process; the survivors' ordinary election timeout is raised to a minute once a leader is known,
so only `MetadataStore.leader_refused` (what the node runtime calls on the Raft transport's refusal) can elect the
next leader within the test's deadline."""

from __future__ import annotations

import trio

from cluster.metadata.model import Barrier
from tests.metadata.helpers import config, free_addresses, start_all, wait_until


async def test_survivors_elect_at_once_when_the_leader_refuses_connections() -> None:
    addrs = free_addresses(3)
    stores = await start_all([config(i, addrs) for i in range(3)])
    try:
        await wait_until(lambda: all(s.leader() is not None for s in stores), what="a leader")
        leader = stores[0].leader()
        old = next(s for s in stores if s.config.address == leader)
        survivors = [s for s in stores if s is not old]
        assert not any(s.leader_refused(survivors[0].config.address) for s in survivors)  # not the leader: no-op
        for s in survivors:
            s._syncobj.conf.raftMinTimeout, s._syncobj.conf.raftMaxTimeout = 60.0, 61.0
        await trio.sleep(0.5)  # the leader's heartbeats restart the survivors' timers with the new timeouts
        old.close()  # its port refuses connections from now on
        first, second = (s.leader_refused(old.config.address) for s in survivors)
        assert first  # the first survivor told still follows the old leader: it schedules its campaign
        # The second may already have heard the first's campaign (pysyncobj's tick thread runs it at once), and then
        # follows no one or the new leader: nothing for it to do.
        assert second or survivors[1].leader() != leader
        await wait_until(lambda: all(s.leader() not in (None, leader) for s in survivors), timeout_s=15,
                         what="a new leader among the survivors")
        assert {s.leader() for s in survivors} <= {s.config.address for s in survivors}
        assert (await survivors[1].apply(Barrier(), timeout_s=10)).ok
    finally:
        for s in stores:
            s.close()
