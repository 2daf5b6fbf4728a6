"""A mirrored-queue replica's files: the log, the leader-epoch cache and the HW checkpoint, kept equal to the core.

What it is for: the pure `Replica` says what a crash leaves (`crash_image()`: the snapshot, the flushed log
prefix, the epoch cache, the HW checkpoint); this module keeps exactly that on disk, and `load()` gives it back as a
`DurableImage` for `Replica.recover`, so a process killed with kill -9 restarts in the state the model predicts.

How it works (one directory per replica):
- `snapshot`: the core's `Snapshot` below the log start as cbor `[offset, epoch, data]`, written atomically
  (below) when it changes, before the log is rewritten without the records it covers.
- `log`: append-only records, each a 4-byte big-endian length, a 4-byte CRC-32 of the body, and the body
  (cbor `[offset, epoch, msg]`). `persist` writes `log[written:flushed]` and fsyncs; the flush policy lives in the
  core: with `flush="fsync"` every append is flushed at once (so written and fsynced before the replica answers or
  fetches again), with `flush="unsynced"` the unflushed tail stays in the process's memory (standing in for the
  page cache) until the host's writeback calls `Replica.flush()` every `writeback_interval_ms`, so kill -9 loses
  it, as a power cut loses Kafka's page cache. A truncation in the core (a `Truncated` effect, or the flushed
  prefix shrinking below what is written) cuts the file at the record's byte position. A torn or corrupt tail
  (a crash mid-write) is cut off by `load()`. When the log start moves (`Replica.trim`, or a follower installing
  the leader's snapshot), the file is rewritten with the records from the new start (a temporary file, fsynced,
  renamed): a crash between the snapshot and that rewrite leaves records below the snapshot, which `load()`
  skips. `read_records(directory)` reads the records of a replica's log without changing anything (the chaos
  checker's divergence check reads replicas' logs with it).
- `epochs`: the leader-epoch cache as cbor `[[epoch, start offset], ...]`, rewritten whole on every change
  (written to a temporary file, fsynced, renamed, directory fsynced): written through, as the core assumes. It is
  written before the log records of a new epoch, and entries at or beyond the recovered log end are dropped on
  recovery (`Replica.recover`), so a crash between the two writes leaves a consistent pair.
- `hw-checkpoint`: the checkpointed HW as decimal text, rewritten the same way whenever the core's
  `hw_checkpoint` moved (the core moves it every `hw_checkpoint_interval_ms`).
Blocking file I/O: the runtime calls it from its trio task (an fsync per batch, as the Raft storage does).
"""

from __future__ import annotations

import os
import pathlib
import zlib
from collections.abc import Iterable

import cbor2

from cluster.mirror_queues.core.replica import DurableImage, Replica
from cluster.mirror_queues.core.types import Effect, Record, Snapshot, Truncated

HEADER_BYTES = 8


def _write_atomically(path: pathlib.Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def encode_record(record: Record) -> bytes:
    body = cbor2.dumps([record.offset, record.epoch, record.msg])
    return len(body).to_bytes(4, "big") + zlib.crc32(body).to_bytes(4, "big") + body


def _parse(data: bytes, start: int) -> tuple[list[Record], list[int], int, int]:
    """The valid records of a log file's bytes from offset `start` on (records below it are skipped), their byte
    positions, where the valid part ends and how many records were skipped."""
    records: list[Record] = []
    positions: list[int] = []
    skipped = 0
    position = 0
    while position + HEADER_BYTES <= len(data):
        size = int.from_bytes(data[position : position + 4], "big")
        crc = int.from_bytes(data[position + 4 : position + 8], "big")
        body = data[position + HEADER_BYTES : position + HEADER_BYTES + size]
        if len(body) < size or zlib.crc32(body) != crc:
            break
        offset, epoch, msg = cbor2.loads(body)
        if offset < start and not records:
            skipped += 1
        elif offset != start + len(records):
            break
        else:
            records.append(Record(offset, epoch, msg))
            positions.append(position)
        position += HEADER_BYTES + size
    return records, positions, position, skipped


def read_snapshot(directory: pathlib.Path) -> Snapshot | None:
    path = directory / "snapshot"
    if not path.exists():
        return None
    offset, epoch, data = cbor2.loads(path.read_bytes())
    return Snapshot(int(offset), int(epoch), str(data))


def read_records(directory: pathlib.Path) -> list[tuple[int, int, str]]:
    """The (offset, epoch, payload) records a replica's log holds on disk, from its log start (the snapshot's
    offset; 0 without one) up to the first torn or corrupt record. Reads only."""
    snapshot = read_snapshot(directory)
    path = directory / "log"
    data = path.read_bytes() if path.exists() else b""
    records, _, _, _ = _parse(data, snapshot.offset if snapshot is not None else 0)
    return [(r.offset, r.epoch, r.msg) for r in records]


class ReplicaStore:
    """The three files of one replica under `directory`; `written` records of the log are on disk."""

    def __init__(self, directory: pathlib.Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.log_path = directory / "log"
        self.epochs_path = directory / "epochs"
        self.hw_path = directory / "hw-checkpoint"
        self.snapshot_path = directory / "snapshot"
        self._start = 0  # the offset of the first record in the file (the log start)
        self._snapshot: Snapshot | None = None
        self._positions: list[int] = []  # byte position of each record on disk
        self._end = 0  # byte length of the valid log
        self._epochs: tuple[tuple[int, int], ...] = ()
        self._hw_checkpoint = 0
        self.fsyncs = 0
        self._log = self.log_path.open("ab+")

    @property
    def written(self) -> int:
        """The offset after the last record on disk."""
        return self._start + len(self._positions)

    def exists(self) -> bool:
        return (self.epochs_path.exists() or self.hw_path.exists() or self.snapshot_path.exists()
                or self.log_path.stat().st_size > 0)

    # --- recovery ----------------------------------------------------------------------------------------------

    def load(self) -> DurableImage:
        """What is on disk; a torn or corrupt tail of the log is cut off (and the file truncated there)."""
        self._snapshot = read_snapshot(self.directory)
        self._start = self._snapshot.offset if self._snapshot is not None else 0
        self._log.seek(0)
        data = self._log.read()
        records, self._positions, position, skipped = _parse(data, self._start)
        self._end = position
        if skipped:  # a crash between writing the snapshot and rewriting the log
            self._rewrite(records)
        elif position < len(data):
            self._cut(position)
        self._epochs = ()
        if self.epochs_path.exists():
            self._epochs = tuple((int(e), int(s)) for e, s in cbor2.loads(self.epochs_path.read_bytes()))
        self._hw_checkpoint = int(self.hw_path.read_text()) if self.hw_path.exists() else 0
        return DurableImage(tuple(records), self._epochs, self._hw_checkpoint, self._snapshot)

    # --- keeping the files equal to the core -------------------------------------------------------------------

    def _cut(self, byte_end: int) -> None:
        self._log.truncate(byte_end)
        self._log.flush()
        os.fsync(self._log.fileno())
        self.fsyncs += 1
        self._end = byte_end

    def _truncate_to(self, offset: int) -> None:
        if offset >= self.written:
            return
        index = max(offset - self._start, 0)
        if index < len(self._positions):  # (below the log start with no record in the file: nothing to cut)
            self._cut(self._positions[index])
            del self._positions[index:]

    def _rewrite(self, records: list[Record]) -> None:
        """The log file holds exactly `records` (from the log start on): a new file, fsynced, renamed."""
        encoded = [encode_record(r) for r in records]
        self._log.close()
        _write_atomically(self.log_path, b"".join(encoded))
        self.fsyncs += 1
        self._log = self.log_path.open("ab+")
        self._positions = []
        self._end = 0
        for chunk in encoded:
            self._positions.append(self._end)
            self._end += len(chunk)

    def persist(self, replica: Replica, effects: Iterable[Effect] = ()) -> list[Record]:
        """Make the files hold `replica.crash_image()`: cut truncated records, write the epoch cache if it changed,
        append and fsync the newly flushed records (returned), write the HW checkpoint if it moved."""
        cuts = [e.to_leo for e in effects if isinstance(e, Truncated)]
        if cuts:
            self._truncate_to(min(cuts))
        if replica.flushed < self.written:  # a truncation below what is written (without its effect at hand)
            self._truncate_to(replica.flushed)
        if replica.snapshot != self._snapshot:
            if replica.snapshot is None:
                self.snapshot_path.unlink(missing_ok=True)
            else:
                snap = replica.snapshot
                _write_atomically(self.snapshot_path, cbor2.dumps([snap.offset, snap.epoch, snap.data]))
                self.fsyncs += 1
            self._snapshot = replica.snapshot
        if replica.log_start != self._start:  # trimmed, a snapshot installed, or emptied: the file starts anew
            self._rewrite(replica.records(replica.log_start, min(self.written, replica.flushed)))
            self._start = replica.log_start
        epochs = tuple(replica.epochs)
        if epochs != self._epochs:
            _write_atomically(self.epochs_path, cbor2.dumps([list(e) for e in epochs]))
            self._epochs = epochs
            self.fsyncs += 1
        appended = replica.records(self.written, replica.flushed)
        if appended:
            chunks = []
            for record in appended:
                encoded = encode_record(record)
                self._positions.append(self._end)
                self._end += len(encoded)
                chunks.append(encoded)
            self._log.write(b"".join(chunks))
            self._log.flush()
            os.fsync(self._log.fileno())
            self.fsyncs += 1
        if replica.hw_checkpoint != self._hw_checkpoint:
            _write_atomically(self.hw_path, str(replica.hw_checkpoint).encode())
            self._hw_checkpoint = replica.hw_checkpoint
            self.fsyncs += 1
        return appended

    def close(self) -> None:
        self._log.close()
