"""`Store.wait_durable` returns only after a commit covered every earlier `persist`, and the management view
answers a change that wrote records only after it (single node: policies, vhosts, users, permissions)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
import trio.testing

from node.broker.broker import Broker
from node.broker.records import VHostRecord
from node.runtime.management_view import BrokerView
from node.runtime.store import Store


async def test_wait_durable_waits_for_the_commit_covering_earlier_appends(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    done: list[str] = []

    async def waiter() -> None:
        await store.wait_durable()
        done.append("durable")

    try:
        await store.wait_durable()  # nothing appended: returns at once
        store.persist(1, [VHostRecord("v1")])
        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
            assert done == []
            assert await store.commit_once() == [1]
        assert done == ["durable"]
        store.persist(2, [VHostRecord("v2")])
        await store.commit_once()
        await store.wait_durable()
    finally:
        await store.flush()


class FakeRuntime:
    def __init__(self) -> None:
        self.applied: list[Any] = []
        self.waits = 0

    def dispatch(self, effects: list[Any]) -> None:
        self.applied.extend(effects)

    async def wait_persisted(self) -> None:
        self.waits += 1


async def test_management_change_waits_for_durability_when_it_wrote_records() -> None:
    runtime = FakeRuntime()
    view = BrokerView(Broker(), runtime.dispatch, node_name="n", wait_durable=runtime.wait_persisted)
    await view.run_command("add_vhost", {"name": "v"})
    assert runtime.waits == 1 and any(type(e).__name__ == "Persist" for e in runtime.applied)
    await view.run_command("set_policy", {"vhost": "v", "name": "p", "pattern": ".*",
                                          "definition": {"max-length": 5}})
    assert runtime.waits == 2
    await view.run_command("add_vhost", {"name": "v"})  # exists: nothing written, nothing to wait for
    assert runtime.waits == 2
