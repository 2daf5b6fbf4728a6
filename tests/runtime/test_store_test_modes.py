"""The store's test-only modes: confirm before fsync (unsafe) and dropping unsynced writes at the next start."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from node.broker.records import MessageRecord, QueueRecord
from node.runtime.store import SYNCED_SIZES_FILE, Store


def _message(msg_id: int) -> MessageRecord:
    return MessageRecord("/", "q", msg_id, "", "q", {"delivery_mode": 2}, f"body-{msg_id}".encode())


def _write_without_fsync(store: Store, msg_ids: range) -> None:
    """Append and write out (WAL and segment, plain writes) without the fsync: what a kill -9 mid-commit leaves."""
    for msg_id in msg_ids:
        store.persist(msg_id, (_message(msg_id),))
    store.log._write_pending()


async def _written_then_killed(directory: Path, drop: bool) -> list[Any]:
    store = Store.open(directory, drop_unsynced_on_kill=drop)
    store.persist(0, (QueueRecord("/", "q"),))
    for msg_id in range(1, 4):
        store.persist(msg_id, (_message(msg_id),))
    await store.commit_once()
    _write_without_fsync(store, range(4, 10))
    store.log._handles.close_all()  # the "kill": no flush, no close
    return Store.open(directory, drop_unsynced_on_kill=drop).recover()


async def test_without_the_mode_a_kill_keeps_unsynced_writes(tmp_path: Path) -> None:
    records = await _written_then_killed(tmp_path, drop=False)
    assert [r.msg_id for r in records if isinstance(r, MessageRecord)] == list(range(1, 10))
    assert not (tmp_path / SYNCED_SIZES_FILE).exists()


async def test_drop_unsynced_on_kill_keeps_exactly_what_was_fsynced(tmp_path: Path) -> None:
    records = await _written_then_killed(tmp_path, drop=True)
    assert records[0] == QueueRecord("/", "q")
    assert [r.msg_id for r in records if isinstance(r, MessageRecord)] == [1, 2, 3]
    assert (tmp_path / SYNCED_SIZES_FILE).exists()  # recorded again right after the open


async def test_drop_unsynced_keeps_everything_after_a_graceful_stop(tmp_path: Path) -> None:
    store = Store.open(tmp_path, drop_unsynced_on_kill=True)
    for msg_id in range(1, 6):
        store.persist(msg_id, (_message(msg_id),))
    await store.flush()
    for _ in range(2):  # twice: the record written at the second open must be right too
        reopened = Store.open(tmp_path, drop_unsynced_on_kill=True)
        assert [r.msg_id for r in reopened.recover() if isinstance(r, MessageRecord)] == [1, 2, 3, 4, 5]
        await reopened.flush()


class OrderNode:
    """Notes, at each confirm, how many commits the store had done."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.broker = self
        self.confirmed: list[tuple[list[int], int]] = []

    def on_persisted_many(self, tokens: list[int]) -> list[Any]:
        self.confirmed.append((list(tokens), self.store.commits))
        return []

    def dispatch(self, effects: list[Any]) -> None:
        assert effects == []


async def _confirm_order(directory: Path, unsafe: bool) -> list[tuple[list[int], int]]:
    store = Store.open(directory, unsafe_confirm_before_fsync=unsafe)
    node = OrderNode(store)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(store.commit_loop, node)
        store.persist(1, (_message(1),))
        with trio.fail_after(30):
            while store.commits < 1 or not node.confirmed:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    await store.flush()
    return node.confirmed


async def test_safe_mode_confirms_after_the_commit(tmp_path: Path) -> None:
    assert await _confirm_order(tmp_path, unsafe=False) == [([1], 1)]


async def test_unsafe_mode_confirms_at_append_before_the_commit(tmp_path: Path) -> None:
    assert await _confirm_order(tmp_path, unsafe=True) == [([1], 0)]  # once only: the commit reports nothing
