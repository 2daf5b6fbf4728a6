"""The runtime side of paging: recovery folds a long queue stream into an index (node/runtime/paging_io.py) and
PageIn reads bring the records back; TailMessageRecord offsets are reported."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from node.broker.records import (
    MessageIndexRecord,
    MessageRecord,
    MessageRemovedRecord,
    QueueRecord,
    TailMessageRecord,
)
from node.runtime import store as store_module
from node.runtime.paging_io import QueueStreamFold
from node.runtime.store import Store


def _message(msg_id: int, body: bytes = b"") -> MessageRecord:
    return MessageRecord("/", "q", msg_id, "", "q", {"delivery_mode": 2}, body or b"m%d" % msg_id)


def test_fold_marks_the_latest_record_of_a_reused_id_dead_and_keeps_order() -> None:
    fold = QueueStreamFold()
    script: list[Any] = [
        _message(1), _message(2), _message(3), MessageRemovedRecord("/", "q", 3), MessageRemovedRecord("/", "q", 1),
        _message(3, b"again"),  # a restart left 2 live: the counter went on at 3
        _message(4), MessageRemovedRecord("/", "q", 4),
        _message(5),
    ]
    for offset, record in enumerate(script):
        fold.add(offset, record)
    [index] = fold.records()
    assert isinstance(index, MessageIndexRecord)
    assert index.msg_ids.tolist() == [2, 3, 5]
    assert index.offsets.tolist() == [1, 5, 8]


async def test_a_long_stream_is_recovered_as_an_index_and_read_back(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "RECOVER_INLINE_RECORDS_MAX", 10)
    store = Store.open(tmp_path)
    store.persist(1, (QueueRecord("/", "q"),))
    store.persist(2, tuple(_message(i) for i in range(1, 31)))
    store.persist(3, tuple(MessageRemovedRecord("/", "q", i) for i in range(1, 11)))
    store.persist(4, (TailMessageRecord("/", "q", 31, "", "q", {"delivery_mode": 2}, b"tail"),
                      TailMessageRecord("/", "q", 32, "", "q", {"delivery_mode": 1}, b"spilled transient")))
    # after 30 messages and the 10 removals (one MessagesRemovedRecord)
    assert store.pages.offsets == [("queue:/:q", 31, 31), ("queue:/:q", 32, 32)]
    assert len(store.books["queue:/:q"].live_messages) == 22, "a spilled message pins the stream until paged in"
    await store.flush()

    reopened = Store.open(tmp_path)
    records = reopened.recover()
    assert records[0] == QueueRecord("/", "q")
    [index] = [r for r in records if isinstance(r, MessageIndexRecord)]
    assert not [r for r in records if isinstance(r, MessageRecord)]
    assert index.msg_ids.tolist() == list(range(11, 32)), "the spilled transient message is dropped"
    assert len(reopened.books["queue:/:q"].live_messages) == 21
    read = reopened.pages.read("queue:/:q", (*index.offsets[:2], index.offsets[-1], 999))
    assert [r.msg_id for r in read] == [11, 12, 31]
    assert read[-1].body == b"tail"
    await reopened.flush()
