"""The store's side of delete + re-declare (node/runtime/store.py): the `QueueStreamStartRecord` it writes, the
truncation it plans for a deleted queue's stream, and how its recovery fold honours the marker.

A fake log records what the store appends and which snapshots it plans; no disk, no trio run needed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import cbor2
import pytest

from node.broker.records import (
    DEFINITIONS_STREAM,
    MessageIndexRecord,
    MessageRecord,
    MessageRemovedRecord,
    QueueRecord,
    QueueStreamStartRecord,
    Record,
    TailMessageRecord,
    queue_stream,
)
from node.runtime import store as store_module
from node.runtime.store import Store, decode
from node.runtime.store_compaction import EMPTY_SNAPSHOT

STREAM = queue_stream("/", "q")


@dataclass
class FakeLog:
    appended: list[tuple[str, Record]] = field(default_factory=list)
    ends: dict[str, int] = field(default_factory=dict)
    snapshots: list[tuple[str, int, bytes]] = field(default_factory=list)

    def append_many(self, items: list[tuple[str, bytes]], timestamp_ms: int = 0) -> list[int]:
        offsets = []
        for stream, payload in items:
            offsets.append(self.ends.get(stream, 0))
            self.ends[stream] = offsets[-1] + 1
            self.appended.append((stream, decode(payload)))
        return offsets

    def write_snapshot(self, stream: str, offset: int, state: bytes) -> None:
        self.snapshots.append((stream, offset, state))


def _message(msg_id: int, body: bytes = b"x") -> MessageRecord:
    return MessageRecord("/", "q", msg_id, "", "q", {"delivery_mode": 2}, body)


def _store() -> tuple[Store, FakeLog]:
    log = FakeLog()
    return Store(log), log


def _planned(store: Store) -> None:
    jobs, store.jobs = store.jobs, []
    for job in jobs:
        job()


def test_a_first_declaration_writes_no_marker() -> None:
    store, log = _store()
    store.persist(1, [QueueRecord("/", "q"), _message(1)])
    assert [type(r) for _s, r in log.appended] == [QueueRecord, MessageRecord]


def test_a_redeclared_queue_gets_a_marker_before_its_definition_in_the_same_batch() -> None:
    store, log = _store()
    store.persist(1, [QueueRecord("/", "q"), _message(1), _message(2)])
    store.persist(2, [QueueRecord("/", "q", deleted=True), MessageRemovedRecord("/", "q", 1),
                      MessageRemovedRecord("/", "q", 2), QueueRecord("/", "q"), _message(1, b"new")])
    kinds = [type(r) for _s, r in log.appended[3:]]
    assert kinds == [QueueRecord, MessageRemovedRecord, MessageRemovedRecord, QueueStreamStartRecord, QueueRecord,
                     MessageRecord]
    _planned(store)
    # the old queue's records (offsets 0..3: two messages, two removals) are truncated, the marker and after kept
    assert log.snapshots == [(STREAM, 3, EMPTY_SNAPSHOT)]


def test_a_deleted_queue_is_truncated_after_its_removals() -> None:
    store, log = _store()
    store.persist(1, [QueueRecord("/", "q"), _message(1)])
    store.persist(2, [QueueRecord("/", "q", deleted=True), MessageRemovedRecord("/", "q", 1)])
    _planned(store)
    assert log.snapshots == [(STREAM, 1, EMPTY_SNAPSHOT)]  # the removal (offset 1) too, not only the message
    # declared again later: a marker (the stream exists), but nothing left to truncate
    store.persist(3, [QueueRecord("/", "q"), _message(1)])
    _planned(store)
    assert isinstance(log.appended[-3][1], QueueStreamStartRecord)
    assert log.snapshots == [(STREAM, 1, EMPTY_SNAPSHOT)]


def test_a_live_queue_is_never_restarted() -> None:
    store, log = _store()
    store.persist(1, [QueueRecord("/", "q"), _message(1)])
    store.persist(2, [QueueRecord("/", "q")])  # (the broker does not write this; the store must not kill msg 1)
    assert not [r for _s, r in log.appended if isinstance(r, QueueStreamStartRecord)]


def _recover_from(tmp_path: Path, records: list[Record]) -> list[Record]:
    store = Store.open(tmp_path)
    for record in records:
        store.log.append(record.stream, store_module.encode(record))
    store.log.commit()
    store.log.close()
    return Store.open(tmp_path).recover()


def test_recovery_drops_what_precedes_a_marker_inline(tmp_path: Path) -> None:
    records: list[Record] = [QueueRecord("/", "q"), _message(1, b"old"), _message(2, b"old"),
                             QueueRecord("/", "q", deleted=True), QueueStreamStartRecord("/", "q"),
                             QueueRecord("/", "q"), _message(1, b"new")]
    recovered = _recover_from(tmp_path, records)
    assert [r.body for r in recovered if isinstance(r, MessageRecord)] == [b"new"]


def test_recovery_drops_what_precedes_a_marker_in_the_index(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "RECOVER_INLINE_RECORDS_MAX", 2)
    old: list[Record] = [_message(i, b"old") for i in range(1, 6)]
    records: list[Record] = [QueueRecord("/", "q"), *old, QueueRecord("/", "q", deleted=True),
                             QueueStreamStartRecord("/", "q"), QueueRecord("/", "q"),
                             *[_message(i, b"new") for i in range(1, 5)]]
    recovered = _recover_from(tmp_path, records)
    [index] = [r for r in recovered if isinstance(r, MessageIndexRecord)]
    assert index.msg_ids.tolist() == [1, 2, 3, 4] and index.offsets.tolist() == [6, 7, 8, 9]


async def test_a_marker_after_a_restart_truncates_the_old_records_left_behind(tmp_path: Path) -> None:
    """Killed after the delete, before its truncation job ran: the old records are still there at the restart.
    Declaring the queue again truncates them (just before the marker)."""
    records: list[Record] = [QueueRecord("/", "q"), _message(1), _message(2), QueueRecord("/", "q", deleted=True)]
    _recover_from(tmp_path, records)
    store = Store.open(tmp_path)
    store.recover()
    store.persist(1, [QueueRecord("/", "q"), _message(1, b"new")])
    await store.flush()
    log = Store.open(tmp_path).log
    snapshot, entries = log.read(STREAM)
    assert snapshot is not None and cbor2.loads(snapshot) == []
    assert [type(decode(payload)) for _offset, payload in entries] == [QueueStreamStartRecord, MessageRecord]
    assert [type(decode(payload)) for _offset, payload in log.read(DEFINITIONS_STREAM)[1]][-1] is QueueRecord
    log.close()


def test_unreported_tail_offsets_of_the_old_queue_are_dropped_at_the_marker() -> None:
    """Paging: offsets of a deleted queue's tail records, not yet reported to the broker, must not reach the new
    queue of the same name (its tail may use the same msg ids)."""
    store, _log = _store()
    store.persist(1, [QueueRecord("/", "q"), TailMessageRecord("/", "q", 7, "", "q", {"delivery_mode": 2}, b"o")])
    store.persist(2, [QueueRecord("/", "other"),
                      TailMessageRecord("/", "other", 7, "", "other", {"delivery_mode": 2}, b"x")])
    store.persist(3, [QueueRecord("/", "q", deleted=True), MessageRemovedRecord("/", "q", 7), QueueRecord("/", "q")])
    assert store.pages.offsets == [(queue_stream("/", "other"), 7, 0)]
