"""Three MetadataStores in one process on loopback ports: replication, idempotent retries, subscriptions."""

from __future__ import annotations

import pytest
import trio

from cluster.metadata.model import PREDECLARED_EXCHANGES, DeclareQueue, PutVhost, QueueRecord
from cluster.metadata.store import MetadataError, MetadataStore
from tests.metadata.helpers import config, free_addresses, start_all, wait_until


async def test_command_applied_on_one_node_is_visible_on_all() -> None:
    addrs = free_addresses(3)
    stores = await start_all([config(i, addrs) for i in range(3)])
    try:
        await wait_until(lambda: all(len(s.state.nodes) == 3 for s in stores), what="three nodes registered")
        start, sub = stores[2].watch()
        assert len(start.nodes) == 3 and not start.vhosts
        out = await stores[0].apply(PutVhost("/", cid="v1"))
        assert out.ok and out.changes[0].action == "created"
        q = QueueRecord("/", "q", "quorum", leader="n1", members=("n0", "n1", "n2"))
        assert (await stores[1].apply(DeclareQueue(q))).ok
        await wait_until(lambda: all(("/", "q") in s.state.queues for s in stores), what="queue everywhere")
        assert stores[2].state.queues[("/", "q")].leader == "n1"
        # a retry of a committed command (same id) is a duplicate with the first outcome, from any node
        again = await stores[2].apply(PutVhost("/", cid="v1"))
        assert again.duplicate and again.changes == out.changes
        with trio.fail_after(10):
            seen = [await sub.receive() for _ in range(2)]
        assert [c.kind for o in seen for c in o.changes] == [
            "vhost", *["exchange"] * len(PREDECLARED_EXCHANGES), "queue"]
        await wait_until(lambda: len({repr(s.state) for s in stores}) == 1, what="equal replicas")
    finally:
        for s in stores:
            s.close()


async def test_sync_is_a_read_barrier_on_a_follower() -> None:
    addrs = free_addresses(3)
    stores = await start_all([config(i, addrs) for i in range(3)])
    try:
        follower = next(s for s in stores if s.leader() != s.config.address)
        writer = next(s for s in stores if s is not follower)
        for i in range(5):
            assert (await writer.apply(PutVhost(f"v{i}"))).ok
        state = await follower.sync()  # no waiting loop: after sync the follower has applied all of it
        assert {f"v{i}" for i in range(5)} <= set(state.vhosts)
    finally:
        for s in stores:
            s.close()


async def test_stores_run_alongside_a_busy_trio_loop() -> None:
    # the bridge never blocks trio: a ticker keeps running while commands replicate
    addrs = free_addresses(3)
    stores: list[MetadataStore] = await start_all([config(i, addrs) for i in range(3)])
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.sleep(0.01)

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ticker)
            for i in range(20):
                assert (await stores[i % 3].apply(PutVhost(f"v{i}"))).ok
            nursery.cancel_scope.cancel()
        assert ticks > 0
        await wait_until(lambda: all(len(s.state.vhosts) == 20 for s in stores), what="20 vhosts everywhere")
    finally:
        for s in stores:
            s.close()


async def test_a_port_in_use_is_a_clear_error() -> None:
    addrs = free_addresses(1)
    first = MetadataStore(config(0, addrs))
    await first.start()
    try:
        second = MetadataStore(config(0, addrs, bind_retries=2))
        with pytest.raises(MetadataError, match="cannot bind"):
            await second.start()
        assert (await first.apply(PutVhost("/"))).ok
    finally:
        first.close()


async def test_a_subscriber_that_falls_behind_is_closed_not_silently_skipped() -> None:
    store = MetadataStore(config(0, free_addresses(1)))
    await store.start()
    try:
        slow = store.watch(buffer_max=2)[1]
        for i in range(4):
            assert (await store.apply(PutVhost(f"v{i}"))).ok
        with trio.fail_after(10):
            got = [await slow.receive(), await slow.receive()]
            with pytest.raises(trio.EndOfChannel):
                await slow.receive()
        assert [o.changes[0].key for o in got] == [("v0",), ("v1",)]
        assert len(store.state.vhosts) == 4  # the state is there to re-read; resubscribe for what follows
    finally:
        store.close()
