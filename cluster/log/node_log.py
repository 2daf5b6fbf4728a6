"""NodeLog: every stream of a node in one durable, bounded log with group commit.

How it works:
- ``append`` assigns the next offset of the stream and queues the record in memory (no syscall).  When the queue
  exceeds ``append_buffer_bytes_max`` it is written out (plain write, no fsync) by the appending thread.
- ``commit`` (a worker thread) writes the queue as one batch of frames to the shared WAL, copies the same records
  into the per-stream segment files (plain writes), then fsyncs the WAL once: group commit for every stream.
- When the WAL reaches ``wal_size_bytes_max`` the commit checkpoints: fsync the dirty segment files, start a new
  WAL file and delete the old ones.  ``write_snapshot`` deletes segments wholly behind the snapshot.
- ``delete_stream`` writes a DELETE frame and fsyncs the WAL, then removes the stream's files; replay drops the
  stream where it meets the frame.  A snapshot of a stream deleted since the last checkpoint checkpoints first.
- ``open`` recovers: load each stream directory (torn segment tails cut off), then replay the WAL on top
  (appends already on disk are stepped over by header; truncations are re-applied), then checkpoint.  The
  checkpoint's recovery-point file says how much of each active segment was fsynced and carries the CRC of that
  prefix's sparse index, saved beside it: open loads that index instead of reading the prefix, and just the tail
  written since is CRC-checked (Kafka's recovery point), so recovery work is bounded by ``wal_size_bytes_max``.

Threading contract: three locks, always taken in this order.
- ``_commit_lock``: one commit/checkpoint/snapshot/delete at a time.
- ``_io_lock``: every file write (WAL and segments). Held while writing, not while the WAL fsyncs, so an
  ``append`` that must flush its full buffer usually waits for a write only (but it does wait for a checkpoint,
  a snapshot or a delete in progress).  ``read_at`` reads without it and retries under it only after a miss.
- ``_lock``: the in-memory queue and per-stream offsets; held only for a few dict operations.
``append``, ``truncate_after``, ``read_at``, ``streams`` may be called from the event-loop thread while ``commit``
runs in a worker thread; ``commit``, ``write_snapshot``, ``delete_stream`` and ``close`` block on fsync and
belong in worker threads.  ``read`` iterates files lazily: do not truncate that stream while iterating.

Failure: a full disk raises ``DiskFullError``. If the WAL write failed, the batch goes back to the queue and a later
``commit`` can retry; if a segment write or an fsync failed, the log refuses further work (``LogBrokenError``) and
must be reopened, which recovers to the last good record.
"""

from __future__ import annotations

import contextlib
import itertools
import pathlib
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NoReturn

from cluster.log import format as fmt
from cluster.log.segment import (
    DiskFullError,
    FileHandles,
    StreamFiles,
    raise_disk_full_or,
    remove_directory,
    write_file_durably,
)
from cluster.log.wal import WalWriter, replay_needed

STREAMS_DIRECTORY = "streams"
WAL_DIRECTORY = "wal"
RECOVERY_POINT_FILE = "recovery-point"
OP_OVERHEAD_BYTES = 64  # bookkeeping charged per queued op against the buffer bound


class LogBrokenError(RuntimeError):
    """An I/O failure left the in-memory view uncertain; reopen the log to recover from disk."""


@dataclass(frozen=True, slots=True)
class LogConfig:
    segment_size_bytes_max: int = 64 * 1024 * 1024
    index_interval_bytes: int = 4096
    wal_size_bytes_max: int = 64 * 1024 * 1024  # bounds crash-recovery work (replay + tail scans)
    append_buffer_bytes_max: int = 16 * 1024 * 1024
    open_files_max: int = 1024  # cached descriptors of segment .log files (index files are opened briefly)

    def __post_init__(self) -> None:
        if not 0 < self.segment_size_bytes_max <= 2**31:  # index positions are u32; one record may overshoot
            raise ValueError("segment_size_bytes_max must be in (0, 2 GiB]")
        if self.index_interval_bytes <= 0 or self.append_buffer_bytes_max <= 0 or self.wal_size_bytes_max <= 0:
            raise ValueError("sizes must be positive")


# A queued operation: (kind, stream, offset, timestamp_ms, payload, sequence).  A plain tuple: this is the hot path.
_Op = tuple[fmt.WalKind, str, int, int, bytes, int]
REPLAY_RUN_BYTES_MAX = 8 * 1024 * 1024  # replay writes segments in runs of at most this much


@dataclass(slots=True)
class _StreamState:
    next_offset: int = 0
    snapshot_offset: int = -1
    unwritten: dict[int, tuple[int, bytes]] = field(default_factory=dict)  # offset -> (sequence, payload)
    has_data: bool = False


class NodeLog:
    def __init__(self, directory: pathlib.Path, config: LogConfig) -> None:
        self.directory = directory
        self.config = config
        self._lock = threading.Lock()
        self._io_lock = threading.Lock()
        self._commit_lock = threading.Lock()
        self._states: dict[str, _StreamState] = {}
        self._files: dict[str, StreamFiles] = {}
        self._pending: list[_Op] = []
        self._pending_bytes = 0
        self._sequence = 0
        self._deferred_error: DiskFullError | None = None
        self._broken: BaseException | None = None
        self._handles = FileHandles(config.open_files_max)
        self._streams_root = directory / STREAMS_DIRECTORY
        self._streams_root.mkdir(parents=True, exist_ok=True)
        self._wal: WalWriter | None = None
        self._closed = False
        self._recovery_point: dict[str, fmt.RecoveryPoint] = {}  # stream directory -> its active segment's
        self._deleted_since_checkpoint: set[str] = set()  # streams with a DELETE frame in the current WAL

    # --- opening and recovery --------------------------------------------------------------------------------

    @classmethod
    def open(cls, directory: pathlib.Path, config: LogConfig | None = None) -> NodeLog:
        log = cls(pathlib.Path(directory), config or LogConfig())
        log._recover()
        return log

    def _recover(self) -> None:
        try:
            recovery_point = fmt.decode_recovery_point((self.directory / RECOVERY_POINT_FILE).read_bytes())
        except FileNotFoundError:
            recovery_point = {}
        self._recovery_point = dict(recovery_point)  # a replayed truncation forgets its stream's entry
        for path in sorted(self._streams_root.iterdir()):
            if not path.is_dir():
                continue
            stream = StreamFiles.load(path, self.config.index_interval_bytes, recovery_point.get(path.name))
            if stream is None:
                remove_directory(path)
                continue
            self._files[stream.name] = stream
        self._replay_wal()
        for name, files in self._files.items():
            self._states[name] = _StreamState(files.end_offset, files.snapshot_offset, has_data=True)
        self._wal = WalWriter(self.directory / WAL_DIRECTORY)
        self._checkpoint_locked()

    def _replay_wal(self) -> None:
        """Re-apply the WAL onto the segments: appends already there are skipped, truncations redone."""
        runs: dict[str, list[tuple[int, int, bytes]]] = {}
        expected_offsets: dict[str, int] = {}  # per stream: the next offset not yet on disk or in its run
        run_bytes = 0
        for frame in replay_needed(self.directory / WAL_DIRECTORY, expected_offsets):
            stream = frame.stream
            if frame.kind == fmt.WalKind.TRUNCATE:
                files = self._files.get(stream)
                if files is not None:
                    self._write_run(files, runs.pop(stream, []))
                    self._forget_recovery_point(files)
                    files.truncate_after(frame.offset, self._handles)
                    expected_offsets[stream] = files.end_offset
                continue
            if frame.kind == fmt.WalKind.DELETE:  # the stream was deleted here: what came before it goes
                runs.pop(stream, None)
                expected_offsets.pop(stream, None)
                self._remove_files(stream)
                continue
            if frame.kind != fmt.WalKind.APPEND:
                continue
            expected = expected_offsets.get(stream)
            if expected is None:
                files = self._files.get(stream)
                if files is None:
                    files = self._files[stream] = StreamFiles.create(self._streams_root, stream, False)
                expected = expected_offsets[stream] = files.end_offset
            if frame.offset < expected:
                continue  # already in the segment (or behind the snapshot)
            runs.setdefault(stream, []).append((frame.offset, frame.timestamp_ms, frame.payload))
            expected_offsets[stream] = frame.offset + 1
            run_bytes += len(frame.payload)
            if run_bytes > REPLAY_RUN_BYTES_MAX:
                self._write_runs(runs)
                run_bytes = 0
        self._write_runs(runs)

    def _write_runs(self, runs: dict[str, list[tuple[int, int, bytes]]]) -> None:
        for stream, run in runs.items():
            self._write_run(self._files[stream], run)
        runs.clear()

    # --- the hot path ----------------------------------------------------------------------------------------

    def append(self, stream: str, payload: bytes, timestamp_ms: int = 0) -> int:
        """Queue a record; returns its offset.  Durable only after a later ``commit`` returns."""
        with self._lock:
            self._check_usable()
            if self._deferred_error is not None and self._pending_bytes > 4 * self.config.append_buffer_bytes_max:
                raise DiskFullError(self._deferred_error.errno, "log storage: disk full and append buffer full")
            state = self._state(stream)
            offset = state.next_offset
            state.next_offset += 1
            state.has_data = True
            self._queue(state, fmt.WalKind.APPEND, stream, offset, timestamp_ms, payload)
            overflow = self._pending_bytes > self.config.append_buffer_bytes_max
        if overflow:
            self._write_pending_deferring_disk_full()
        return offset

    def append_many(self, records: Sequence[tuple[str, bytes]], timestamp_ms: int = 0) -> list[int]:
        """``append`` of each ``(stream, payload)`` in order, under one lock round; returns their offsets."""
        offsets: list[int] = []
        with self._lock:
            self._check_usable()
            if self._deferred_error is not None and self._pending_bytes > 4 * self.config.append_buffer_bytes_max:
                raise DiskFullError(self._deferred_error.errno, "log storage: disk full and append buffer full")
            pending = self._pending
            append_kind = fmt.WalKind.APPEND
            sequence = self._sequence
            added_bytes = 0
            last_stream: str | None = None
            state: _StreamState | None = None
            try:
                for stream, payload in records:
                    if stream != last_stream or state is None:
                        state = self._states.get(stream) or self._state(stream)
                        state.has_data = True
                        last_stream = stream
                    offset = state.next_offset
                    state.next_offset = offset + 1
                    sequence += 1
                    state.unwritten[offset] = (sequence, payload)
                    pending.append((append_kind, stream, offset, timestamp_ms, payload, sequence))
                    added_bytes += len(payload) + OP_OVERHEAD_BYTES
                    offsets.append(offset)
            finally:  # a bad stream name stops the batch; what was queued before it stays consistent
                self._sequence = sequence
                self._pending_bytes += added_bytes
            overflow = self._pending_bytes > self.config.append_buffer_bytes_max
        if overflow:
            self._write_pending_deferring_disk_full()
        return offsets

    def append_run(self, stream: str, payloads: Sequence[bytes], timestamp_ms: int = 0) -> int:
        """``append`` of each payload to one stream, in order, under one lock round; returns the first offset (the
        others follow it contiguously). The store's per-message path: one run per stream of a persist batch."""
        with self._lock:
            self._check_usable()
            if self._deferred_error is not None and self._pending_bytes > 4 * self.config.append_buffer_bytes_max:
                raise DiskFullError(self._deferred_error.errno, "log storage: disk full and append buffer full")
            state = self._states.get(stream) or self._state(stream)
            state.has_data = True
            first = offset = state.next_offset
            sequence = self._sequence
            unwritten = state.unwritten
            pending_append = self._pending.append
            append_kind = fmt.WalKind.APPEND
            for payload in payloads:
                sequence += 1
                unwritten[offset] = (sequence, payload)
                pending_append((append_kind, stream, offset, timestamp_ms, payload, sequence))
                offset += 1
            state.next_offset = offset
            self._sequence = sequence
            self._pending_bytes += sum(map(len, payloads)) + OP_OVERHEAD_BYTES * len(payloads)
            overflow = self._pending_bytes > self.config.append_buffer_bytes_max
        if overflow:
            self._write_pending_deferring_disk_full()
        return first

    def _write_pending_deferring_disk_full(self) -> None:
        """Write the append buffer out early (it went over its bound); a full disk is kept for commit to report,
        and the records stay queued."""
        try:
            self._write_pending()
        except DiskFullError as error:
            self._deferred_error = error

    def _state(self, stream: str) -> _StreamState:
        state = self._states.get(stream)
        if state is None:
            if not stream or len(stream.encode()) > fmt.STREAM_NAME_BYTES_MAX:
                raise ValueError(f"stream names are 1..{fmt.STREAM_NAME_BYTES_MAX} bytes of UTF-8")
            state = self._states[stream] = _StreamState()
        return state

    def _queue(self, state: _StreamState, kind: fmt.WalKind, stream: str, offset: int, timestamp_ms: int,
               payload: bytes) -> None:
        self._sequence += 1
        if kind == fmt.WalKind.APPEND:
            state.unwritten[offset] = (self._sequence, payload)
        self._pending.append((kind, stream, offset, timestamp_ms, payload, self._sequence))
        self._pending_bytes += len(payload) + OP_OVERHEAD_BYTES

    def _fail(self, error: OSError) -> NoReturn:
        """An I/O failure with uncertain aftermath: refuse further work until reopened."""
        self._broken = error
        raise_disk_full_or(error)

    def _check_usable(self) -> None:
        if self._closed:
            raise ValueError("log is closed")
        if self._broken is not None:
            raise LogBrokenError(f"log storage failed earlier ({self._broken!r}); reopen to recover")

    def commit(self) -> None:
        """Make every record appended before this call durable: one WAL write and one fsync for all streams."""
        with self._commit_lock:
            with self._lock:
                self._check_usable()
            self._write_and_sync()
            self._deferred_error = None
            assert self._wal is not None
            if self._wal.size_bytes >= self.config.wal_size_bytes_max:
                self.checkpoint()

    def _write_and_sync(self) -> None:
        """Write the queued ops to the WAL (and segments), then fsync the WAL. Under the commit lock."""
        self._write_pending()
        assert self._wal is not None
        try:
            self._wal.sync()
        except OSError as error:
            self._fail(error)

    def _write_pending(self) -> None:
        with self._io_lock:
            with self._lock:
                self._check_usable()
                batch, self._pending, self._pending_bytes = self._pending, [], 0
            if not batch:
                return
            assert self._wal is not None
            try:
                self._wal.write(fmt.encode_wal_frames(batch))
            except DiskFullError:
                with self._lock:
                    self._pending[:0] = batch
                    self._pending_bytes += sum(len(op[4]) + OP_OVERHEAD_BYTES for op in batch)
                raise
            except OSError as error:
                self._fail(error)
            try:
                self._apply_to_segments(batch)
            except OSError as error:
                self._fail(error)
            self._forget_written(batch)

    def _apply_to_segments(self, batch: list[_Op]) -> None:
        """Each stream's ops in order, in one pass: appends gather into a run per stream, written when a
        truncation of that stream comes (then the truncation) and at the end. Streams are independent files."""
        runs: dict[str, list[tuple[int, int, bytes]]] = {}
        append_kind, delete_kind = fmt.WalKind.APPEND, fmt.WalKind.DELETE
        for kind, stream, offset, timestamp_ms, payload, _ in batch:
            run = runs.get(stream)
            if run is None:
                run = runs[stream] = []
            if kind == append_kind:
                run.append((offset, timestamp_ms, payload))
                continue
            if kind == delete_kind:  # its files go once the frame is durable (delete_stream)
                run.clear()
                continue
            files = self._files_for(stream)
            self._write_run(files, run)
            run.clear()
            self._forget_recovery_point(files)
            files.truncate_after(offset, self._handles)
        for stream, run in runs.items():
            if run:
                self._write_run(self._files_for(stream), run)

    def _files_for(self, stream: str) -> StreamFiles:
        files = self._files.get(stream)
        if files is None:
            files = self._files[stream] = StreamFiles.create(self._streams_root, stream, False)
        return files

    def _write_run(self, files: StreamFiles, run: list[tuple[int, int, bytes]]) -> None:
        if run:
            files.write_records(run, self._handles, self.config.segment_size_bytes_max,
                                self.config.index_interval_bytes)

    def _forget_written(self, batch: list[_Op]) -> None:
        append_kind = fmt.WalKind.APPEND
        states = self._states
        with self._lock:
            last_stream: str | None = None
            unwritten: dict[int, tuple[int, bytes]] | None = None
            for kind, stream, offset, _, _, sequence in batch:
                if kind != append_kind:
                    continue
                if stream != last_stream:
                    last_stream = stream
                    state = states.get(stream)
                    unwritten = None if state is None else state.unwritten
                if unwritten is None:
                    continue
                entry = unwritten.get(offset)
                if entry is not None and entry[0] == sequence:
                    del unwritten[offset]

    def checkpoint(self) -> None:
        """fsync every dirty segment, then drop the WAL (everything in it is now durable in segments)."""
        with self._io_lock:
            self._checkpoint_locked()

    def _checkpoint_locked(self) -> None:
        assert self._wal is not None
        try:
            for files in self._files.values():
                files.sync(self._handles)
            points = {files.directory.name: files.save_active_index() for files in self._files.values()}
            self._recovery_point = {name: point for name, point in points.items() if point is not None}
            self._write_recovery_point()
            self._wal.start_new_file()
            self._deleted_since_checkpoint.clear()
        except OSError as error:
            self._fail(error)

    def _write_recovery_point(self) -> None:
        write_file_durably(self.directory / RECOVERY_POINT_FILE, fmt.encode_recovery_point(self._recovery_point))

    def _forget_recovery_point(self, files: StreamFiles) -> None:
        """Before a truncation rewrites synced bytes: that stream's active segment gets a full scan at open."""
        if self._recovery_point.pop(files.directory.name, None) is not None:
            self._write_recovery_point()

    # --- raft-style edits ------------------------------------------------------------------------------------

    def truncate_after(self, stream: str, offset: int) -> None:
        """Drop every record of ``stream`` with an offset > ``offset`` (durable at the next commit)."""
        with self._lock:
            self._check_usable()
            state = self._state(stream)
            if offset < state.snapshot_offset:
                raise ValueError(f"cannot truncate {stream!r} after {offset}: snapshot is at {state.snapshot_offset}")
            if offset + 1 >= state.next_offset:
                return
            state.next_offset = offset + 1
            for dropped in [o for o in state.unwritten if o > offset]:
                del state.unwritten[dropped]
            self._queue(state, fmt.WalKind.TRUNCATE, stream, offset, 0, b"")

    def write_snapshot(self, stream: str, offset: int, state: bytes) -> None:
        """Durably store ``state`` as the stream's state through ``offset``; older segments are deleted.

        A snapshot older than the stream's current one is ignored."""
        with self._commit_lock, self._io_lock:
            with self._lock:
                self._check_usable()
                stream_state = self._state(stream)
                if offset < stream_state.snapshot_offset:
                    return  # an older snapshot than the one we hold: nothing to do
                stream_state.has_data = True
                stream_state.snapshot_offset = max(stream_state.snapshot_offset, offset)
                stream_state.next_offset = max(stream_state.next_offset, offset + 1)
            if stream in self._deleted_since_checkpoint:
                self._checkpoint_locked()  # a replayed DELETE frame would remove this snapshot: drop the frame first
            files = self._files.get(stream)
            if files is None:
                files = self._files[stream] = StreamFiles.create(self._streams_root, stream, True)
            files.install_snapshot(offset, state, self._handles)

    def delete_stream(self, stream: str) -> None:
        """Remove the stream and all its files, durably, before returning.

        A DELETE frame goes into the WAL and is fsynced (replay drops the stream there, so no earlier frame of it
        can come back), then the files are removed: one WAL fsync, not a checkpoint of every stream. The caller
        appends nothing more to the stream until this returns; the name may be used again afterwards."""
        with self._commit_lock:
            with self._lock:
                self._check_usable()
                state = self._states.pop(stream, None)
                self._queue(state or _StreamState(), fmt.WalKind.DELETE, stream, 0, 0, b"")
            self._write_and_sync()
            with self._io_lock:
                try:
                    self._remove_files(stream)
                except OSError as error:
                    self._fail(error)
                self._deleted_since_checkpoint.add(stream)

    def _remove_files(self, stream: str) -> None:
        files = self._files.pop(stream, None)
        if files is not None:
            files.delete(self._handles)
            self._recovery_point.pop(files.directory.name, None)  # written at the next checkpoint

    # --- reading ---------------------------------------------------------------------------------------------

    def streams(self) -> list[str]:
        with self._lock:
            return sorted(name for name, state in self._states.items() if state.has_data)

    def read(self, stream: str) -> tuple[bytes | None, Iterator[tuple[int, bytes]]]:
        """(latest snapshot state or None, records after the snapshot in offset order)."""
        with self._io_lock:
            files = self._files.get(stream)
            snapshot = files.read_snapshot() if files is not None else None
            records = self._records_locked(stream)
        return (snapshot[1] if snapshot else None), records

    def _records_locked(self, stream: str) -> Iterator[tuple[int, bytes]]:
        """The records after the snapshot, read lazily: do not truncate or snapshot the stream while iterating."""
        files = self._files.get(stream)
        with self._lock:
            state = self._states.get(stream, _StreamState())
            first, end = state.snapshot_offset + 1, state.next_offset
            in_memory = sorted((o, p) for o, (_, p) in state.unwritten.items() if first <= o < end)
        disk_end = in_memory[0][0] if in_memory else end
        disk = files.iter_range(first, disk_end) if files is not None else iter(())
        return itertools.chain(disk, in_memory)  # the disk part stops before the first record still in memory

    def snapshot_offset(self, stream: str) -> int:
        """Offset the stream's latest snapshot covers (-1: none)."""
        with self._lock:
            state = self._states.get(stream)
            return state.snapshot_offset if state is not None else -1

    def read_at(self, stream: str, offset: int) -> bytes:
        """The payload of one record (KeyError if it is not in the log, e.g. behind the snapshot)."""
        with self._lock:
            state = self._states.get(stream)
            if state is None or not state.snapshot_offset < offset < state.next_offset:
                raise KeyError((stream, offset))
            entry = state.unwritten.get(offset)
            if entry is not None:
                return entry[1]
        files = self._files.get(stream)
        try:  # optimistic, without the I/O lock: a checkpoint's fsyncs must not stall a consumer's read
            payload = files.read_at(offset) if files is not None else None
        except (IndexError, OSError):
            payload = None
        if payload is None:  # raced with a roll, truncation or snapshot: ask again, serialised with writers
            with self._io_lock:
                files = self._files.get(stream)
                payload = files.read_at(offset) if files is not None else None
        if payload is None:
            raise KeyError((stream, offset))
        return payload

    def read_many(self, stream: str, offsets: Iterable[int]) -> dict[int, bytes]:
        """Payloads of several records at once: offset -> payload for each of ``offsets`` in the log (absent ones,
        e.g. behind the snapshot, are left out).  Nearby records share one sequential read, so paging in a run of
        a queue's messages costs about one scan instead of one ``read_at`` each.  Thread-safe like ``read_at``."""
        wanted = sorted(set(offsets))
        with self._lock:
            state = self._states.get(stream)
            if state is None:
                return {}
            wanted = [o for o in wanted if state.snapshot_offset < o < state.next_offset]
            found = {o: state.unwritten[o][1] for o in wanted if o in state.unwritten}
        on_disk = [o for o in wanted if o not in found]
        files = self._files.get(stream)
        if not on_disk or files is None:
            return found
        with contextlib.suppress(IndexError, OSError):  # optimistic, without the I/O lock, as read_at
            found.update(files.read_many(on_disk))
        missing = [o for o in on_disk if o not in found]
        if missing:  # raced with a roll, truncation or snapshot: ask again, serialised with writers
            with self._io_lock:
                files = self._files.get(stream)
                if files is not None:
                    found.update(files.read_many(missing))
        return found

    def end_offset(self, stream: str) -> int:
        """The offset the next append to ``stream`` will get."""
        with self._lock:
            state = self._states.get(stream)
            return state.next_offset if state is not None else 0

    def offset_for_time(self, stream: str, timestamp_ms: int) -> int | None:
        """First offset on disk with a timestamp >= ``timestamp_ms`` (via the time index)."""
        with self._io_lock:
            files = self._files.get(stream)
            return files.offset_for_time(timestamp_ms) if files is not None else None

    def close(self) -> None:
        """Commit what is queued, checkpoint (the WAL is emptied) and release every file (even if that fails)."""
        if self._closed:
            return
        try:
            if self._broken is None:
                self.commit()
                self.checkpoint()
        finally:
            with self._commit_lock, self._io_lock:
                self._closed = True
                self._handles.close_all()
                if self._wal is not None:
                    self._wal.close()

