"""Regression (issue 3 follow-up): no crash point of the memory alarm's spill loses a persistent message.

Under the memory alarm a pageable queue writes its newest in-memory persistent messages again, at the end of its
stream (node/broker/paged_tail.py `spilled_out`). It used to write a MessageRemoved of the old record, then the copy:
a crash between the two (an append buffer written out between them, a torn WAL tail, two commit batches) left
the removal without the copy, and recovery lost a message its publisher had been confirmed. The spill now writes
the copy alone, and both recovery folds (the store's `QueueStreamFold` and `Broker.recover`'s) treat a record of
an id already live as the message's new place. These tests cut the stream after every record the spill wrote and
recover: through the pure folds, and through a real `Store` on disk (inline records and the index of a long
stream). They also pin the other side: an ack after a spill still removes the message (no resurrection).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from node.broker.broker import Broker, BrokerConfig
from node.broker.effects import PageIn
from node.broker.records import (
    DEFINITIONS_STREAM,
    MessageIndexRecord,
    MessageRecord,
    MessageRemovedRecord,
    Record,
)
from node.runtime import store as store_module
from node.runtime.paging_io import QueueStreamFold
from node.runtime.store import Store
from tests.broker.harness import deliveries
from tests.paging.test_broker_paging import LIMIT, STREAM, FakeStorage, _client

COUNT = LIMIT + 4  # LIMIT in the machine (the alarm spills all but the floor of them), 4 already paged out


def _spilled() -> tuple[FakeStorage, int, list[bytes]]:
    """A durable queue of persistent messages after the memory alarm: (storage, stream length before the alarm,
    bodies in publish order)."""
    broker = Broker(BrokerConfig(queue_messages_in_memory_max=LIMIT))
    storage = FakeStorage(broker)
    client = _client(broker)
    storage.run(client.declare("q", durable=True))
    bodies = [f"m{n}".encode() for n in range(COUNT)]
    for body in bodies:
        storage.run(client.publish("", "q", body, delivery_mode=2))
    before = len(storage.streams[STREAM])
    storage.run(broker.set_alarm("memory", True))
    assert len(storage.streams[STREAM]) > before, "the alarm spilled something"
    return storage, before, bodies


def _drain(records: list[Record], streams: dict[str, list[Record]]) -> list[bytes]:
    """Recover a fresh broker from `records` (page-ins read `streams`) and consume everything."""
    restarted = Broker(BrokerConfig(queue_messages_in_memory_max=LIMIT))
    storage = FakeStorage(restarted)
    storage.streams = {name: list(log) for name, log in streams.items()}  # (consuming appends removals)
    storage.run(restarted.recover(records))
    storage.run(_client(restarted).consume("q", "c", no_ack=True))
    return [body for _tag, _redelivered, body in storage.delivered]


def _store_fold(definitions: list[Record], stream: list[Record]) -> list[Record]:
    fold = QueueStreamFold()
    for offset, record in enumerate(stream):
        fold.add(offset, record)
    return [*definitions, *fold.records()]


def test_every_cut_of_the_spill_recovers_every_persistent_message_once() -> None:
    storage, before, bodies = _spilled()
    definitions = storage.streams[DEFINITIONS_STREAM]
    full = storage.streams[STREAM]
    for cut in range(before, len(full) + 1):
        stream = full[:cut]
        streams = {DEFINITIONS_STREAM: definitions, STREAM: stream}
        assert _drain(_store_fold(definitions, stream), streams) == bodies, f"store's fold, cut at {cut}"
        assert _drain([*definitions, *stream], streams) == bodies, f"inline records, cut at {cut}"


def test_the_spill_writes_no_removal_of_the_old_copy() -> None:
    storage, before, _bodies = _spilled()
    assert not [r for r in storage.streams[STREAM][before:] if isinstance(r, MessageRemovedRecord)]


def _message(msg_id: int, body: bytes) -> MessageRecord:
    return MessageRecord("/", "q", msg_id, "", "q", {"delivery_mode": 2}, body)


def test_a_later_copy_moves_the_message_and_an_ack_still_removes_it() -> None:
    fold = QueueStreamFold()
    script: list[Record] = [
        _message(1, b"a"), _message(2, b"b"), _message(3, b"c"),
        _message(2, b"b"), _message(3, b"c"),  # spilled: 2 and 3 move to the end
        _message(4, b"d"),
        MessageRemovedRecord("/", "q", 3),  # acked after a page-in: gone, both copies
        _message(2, b"b"),  # spilled again
    ]
    for offset, record in enumerate(script):
        fold.add(offset, record)
    [index] = fold.records()
    assert isinstance(index, MessageIndexRecord)
    assert index.msg_ids.tolist() == [1, 4, 2] and index.offsets.tolist() == [0, 5, 7]


async def _store_recover(tmp_path: Path, definitions: list[Record], stream: list[Record]) -> list[bytes]:
    """Write the records through a real Store, reopen it, recover a broker and consume everything (page-ins are
    read from the reopened store)."""
    store = Store.open(tmp_path)
    store.persist(1, definitions)
    store.persist(2, stream)
    await store.flush()
    reopened = Store.open(tmp_path)
    records = reopened.recover()
    restarted = Broker(BrokerConfig(queue_messages_in_memory_max=LIMIT))
    delivered: list[bytes] = []
    todo: list[Any] = [*restarted.recover(records), *_client(restarted).consume("q", "c", no_ack=True)]
    while todo:
        follow: list[Any] = []
        delivered.extend(d.body for d in deliveries(todo))
        for effect in todo:
            if isinstance(effect, PageIn):
                read = reopened.pages.read(effect.stream, effect.offsets)
                follow += restarted.on_paged_in(effect.vhost, effect.queue, effect.request_id, read)
        todo = follow
    await reopened.flush()
    return delivered


@pytest.mark.parametrize("inline_max", [store_module.RECOVER_INLINE_RECORDS_MAX, 4])
async def test_a_real_store_cut_after_any_spill_record_recovers_every_message(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inline_max: int) -> None:
    monkeypatch.setattr(store_module, "RECOVER_INLINE_RECORDS_MAX", inline_max)
    storage, before, bodies = _spilled()
    definitions = storage.streams[DEFINITIONS_STREAM]
    full = storage.streams[STREAM]
    for cut in range(before, len(full) + 1):
        delivered = await _store_recover(tmp_path / f"cut{cut}", definitions, full[:cut])
        assert delivered == bodies, f"cut at {cut}"
