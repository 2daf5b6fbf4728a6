"""The metadata replica keeps ticking after trio retires its idle worker threads.

pysyncobj's tick thread stops once the thread that created the `SyncObj` has exited. The store used to create it in
a trio worker thread, which trio retires after ~10 s idle; the test makes trio retire idle workers after 0.1 s
(`trio._core._thread_cache.IDLE_TIMEOUT`, read by each worker as it goes idle), lets every worker go, and checks the
three stores still tick and commit a command.
"""

from __future__ import annotations

import pytest
import trio

from cluster.metadata.model import PutVhost
from tests.metadata.helpers import config, free_addresses, start_all, wait_until


async def test_store_still_commits_after_trio_retired_its_worker_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    from trio._core import _thread_cache
    monkeypatch.setattr(_thread_cache, "IDLE_TIMEOUT", 0.1)
    addrs = free_addresses(3)
    stores = await start_all([config(i, addrs) for i in range(3)])
    try:
        await trio.sleep(1.5)  # every worker thread used by start() is idle and retired by now
        assert all(s.ticking() for s in stores)
        assert (await stores[0].apply(PutVhost("after-retirement"), timeout_s=15)).ok
        await wait_until(lambda: all("after-retirement" in s.state.vhosts for s in stores), what="vhost everywhere")
        assert all(s.status()["ticking"] for s in stores)
    finally:
        for s in stores:
            s.close()
    await wait_until(lambda: not any(s._owner is not None for s in stores), what="owners released")
