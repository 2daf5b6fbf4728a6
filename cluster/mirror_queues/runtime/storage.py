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
Blocking file I/O, kept off an event loop: `plan` (no I/O) brings the store's view up to the core and returns the
file operations, `execute` runs them (it touches only the files, so a worker thread can run it while the loop
plans the next batch; adjacent appends share one fsync). `persist` does both at once.
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
Plan = list[tuple[str, bytes | int | None]]  # file operations in order: (kind, data), see ReplicaStore.execute


def write_atomically(path: pathlib.Path, data: bytes) -> None:
    """Replace `path` with `data` durably: a temp file, fsync, rename, fsync of the directory."""
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
        self.hw_checkpoint_written = 0  # the HW checkpoint the file holds (`_hw_checkpoint` is the planned one)
        self.fsyncs = 0
        self.planned_appended: list[Record] = []  # the records the last `plan` appends
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
        self.hw_checkpoint_written = self._hw_checkpoint
        return DurableImage(tuple(records), self._epochs, self._hw_checkpoint, self._snapshot)

    # --- keeping the files equal to the core -------------------------------------------------------------------

    def _cut(self, byte_end: int) -> None:
        self._log.truncate(byte_end)
        self._log.flush()
        os.fsync(self._log.fileno())
        self.fsyncs += 1
        self._end = byte_end

    def _rewrite(self, records: list[Record]) -> None:
        """(At load) the log file holds exactly `records`: a new file, fsynced, renamed."""
        self.execute(self._plan_rewrite(records))

    def _plan_cut(self, offset: int, ops: Plan) -> None:
        if offset >= self.written:
            return
        index = max(offset - self._start, 0)
        if index < len(self._positions):  # (below the log start with no record in the file: nothing to cut)
            self._end = self._positions[index]
            ops.append(("cut", self._end))
            del self._positions[index:]

    def _plan_rewrite(self, records: list[Record]) -> Plan:
        encoded = [encode_record(r) for r in records]
        self._positions = []
        self._end = 0
        for chunk in encoded:
            self._positions.append(self._end)
            self._end += len(chunk)
        return [("rewrite", b"".join(encoded))]

    def plan(self, replica: Replica, effects: Iterable[Effect] = ()) -> Plan:
        """The file operations that make the files hold `replica.crash_image()` (cut truncated records, the
        snapshot, the log rewritten from a new start, the epoch cache if it changed, the newly flushed records,
        the HW checkpoint if it moved), in order; this store's view moves on at once, the files when `execute`
        runs the plan (in order with earlier plans; it may run in a worker thread: it touches only the files)."""
        ops: Plan = []
        cuts = [e.to_leo for e in effects if isinstance(e, Truncated)]
        if cuts:
            self._plan_cut(min(cuts), ops)
        if replica.flushed < self.written:  # a truncation below what is written (without its effect at hand)
            self._plan_cut(replica.flushed, ops)
        if replica.snapshot != self._snapshot:
            snap = replica.snapshot
            ops.append(("snapshot", None if snap is None else cbor2.dumps([snap.offset, snap.epoch, snap.data])))
            self._snapshot = snap
        if replica.log_start != self._start:  # trimmed, a snapshot installed, or emptied: the file starts anew
            ops.extend(self._plan_rewrite(replica.records(replica.log_start, min(self.written, replica.flushed))))
            self._start = replica.log_start
        epochs = tuple(replica.epochs)
        if epochs != self._epochs:
            ops.append(("epochs", cbor2.dumps([list(e) for e in epochs])))
            self._epochs = epochs
        appended = replica.records(self.written, replica.flushed)
        self.planned_appended = appended
        if appended:
            chunks = []
            for record in appended:
                encoded = encode_record(record)
                self._positions.append(self._end)
                self._end += len(encoded)
                chunks.append(encoded)
            ops.append(("append", b"".join(chunks)))
        if replica.hw_checkpoint != self._hw_checkpoint:
            ops.append(("hw", str(replica.hw_checkpoint).encode()))
            self._hw_checkpoint = replica.hw_checkpoint
        return ops

    def execute(self, ops: Plan) -> None:
        """Run planned file operations, in order; adjacent appends are written with one fsync."""
        i = 0
        while i < len(ops):
            kind, data = ops[i]
            if kind == "append":
                chunks = [data]
                while i + 1 < len(ops) and ops[i + 1][0] == "append":
                    i += 1
                    chunks.append(ops[i][1])
                self._log.write(b"".join(c for c in chunks if isinstance(c, bytes)))
                self._log.flush()
                os.fsync(self._log.fileno())
            elif kind == "cut":
                assert isinstance(data, int)
                self._log.truncate(data)
                self._log.flush()
                os.fsync(self._log.fileno())
            elif kind == "rewrite":
                self._log.close()
                write_atomically(self.log_path, data if isinstance(data, bytes) else b"")
                self._log = self.log_path.open("ab+")
            elif kind == "snapshot":
                if data is None:
                    self.snapshot_path.unlink(missing_ok=True)
                else:
                    assert isinstance(data, bytes)
                    write_atomically(self.snapshot_path, data)
            elif kind == "epochs":
                assert isinstance(data, bytes)
                write_atomically(self.epochs_path, data)
            elif kind == "hw":
                assert isinstance(data, bytes)
                write_atomically(self.hw_path, data)
                self.hw_checkpoint_written = int(data)
            self.fsyncs += 1
            i += 1

    def persist(self, replica: Replica, effects: Iterable[Effect] = ()) -> list[Record]:
        """`plan` and `execute` at once; returns the records appended."""
        self.execute(self.plan(replica, effects))
        return self.planned_appended

    def close(self) -> None:
        self._log.close()
