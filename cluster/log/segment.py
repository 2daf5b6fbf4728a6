"""Per-stream segment files: append-only ``.log`` files named by base offset, with sparse indexes.

A stream lives in its own directory (named by a hash of the stream name; the name itself is in ``stream.name``).
Inside: ``<base>.log`` segments (records as in ``format.py``), a sparse ``<base>.index`` (relative offset ->
byte position, one entry per ``index_interval_bytes``), ``<base>.timeindex`` (max timestamp before a record ->
its relative offset) and ``snapshot`` (latest snapshot, replaced atomically by rename).  Indexes live in memory
(``format.SparseIndex``); the two index files are written once, when the segment rolls (is sealed).  The active
segment's index is saved at each checkpoint as ``active.index`` (validated by the recovery point's CRC at load).

Durability: segment writes are plain writes; the shared WAL is what makes records durable.  A segment is fsynced
when it rolls and every dirty segment is fsynced at a WAL checkpoint, so at most the active segment of a stream
can have a torn tail, which ``load`` drops (truncating the file).  Writers run under the node log's I/O lock;
reads open their own descriptors (``read_at`` may run without the lock and copes with a racing roll or delete).
"""

from __future__ import annotations

import errno
import hashlib
import itertools
import os
import pathlib
import zlib
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NoReturn

from cluster.log import format as fmt
from cluster.log import scan
from cluster.log.scan import iter_file_records

NAME_FILE = "stream.name"
SNAPSHOT_FILE = "snapshot"
SAVED_INDEX_FILE = "active.index"  # the active segment's sparse index at the last checkpoint
READ_CHUNK_BYTES = scan.READ_CHUNK_BYTES  # sequential scans
RANDOM_READ_CHUNK_BYTES = 16 * 1024  # read_at: covers the default 4 KiB index interval plus a typical record
READ_MANY_GAP_BYTES_MAX = 256 * 1024  # read_many: wanted records closer than this share one sequential scan


class DiskFullError(OSError):
    """The disk is full (ENOSPC/EDQUOT): the write did not happen; files were cut back to their last good record."""


def raise_disk_full_or(error: OSError) -> NoReturn:
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        raise DiskFullError(error.errno, f"log storage: disk full ({error.strerror})") from error
    raise error


def stream_directory_name(stream: str) -> str:
    return hashlib.sha256(stream.encode()).hexdigest()[:32]


def fsync_path(path: pathlib.Path) -> None:
    """fsync a file or directory through a short-lived descriptor."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


fsync_directory = fsync_path


def write_file_durably(path: pathlib.Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: temp file, fsync, rename, fsync the directory."""
    temporary = path.with_name(path.name + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        except OSError as error:
            os.close(fd)
            fd = -1
            temporary.unlink(missing_ok=True)
            raise_disk_full_or(error)
    finally:
        if fd >= 0:
            os.close(fd)
    os.replace(temporary, path)
    fsync_directory(path.parent)


def remove_directory(directory: pathlib.Path) -> None:
    for path in directory.iterdir():
        path.unlink(missing_ok=True)
    directory.rmdir()


class FileHandles:
    """A bounded LRU of open read-write descriptors for segment and index files (used under the I/O lock)."""

    def __init__(self, open_files_max: int) -> None:
        self._open_files_max = max(4, open_files_max)
        self._fds: OrderedDict[pathlib.Path, int] = OrderedDict()

    def get(self, path: pathlib.Path) -> int:
        fd = self._fds.get(path)
        if fd is not None:
            self._fds.move_to_end(path)
            return fd
        while len(self._fds) >= self._open_files_max:
            _, old_fd = self._fds.popitem(last=False)
            os.close(old_fd)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self._fds[path] = fd
        return fd

    def forget(self, path: pathlib.Path) -> None:
        fd = self._fds.pop(path, None)
        if fd is not None:
            os.close(fd)

    def close_all(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def pwrite_all(fd: int, data: bytes, position: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, position)
        view = view[written:]
        position += written


@dataclass(slots=True)
class Segment:
    base_offset: int
    log_path: pathlib.Path
    index_path: pathlib.Path
    time_index_path: pathlib.Path
    size_bytes: int = 0
    next_offset: int = 0
    max_timestamp_ms: int = -(2**63)
    index: fmt.SparseIndex = field(default_factory=fmt.SparseIndex)
    last_indexed_position: int = 0
    dirty: bool = False  # written since its last fsync

    @classmethod
    def at(cls, directory: pathlib.Path, base_offset: int) -> Segment:
        return cls(base_offset, directory / fmt.segment_file_name(base_offset, ".log"),
                   directory / fmt.segment_file_name(base_offset, ".index"),
                   directory / fmt.segment_file_name(base_offset, ".timeindex"), next_offset=base_offset)

    @property
    def paths(self) -> tuple[pathlib.Path, pathlib.Path, pathlib.Path]:
        return (self.log_path, self.index_path, self.time_index_path)


class StreamFiles:
    """The segments and snapshot of one stream on disk."""

    def __init__(self, name: str, directory: pathlib.Path) -> None:
        self.name = name
        self.directory = directory
        self.segments: list[Segment] = []
        self.snapshot_offset = -1
        self.directory_dirty = False  # entries created or removed since the directory's last fsync
        self.new_directory = False  # the stream directory itself (and its name file) not yet fsynced
        self.saved_recovery_point: fmt.RecoveryPoint | None = None  # as last written by save_active_index

    # --- opening ---------------------------------------------------------------------------------------------

    @classmethod
    def create(cls, root: pathlib.Path, name: str, durable: bool) -> StreamFiles:
        """A new stream directory.  Not durable (the WAL covers it) unless asked: ``sync`` makes it so."""
        directory = root / stream_directory_name(name)
        directory.mkdir(parents=True, exist_ok=True)
        stream = cls(name, directory)
        if durable:
            write_file_durably(directory / NAME_FILE, name.encode())
            fsync_directory(root)
        else:
            (directory / NAME_FILE).write_bytes(name.encode())
            stream.new_directory = stream.directory_dirty = True
        return stream

    @classmethod
    def load(cls, directory: pathlib.Path, index_interval_bytes: int,
             synced: fmt.RecoveryPoint | None = None) -> StreamFiles | None:
        """Recover a stream directory; None if it never got its name file (a crash while creating it).

        ``synced``: what the last checkpoint made durable of the active segment (from the recovery point)."""
        try:
            name = (directory / NAME_FILE).read_bytes().decode()
        except (FileNotFoundError, UnicodeDecodeError):
            return None
        if stream_directory_name(name) != directory.name:
            return None  # a torn name file: the stream was never checkpointed, the WAL holds all of it
        stream = cls(name, directory)
        snapshot = stream.read_snapshot()
        stream.snapshot_offset = snapshot[0] if snapshot else -1
        bases = sorted(int(p.stem) for p in directory.glob("*.log") if p.stem.isdigit())
        for position, base in enumerate(bases):
            is_last = position == len(bases) - 1
            if is_last and synced is not None and synced.active_base == base:
                segment = stream._load_active_segment(base, index_interval_bytes, synced)
            else:
                segment = stream._load_segment(base, index_interval_bytes, scan_fully=is_last)
            stream.segments.append(segment)
        while stream.segments and stream.segments[-1].size_bytes == 0 and len(stream.segments) > 1:
            stream._remove_segment(stream.segments.pop())
        for leftover in directory.glob("*.tmp"):
            leftover.unlink(missing_ok=True)
        return stream

    def _load_segment(self, base: int, index_interval_bytes: int, scan_fully: bool) -> Segment:
        segment = Segment.at(self.directory, base)
        file_size = segment.log_path.stat().st_size
        index = None
        if not scan_fully and segment.index_path.exists() and segment.time_index_path.exists():
            index = fmt.SparseIndex.decode_files(segment.index_path.read_bytes(),
                                                 segment.time_index_path.read_bytes(), file_size)
        if index is None:
            self._rebuild_segment(segment, index_interval_bytes, persist_indexes=not scan_fully)
            return segment
        segment.index = index
        start = index.last_position()
        segment.last_indexed_position = start
        if len(index):
            segment.max_timestamp_ms = index.max_timestamps_before[-1]
        end, last_offset = scan.index_records(segment.log_path, segment, start, None, -1, True, index_interval_bytes)
        segment.size_bytes, segment.next_offset = end, max(segment.base_offset, last_offset + 1)
        if end != file_size:  # damaged in the middle: trust nothing, rescan
            self._rebuild_segment(segment, index_interval_bytes, persist_indexes=True)
        return segment

    def _load_active_segment(self, base: int, index_interval_bytes: int, synced: fmt.RecoveryPoint) -> Segment:
        """Index the fsynced prefix without CRCs (from the saved index, else by walking headers), then validate
        (CRC) the tail written since the checkpoint and cut a bad tail.  Anything inconsistent: full rescan."""
        segment = Segment.at(self.directory, base)
        file_size = segment.log_path.stat().st_size
        synced_size = synced.synced_size_bytes
        if synced_size > file_size:
            self._rebuild_segment(segment, index_interval_bytes, persist_indexes=False)
            return segment
        saved = self._read_saved_index(synced)
        if not self._index_synced_prefix(segment, synced_size, saved, index_interval_bytes):
            self._rebuild_segment(segment, index_interval_bytes, persist_indexes=False)
            return segment
        self._index_from(segment, synced_size, index_interval_bytes, verify_crc=True)
        if segment.size_bytes == synced_size and (saved is not None or synced.index_entries == len(segment.index) == 0):
            self.saved_recovery_point = synced  # unchanged since the checkpoint: the next one need not save it again
        if segment.size_bytes != file_size:
            os.truncate(segment.log_path, segment.size_bytes)
            segment.dirty = True
        return segment

    def _index_synced_prefix(self, segment: Segment, synced_size: int, saved: fmt.SparseIndex | None,
                             index_interval_bytes: int) -> bool:
        """Index the first ``synced_size`` bytes by headers only, starting from the saved index if there is one;
        False if the headers do not chain exactly to ``synced_size``."""
        start = 0
        if saved is not None:
            segment.index = saved
            start = segment.last_indexed_position = saved.last_position()
            segment.max_timestamp_ms = saved.max_timestamps_before[-1]
            segment.next_offset = segment.base_offset + saved.relative_offsets[-1]
        self._index_from(segment, start, index_interval_bytes, verify_crc=False, stop_position=synced_size)
        return segment.size_bytes == synced_size

    def _read_saved_index(self, synced: fmt.RecoveryPoint) -> fmt.SparseIndex | None:
        if synced.index_entries <= 0:
            return None
        try:
            data = (self.directory / SAVED_INDEX_FILE).read_bytes()
        except FileNotFoundError:
            return None
        return fmt.decode_saved_index(data, synced)

    def _index_from(self, segment: Segment, start_position: int, index_interval_bytes: int, verify_crc: bool,
                    stop_position: int | None = None) -> None:
        """Index the records from ``start_position`` (the record there must have offset ``segment.next_offset``)
        until the first invalid one or ``stop_position``; sets the segment's size and next offset."""
        end, last_offset = scan.index_records(segment.log_path, segment, start_position, stop_position,
                                              segment.next_offset - 1, verify_crc, index_interval_bytes)
        segment.size_bytes, segment.next_offset = end, last_offset + 1

    def save_active_index(self) -> fmt.RecoveryPoint | None:
        """At a checkpoint (everything fsynced): the active segment's recovery point, saving its sparse index
        (plain write, no fsync: the recovery point's CRC of it rejects a stale or lost file)."""
        if not self.segments:
            return None
        segment = self.segments[-1]
        saved = self.saved_recovery_point
        if saved is not None and saved.active_base == segment.base_offset and \
                saved.synced_size_bytes == segment.size_bytes:
            return saved
        entries, crc = len(segment.index), 0
        if entries:
            data = fmt.encode_saved_index(segment.index)
            crc = zlib.crc32(data)
            if not self._write_saved_index(data):
                entries = crc = 0  # no saved index: the prefix is walked by headers at open
        self.saved_recovery_point = fmt.RecoveryPoint(segment.base_offset, segment.size_bytes, entries, crc)
        return self.saved_recovery_point

    def _write_saved_index(self, data: bytes) -> bool:
        """Best effort (a full disk must not fail the checkpoint): False if the file could not be written."""
        try:
            fd = os.open(self.directory / SAVED_INDEX_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        except OSError:
            return False
        try:
            pwrite_all(fd, data, 0)
            return True
        except OSError:
            return False
        finally:
            os.close(fd)

    def _rebuild_segment(self, segment: Segment, index_interval_bytes: int, persist_indexes: bool) -> None:
        """Scan the whole segment, drop a torn/corrupt tail, rebuild both indexes (and rewrite a sealed one's)."""
        file_size = segment.log_path.stat().st_size
        segment.index = fmt.SparseIndex()
        segment.size_bytes, segment.next_offset, segment.last_indexed_position = 0, segment.base_offset, 0
        segment.max_timestamp_ms = -(2**63)
        self._index_from(segment, 0, index_interval_bytes, verify_crc=True)
        if segment.size_bytes != file_size:
            os.truncate(segment.log_path, segment.size_bytes)
            segment.dirty = True
        if persist_indexes:
            self._write_index_files(segment)

    @staticmethod
    def _write_index_files(segment: Segment) -> None:
        """Persist a sealed segment's indexes (the active segment's live in memory and are rebuilt at load)."""
        index_bytes, time_bytes = segment.index.encode_files()
        for path, data in ((segment.index_path, index_bytes), (segment.time_index_path, time_bytes)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                pwrite_all(fd, data, 0)
                os.fsync(fd)
            finally:
                os.close(fd)

    # --- state -----------------------------------------------------------------------------------------------

    @property
    def end_offset(self) -> int:
        """One past the last offset this stream has ever used (on disk or through its snapshot)."""
        on_disk = self.segments[-1].next_offset if self.segments else 0
        return max(on_disk, self.snapshot_offset + 1)

    def read_snapshot(self) -> tuple[int, bytes] | None:
        try:
            return fmt.decode_snapshot((self.directory / SNAPSHOT_FILE).read_bytes())
        except FileNotFoundError:
            return None

    # --- writing ---------------------------------------------------------------------------------------------

    def write_records(self, records: list[tuple[int, int, bytes]], handles: FileHandles,
                      segment_size_bytes_max: int, index_interval_bytes: int) -> None:
        """Append ``(offset, timestamp_ms, payload)`` records (offsets contiguous from ``end_offset``).

        Each record is ``fmt.encode_record``'s layout written as its header and then the payload (no copy of the
        payload), with the header and the sparse-index step inlined: this is the commit's
        per-record loop."""
        pending: list[bytes] = []
        segment: Segment | None = self.segments[-1] if self.segments else None
        start_size = segment.size_bytes if segment is not None else 0
        snapshot_offset = self.snapshot_offset
        pack_body_header = fmt.RECORD_BODY_HEADER.pack
        pack_crc = fmt.RECORD_CRC.pack
        crc32 = zlib.crc32
        header_size = fmt.RECORD_HEADER.size
        extend = pending.extend
        for offset, timestamp_ms, payload in records:
            if offset <= snapshot_offset:
                continue
            if segment is None or (segment.size_bytes >= segment_size_bytes_max and segment.size_bytes > 0):
                if segment is not None:
                    self._flush(segment, start_size, pending, handles)
                    self._seal(segment, handles)
                segment = self._new_segment(offset)
                start_size = 0
                pending = []
                extend = pending.extend
            position = segment.size_bytes
            if position > 0 and position - segment.last_indexed_position >= index_interval_bytes:
                segment.index.add(offset - segment.base_offset, position, segment.max_timestamp_ms)
                segment.last_indexed_position = position
            if timestamp_ms > segment.max_timestamp_ms:
                segment.max_timestamp_ms = timestamp_ms
            body_header = pack_body_header(len(payload), offset, timestamp_ms)
            extend((pack_crc(crc32(payload, crc32(body_header))), body_header, payload))
            segment.size_bytes = position + header_size + len(payload)
            segment.next_offset = offset + 1
        if segment is not None and pending:
            self._flush(segment, start_size, pending, handles)

    def _flush(self, segment: Segment, start_size: int, pending: list[bytes], handles: FileHandles) -> None:
        if not pending:
            return
        try:
            pwrite_all(handles.get(segment.log_path), b"".join(pending), start_size)
        except OSError as error:
            os.truncate(segment.log_path, start_size)
            raise_disk_full_or(error)
        segment.dirty = True

    def _new_segment(self, base_offset: int) -> Segment:
        segment = Segment.at(self.directory, base_offset)
        segment.log_path.open("wb").close()
        self.segments.append(segment)
        segment.dirty = self.directory_dirty = True
        return segment

    def _seal(self, segment: Segment, handles: FileHandles) -> None:
        """The segment rolled: make it and its index files durable; it is never written again."""
        os.fsync(handles.get(segment.log_path))
        handles.forget(segment.log_path)
        try:
            self._write_index_files(segment)
        except OSError as error:
            raise_disk_full_or(error)  # the indexes are rebuilt from the segment at the next open
        segment.dirty = False

    def sync(self, handles: FileHandles) -> None:
        """fsync every file and directory written since the last sync (the WAL checkpoint calls this)."""
        for segment in self.segments:
            if segment.dirty:
                os.fsync(handles.get(segment.log_path))
                segment.dirty = False
        if self.new_directory:
            fsync_path(self.directory / NAME_FILE)
        if self.directory_dirty:
            fsync_directory(self.directory)
        if self.new_directory:
            fsync_directory(self.directory.parent)
        self.directory_dirty = self.new_directory = False

    def truncate_after(self, offset: int, handles: FileHandles) -> None:
        """Drop every record with an offset > ``offset``."""
        while self.segments and self.segments[-1].base_offset > offset:
            self._remove_segment(self.segments.pop(), handles)
        if not self.segments or self.segments[-1].next_offset <= offset + 1:
            return
        segment = self.segments[-1]
        size, max_timestamp_ms = 0, -(2**63)
        for record in iter_file_records(segment.log_path):
            if record.offset > offset:
                break
            size, max_timestamp_ms = record.position + record.size_bytes, max(max_timestamp_ms, record.timestamp_ms)
        handles.forget(segment.log_path)
        self.saved_recovery_point = None  # the bytes it described may be rewritten differently
        os.truncate(segment.log_path, size)
        segment.size_bytes, segment.next_offset, segment.max_timestamp_ms = size, offset + 1, max_timestamp_ms
        segment.index.truncate_at_position(size)
        segment.last_indexed_position = segment.index.last_position()
        for path in (segment.index_path, segment.time_index_path):
            path.unlink(missing_ok=True)  # active again: its indexes live in memory until it is sealed
        segment.dirty = self.directory_dirty = True

    def install_snapshot(self, offset: int, state: bytes, handles: FileHandles) -> None:
        """Durably replace the snapshot, then delete the segments wholly at or behind ``offset``."""
        if self.new_directory:
            self.sync(handles)  # the snapshot must not sit in a directory a crash could lose
        write_file_durably(self.directory / SNAPSHOT_FILE, fmt.encode_snapshot(offset, state))
        self.snapshot_offset = max(self.snapshot_offset, offset)
        self.delete_segments_through(self.snapshot_offset, handles)

    def delete_segments_through(self, offset: int, handles: FileHandles) -> None:
        """Delete every segment whose records are all <= ``offset`` (the active one too: appends re-create it)."""
        while self.segments and self.segments[0].next_offset - 1 <= offset:
            self._remove_segment(self.segments.pop(0), handles)

    def _remove_segment(self, segment: Segment, handles: FileHandles | None = None) -> None:
        self.saved_recovery_point = None
        for path in segment.paths:
            if handles is not None:
                handles.forget(path)
            path.unlink(missing_ok=True)
        self.directory_dirty = True

    def delete(self, handles: FileHandles) -> None:
        """Remove the stream: the name file goes first, so a crash half-way leaves a directory ``load`` ignores."""
        (self.directory / NAME_FILE).unlink(missing_ok=True)
        fsync_directory(self.directory)
        for segment in self.segments:
            self._remove_segment(segment, handles)
        self.segments.clear()
        remove_directory(self.directory)
        fsync_directory(self.directory.parent)
        self.directory_dirty = self.new_directory = False

    # --- reading ---------------------------------------------------------------------------------------------

    def read_at(self, offset: int) -> bytes | None:
        """One record via the sparse index: a read of about one index interval, then the record."""
        position = fmt.segment_for_offset([s.base_offset for s in self.segments], offset)
        if position < 0:
            return None
        segment = self.segments[position]
        if offset >= segment.next_offset:
            return None
        start = segment.index.floor_position(offset - segment.base_offset)
        for record in iter_file_records(segment.log_path, start, RANDOM_READ_CHUNK_BYTES):
            if record.offset == offset:
                return record.payload
            if record.offset > offset:
                return None
        return None

    def read_many(self, offsets: list[int]) -> dict[int, bytes]:
        """Payloads of the wanted ``offsets`` (sorted, distinct) found on disk.  Offsets whose sparse-index
        positions lie within ``READ_MANY_GAP_BYTES_MAX`` of each other share one sequential scan."""
        found: dict[int, bytes] = {}
        segments = list(self.segments)
        bases = [s.base_offset for s in segments]
        i = 0
        while i < len(offsets):
            segment_index = fmt.segment_for_offset(bases, offsets[i])
            if segment_index < 0:
                i += 1
                continue
            segment = segments[segment_index]
            start = last_position = segment.index.floor_position(offsets[i] - segment.base_offset)
            j = i + 1
            while j < len(offsets) and offsets[j] < segment.next_offset:
                position = segment.index.floor_position(offsets[j] - segment.base_offset)
                if position - last_position > READ_MANY_GAP_BYTES_MAX:
                    break
                last_position, j = position, j + 1
            group = offsets[i:j]
            wanted = set(group)
            chunk_bytes = min(READ_CHUNK_BYTES, last_position - start + RANDOM_READ_CHUNK_BYTES)
            for offset, payload in scan.iter_payloads(segment.log_path, start, group[0], group[-1] + 1, chunk_bytes):
                if offset in wanted:
                    found[offset] = payload
            i = j
        return found

    def iter_range(self, first_offset: int, end_offset: int) -> Iterator[tuple[int, bytes]]:
        """Records with ``first_offset <= offset < end_offset``, in order, from disk, read lazily in large chunks.

        One flat iterator over per-segment scans (``itertools.chain``): no generator layer per record."""
        return itertools.chain.from_iterable(self._segment_scans(first_offset, end_offset))

    def _segment_scans(self, first_offset: int, end_offset: int) -> Iterator[Iterator[tuple[int, bytes]]]:
        segments = list(self.segments)
        bases = [s.base_offset for s in segments]
        start_segment = max(0, fmt.segment_for_offset(bases, first_offset))
        for segment in segments[start_segment:]:
            if segment.base_offset >= end_offset:
                return
            start = segment.index.floor_position(max(0, first_offset - segment.base_offset))
            yield scan.iter_payloads(segment.log_path, start, first_offset, min(end_offset, segment.next_offset))

    def offset_for_time(self, timestamp_ms: int) -> int | None:
        """First offset on disk whose timestamp is >= ``timestamp_ms``, or None."""
        for segment in self.segments:
            if segment.max_timestamp_ms < timestamp_ms:
                continue
            start = segment.index.position_for_time(timestamp_ms)
            for record in iter_file_records(segment.log_path, start, RANDOM_READ_CHUNK_BYTES):
                if record.timestamp_ms >= timestamp_ms:
                    return record.offset
        return None

