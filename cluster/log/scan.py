"""Fast sequential scans of segment and WAL files: the loops that recovery and full reads spend their time in.

Each scan reads its file in large chunks (``READ_CHUNK_BYTES``) and walks the records of a chunk with
``struct.unpack_from`` on the chunk and one ``zlib.crc32`` over a memoryview slice per record (no copies, no
per-record objects besides what the caller gets).  The buffer holds at most one chunk plus one record, so memory
is bounded however large the file.  Every scan stops at the first record that is torn, has an impossible length, a
bad CRC, or an offset that does not increase; the caller decides what that means (cut a tail, stop reading).

- ``iter_payloads``: ``(offset, payload)`` of a segment from a byte position, CRC-checked (full reads).
- ``index_records``: adds records to a segment's sparse index, with or without the CRC check (recovery indexes a
  trusted, fsynced prefix by headers only and CRC-checks only the tail written after it).
- ``scan_file``/``iter_file_records``: the generic bounded scanner (decode callbacks, one item object each), for
  the paths where per-record cost does not matter (whole-WAL ``replay``, truncation, single-record reads).
- ``iter_wal_needed``: the WAL frames replay must apply; frames a predicate says are already in the segments are
  skipped by header (no CRC, no payload copy).
"""

from __future__ import annotations

import os
import pathlib
import zlib
from collections.abc import Callable, Iterator, Mapping
from typing import Protocol, TypeVar

from cluster.log import format as fmt

READ_CHUNK_BYTES = 1024 * 1024
T = TypeVar("T")
_GARBAGE_SIZE_BYTES = fmt.PAYLOAD_SIZE_BYTES_MAX + fmt.STREAM_NAME_BYTES_MAX + 4096


def _open_for_reading(path: pathlib.Path) -> int | None:
    try:
        return os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None


def iter_payloads(path: pathlib.Path, start_position: int, first_offset: int, end_offset: int,
                  chunk_bytes: int = READ_CHUNK_BYTES) -> Iterator[tuple[int, bytes]]:
    """Valid records of a segment from ``start_position`` with ``first_offset <= offset < end_offset``."""
    fd = _open_for_reading(path)
    if fd is None:
        return
    unpack, header_size, crc32 = fmt.RECORD_HEADER.unpack_from, fmt.RECORD_HEADER.size, zlib.crc32
    try:
        buffer, buffer_position, wanted, previous = b"", start_position, chunk_bytes, -1
        while True:
            chunk = os.pread(fd, wanted, buffer_position + len(buffer))
            if not chunk:
                return  # end of file (a torn tail is simply not yielded)
            buffer = buffer + chunk if buffer else chunk
            view, size, cursor = memoryview(buffer), len(buffer), 0
            while cursor + header_size <= size:
                crc, length, offset, _ = unpack(buffer, cursor)
                end = cursor + header_size + length
                if end > size:
                    break
                if offset <= previous or crc32(view[cursor + 4 : end]) != crc:
                    return
                if offset >= end_offset:
                    return
                if offset >= first_offset:
                    yield offset, buffer[cursor + header_size : end]
                previous, cursor = offset, end
            claimed = _claimed_record_size(buffer, cursor)
            if claimed > _GARBAGE_SIZE_BYTES:
                return
            view.release()
            buffer, buffer_position = buffer[cursor:], buffer_position + cursor
            wanted = max(chunk_bytes, claimed - len(buffer))
    finally:
        os.close(fd)


def _claimed_record_size(buffer: bytes, cursor: int) -> int:
    if cursor + fmt.RECORD_HEADER.size > len(buffer):
        return 0
    return fmt.RECORD_HEADER.size + int(fmt.RECORD_HEADER.unpack_from(buffer, cursor)[1])


class IndexedSegment(Protocol):
    """What ``index_records`` updates: a segment's in-memory sparse index and its running maximum timestamp."""

    base_offset: int
    index: fmt.SparseIndex
    last_indexed_position: int
    max_timestamp_ms: int


def index_records(path: pathlib.Path, segment: IndexedSegment, start_position: int, stop_position: int | None,
                  previous_offset: int, verify_crc: bool, index_interval_bytes: int,
                  chunk_bytes: int = READ_CHUNK_BYTES) -> tuple[int, int]:
    """Add each valid record from ``start_position`` to the segment's sparse index and maximum timestamp.

    A record is indexed when it starts ``index_interval_bytes`` or more past the last indexed one (as appends do).
    Stops at ``stop_position`` (a record may not cross it), at the end of the file, or at the first invalid record
    (torn, impossible length, bad CRC when ``verify_crc``, offset not above the previous one).  Returns
    ``(end_position, last_offset)``: the byte just past the last valid record and that record's offset
    (``previous_offset`` if there was none)."""
    fd = _open_for_reading(path)
    if fd is None:
        return start_position, previous_offset
    unpack, header_size, crc32 = fmt.RECORD_HEADER.unpack_from, fmt.RECORD_HEADER.size, zlib.crc32
    limit = stop_position if stop_position is not None else 2**63
    add_entry, base_offset = segment.index.add, segment.base_offset
    last_indexed, max_timestamp = segment.last_indexed_position, segment.max_timestamp_ms
    try:
        buffer_position, cursor_position, wanted = start_position, start_position, chunk_bytes
        buffer = b""
        while cursor_position < limit:
            chunk = os.pread(fd, min(wanted, limit - buffer_position - len(buffer)), buffer_position + len(buffer))
            if not chunk:
                break
            buffer = buffer + chunk if buffer else chunk
            view, size, cursor = memoryview(buffer), len(buffer), 0
            while cursor + header_size <= size:
                crc, length, offset, timestamp_ms = unpack(buffer, cursor)
                end = cursor + header_size + length
                if end > size:
                    break
                if offset <= previous_offset or (verify_crc and crc32(view[cursor + 4 : end]) != crc):
                    cursor_position = buffer_position + cursor
                    return cursor_position, previous_offset
                position = buffer_position + cursor
                if position > 0 and position - last_indexed >= index_interval_bytes:
                    add_entry(offset - base_offset, position, max_timestamp)
                    last_indexed = position
                if timestamp_ms > max_timestamp:
                    max_timestamp = timestamp_ms
                previous_offset, cursor = offset, end
            cursor_position = buffer_position + cursor
            claimed = _claimed_record_size(buffer, cursor)
            if claimed > _GARBAGE_SIZE_BYTES or cursor_position + claimed > limit:
                break
            view.release()
            buffer, buffer_position = buffer[cursor:], cursor_position
            wanted = max(chunk_bytes, claimed - len(buffer))
        return cursor_position, previous_offset
    finally:
        segment.last_indexed_position, segment.max_timestamp_ms = last_indexed, max_timestamp
        os.close(fd)


def iter_wal_needed(path: pathlib.Path, applied_below: Mapping[str, int],
                    chunk_bytes: int = READ_CHUNK_BYTES) -> Iterator[fmt.WalFrame]:
    """The frames of one WAL file that replay must apply, in order; the rest are skipped by header only.

    An APPEND frame with an offset below ``applied_below[stream]`` is already in its segment (which recovery has
    validated): it is stepped over without a CRC check or a payload copy.  The caller may update the mapping
    between frames (it is read as the scan goes).  Every other frame is fully decoded
    and CRC-checked; the scan ends at the first torn or invalid one (the torn tail of an unclean stop)."""
    fd = _open_for_reading(path)
    if fd is None:
        return
    unpack, header_size = fmt.WAL_HEADER.unpack_from, fmt.WAL_HEADER.size
    names: dict[bytes, str] = {}
    append, name_max, payload_max = int(fmt.WalKind.APPEND), fmt.STREAM_NAME_BYTES_MAX, fmt.PAYLOAD_SIZE_BYTES_MAX
    try:
        buffer, buffer_position, wanted = b"", 0, chunk_bytes
        while True:
            chunk = os.pread(fd, wanted, buffer_position + len(buffer))
            if not chunk:
                return
            buffer = buffer + chunk if buffer else chunk
            size, cursor = len(buffer), 0
            while cursor + header_size <= size:
                _, kind, name_len, length, offset, _ = unpack(buffer, cursor)
                if name_len > name_max or length > payload_max:
                    return
                name_start = cursor + header_size
                end = name_start + name_len + length
                if end > size:
                    break
                if kind == append:
                    name_bytes = buffer[name_start : name_start + name_len]
                    stream = names.get(name_bytes)
                    if stream is not None and offset < applied_below.get(stream, -1):
                        cursor = end
                        continue
                frame = fmt.decode_wal_frame_at(buffer, cursor)
                if frame is None:
                    return
                if frame.kind == append:
                    names[buffer[name_start : name_start + name_len]] = frame.stream
                yield frame
                cursor = end
            claimed = fmt.wal_frame_size_at(buffer, cursor) or 0
            if claimed > _GARBAGE_SIZE_BYTES:
                return
            buffer, buffer_position = buffer[cursor:], buffer_position + cursor
            wanted = max(chunk_bytes, claimed - len(buffer))
    finally:
        os.close(fd)


# --- generic bounded scanner (WAL replay in wal.py, truncation and single-record reads in segment.py) ---------


def scan_file(path: pathlib.Path, start_position: int, decode_at: Callable[[bytes, int], T | None],
              size_at: Callable[[bytes, int], int | None], item_size: Callable[[T], int],
              chunk_bytes: int = READ_CHUNK_BYTES) -> Iterator[tuple[int, T]]:
    """(position, item) for each valid item of a file from ``start_position``, read in bounded chunks.

    Stops at the first item that is corrupt, or torn at the end of the file.  The buffer holds at most one chunk
    plus one item: an item is only waited for if its claimed size is plausible and not yet all read."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        buffer, buffer_position, cursor, at_eof = b"", start_position, 0, False
        while True:
            item = decode_at(buffer, cursor)
            if item is not None:
                yield buffer_position + cursor, item
                cursor += item_size(item)
                continue
            claimed = size_at(buffer, cursor)
            if at_eof or (claimed is not None and claimed <= len(buffer) - cursor):
                return  # torn at the end, or complete and corrupt
            if claimed is not None and claimed > fmt.PAYLOAD_SIZE_BYTES_MAX + 4096:
                return  # a garbage length: do not read the rest of the file hoping for it
            buffer, buffer_position, cursor = buffer[cursor:], buffer_position + cursor, 0
            chunk = os.pread(fd, max(chunk_bytes, (claimed or 0) - len(buffer)), buffer_position + len(buffer))
            at_eof = not chunk
            buffer += chunk
    finally:
        os.close(fd)


def iter_file_records(path: pathlib.Path, start_position: int = 0,
                      chunk_bytes: int = READ_CHUNK_BYTES) -> Iterator[fmt.Record]:
    """Valid records of a segment file from ``start_position`` (offsets must strictly increase)."""
    previous_offset = -1
    for position, record in scan_file(path, start_position, fmt.decode_record_at, fmt.record_size_at,
                                      _record_size, chunk_bytes):
        if record.offset <= previous_offset:
            return
        previous_offset = record.offset
        yield fmt.Record(record.offset, record.timestamp_ms, record.payload, position, record.size_bytes)


def _record_size(record: fmt.Record) -> int:
    return record.size_bytes
