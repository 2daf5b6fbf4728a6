"""Durable storage for one node: the broker's `Persist` effects written through cluster/log's `NodeLog`.

`persist(token, records)` appends each record (cbor2 of `records.to_cbor`) to the stream the record names; the
append is cheap and in memory, on the trio thread. `commit_loop` is the group commit: while tokens are pending it
runs one `NodeLog.commit()` (one fsync for every stream) in a worker thread, then calls `Broker.on_persisted` for
every token that commit covered and dispatches the resulting effects (the publisher confirms). Appends go on while
a commit runs; they are covered by the next one.

Compaction is a small bookkeeping job done here, not a second storage engine: the store counts the records of
each stream and remembers the live keys (message ids per queue stream, the latest definition per key). A queue
stream with no live message left is truncated with an empty snapshot; the definitions stream is rewritten as a
snapshot of its live records once dead records dominate. A deleted durable queue's stream is truncated the same
way (an empty snapshot), so a queue re-declared under the same name keeps what it appends afterwards.
Recovery reads every stream back (snapshot first, then the entries after it) for `Broker.recover`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cbor2
import trio

from node.broker.records import (
    DEFINITIONS_STREAM,
    BindingRecord,
    ExchangeRecord,
    MessageRecord,
    MessageRemovedRecord,
    PermissionRecord,
    QueueRecord,
    Record,
    UserRecord,
    VHostRecord,
    from_cbor,
    queue_stream,
    to_cbor,
)

log = logging.getLogger("raftmq.store")

COMPACT_QUEUE_RECORDS_MIN = 256  # don't snapshot a drained queue stream for fewer dead records than this
COMPACT_DEFINITION_RECORDS_MIN = 4096
DISK_FULL_RETRY_S = 1.0
PENDING_TOKENS_MAX = 1_000_000  # a bound on bookkeeping; far above what a healthy disk ever accumulates


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
    return ("other", id(record))


def encode(record: Record) -> bytes:
    return cbor2.dumps(to_cbor(record))


def decode(payload: bytes) -> Record:
    return from_cbor(cbor2.loads(payload))


@dataclass(slots=True)
class StreamBook:
    """Per-stream bookkeeping for compaction."""

    records_since_snapshot: int = 0
    last_offset: int = -1
    live_messages: set[int] = field(default_factory=set)


class Store:
    """Wraps a NodeLog; all methods except the thread jobs run on the trio thread."""

    def __init__(self, node_log: Any) -> None:
        self.log = node_log
        self.pending_tokens: list[int] = []
        self.books: dict[str, StreamBook] = {}
        self.definitions: dict[tuple[Any, ...], Record] = {}
        self.jobs: list[Callable[[], None]] = []
        self._wake = trio.Event()
        self.commits = 0
        self.closed = False

    @classmethod
    def open(cls, directory: Path) -> Store:
        from cluster.log import NodeLog  # imported here so `raftmq node --help` stays cheap

        directory.mkdir(parents=True, exist_ok=True)
        return cls(NodeLog.open(directory))

    # --------------------------------------------------------------------------------------- recovery
    def recover(self) -> list[Record]:
        """Every record of every stream, definitions first; also primes the compaction bookkeeping."""
        streams = sorted(self.log.streams(), key=lambda name: name != DEFINITIONS_STREAM)
        records: list[Record] = []
        for stream in streams:
            book = self.books.setdefault(stream, StreamBook())
            snapshot, entries = self.log.read(stream)
            if snapshot is not None:
                for item in cbor2.loads(snapshot):
                    records.append(self._track(stream, from_cbor(item), book))
            for offset, payload in entries:
                records.append(self._track(stream, decode(payload), book))
                book.last_offset = offset
                book.records_since_snapshot += 1
        return records

    # ---------------------------------------------------------------------------------------- writing
    def persist(self, token: int, records: Iterable[Record]) -> None:
        for record in records:
            stream = record.stream
            book = self.books.setdefault(stream, StreamBook())
            book.last_offset = self.log.append(stream, encode(record))
            book.records_since_snapshot += 1
            self._track(stream, record, book)
            self._plan_compaction(stream, record, book)
        if len(self.pending_tokens) >= PENDING_TOKENS_MAX:
            log.error("store: %d tokens pending; storage is not keeping up", len(self.pending_tokens))
        self.pending_tokens.append(token)
        self._wake.set()

    def _track(self, stream: str, record: Record, book: StreamBook) -> Record:
        if isinstance(record, MessageRecord):
            book.live_messages.add(record.msg_id)
        elif isinstance(record, MessageRemovedRecord):
            book.live_messages.discard(record.msg_id)
        elif stream == DEFINITIONS_STREAM:
            key = definition_key(record)
            if getattr(record, "deleted", False):
                self.definitions.pop(key, None)
            else:
                self.definitions[key] = record
        return record

    def _plan_compaction(self, stream: str, record: Record, book: StreamBook) -> None:
        if isinstance(record, QueueRecord) and record.deleted:
            # Truncate (not delete) the queue's stream: a queue re-declared under the same name before the
            # job runs appends to the same stream, and those later records must survive.
            doomed = self.books.get(queue_stream(record.vhost, record.name))
            if doomed is not None and doomed.last_offset >= 0:
                doomed.live_messages.clear()
                self._schedule_snapshot(queue_stream(record.vhost, record.name), doomed, cbor2.dumps([]))
            return
        if stream == DEFINITIONS_STREAM:
            dead = book.records_since_snapshot - len(self.definitions)
            if book.records_since_snapshot >= COMPACT_DEFINITION_RECORDS_MIN and dead > len(self.definitions):
                state = cbor2.dumps([to_cbor(r) for r in self.definitions.values()])
                self._schedule_snapshot(stream, book, state)
        elif not book.live_messages and book.records_since_snapshot >= COMPACT_QUEUE_RECORDS_MIN:
            self._schedule_snapshot(stream, book, cbor2.dumps([]))

    def _schedule_snapshot(self, stream: str, book: StreamBook, state: bytes) -> None:
        offset = book.last_offset
        book.records_since_snapshot = 0
        self.jobs.append(lambda: self.log.write_snapshot(stream, offset, state))

    # ----------------------------------------------------------------------------------- group commit
    def _commit_and_compact(self, jobs: list[Callable[[], None]]) -> None:
        """Worker thread: one fsync for everything appended so far, then the compaction jobs it allows."""
        self.log.commit()
        for job in jobs:
            try:
                job()
            except Exception:
                log.exception("store: compaction job failed")

    async def commit_once(self) -> list[int]:
        tokens, self.pending_tokens = self.pending_tokens, []
        jobs, self.jobs = self.jobs, []
        try:
            await trio.to_thread.run_sync(self._commit_and_compact, jobs)
        except BaseException:
            self.pending_tokens[:0] = tokens  # not durable: they wait for the next successful commit
            self.jobs[:0] = jobs
            raise
        self.commits += 1
        return tokens

    async def commit_loop(self, node: Any) -> None:
        """Group commit until cancelled. A full disk keeps the tokens pending (no confirms) and retries."""
        from cluster.log import DiskFullError

        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            if not self.pending_tokens and not self.jobs:
                continue
            try:
                tokens = await self.commit_once()
            except DiskFullError as exc:
                log.error("store: disk full (%s); retrying in %.1f s", exc, DISK_FULL_RETRY_S)
                self._wake.set()
                await trio.sleep(DISK_FULL_RETRY_S)
                continue
            for token in tokens:
                node.dispatch(node.broker.on_persisted(token))

    async def flush(self) -> None:
        """Shutdown: commit what is pending and close the log (shielded: it must finish)."""
        if self.closed:
            return
        with trio.CancelScope(shield=True):
            await self.commit_once()
            await trio.to_thread.run_sync(self.log.close)
        self.closed = True
