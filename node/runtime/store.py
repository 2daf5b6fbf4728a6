"""Durable storage for one node: the broker's `Persist` effects written through cluster/log's `NodeLog`.

`persist(token, records)` appends each record (cbor2 of `records.to_cbor`) to the stream the record names; the
append is cheap and in memory, on the trio thread. `commit_loop` is the group commit: while tokens are pending it
runs one `NodeLog.commit()` (one fsync for every stream) in a worker thread, then calls `Broker.on_persisted` for
every token that commit covered and dispatches the resulting effects (the publisher confirms). Appends go on while
a commit runs; they are covered by the next one.

Confirms come first: the commit's tokens are reported to the broker in one batch (`on_persisted` per token, the
effects carried out with one `dispatch`, so every connection is flushed once per commit) before any compaction
job runs, and compaction jobs never share a worker-thread hop with the commit the confirms wait for.

Compaction is a small bookkeeping job done here, not a second storage engine: the store counts the records and
bytes of each stream and remembers the live keys (message ids per queue stream, the latest definition per key).
A queue stream with no live message left is truncated with an empty snapshot, but only once it has grown past
`CompactionPolicy.queue_records_min` records or `queue_bytes_min` bytes since its last snapshot, and at most once
per `interval_s` per stream, so a steady drained flow does not write (and fsync) a snapshot every few hundred
messages; disk per drained stream stays bounded by those thresholds. A stream that passed a threshold while the
interval held it back is a candidate, re-checked by the commit loop at least every `interval_s`. The definitions
stream is rewritten as a snapshot of its live records once dead records dominate. A deleted durable queue's stream is truncated the same
way (an empty snapshot), so a queue re-declared under the same name keeps what it appends afterwards.
Recovery reads every stream back (snapshot first, then the entries after it) for `Broker.recover`.
"""

from __future__ import annotations

import logging
import time
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

COMPACT_DEFINITION_RECORDS_MIN = 4096
DISK_FULL_RETRY_S = 1.0
PENDING_TOKENS_MAX = 1_000_000  # a bound on bookkeeping; far above what a healthy disk ever accumulates
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
    return ("other", id(record))


def encode(record: Record) -> bytes:
    return cbor2.dumps(to_cbor(record))


def decode(payload: bytes) -> Record:
    return from_cbor(cbor2.loads(payload))


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
    live_messages: set[int] = field(default_factory=set)


class Store:
    """Wraps a NodeLog; all methods except the thread jobs run on the trio thread."""

    def __init__(self, node_log: Any, policy: CompactionPolicy | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.log = node_log
        self.policy = policy or CompactionPolicy()
        self.clock = clock
        self.pending_tokens: list[int] = []
        self.books: dict[str, StreamBook] = {}
        self.candidates: set[str] = set()  # drained streams past a threshold, held back by the interval
        self.definitions: dict[tuple[Any, ...], Record] = {}
        self.jobs: list[Callable[[], None]] = []
        self._wake = trio.Event()
        self.commits = 0
        self.closed = False

    @classmethod
    def open(cls, directory: Path, policy: CompactionPolicy | None = None) -> Store:
        from cluster.log import NodeLog  # imported here so `raftmq node --help` stays cheap

        directory.mkdir(parents=True, exist_ok=True)
        return cls(NodeLog.open(directory), policy)

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
                book.bytes_since_snapshot += len(payload)
        return records

    # ---------------------------------------------------------------------------------------- writing
    def persist(self, token: int, records: Iterable[Record]) -> None:
        books = self.books
        append = self.log.append
        for record in records:
            stream = record.stream
            book = books.get(stream)
            if book is None:
                book = books[stream] = StreamBook()
            payload = encode(record)
            book.last_offset = append(stream, payload)
            book.records_since_snapshot += 1
            book.bytes_since_snapshot += len(payload)
            self._track(stream, record, book)
            self._plan_compaction(stream, record, book)
        if len(self.pending_tokens) >= PENDING_TOKENS_MAX:
            log.error("store: %d tokens pending; storage is not keeping up", len(self.pending_tokens))
        self.pending_tokens.append(token)
        self._wake.set()

    def _track(self, stream: str, record: Record, book: StreamBook) -> Record:
        cls = type(record)
        if cls is MessageRecord:
            book.live_messages.add(record.msg_id)  # type: ignore[union-attr]
        elif cls is MessageRemovedRecord:
            book.live_messages.discard(record.msg_id)  # type: ignore[union-attr]
        elif stream == DEFINITIONS_STREAM:
            key = definition_key(record)
            if getattr(record, "deleted", False):
                self.definitions.pop(key, None)
            else:
                self.definitions[key] = record
        return record

    def _plan_compaction(self, stream: str, record: Record, book: StreamBook) -> None:
        cls = type(record)
        if cls is MessageRecord or cls is MessageRemovedRecord:
            if not book.live_messages and self._queue_stream_grown(book):
                self._compact_drained(stream, book)
            return
        if isinstance(record, QueueRecord) and record.deleted:
            # Truncate (not delete) the queue's stream: a queue re-declared under the same name before the
            # job runs appends to the same stream, and those later records must survive.
            doomed = self.books.get(queue_stream(record.vhost, record.name))
            if doomed is not None and doomed.last_offset >= 0:
                doomed.live_messages.clear()
                self._schedule_snapshot(queue_stream(record.vhost, record.name), doomed, EMPTY_SNAPSHOT)
            return
        if stream == DEFINITIONS_STREAM:
            dead = book.records_since_snapshot - len(self.definitions)
            if book.records_since_snapshot >= COMPACT_DEFINITION_RECORDS_MIN and dead > len(self.definitions):
                state = cbor2.dumps([to_cbor(r) for r in self.definitions.values()])
                self._schedule_snapshot(stream, book, state)
        elif not book.live_messages and self._queue_stream_grown(book):
            self._compact_drained(stream, book)

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

    def sweep_candidates(self) -> None:
        """Compact the candidates that are drained and whose interval has passed (the commit loop calls this)."""
        for stream in list(self.candidates):
            book = self.books.get(stream)
            if book is None or not self._queue_stream_grown(book):
                self.candidates.discard(stream)
            elif not book.live_messages:
                self._compact_drained(stream, book)
        if self.jobs:
            self._wake.set()

    def _schedule_snapshot(self, stream: str, book: StreamBook, state: bytes) -> None:
        offset = book.last_offset
        book.records_since_snapshot = 0
        book.bytes_since_snapshot = 0
        book.last_snapshot_s = self.clock()
        self.jobs.append(lambda: self.log.write_snapshot(stream, offset, state))

    # ----------------------------------------------------------------------------------- group commit
    def _run_jobs(self, jobs: list[Callable[[], None]]) -> None:
        """Worker thread: compaction jobs (each covered by an earlier commit: they were planned before it)."""
        for job in jobs:
            try:
                job()
            except Exception:
                log.exception("store: compaction job failed")

    async def commit_once(self) -> list[int]:
        """One commit (one fsync) for every append so far; returns the tokens it made durable."""
        tokens, self.pending_tokens = self.pending_tokens, []
        try:
            await trio.to_thread.run_sync(self.log.commit)
        except BaseException:
            self.pending_tokens[:0] = tokens  # not durable: they wait for the next successful commit
            raise
        self.commits += 1
        return tokens

    async def run_jobs(self, jobs: list[Callable[[], None]]) -> None:
        """Run compaction jobs that a finished commit covers (they were planned before it started)."""
        if jobs:
            await trio.to_thread.run_sync(self._run_jobs, jobs)

    async def commit_loop(self, node: Any) -> None:
        """Group commit until cancelled. A full disk keeps the tokens pending (no confirms) and retries.

        While a commit is in flight, appends accumulate; the next iteration covers all of them with one fsync.
        Confirms of one commit are carried out as one batch before compaction jobs run."""
        from cluster.log import DiskFullError

        while True:
            with trio.move_on_after(self.policy.interval_s):
                await self._wake.wait()
            self._wake = trio.Event()
            if self.candidates:
                self.sweep_candidates()
            if not self.pending_tokens and not self.jobs:
                continue
            jobs, self.jobs = self.jobs, []
            try:
                tokens = await self.commit_once()
            except DiskFullError as exc:
                self.jobs[:0] = jobs
                log.error("store: disk full (%s); retrying in %.1f s", exc, DISK_FULL_RETRY_S)
                self._wake.set()
                await trio.sleep(DISK_FULL_RETRY_S)
                continue
            except BaseException:
                self.jobs[:0] = jobs
                raise
            if tokens:
                self._report(node, tokens)
            await self.run_jobs(jobs)

    @staticmethod
    def _report(node: Any, tokens: list[int]) -> None:
        """The tokens of one commit to the broker together (`on_persisted_many` when it has it: a channel's
        confirms become one multiple ack), the resulting effects carried out as one batch."""
        broker = node.broker
        on_persisted_many = getattr(broker, "on_persisted_many", None)
        if on_persisted_many is not None:
            node.dispatch(on_persisted_many(tokens))
            return
        effects: list[Any] = []
        for token in tokens:
            effects.extend(broker.on_persisted(token))
        node.dispatch(effects)

    async def flush(self) -> None:
        """Shutdown: commit what is pending and close the log (shielded: it must finish)."""
        if self.closed:
            return
        with trio.CancelScope(shield=True):
            jobs, self.jobs = self.jobs, []
            await self.commit_once()
            await self.run_jobs(jobs)
            await trio.to_thread.run_sync(self.log.close)
        self.closed = True
