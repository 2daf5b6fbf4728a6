"""Durable storage for one node: the broker's `Persist` effects written through cluster/log's `NodeLog`.

`persist(token, records)` appends each record (cbor2 of `records.to_cbor`, `records.encode_record`) to the stream
the record names, the whole batch with one `NodeLog.append_many`; the append is cheap and in memory, on the trio
thread. A batch of message records only (publishes and acks, the hot path) goes by runs instead: each run of one
record type in one queue stream is one `NodeLog.append_run`, and a run of two or more removals (a multiple ack) is
written as one `MessagesRemovedRecord`, which recovery expands back into the removals it stands for (compaction
counts it as that many records). `commit_loop` is the group commit: while tokens are pending it runs one `NodeLog.commit()` (one fsync for
every stream) on the store's long-lived commit thread, then calls `Broker.on_persisted` for
every token that commit covered and dispatches the resulting effects (the publisher confirms, and the definition
replies the broker held: node/broker/reply_gate.py). Appends go on while a commit runs; they are covered by the next
one. `wait_durable()` waits until a commit covered every earlier `persist` (the management API's changes).

Confirms come first: the commit's tokens are reported to the broker in one batch (`on_persisted` per token, the
effects carried out with one `dispatch`, so every connection is flushed once per commit) before any compaction
job runs, and compaction jobs never share a worker-thread hop with the commit the confirms wait for.

Compaction (store_compaction.py, which `Store` builds on) keeps each stream's disk bounded: drained queue streams
and deleted queues' streams are truncated with an empty snapshot, the definitions stream rewritten as a snapshot
of its live records; the snapshots are jobs the commit loop runs after the commit that covers them, and
`sweep_candidates` re-checks, at least every `interval_s`, the drained streams the interval held back.
Recovery reads every stream back (snapshot first, then the entries after it) for `Broker.recover`.

Test-only modes (settings `test_unsafe_confirm_before_fsync` and `test_drop_unsynced_on_kill`; never for
production, the node logs a WARNING at start when either is on), so that the chaos tests can show that the fsync
discipline is what keeps confirmed messages, and that the checker catches it when it is broken:

- Unsafe confirm before fsync: a task beside the commit loop reports each token to the broker (the publisher
  confirms leave) as soon as its records are appended, in memory, before the commit that writes and fsyncs
  them; the commit loop then reports nothing. A kill -9 then loses confirmed messages: those still in memory,
  and (with the drop mode below) those written but not yet fsynced.
- Drop unsynced writes on kill (node/runtime/synced_sizes.py): a SIGKILL does not lose what the process wrote
  (the OS page cache keeps it), so a plain kill -9 never tests the fsyncs. In this mode the store durably records
  the size of every append-only file of the log after every successful `NodeLog.commit()` (and after every
  compaction job batch, and once right after `NodeLog.open`), and the next start cuts every recorded file that
  has grown back to its recorded size before `NodeLog.open`: what a power loss would have left.
- A slow disk (`test_fsync_delay_ms`): each commit writes its batch (WAL and segments, plain writes), sleeps, then
  fsyncs (what is appended during the sleep is written and fsynced by that same commit). On this kind of
  machine an fsync takes well under a millisecond, so without it the window in which written data is not yet
  durable is too short for a kill -9 from a test to land in reliably; with it, kill -9 nearly always finds
  written-but-unsynced records for the drop mode to discard (and, in the unsafe mode, confirmed ones).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import cbor2
import trio

from cluster.raft.runtime.sync_thread import SyncThread
from node.broker.records import (
    DEFINITIONS_STREAM,
    MessageRecord,
    MessageRemovedRecord,
    MessagesRemovedRecord,
    QueueRecord,
    QueueStreamStartRecord,
    Record,
    TailMessageRecord,
    encode_record,
    encode_removed_many,
    encode_removed_run,
    from_cbor,
    queue_stream,
)
from node.runtime.paging_io import PageReader, QueueStreamFold
from node.runtime.store_compaction import CompactionPolicy, StoreCompaction, StreamBook, definition_key
from node.runtime.synced_sizes import SYNCED_SIZES_FILE, drop_unsynced, record_synced_sizes

log = logging.getLogger("raftmq.store")

RECOVER_INLINE_RECORDS_MAX = 20_000  # a longer queue stream is recovered as an index of offsets (paging)
DISK_FULL_RETRY_S = 1.0
PENDING_TOKENS_MAX = 1_000_000  # a bound on bookkeeping; far above what a healthy disk ever accumulates
_MESSAGE_RECORD_TYPES = frozenset({MessageRecord, MessageRemovedRecord})  # Store.persist's per-message path


def encode(record: Record) -> bytes:
    return encode_record(record)  # cbor2.dumps(to_cbor(record)), with a fast path for message records


def decode(payload: bytes) -> Record:
    return from_cbor(cbor2.loads(payload))


class Store(StoreCompaction):
    """Wraps a NodeLog; all methods except the thread jobs run on the trio thread."""

    def __init__(self, node_log: Any, policy: CompactionPolicy | None = None,
                 clock: Callable[[], float] = time.monotonic, *, unsafe_confirm_before_fsync: bool = False,
                 synced_sizes_directory: Path | None = None, fsync_delay_s: float = 0.0) -> None:
        self.log = node_log
        self.fsync_delay_s = fsync_delay_s  # test only (a slow disk): see the module docstring
        self.unsafe_confirm_before_fsync = unsafe_confirm_before_fsync  # test only: see the module docstring
        self.synced_sizes_directory = synced_sizes_directory  # test only (drop unsynced on kill): where to record
        self.policy = policy or CompactionPolicy()
        self.clock = clock
        self.pending_tokens: list[int] = []
        self.books: dict[str, StreamBook] = {}
        self.candidates: set[str] = set()  # drained streams past a threshold, held back by the interval
        self.definitions: dict[tuple[Any, ...], Record] = {}
        self.doomed: dict[str, None] = {}  # streams of queues deleted in the batch being persisted
        self.jobs: list[Callable[[], None]] = []
        self._wake = trio.Event()
        self.unsafe_tokens: list[int] = []  # test only: appended, not yet reported (unsafe confirm mode)
        self._unsafe_wake = trio.Event()
        self.commits = 0
        self.appended = 0  # persist calls so far (wait_durable's measure)
        self.durable_through = 0  # `appended` as of the start of the latest finished commit
        self._durable_changed = trio.Event()
        self.closed = False
        self._commit_thread: SyncThread | None = None  # the group commit's worker (commit_once)
        self.pages = PageReader(node_log)  # single-node paging: offsets to report, PageIn reads

    @classmethod
    def open(cls, directory: Path, policy: CompactionPolicy | None = None, *,
             unsafe_confirm_before_fsync: bool = False, drop_unsynced_on_kill: bool = False,
             fsync_delay_s: float = 0.0) -> Store:
        from cluster.log import NodeLog  # imported here so `raftmq node --help` stays cheap

        directory.mkdir(parents=True, exist_ok=True)
        if drop_unsynced_on_kill:
            dropped = drop_unsynced(directory)
            log.warning("store: test_drop_unsynced_on_kill: dropped %d bytes written after the last fsync", dropped)
        else:
            (directory / SYNCED_SIZES_FILE).unlink(missing_ok=True)  # never apply a stale record later
        store = cls(NodeLog.open(directory), policy, unsafe_confirm_before_fsync=unsafe_confirm_before_fsync,
                    synced_sizes_directory=directory if drop_unsynced_on_kill else None, fsync_delay_s=fsync_delay_s)
        store._record_synced_sizes()  # open checkpointed: everything on disk now is durable
        return store

    def _record_synced_sizes(self) -> None:
        if self.synced_sizes_directory is not None:
            record_synced_sizes(self.synced_sizes_directory)

    def _commit_and_record(self) -> None:
        """Worker thread: one commit, then (drop-unsynced test mode) the sizes that fsync covered."""
        if self.fsync_delay_s > 0:  # test only: write the batch now (no fsync), fsync it after the delay
            self.log._write_pending()
            time.sleep(self.fsync_delay_s)
        self.log.commit()
        self._record_synced_sizes()

    # --------------------------------------------------------------------------------------- recovery
    def recover(self) -> list[Record]:
        """Every record of every stream, definitions first; also primes the compaction bookkeeping.

        A queue stream longer than `RECOVER_INLINE_RECORDS_MAX` records is not returned record by record: its live
        messages come as one `MessageIndexRecord` (ids and offsets; the broker pages the bodies in), so a backlog of
        millions is never decoded into memory at once (paging_io.QueueStreamFold)."""
        streams = sorted(self.log.streams(), key=lambda name: name != DEFINITIONS_STREAM)
        records: list[Record] = []
        for stream in streams:
            book = self.books.setdefault(stream, StreamBook())
            book.truncated_through = self.log.snapshot_offset(stream)
            snapshot, entries = self.log.read(stream)
            if snapshot is not None:
                for item in cbor2.loads(snapshot):
                    records.append(self._track(stream, from_cbor(item), book))
            inline: list[tuple[int, Record]] = []
            fold: QueueStreamFold | None = None
            for offset, payload in entries:
                decoded = decode(payload)
                book.last_offset = offset
                book.bytes_since_snapshot += len(payload)
                for record in (decoded.expand() if type(decoded) is MessagesRemovedRecord else (decoded,)):
                    self._track(stream, record, book)
                    if type(record) is MessageRecord and record.properties.get("delivery_mode") != 2:
                        book.live_messages.discard(record.msg_id)  # spilled by paging before the restart: dead now
                    book.records_since_snapshot += 1
                    if type(record) is QueueStreamStartRecord:  # a re-declared queue: the old one's records are dead
                        inline, fold = [], None
                    if fold is not None:
                        fold.add(offset, record)
                        continue
                    inline.append((offset, record))
                    if len(inline) > RECOVER_INLINE_RECORDS_MAX and stream.startswith("queue:"):
                        fold = QueueStreamFold()
                        for early_offset, early in inline:
                            fold.add(early_offset, early)
                        inline = []
            if fold is None:
                records.extend(record for _offset, record in inline)
            else:
                records.extend(fold.records())
        return records

    # ---------------------------------------------------------------------------------------- writing
    def persist(self, token: int, records: Iterable[Record]) -> None:
        """Append the records (one `NodeLog.append_many` for the whole batch) and queue the token for the next
        commit. The two per-message records (MessageRecord, MessageRemovedRecord) take an inlined path."""
        batch = records if isinstance(records, (list, tuple)) else list(records)
        if self.doomed:
            self.doomed.clear()  # (left by a batch that raised half-way: its truncation is only skipped)
        if _MESSAGE_RECORD_TYPES.issuperset(map(type, batch)):  # (C-level scan) publishes and acks only
            self._persist_message_runs(batch)
        else:
            self._persist_records(batch)
        if len(self.pending_tokens) >= PENDING_TOKENS_MAX:
            log.error("store: %d tokens pending; storage is not keeping up", len(self.pending_tokens))
        self.pending_tokens.append(token)
        self.appended += 1
        self._wake.set()
        if self.unsafe_confirm_before_fsync:
            self.unsafe_tokens.append(token)
            self._unsafe_wake.set()

    def _persist_message_runs(self, batch: list[Any] | tuple[Any, ...]) -> None:
        """The per-message path (a batch of MessageRecords and MessageRemovedRecords only): each run of one record
        type in one queue's stream is encoded and appended at once (`NodeLog.append_run`) and counted in its
        book at once, with exactly the bookkeeping `_persist_records` does record by record."""
        runs: list[tuple[type, str, str, list[Any]]] = []
        last_cls: type | None = None
        last_vhost = last_queue = ""
        members: list[Any] = []
        for record in batch:
            cls = type(record)
            if cls is not last_cls or record.queue != last_queue or record.vhost != last_vhost:
                last_cls, last_vhost, last_queue = cls, record.vhost, record.queue
                members = []
                runs.append((cls, last_vhost, last_queue, members))
            members.append(record)
        books = self.books
        append_run = self.log.append_run
        for cls, vhost, queue, members in runs:
            stream = queue_stream(vhost, queue)
            book = books.get(stream)
            if book is None:
                book = books[stream] = StreamBook()
            msg_ids = [record.msg_id for record in members]
            if cls is MessageRecord:
                payloads = [encode_record(record) for record in members]
                first = append_run(stream, payloads)
                book.last_offset = first + len(payloads) - 1
                book.records_since_snapshot += len(payloads)
                book.bytes_since_snapshot += sum(map(len, payloads))
                add = book.live_messages.add  # live now, so never a drained stream to compact
                for msg_id in msg_ids:
                    add(msg_id)
            elif len(msg_ids) == 1:
                payloads = encode_removed_run(vhost, queue, msg_ids)
                self._note_removals(stream, book, msg_ids, payloads, append_run(stream, payloads))
            else:  # a run of removals (a multiple ack): one MessagesRemovedRecord
                payload = encode_removed_many(vhost, queue, msg_ids)
                offset = append_run(stream, [payload])
                live = book.live_messages
                discard = live.discard
                for msg_id in msg_ids:
                    discard(msg_id)
                book.last_offset = offset
                book.records_since_snapshot += len(msg_ids)  # (counted as the removals it stands for)
                book.bytes_since_snapshot += len(payload)
                if not live and self._queue_stream_grown(book):
                    self._compact_drained(stream, book)

    def _note_removals(self, stream: str, book: StreamBook, msg_ids: list[int], payloads: list[bytes],
                       first_offset: int) -> None:
        """A run of MessageRemovedRecords appended from `first_offset` on: the book counts them, and at each one
        that leaves the stream drained (rare) with the counts as of that record, a compaction is planned."""
        live = book.live_messages
        discard = live.discard
        counted = 0
        for index, msg_id in enumerate(msg_ids):
            discard(msg_id)
            if not live:
                book.last_offset = first_offset + index
                book.records_since_snapshot += index + 1 - counted
                book.bytes_since_snapshot += sum(map(len, payloads[counted:index + 1]))
                counted = index + 1
                if self._queue_stream_grown(book):
                    self._compact_drained(stream, book)
        if counted < len(payloads):
            book.last_offset = first_offset + len(payloads) - 1
            book.records_since_snapshot += len(payloads) - counted
            book.bytes_since_snapshot += sum(map(len, payloads[counted:]))

    def _persist_records(self, batch: list[Any] | tuple[Any, ...]) -> None:
        """Any batch, record by record (definitions, paging's tail records, stream starts)."""
        if QueueRecord in map(type, batch):  # (C-level scan)
            batch = self._with_stream_starts(batch)
        items = [(record.stream, encode_record(record)) for record in batch]
        offsets = self.log.append_many(items)
        books = self.books
        for record, (stream, payload), offset in zip(batch, items, offsets, strict=True):
            book = books.get(stream)
            if book is None:
                book = books[stream] = StreamBook()
            book.last_offset = offset
            book.records_since_snapshot += 1
            book.bytes_since_snapshot += len(payload)
            cls = type(record)
            if cls is MessageRecord:  # live now, so never a drained stream to compact
                book.live_messages.add(record.msg_id)
                continue
            if cls is MessageRemovedRecord:
                live = book.live_messages
                live.discard(record.msg_id)
                if not live and self._queue_stream_grown(book):
                    self._compact_drained(stream, book)
                continue
            if cls is TailMessageRecord:  # paged out: the broker wants its offset (paging_io)
                self.pages.tail_appended(stream, record.msg_id, offset)
            self._track(stream, record, book)
            self._plan_compaction(stream, record, book)
        if self.doomed:
            self._truncate_doomed()

    def _with_stream_starts(self, batch: list[Record] | tuple[Record, ...]) -> list[Record]:
        """The batch with a `QueueStreamStartRecord` before the QueueRecord of each queue declared anew (not live
        at that point of the batch) whose stream exists: what the stream holds is a deleted queue's, and no crash
        point may give it back to the new queue (not the removals a crash cut off, not a truncation job that never
        ran). One batch is one append: the marker is never durable without what follows it, nor the reverse."""
        out: list[Record] = []
        live: dict[tuple[Any, ...], bool] = {}  # queue definition key -> live, as of this point of the batch
        streams: set[str] = set()  # streams the batch appended to so far
        for record in batch:
            if type(record) is QueueRecord:
                key = definition_key(record)
                if not record.deleted:
                    stream = queue_stream(record.vhost, record.name)
                    if not live.get(key, key in self.definitions) and (stream in self.books or stream in streams):
                        out.append(QueueStreamStartRecord(record.vhost, record.name))
                        streams.add(stream)
                        # tail offsets not yet reported are the old queue's: never hand them to the new one
                        self.pages.offsets = [item for item in self.pages.offsets if item[0] != stream]
                live[key] = not record.deleted
            else:
                streams.add(record.stream)
            out.append(record)
        return out

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

    # ----------------------------------------------------------------------------------- group commit
    def _run_jobs(self, jobs: list[Callable[[], None]]) -> None:
        """Worker thread: compaction jobs (each covered by an earlier commit: they were planned before it)."""
        for job in jobs:
            try:
                job()
            except Exception:
                log.exception("store: compaction job failed")
        self._record_synced_sizes()  # snapshots are written durably

    async def commit_once(self) -> list[int]:
        """One commit (one fsync) for every append so far; returns the tokens it made durable.

        The commit runs on one long-lived thread (`SyncThread`, started on first use, stopped by `flush`), not a
        `trio.to_thread` hand-off per commit: that hand-off (capacity limiter, thread cache, naming the OS thread
        through ctypes) cost about 7% of the node's GIL time under workload (a)."""
        tokens, self.pending_tokens = self.pending_tokens, []
        covered = self.appended
        if self._commit_thread is None:
            self._commit_thread = SyncThread("store-commit")
        try:
            await self._commit_thread.run(self._commit_and_record)
        except BaseException:
            self.pending_tokens[:0] = tokens  # not durable: they wait for the next successful commit
            raise
        self.commits += 1
        self._mark_durable(covered)
        return tokens

    def _mark_durable(self, covered: int) -> None:
        if covered > self.durable_through:
            self.durable_through = covered
            self._durable_changed.set()
            self._durable_changed = trio.Event()

    async def wait_durable(self) -> None:
        """Wait until everything `persist` appended before this call is durable (a later commit covered it)."""
        target = self.appended
        while self.durable_through < target:
            await self._durable_changed.wait()

    async def run_jobs(self, jobs: list[Callable[[], None]]) -> None:
        """Run compaction jobs that a finished commit covers (they were planned before it started)."""
        if jobs:
            await trio.to_thread.run_sync(self._run_jobs, jobs)

    async def commit_loop(self, node: Any) -> None:
        """Group commit until cancelled (with, in the unsafe test mode, the task that confirms at append)."""
        if not self.unsafe_confirm_before_fsync:
            await self._commit_loop(node)
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._unsafe_confirm_loop, node)
            await self._commit_loop(node)

    async def _unsafe_confirm_loop(self, node: Any) -> None:
        """Test only, deliberately unsafe: report every token as soon as its records are appended (in memory),
        before any write or fsync, so the publisher confirms leave before the data is durable."""
        while True:
            await self._unsafe_wake.wait()
            self._unsafe_wake = trio.Event()
            tokens, self.unsafe_tokens = self.unsafe_tokens, []
            if tokens:
                self._report(node, tokens)

    async def _commit_loop(self, node: Any) -> None:
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
            if tokens and not self.unsafe_confirm_before_fsync:  # unsafe: reported at append already
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
            await trio.to_thread.run_sync(self._record_synced_sizes)  # close commits and checkpoints
        self.closed = True
        if self._commit_thread is not None:
            self._commit_thread.close()
            self._commit_thread = None
