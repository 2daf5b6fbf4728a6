"""Regression: a durable queue deleted and re-declared under the same name never gets the old queue's messages back.

A classic durable queue keeps its persistent messages in its own log stream ("queue:<vhost>:<name>"), which a
re-declared queue of the same name shares. Deleting the queue truncates that stream only later (a snapshot job
after the commit), so a kill -9 can leave the old queue's records on disk. These tests build the on-disk state of
every crash point of one scenario (declare, publish, delete, re-declare, publish) and recover it, twice:

1. The scenario runs through a real `Store` whose log only records what it is asked to append (and the
   truncation snapshots it plans). Each crash point is a prefix of that append order (the node log recovers a
   prefix: one WAL, replayed in order; a kill -9 keeps what was written), with or without the snapshot jobs
   that could have run by then; it is written to a real `NodeLog` on disk.
2. Recover (`Store.recover`, `Broker.recover`) and check: the queue is absent, or it is the old queue with a
   prefix of its messages (its delete was not durable), or the new queue with a prefix of the new messages.
   Never a mix, never a partly deleted old queue.
3. Then, on that recovered node, a client declares the queue again and publishes more; recover once more: exactly
   what phase 2 saw, plus the new messages. A record of the old queue left on disk must not come back here.

Run with and without paging (a tail of `TailMessageRecord`s, recovered as an index) and with the store's inline
limit lowered, so that both recovery folds (inline records and `QueueStreamFold`) see every state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import node.amqp.methods as m
from cluster.log import NodeLog
from node.broker.broker import Broker, BrokerConfig
from node.broker.effects import PageIn, Persist
from node.runtime import store as store_module
from node.runtime.store import Store
from tests.broker.harness import Client, deliveries

OLD = [f"old{n}".encode() for n in range(4)]
NEW = [f"new{n}".encode() for n in range(3)]
AFTER = [f"after{n}".encode() for n in range(2)]


@dataclass
class RecordingLog:
    """A NodeLog stand-in: remembers the global append order and the snapshots the store plans."""

    appended: list[tuple[str, bytes]] = field(default_factory=list)
    ends: dict[str, int] = field(default_factory=dict)
    snapshots: list[tuple[int, str, int, bytes]] = field(default_factory=list)  # (appended so far, stream, ...)

    def append_many(self, items: list[tuple[str, bytes]], timestamp_ms: int = 0) -> list[int]:
        offsets = []
        for stream, payload in items:
            offsets.append(self.ends.get(stream, 0))
            self.ends[stream] = offsets[-1] + 1
            self.appended.append((stream, payload))
        return offsets

    def append_run(self, stream: str, payloads: list[bytes], timestamp_ms: int = 0) -> int:
        """NodeLog.append_run: one stream's payloads in order; the first one's offset."""
        first = self.ends.get(stream, 0)
        self.append_many([(stream, payload) for payload in payloads])
        return first

    def write_snapshot(self, stream: str, offset: int, state: bytes) -> None:
        self.snapshots.append((len(self.appended), stream, offset, state))


def _run(broker: Broker, store: Store, effects: list[Any]) -> list[Any]:
    """Carry out Persist effects through `store` (confirmed at once) and PageIns from its log; returns every
    effect seen."""
    seen: list[Any] = []
    todo = list(effects)
    while todo:
        seen.extend(todo)
        follow: list[Any] = []
        for effect in todo:
            if isinstance(effect, Persist):
                store.persist(effect.token, effect.records)
                follow += broker.on_persisted(effect.token)
            elif isinstance(effect, PageIn):
                records = store.pages.read(effect.stream, effect.offsets)
                follow += broker.on_paged_in(effect.vhost, effect.queue, effect.request_id, records)
        offsets, store.pages.offsets = store.pages.offsets, []
        if offsets:
            follow += broker.on_tail_offsets(offsets)
        todo = follow
    return seen


def _run_jobs(store: Store) -> None:
    jobs, store.jobs = store.jobs, []
    for job in jobs:
        job()


def _scenario(limit: int) -> RecordingLog:
    log = RecordingLog()
    store = Store(log)
    broker = Broker(BrokerConfig(queue_messages_in_memory_max=limit))
    client = Client(broker)
    steps: list[Any] = [lambda: client.open(1), lambda: client.declare("q", durable=True)]
    steps += [lambda body=body: client.publish("", "q", body, delivery_mode=2) for body in OLD]
    steps += [lambda: client.call(m.QueueDelete(queue="q")), lambda: client.declare("q", durable=True)]
    steps += [lambda body=body: client.publish("", "q", body, delivery_mode=2) for body in NEW]
    for step in steps:
        _run(broker, store, step())
        _run_jobs(store)
    return log


def _write_crash_state(directory: Path, log: RecordingLog, cut: int, with_jobs: bool) -> None:
    node_log = NodeLog.open(directory)
    for stream, payload in log.appended[:cut]:
        node_log.append(stream, payload)
    node_log.commit()
    if with_jobs:
        for planned_at, stream, offset, state in log.snapshots:
            if planned_at <= cut:
                node_log.write_snapshot(stream, offset, state)
    node_log.close()


def _peek(directory: Path, limit: int) -> list[bytes] | None:
    """Every message of "q" as a fresh recovery of `directory` sees it (consumed no-ack, nothing written), or
    None if the queue does not exist."""
    store = Store.open(directory)
    try:
        broker = Broker(BrokerConfig(queue_messages_in_memory_max=limit))
        client = Client(broker)
        client.open(1)
        todo = broker.recover(store.recover())
        if "q" not in broker.vhosts["/"].queues:
            return None
        todo += client.consume("q", "c", no_ack=True)
        bodies: list[bytes] = []
        while todo:
            bodies.extend(d.body for d in deliveries(todo))
            follow: list[Any] = []
            for effect in todo:
                if isinstance(effect, PageIn):
                    read = store.pages.read(effect.stream, effect.offsets)
                    follow += broker.on_paged_in(effect.vhost, effect.queue, effect.request_id, read)
            todo = follow
        return bodies
    finally:
        store.log.close()


def _check_first_recovery(found: list[bytes] | None, cut_has_delete: bool, cut: int) -> None:
    if found is None:
        return
    if cut_has_delete:
        assert found == NEW[:len(found)], f"cut {cut}: after the delete only the new queue may exist: {found}"
    else:
        assert found == OLD[:len(found)], f"cut {cut}: before the delete the old queue is whole: {found}"


def _delete_position(log: RecordingLog) -> int:
    """Index (in the append order) just past the old queue's deletion record."""
    from node.broker.records import QueueRecord
    from node.runtime.store import decode

    for index, (_stream, payload) in enumerate(log.appended):
        record = decode(payload)
        if isinstance(record, QueueRecord) and record.deleted:
            return index + 1
    raise AssertionError("no deletion record")


@pytest.mark.parametrize(("limit", "inline_max"), [(10_000, store_module.RECOVER_INLINE_RECORDS_MAX), (2, 3)],
                         ids=["in-memory", "paged-index"])
async def test_no_crash_point_of_delete_and_redeclare_resurrects_old_messages(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, limit: int, inline_max: int) -> None:
    monkeypatch.setattr(store_module, "RECOVER_INLINE_RECORDS_MAX", inline_max)
    log = _scenario(limit)
    deleted_at = _delete_position(log)
    for cut in range(len(log.appended) + 1):
        for with_jobs in (False, True):
            directory = tmp_path / f"cut{cut}-{with_jobs}"
            _write_crash_state(directory, log, cut, with_jobs)
            found = _peek(directory, limit)
            _check_first_recovery(found, cut >= deleted_at, cut)
            # the recovered node lives on: the queue is declared again (a no-op if it exists), more is published
            store = Store.open(directory)
            broker = Broker(BrokerConfig(queue_messages_in_memory_max=limit))
            _run(broker, store, broker.recover(store.recover()))
            client = Client(broker)
            _run(broker, store, client.open(1))
            _run(broker, store, client.declare("q", durable=True))
            for body in AFTER:
                _run(broker, store, client.publish("", "q", body, delivery_mode=2))
            await store.flush()
            again = _peek(directory, limit)
            assert again == [*(found or []), *AFTER], f"cut {cut} (snapshot jobs run: {with_jobs}): {again}"



def test_broker_recovery_drops_what_precedes_a_stream_start() -> None:
    """`Broker.recover`'s own fold honours the marker too (records straight from the streams, as a store that
    returns every record would)."""
    from node.broker.records import MessageRecord, QueueRecord, QueueStreamStartRecord, Record

    def message(msg_id: int, body: bytes) -> MessageRecord:
        return MessageRecord("/", "q", msg_id, "", "q", {"delivery_mode": 2}, body)

    records: list[Record] = [QueueRecord("/", "q"), QueueRecord("/", "q", deleted=True), QueueRecord("/", "q"),
                             message(1, b"old1"), message(2, b"old2"), QueueStreamStartRecord("/", "q"),
                             message(1, b"new1")]
    broker = Broker(BrokerConfig())
    client = Client(broker)
    client.open(1)
    broker.recover(records)
    assert [d.body for d in deliveries(client.consume("q", "c", no_ack=True))] == [b"new1"]
