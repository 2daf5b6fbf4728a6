"""Compaction bookkeeping of the node's store (store.py): when a stream is truncated behind a snapshot.

Compaction is a small bookkeeping job done here, not a second storage engine: the store counts the records and
bytes of each stream and remembers the live keys (message ids per queue stream, the latest definition per key).
A queue stream with no live message left is truncated with an empty snapshot, but only once it has grown past
`CompactionPolicy.queue_records_min` records or `queue_bytes_min` bytes since its last snapshot, and at most once
per `interval_s` per stream, so a steady drained flow does not write (and fsync) a snapshot every few hundred
messages; disk per drained stream stays bounded by those thresholds. A stream that passed a threshold while the
interval held it back is a candidate, re-checked by the commit loop at least every `interval_s`. The definitions
stream is rewritten as a snapshot of its live records once dead records dominate. A deleted durable queue's stream is truncated the same
way (an empty snapshot, at the end of the batch that deleted it: after its removal records), so a queue re-declared
under the same name keeps what it appends afterwards. Truncation is late (a job after the commit), so the re-declare
does not rely on it: before the QueueRecord of a queue declared anew whose stream exists, `persist` appends a
`QueueStreamStartRecord` to the stream (same batch: the log recovers a prefix of the append order, so the marker is
durable whenever the new definition is), recovery drops every record of the stream before it, and the records before
it are truncated (a snapshot just before it) if nothing had yet.

`StoreCompaction` is the part of `Store` that does this: `_track` keeps the live keys of every record persisted or
recovered, `_plan_compaction` decides per record, `_truncate_doomed` ends a persist batch, and `_schedule_snapshot`
queues the snapshot as a job (`Store.jobs`) for the commit loop. No I/O happens here: the jobs run on a worker
thread after the commit that covers them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import cbor2

from node.broker.records import (
    DEFINITIONS_STREAM,
    BindingRecord,
    ExchangeRecord,
    MessageRecord,
    MessageRemovedRecord,
    PermissionRecord,
    PolicyRecord,
    QueueRecord,
    QueueStreamStartRecord,
    Record,
    TailMessageRecord,
    UserRecord,
    VHostRecord,
    queue_stream,
    to_cbor,
)
from node.runtime.live_ids import LiveIds

COMPACT_DEFINITION_RECORDS_MIN = 4096
EMPTY_SNAPSHOT = cbor2.dumps([])


def definition_key(record: Record) -> tuple[Any, ...]:
    """The identity of a definition: a later record with the same key replaces the earlier one."""
    if isinstance(record, VHostRecord):
        return ("vhost", record.name)
    if isinstance(record, UserRecord):
        return ("user", record.name)
    if isinstance(record, PermissionRecord):
        return ("perm", record.user, record.vhost)
    if isinstance(record, ExchangeRecord):
        return ("exchange", record.vhost, record.name)
    if isinstance(record, QueueRecord):
        return ("queue", record.vhost, record.name)
    if isinstance(record, BindingRecord):
        args = cbor2.dumps(record.arguments, canonical=True)
        return ("binding", record.vhost, record.source, record.dest_kind, record.destination, record.routing_key, args)
    if isinstance(record, PolicyRecord):
        return ("policy", record.vhost, record.name)
    return ("other", id(record))


@dataclass(frozen=True, slots=True)
class CompactionPolicy:
    """When a drained queue stream is truncated by an empty snapshot (a durable file write and two fsyncs)."""

    queue_records_min: int = 100_000  # records appended since the last snapshot, or ...
    queue_bytes_min: int = 64 * 1024 * 1024  # ... payload bytes appended since the last snapshot
    interval_s: float = 10.0  # at most one snapshot per stream per this many seconds


@dataclass(slots=True)
class StreamBook:
    """Per-stream bookkeeping for compaction."""

    records_since_snapshot: int = 0
    bytes_since_snapshot: int = 0
    last_offset: int = -1
    last_snapshot_s: float = float("-inf")
    live_messages: LiveIds = field(default_factory=LiveIds)  # a bitmap: ~1 bit per id, not ~60 bytes
    truncated_through: int = -1  # the offset of the latest snapshot written or planned (-1: none)


class StoreCompaction:
    """The compaction half of `Store` (its attributes are set by `Store.__init__`)."""

    log: Any
    policy: CompactionPolicy
    clock: Callable[[], float]
    books: dict[str, StreamBook]
    candidates: set[str]
    definitions: dict[tuple[Any, ...], Record]
    doomed: dict[str, None]
    jobs: list[Callable[[], None]]

    def _track(self, stream: str, record: Record, book: StreamBook) -> Record:
        cls = type(record)
        if cls is MessageRecord or cls is TailMessageRecord:  # (spilled ones too: live until paged in)
            book.live_messages.add(record.msg_id)  # type: ignore[union-attr]
        elif cls is MessageRemovedRecord:
            book.live_messages.discard(record.msg_id)  # type: ignore[union-attr]
        elif cls is QueueStreamStartRecord:
            book.live_messages.clear()  # what came before was a deleted queue's
        elif stream == DEFINITIONS_STREAM:
            key = definition_key(record)
            if getattr(record, "deleted", False):
                self.definitions.pop(key, None)
            else:
                self.definitions[key] = record
        return record

    def _plan_compaction(self, stream: str, record: Record, book: StreamBook) -> None:
        cls = type(record)
        if cls is MessageRecord or cls is MessageRemovedRecord or cls is TailMessageRecord:
            if not book.live_messages and self._queue_stream_grown(book):
                self._compact_drained(stream, book)
            return
        if isinstance(record, QueueRecord) and record.deleted:
            # Truncate (not delete) the queue's stream, at the end of this batch (its removal records follow the
            # deletion) or just before a re-declared queue's first record, whichever comes first: a queue
            # re-declared under the same name appends to the same stream, and those later records must survive.
            self.doomed[queue_stream(record.vhost, record.name)] = None
            return
        if cls is QueueStreamStartRecord:
            self.doomed.pop(stream, None)
            if book.last_offset - 1 > book.truncated_through:  # the old queue's records: truncate them
                self._schedule_snapshot(stream, book, EMPTY_SNAPSHOT, book.last_offset - 1)
            return
        if stream == DEFINITIONS_STREAM:
            dead = book.records_since_snapshot - len(self.definitions)
            if book.records_since_snapshot >= COMPACT_DEFINITION_RECORDS_MIN and dead > len(self.definitions):
                state = cbor2.dumps([to_cbor(r) for r in self.definitions.values()])
                self._schedule_snapshot(stream, book, state)
        elif not book.live_messages and self._queue_stream_grown(book):
            self._compact_drained(stream, book)

    def _truncate_doomed(self) -> None:
        """End of a persist batch: truncate the streams of the queues it deleted (not declared again in it)."""
        for stream in self.doomed:
            book = self.books.get(stream)
            if book is not None and book.last_offset > book.truncated_through:
                book.live_messages.clear()
                self._schedule_snapshot(stream, book, EMPTY_SNAPSHOT)
        self.doomed.clear()

    def _queue_stream_grown(self, book: StreamBook) -> bool:
        policy = self.policy
        return (book.records_since_snapshot >= policy.queue_records_min
                or book.bytes_since_snapshot >= policy.queue_bytes_min)

    def _compact_drained(self, stream: str, book: StreamBook) -> None:
        """Truncate a drained queue stream now, or make it a candidate while the interval holds it back."""
        if self.clock() - book.last_snapshot_s >= self.policy.interval_s:
            self.candidates.discard(stream)
            self._schedule_snapshot(stream, book, EMPTY_SNAPSHOT)
        else:
            self.candidates.add(stream)

    def _schedule_snapshot(self, stream: str, book: StreamBook, state: bytes, offset: int | None = None) -> None:
        offset = book.last_offset if offset is None else offset
        book.truncated_through = offset
        book.records_since_snapshot = 0
        book.bytes_since_snapshot = 0
        book.last_snapshot_s = self.clock()
        self.jobs.append(lambda: self.log.write_snapshot(stream, offset, state))
