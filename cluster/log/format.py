"""Pure on-disk formats of the log: segment records, WAL frames, index entries, snapshots.

No file I/O here: every function maps bytes to values and back, so each edge case (torn tail, flipped bit,
garbage length) is a unit test.  The file code in ``segment.py``/``wal.py`` calls these helpers.

Layout (all little-endian, packed with ``struct`` rather than cbor2, which is slower per record:
``bench/micro/log_storage.py``, figures in docs/benchmarks.md "Log record format"):

- Segment record: ``crc32 u32 | payload_len u32 | offset u64 | timestamp_ms i64 | payload``.
  The CRC covers everything after itself.  24-byte header.
- WAL frame: ``crc32 u32 | kind u8 | stream_len u16 | payload_len u32 | offset u64 | timestamp_ms i64 |
  stream (utf-8) | payload``.  Kinds: APPEND, TRUNCATE (drop records > offset), DELETE (drop the stream: replay
  removes what it holds of it so far).
- Offset index entry: ``relative_offset u32 | position u32`` (sparse, one per ``index_interval_bytes``).
- Time index entry: ``timestamp_ms i64 | relative_offset u32`` (max timestamp seen so far, monotone).
- Snapshot file: ``magic 4s | crc32 u32 | offset i64 | state_len u32 | state``.
- Recovery point (node-wide, rewritten at each checkpoint): ``magic 4s | crc32 u32 | count u32`` then per stream
  ``directory 32s | active_base u64 | synced_size u64 | index_entries u32 | index_crc u32``: bytes of the active
  segment known to be fsynced, and the entry count and CRC of that prefix's saved sparse index (``active.index``:
  relative offsets u32[], positions u32[], max timestamps i64[]).  ``open`` loads the saved index, walks the few
  headers after its last entry (no CRC) and validates just the tail written after the checkpoint.  Version 1
  (magic ``RMQR``, no index fields) is still read: its prefix is walked by headers.

A scan stops at the first record that is short, has an impossible length or a bad CRC; everything from there
on is a torn or corrupt tail and the caller truncates the file at ``valid_end``.
"""

from __future__ import annotations

import bisect
import itertools
import operator
import struct
import sys
import zlib
from array import array
from collections.abc import Iterable, Iterator
from enum import IntEnum
from typing import NamedTuple

RECORD_HEADER = struct.Struct("<IIqq")
RECORD_BODY_HEADER = struct.Struct("<Iqq")  # the CRC-covered part of the record header
WAL_HEADER = struct.Struct("<IBHIqq")
WAL_BODY_HEADER = struct.Struct("<BHIqq")
INDEX_ENTRY = struct.Struct("<II")
TIME_INDEX_ENTRY = struct.Struct("<qI")
SNAPSHOT_HEADER = struct.Struct("<4sIqI")
SNAPSHOT_MAGIC = b"RMQS"

PAYLOAD_SIZE_BYTES_MAX = 256 * 1024 * 1024  # any larger length field is garbage, not a record
STREAM_NAME_BYTES_MAX = 1024


class WalKind(IntEnum):
    APPEND = 1
    TRUNCATE = 2
    DELETE = 3


class Record(NamedTuple):  # a NamedTuple, not a frozen dataclass: built once per record read, on the hot path
    offset: int
    timestamp_ms: int
    payload: bytes
    position: int  # byte position of the record in its file
    size_bytes: int  # header + payload


class WalFrame(NamedTuple):
    kind: int  # a WalKind value (kept a plain int: building the enum per frame costs more than the rest)
    stream: str
    offset: int
    timestamp_ms: int
    payload: bytes
    size_bytes: int


# --- segment records -------------------------------------------------------------------------------------------


def encode_record(offset: int, timestamp_ms: int, payload: bytes) -> bytes:
    body_header = RECORD_BODY_HEADER.pack(len(payload), offset, timestamp_ms)
    crc = zlib.crc32(payload, zlib.crc32(body_header))
    return struct.pack("<I", crc) + body_header + payload


RECORD_CRC = struct.Struct("<I")  # the CRC in front of RECORD_BODY_HEADER


def decode_record_at(data: bytes | memoryview, position: int) -> Record | None:
    """The valid record starting at ``position``, or None if it is torn, garbage or corrupt."""
    end_header = position + RECORD_HEADER.size
    if end_header > len(data):
        return None
    crc, length, offset, timestamp_ms = RECORD_HEADER.unpack_from(data, position)
    end = end_header + length
    if length > PAYLOAD_SIZE_BYTES_MAX or end > len(data):
        return None
    view = memoryview(data)
    if zlib.crc32(view[position + 4 : end]) != crc:  # body header and payload are contiguous: one CRC call
        return None
    return Record(offset, timestamp_ms, bytes(view[end_header:end]), position, RECORD_HEADER.size + length)


def scan_records(data: bytes | memoryview, start_position: int = 0) -> Iterator[Record]:
    """Every valid record from ``start_position`` on, stopping at the first invalid one.

    Offsets must strictly increase; a record that breaks the order is treated as corruption."""
    position = start_position
    previous_offset = -1
    while True:
        record = decode_record_at(data, position)
        if record is None or record.offset <= previous_offset:
            return
        yield record
        previous_offset = record.offset
        position += record.size_bytes


def record_size_at(data: bytes | memoryview, position: int) -> int | None:
    """Total size the record header at ``position`` claims (None if the header itself is incomplete)."""
    if position + RECORD_HEADER.size > len(data):
        return None
    return RECORD_HEADER.size + int(RECORD_HEADER.unpack_from(data, position)[1])


# --- WAL frames ------------------------------------------------------------------------------------------------


def encode_wal_frame(kind: WalKind, stream: str, offset: int, timestamp_ms: int, payload: bytes) -> bytes:
    name = stream.encode()
    if len(name) > STREAM_NAME_BYTES_MAX:
        raise ValueError(f"stream name longer than {STREAM_NAME_BYTES_MAX} bytes")
    body_header = WAL_BODY_HEADER.pack(int(kind), len(name), len(payload), offset, timestamp_ms)
    crc = zlib.crc32(payload, zlib.crc32(name, zlib.crc32(body_header)))
    return b"".join((struct.pack("<I", crc), body_header, name, payload))


_CRC = struct.Struct("<I")


def encode_wal_frames(ops: Iterable[tuple[WalKind, str, int, int, bytes, int]]) -> bytes:
    """``encode_wal_frame`` of every ``(kind, stream, offset, timestamp_ms, payload, _)`` op, joined (the commit's
    batch: each stream's name encoded once, no call per frame)."""
    parts: list[bytes] = []
    append = parts.append
    names: dict[str, bytes] = {}
    crc32 = zlib.crc32
    pack_body_header = WAL_BODY_HEADER.pack
    pack_crc = _CRC.pack
    for kind, stream, offset, timestamp_ms, payload, _ in ops:
        name = names.get(stream)
        if name is None:
            name = names[stream] = stream.encode()
            if len(name) > STREAM_NAME_BYTES_MAX:
                raise ValueError(f"stream name longer than {STREAM_NAME_BYTES_MAX} bytes")
        body_header = pack_body_header(kind, len(name), len(payload), offset, timestamp_ms)
        append(pack_crc(crc32(payload, crc32(name, crc32(body_header)))))
        append(body_header)
        append(name)
        append(payload)
    return b"".join(parts)


def decode_wal_frame_at(data: bytes | memoryview, position: int) -> WalFrame | None:
    end_header = position + WAL_HEADER.size
    if end_header > len(data):
        return None
    crc, kind, name_len, length, offset, timestamp_ms = WAL_HEADER.unpack_from(data, position)
    if name_len > STREAM_NAME_BYTES_MAX or length > PAYLOAD_SIZE_BYTES_MAX:
        return None
    end = end_header + name_len + length
    if end > len(data) or kind not in _WAL_KINDS:
        return None
    view = memoryview(data)
    if zlib.crc32(view[position + 4 : end]) != crc:
        return None
    try:
        stream = str(view[end_header : end_header + name_len], "utf-8")
    except UnicodeDecodeError:
        return None
    return WalFrame(kind, stream, offset, timestamp_ms, bytes(view[end_header + name_len : end]), end - position)


_WAL_KINDS = frozenset(int(k) for k in WalKind)


def wal_frame_size_at(data: bytes | memoryview, position: int) -> int | None:
    """Total size the frame header at ``position`` claims (None if the header itself is incomplete)."""
    if position + WAL_HEADER.size > len(data):
        return None
    _, _, name_len, length, _, _ = WAL_HEADER.unpack_from(data, position)
    return WAL_HEADER.size + int(name_len) + int(length)


def scan_wal(data: bytes | memoryview) -> Iterator[WalFrame]:
    """Every valid frame from the start, stopping at the first torn or corrupt one."""
    position = 0
    while True:
        frame = decode_wal_frame_at(data, position)
        if frame is None:
            return
        yield frame
        position += frame.size_bytes


# --- indexes ---------------------------------------------------------------------------------------------------


def encode_index_entry(relative_offset: int, position: int) -> bytes:
    return INDEX_ENTRY.pack(relative_offset, position)


def decode_index(data: bytes, file_size_bytes: int) -> list[tuple[int, int]] | None:
    """Offset-index entries, or None if the file is not a plausible index for a segment of that size."""
    if len(data) % INDEX_ENTRY.size:
        return None
    entries = [INDEX_ENTRY.unpack_from(data, i) for i in range(0, len(data), INDEX_ENTRY.size)]
    for (rel_a, pos_a), (rel_b, pos_b) in itertools.pairwise(entries):
        if rel_b <= rel_a or pos_b <= pos_a:
            return None
    if entries and entries[-1][1] >= file_size_bytes:
        return None
    return entries


def encode_time_index_entry(timestamp_ms: int, relative_offset: int) -> bytes:
    return TIME_INDEX_ENTRY.pack(timestamp_ms, relative_offset)


def decode_time_index(data: bytes) -> list[tuple[int, int]]:
    usable = len(data) - len(data) % TIME_INDEX_ENTRY.size
    return [TIME_INDEX_ENTRY.unpack_from(data, i) for i in range(0, usable, TIME_INDEX_ENTRY.size)]


class SparseIndex:
    """A segment's offset and time indexes in memory: three parallel arrays, 16 bytes per entry.

    Entry i says: the record with relative offset ``relative_offsets[i]`` starts at ``positions[i]``, and every
    record before it has a timestamp <= ``max_timestamps_before[i]``.  Entries are added about once per
    ``index_interval_bytes`` of records, so a 10 GiB backlog costs ~40 MB of index at the 4 KiB default."""

    __slots__ = ("max_timestamps_before", "positions", "relative_offsets")

    def __init__(self) -> None:
        self.relative_offsets = array("I")
        self.positions = array("I")
        self.max_timestamps_before = array("q")

    def __len__(self) -> int:
        return len(self.positions)

    def add(self, relative_offset: int, position: int, max_timestamp_before_ms: int) -> None:
        self.relative_offsets.append(relative_offset)
        self.positions.append(position)
        self.max_timestamps_before.append(max_timestamp_before_ms)

    def last_position(self) -> int:
        return self.positions[-1] if self.positions else 0

    def floor_position(self, relative_offset: int) -> int:
        """Byte position to start scanning from to find ``relative_offset`` (the largest entry <= it)."""
        i = bisect.bisect_right(self.relative_offsets, relative_offset) - 1
        return self.positions[i] if i >= 0 else 0

    def position_for_time(self, timestamp_ms: int) -> int:
        """Byte position to scan from for the first record with a timestamp >= ``timestamp_ms``."""
        i = bisect.bisect_left(self.max_timestamps_before, timestamp_ms) - 1
        return self.positions[i] if i >= 0 else 0

    def truncate_at_position(self, size_bytes: int) -> None:
        """Drop the entries at or past ``size_bytes`` (the segment was cut there)."""
        keep = bisect.bisect_left(self.positions, size_bytes)
        del self.relative_offsets[keep:], self.positions[keep:], self.max_timestamps_before[keep:]

    def encode_files(self) -> tuple[bytes, bytes]:
        """(.index bytes, .timeindex bytes)."""
        entries = zip(self.relative_offsets, self.positions, self.max_timestamps_before, strict=True)
        index, times = [], []
        for relative, position, timestamp in entries:
            index.append(encode_index_entry(relative, position))
            times.append(encode_time_index_entry(timestamp, relative))
        return b"".join(index), b"".join(times)

    @classmethod
    def decode_files(cls, index_bytes: bytes, time_bytes: bytes, file_size_bytes: int) -> SparseIndex | None:
        """The index of a sealed segment, or None if the files are implausible (then: rebuild by scanning).

        Decoded with array slicing and C-level comparisons (no Python loop per entry in the offset index): a
        segment's index is read at every open, ~16k entries per 64 MiB segment at the default interval."""
        count = len(index_bytes) // INDEX_ENTRY.size
        if len(index_bytes) % INDEX_ENTRY.size or len(time_bytes) != count * TIME_INDEX_ENTRY.size:
            return None
        pairs = array("I")
        pairs.frombytes(index_bytes)
        if sys.byteorder != "little":
            pairs.byteswap()
        index = cls()
        index.relative_offsets, index.positions = pairs[0::2], pairs[1::2]
        timestamps, time_relatives = zip(*TIME_INDEX_ENTRY.iter_unpack(time_bytes), strict=True) if count else ((), ())
        index.max_timestamps_before = array("q", timestamps)
        if array("I", time_relatives) != index.relative_offsets or not (_strictly_increasing(index.relative_offsets)
                                                            and _strictly_increasing(index.positions)):
            return None
        if count and index.positions[-1] >= file_size_bytes:
            return None
        return index


def _strictly_increasing(values: array[int]) -> bool:
    return all(map(operator.lt, values, itertools.islice(values, 1, None)))


def segment_for_offset(bases: list[int], offset: int) -> int:
    """Index into sorted ``bases`` of the segment holding ``offset`` (-1 if before the first)."""
    return bisect.bisect_right(bases, offset) - 1


def segment_file_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


# --- snapshots -------------------------------------------------------------------------------------------------


def encode_snapshot(offset: int, state: bytes) -> bytes:
    crc = zlib.crc32(state, zlib.crc32(struct.pack("<qI", offset, len(state))))
    return SNAPSHOT_HEADER.pack(SNAPSHOT_MAGIC, crc, offset, len(state)) + state


def decode_snapshot(data: bytes) -> tuple[int, bytes] | None:
    if len(data) < SNAPSHOT_HEADER.size:
        return None
    magic, crc, offset, length = SNAPSHOT_HEADER.unpack_from(data, 0)
    state = data[SNAPSHOT_HEADER.size :]
    if magic != SNAPSHOT_MAGIC or length != len(state):
        return None
    if zlib.crc32(state, zlib.crc32(struct.pack("<qI", offset, length))) != crc:
        return None
    return offset, state


# --- recovery point --------------------------------------------------------------------------------------------

RECOVERY_POINT_HEADER = struct.Struct("<4sII")
RECOVERY_POINT_ENTRY_V1 = struct.Struct("<32sQQ")
RECOVERY_POINT_ENTRY = struct.Struct("<32sQQII")
RECOVERY_POINT_MAGIC_V1 = b"RMQR"
RECOVERY_POINT_MAGIC = b"RMQ2"


class RecoveryPoint(NamedTuple):
    """What the last checkpoint made durable of a stream's active segment.

    ``synced_size_bytes`` of the segment were fsynced; ``index_entries``/``index_crc`` describe the saved sparse
    index of that prefix (``active.index``, see ``encode_saved_index``); 0 entries = no saved index."""

    active_base: int
    synced_size_bytes: int
    index_entries: int = 0
    index_crc: int = 0


def encode_recovery_point(entries: dict[str, RecoveryPoint]) -> bytes:
    body = b"".join(RECOVERY_POINT_ENTRY.pack(name.encode(), *point) for name, point in sorted(entries.items()))
    return RECOVERY_POINT_HEADER.pack(RECOVERY_POINT_MAGIC, zlib.crc32(body), len(entries)) + body


def decode_recovery_point(data: bytes) -> dict[str, RecoveryPoint]:
    """Directory name -> recovery point; empty if the file is damaged (then: full scans).  Reads both versions."""
    if len(data) < RECOVERY_POINT_HEADER.size:
        return {}
    magic, crc, count = RECOVERY_POINT_HEADER.unpack_from(data, 0)
    entry = {RECOVERY_POINT_MAGIC: RECOVERY_POINT_ENTRY, RECOVERY_POINT_MAGIC_V1: RECOVERY_POINT_ENTRY_V1}.get(magic)
    body = data[RECOVERY_POINT_HEADER.size :]
    if entry is None or len(body) != count * entry.size or zlib.crc32(body) != crc:
        return {}
    entries: dict[str, RecoveryPoint] = {}
    for i in range(count):
        name, *point = entry.unpack_from(body, i * entry.size)
        entries[name.decode("ascii", "replace")] = RecoveryPoint(*point)
    return entries


# --- saved sparse index of an active segment -------------------------------------------------------------------
# The three arrays of a SparseIndex back to back, little-endian; the entry count and a CRC of the bytes live in the
# recovery point, so a stale, torn or unsynced file is detected (and the prefix is walked by headers instead).


def encode_saved_index(index: SparseIndex) -> bytes:
    parts = [array(a.typecode, a) for a in (index.relative_offsets, index.positions, index.max_timestamps_before)]
    if sys.byteorder != "little":
        for part in parts:
            part.byteswap()
    return b"".join(part.tobytes() for part in parts)


def decode_saved_index(data: bytes, point: RecoveryPoint) -> SparseIndex | None:
    """The saved index the recovery point describes, or None if ``data`` does not match it or is implausible."""
    count = point.index_entries
    size_bytes = count * SAVED_INDEX_ENTRY_BYTES
    if count <= 0 or len(data) < size_bytes or zlib.crc32(data[:size_bytes]) != point.index_crc:
        return None
    index = SparseIndex()
    arrays = (index.relative_offsets, index.positions, index.max_timestamps_before)
    start = 0
    for part in arrays:
        end = start + count * part.itemsize
        part.frombytes(data[start:end])
        if sys.byteorder != "little":
            part.byteswap()
        start = end
    positions = index.positions
    if any(b <= a for a, b in itertools.pairwise(positions)) or positions[-1] >= point.synced_size_bytes:
        return None
    return index


SAVED_INDEX_ENTRY_BYTES = 4 + 4 + 8
