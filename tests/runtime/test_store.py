"""The runtime store over a real NodeLog: group commit, recovery, and compaction by snapshots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cluster.log import LogConfig, NodeLog
from node.broker.records import (
    DEFINITIONS_STREAM,
    ExchangeRecord,
    MessageRecord,
    MessageRemovedRecord,
    QueueRecord,
    queue_stream,
)
from node.runtime import store_compaction
from node.runtime.store import Store
from node.runtime.store_compaction import CompactionPolicy

EAGER = CompactionPolicy(queue_records_min=4, interval_s=0)  # compact a drained stream after 4 records


def _message(msg_id: int, queue: str = "q") -> MessageRecord:
    return MessageRecord("/", queue, msg_id, "", queue, {"delivery_mode": 2}, f"body-{msg_id}".encode())


class FakeNode:
    """Records the tokens the store reports durable."""

    def __init__(self) -> None:
        self.persisted: list[int] = []
        self.broker = self

    def on_persisted(self, token: int) -> list[Any]:
        self.persisted.append(token)
        return []

    def dispatch(self, effects: list[Any]) -> None:
        assert effects == []


async def test_commit_covers_every_pending_token_and_recovery_reads_back(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    store.persist(1, (QueueRecord("/", "q"), ExchangeRecord("/", "x", "direct")))
    store.persist(2, (_message(1), _message(2)))
    store.persist(3, (MessageRemovedRecord("/", "q", 1),))
    assert await store.commit_once() == [1, 2, 3]
    assert store.pending_tokens == []
    await store.flush()

    reopened = Store.open(tmp_path)
    records = reopened.recover()
    assert records[:2] == [QueueRecord("/", "q"), ExchangeRecord("/", "x", "direct")]  # definitions first
    assert records[2:] == [_message(1), _message(2), MessageRemovedRecord("/", "q", 1)]
    assert reopened.books[queue_stream("/", "q")].live_messages == {2}
    await reopened.flush()


async def test_drained_queue_stream_is_truncated_by_an_empty_snapshot(tmp_path: Path) -> None:
    store = Store.open(tmp_path, EAGER)
    store.persist(1, (QueueRecord("/", "q"),))
    for msg_id in range(3):
        store.persist(10 + msg_id, (_message(msg_id),))
    for msg_id in range(3):
        store.persist(20 + msg_id, (MessageRemovedRecord("/", "q", msg_id),))
    assert store.jobs, "a drained stream with enough dead records schedules a snapshot"
    await store.commit_once()
    store.persist(30, (_message(99),))  # appended after the snapshot point: must survive
    await store.flush()

    reopened = Store.open(tmp_path)
    records = reopened.recover()
    assert [r for r in records if isinstance(r, MessageRecord | MessageRemovedRecord)] == [_message(99)]
    await reopened.flush()


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def _segment_files(directory: Path) -> list[Path]:
    return sorted((directory / "streams").rglob("*.log"))


def _drain(store: Store, first: int, count: int) -> None:
    """`count` messages published and consumed: the queue stream is drained afterwards."""
    for msg_id in range(first, first + count):
        store.persist(msg_id, (_message(msg_id),))
        store.persist(msg_id, (MessageRemovedRecord("/", "q", msg_id),))


async def test_a_steady_drained_flow_below_the_thresholds_writes_no_snapshot(tmp_path: Path) -> None:
    store = Store.open(tmp_path, CompactionPolicy(queue_records_min=1000, queue_bytes_min=1 << 30))
    _drain(store, 0, 400)  # 800 records, drained after every second one
    assert store.jobs == []
    await store.flush()


async def test_segments_behind_the_snapshot_of_a_drained_queue_are_deleted(tmp_path: Path) -> None:
    clock = FakeClock()
    policy = CompactionPolicy(queue_records_min=10_000, queue_bytes_min=2000, interval_s=5)
    store = Store(NodeLog.open(tmp_path, LogConfig(segment_size_bytes_max=512)), policy, clock)
    msg_id = 0
    while not store.jobs:  # until the byte threshold is passed while drained: several 512-byte segments
        _drain(store, msg_id, 1)
        msg_id += 1
    await store.commit_once()
    assert len(_segment_files(tmp_path)) > 3
    assert len(store.jobs) == 1
    await store.run_jobs(store.jobs)
    store.jobs = []
    assert len(_segment_files(tmp_path)) <= 1, "segments wholly behind the snapshot are gone"

    _drain(store, 1000, 60)  # past the threshold again, but within the interval: held back
    assert store.jobs == [] and store.candidates == {queue_stream("/", "q")}
    clock.now_s += 5
    store.sweep_candidates()
    assert len(store.jobs) == 1 and not store.candidates
    await store.flush()
    assert len(_segment_files(tmp_path)) <= 1
    records = Store.open(tmp_path).recover()
    assert not [r for r in records if isinstance(r, MessageRecord | MessageRemovedRecord)]


async def test_a_queue_that_is_not_drained_is_not_truncated(tmp_path: Path) -> None:
    store = Store.open(tmp_path, EAGER)
    store.persist(1, (_message(1),))
    _drain(store, 10, 10)
    assert store.jobs == [], "message 1 is still live"
    await store.flush()
    records = Store.open(tmp_path).recover()
    assert _message(1) in records


async def test_deleted_queue_is_truncated_but_a_redeclared_one_keeps_its_messages(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    store.persist(1, (QueueRecord("/", "q"), _message(1), _message(2)))
    await store.commit_once()
    store.persist(2, (QueueRecord("/", "q", deleted=True),))
    store.persist(3, (QueueRecord("/", "q"), _message(7)))  # before the truncation job has run
    await store.flush()

    records = Store.open(tmp_path).recover()
    assert [r for r in records if isinstance(r, MessageRecord)] == [_message(7)]
    assert records[-1] == _message(7)


async def test_definitions_are_rewritten_as_a_snapshot_when_mostly_dead(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(store_compaction, "COMPACT_DEFINITION_RECORDS_MIN", 10)
    store = Store.open(tmp_path)
    for i in range(12):
        store.persist(i, (ExchangeRecord("/", f"x{i}", "fanout"), ExchangeRecord("/", f"x{i}", "fanout", deleted=True)))
    store.persist(100, (ExchangeRecord("/", "kept", "topic"),))
    await store.flush()
    reopened = Store.open(tmp_path)
    records = reopened.recover()
    snapshot, _entries = reopened.log.read(DEFINITIONS_STREAM)
    assert snapshot is not None
    latest: dict[str, bool] = {}
    for record in records:
        if isinstance(record, ExchangeRecord):
            latest[record.name] = record.deleted
    assert {name for name, deleted in latest.items() if not deleted} == {"kept"}
    assert len(records) < 25
    await reopened.flush()


async def test_commit_loop_reports_tokens_to_the_broker(tmp_path: Path) -> None:
    import trio

    store = Store.open(tmp_path)
    node = FakeNode()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(store.commit_loop, node)
        store.persist(1, (_message(1),))
        store.persist(2, ())
        with trio.fail_after(30):
            while node.persisted != [1, 2]:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    await store.flush()


async def test_commit_loop_runs_compaction_after_the_confirms(tmp_path: Path) -> None:
    import trio

    store = Store.open(tmp_path, EAGER)
    node = FakeNode()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(store.commit_loop, node)
        _drain(store, 0, 3)
        with trio.fail_after(30):
            while store.log.snapshot_offset(queue_stream("/", "q")) < 0:
                await trio.sleep(0.01)
        assert sorted(set(node.persisted)) == [0, 1, 2]
        nursery.cancel_scope.cancel()
    await store.flush()


class FakeNodeMany(FakeNode):
    """A broker with `on_persisted_many`: one call per commit."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[int]] = []

    def on_persisted_many(self, tokens: list[int]) -> list[Any]:
        self.batches.append(list(tokens))
        return []


async def test_one_commits_tokens_reach_the_broker_in_one_call(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    node = FakeNodeMany()
    for token in (1, 2, 3):
        store.persist(token, (_message(token),))
    Store._report(node, await store.commit_once())
    assert node.batches == [[1, 2, 3]] and node.persisted == []
    await store.flush()
