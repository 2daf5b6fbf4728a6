"""A pysyncobj journal that reaches the disk before pysyncobj answers anyone.

What it is for: pysyncobj's `FileJournal` writes Raft log entries into an mmap and its term/vote file with a plain
write and rename, and never fsyncs either. Raft's safety needs both to be on stable storage before the node
acknowledges an entry or grants a vote; otherwise a power loss on a majority can forget committed metadata.

How it works: `DurableFileJournal` subclasses `FileJournal` and, after every mutation (append, truncation, clear),
msyncs the mmap and fsyncs the file; its meta (current term, voted-for) goes through `DurableMetaStorer`, which
writes a temporary file, fsyncs it, renames it over the old one and fsyncs the directory. pysyncobj appends and
answers in the same tick, so an entry is durable before the AppendEntries reply that acknowledges it is sent.
`install()` points `pysyncobj.syncobj.createJournal` at this class (pysyncobj has no journal-factory option); it
is idempotent and only changes journals created with a file name.

Compaction (snapshots) is made durable the same way, in three ordered steps that each survive a crash:
1. `DurableSnapshot.serialize` (pysyncobj's `serializer` hook, tick thread) writes our cbor snapshot with a crc32
   to `<dump>.tmp` and fsyncs it; pysyncobj then renames it over the dump file.
2. `DurableFileJournal.deleteEntriesTo` (called by pysyncobj only after step 1 succeeded) first fsyncs the
   directory, so the renamed snapshot is on disk before any entry it replaces is dropped, then rewrites the
   journal atomically: the kept entries go to `<journal>.compact`, fsync, rename over the journal, fsync dir.
   (pysyncobj's own version clears the journal in place and re-adds the entries: a crash in between lost them.)
3. On restart `DurableSnapshot.deserialize` restores the replica and *rolls forward* a compaction interrupted
   between 1 and 2: pysyncobj discards the journal when its first entries are not the snapshot's, which would
   lose every acknowledged entry after the snapshot; we drop the journal prefix the snapshot covers first.
A snapshot received from the leader is fsynced (file and directory) in `deserialize`, before pysyncobj clears
the journal behind it.

Membership: with dynamicMembershipChange pysyncobj hands the group's members (its own node included) to the
serializer and takes them back from the deserializer (it then *replaces* its partner list with them), so the
snapshot stores them as metadata addresses ("cluster"); a snapshot written before this field existed gives back
the members the node runs with now (`members()`), never an empty list.

Known limit (see docs/metadata.md): pysyncobj's journal record format has no checksums, so a torn write of the
last record on power loss is not detected by pysyncobj (the snapshot file has a crc32).
"""

from __future__ import annotations

import os
import struct
import weakref
import zlib
from collections.abc import Callable
from typing import Any

import cbor2
import pysyncobj.syncobj as _syncobj
from pysyncobj.journal import (
    FIRST_RECORD_OFFSET,
    LAST_RECORD_OFFSET_OFFSET,
    FileJournal,
    MemoryJournal,
    MetaStorer,
    ResizableFile,
)
from pysyncobj.node import TCPNode
from pysyncobj.pickle import dumps as _pysyncobj_dumps
from pysyncobj.pickle import to_bytes as _to_bytes

FSYNC_COUNTER = {"journal": 0, "meta": 0, "snapshot": 0}  # observability for tests and status
SNAPSHOT_MAGIC = b"RMQS"
SNAPSHOT_FORMAT = 1
Entry = tuple[bytes, int, int]  # pysyncobj's journal entry: (command, index, term)

_JOURNALS: weakref.WeakValueDictionary[str, DurableFileJournal] = weakref.WeakValueDictionary()


def _private(journal: FileJournal, name: str) -> Any:
    """A name-mangled attribute of pysyncobj's FileJournal (it has no accessors for them)."""
    return getattr(journal, "_FileJournal__" + name)


def fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str) -> None:
    fd = os.open(os.path.dirname(os.path.abspath(path)) or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class DurableMetaStorer(MetaStorer):  # type: ignore[misc]
    def storeMeta(self, meta: dict[str, Any]) -> None:
        path = self.getPath()
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(_pysyncobj_dumps(meta))  # pysyncobj's own term/vote record, read back by pysyncobj
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path)
        FSYNC_COUNTER["meta"] += 1


class DurableFileJournal(FileJournal):  # type: ignore[misc]
    def __init__(self, journal_file: str) -> None:
        super().__init__(journal_file)
        self._FileJournal__metaStorer = DurableMetaStorer(journal_file + ".meta")
        self.path = os.path.abspath(journal_file)
        fsync_dir(journal_file)
        _JOURNALS[self.path] = self

    def _sync(self) -> None:
        resizable = self._FileJournal__journalFile
        resizable.flush()
        os.fsync(resizable._ResizableFile__f.fileno())
        FSYNC_COUNTER["journal"] += 1

    def add(self, command: bytes, idx: int, term: int) -> None:
        super().add(command, idx, term)
        self._sync()

    def clear(self) -> None:
        super().clear()
        self._sync()

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        super().deleteEntriesFrom(entryFrom)
        self._sync()

    def deleteEntriesTo(self, entryTo: int) -> None:
        """Drop the first `entryTo` entries (log compaction) atomically, after making the snapshot durable."""
        fsync_dir(self.path)  # the snapshot pysyncobj just renamed into this directory reaches the disk first
        kept: list[Entry] = list(_private(self, "journal")[entryTo:])
        tmp = self.path + ".compact"
        with open(tmp, "wb") as f:
            f.write(encode_journal(self._FileJournal__getDefaultHeader(), kept))
            f.flush()
            os.fsync(f.fileno())
        _private(self, "journalFile")._destroy()
        os.replace(tmp, self.path)
        fsync_dir(self.path)
        self._FileJournal__journalFile = ResizableFile(self.path)
        self._FileJournal__journal = kept
        self._FileJournal__currentOffset = FIRST_RECORD_OFFSET + sum(_record_size(e) for e in kept)
        FSYNC_COUNTER["journal"] += 1


def _record(entry: Entry) -> bytes:
    command, idx, term = entry
    data: bytes = struct.pack("<QQ", idx, term) + _to_bytes(command)
    size = struct.pack("<I", len(data))
    return size + data + size


def _record_size(entry: Entry) -> int:
    return len(_to_bytes(entry[0])) + 16 + 8


def encode_journal(header: bytes, entries: list[Entry]) -> bytes:
    """A whole pysyncobj journal file (its format: header with the end offset, then size-framed records)."""
    body = b"".join(_record(e) for e in entries)
    end = struct.pack("<I", FIRST_RECORD_OFFSET + len(body))
    return header[:LAST_RECORD_OFFSET_OFFSET] + end + header[LAST_RECORD_OFFSET_OFFSET + 4:] + body


class SnapshotError(Exception):
    """A snapshot file that is not ours, or damaged (bad crc)."""


class DurableSnapshot:
    """pysyncobj's `serializer` / `deserializer` pair for the metadata replica (see the module header).

    `take_state()` returns the replica's state as bytes; `put_state(bytes)` replaces it. Both run in the tick
    thread, where the replica applies commands, so the state taken is exactly the state at pysyncobj's last
    applied entry."""

    def __init__(self, journal_path: str, take_state: Callable[[], bytes],
                 put_state: Callable[[bytes], None], members: Callable[[], tuple[str, ...]] = tuple) -> None:
        self.journal_path = os.path.abspath(journal_path)
        self.take_state = take_state
        self.put_state = put_state
        self.members = members

    def serialize(self, tmp_path: str, data: tuple[Any, ...]) -> None:
        last, prev = data[0], data[1]
        cluster = sorted(str(getattr(n, "id", n)) for n in data[2]) if len(data) > 2 else list(self.members())
        body = cbor2.dumps({"format": SNAPSHOT_FORMAT, "state": self.take_state(),
                            "last": list(last), "prev": list(prev), "cluster": cluster})
        with open(tmp_path, "wb") as f:
            f.write(SNAPSHOT_MAGIC + struct.pack("<I", zlib.crc32(body)) + body)
            f.flush()
            os.fsync(f.fileno())
        FSYNC_COUNTER["snapshot"] += 1

    def deserialize(self, path: str) -> tuple[Entry, Entry, list[Any] | None]:
        fsync_file(path)  # a snapshot received from the leader was renamed into place without fsync
        fsync_dir(path)
        last, prev, state = read_snapshot(path)
        self.put_state(state)
        journal = _JOURNALS.get(self.journal_path)
        if journal is not None:
            roll_forward(journal, last, prev)
        cluster = read_snapshot_cluster(path) or list(self.members())
        return last, prev, ([TCPNode(address) for address in cluster] if cluster else None)  # None: no knowledge


def read_snapshot(path: str) -> tuple[Entry, Entry, bytes]:
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:4] != SNAPSHOT_MAGIC or len(raw) < 8:
        raise SnapshotError(f"{path} is not a raftmq metadata snapshot")
    (crc,) = struct.unpack("<I", raw[4:8])
    if zlib.crc32(raw[8:]) != crc:
        raise SnapshotError(f"{path}: crc mismatch (damaged snapshot)")
    doc = cbor2.loads(raw[8:])
    last, prev = doc["last"], doc["prev"]
    return (last[0], last[1], last[2]), (prev[0], prev[1], prev[2]), doc["state"]


def read_snapshot_cluster(path: str) -> list[str]:
    """The group members a snapshot recorded ([] for a snapshot written before they were recorded)."""
    with open(path, "rb") as f:
        raw = f.read()
    cluster = cbor2.loads(raw[8:]).get("cluster") or []
    return [str(a) for a in cluster]


def roll_forward(journal: DurableFileJournal, last: Entry, prev: Entry) -> bool:
    """Finish a compaction a crash interrupted: when the journal holds the snapshot's two entries further in,
    drop what comes before them, as pysyncobj would have. Returns whether it did."""
    entries = _private(journal, "journal")
    for i in range(len(entries) - 1):
        if tuple(entries[i]) == prev and tuple(entries[i + 1]) == last:
            if i > 0:
                journal.deleteEntriesTo(i)
            return i > 0
    return False


def _create_journal(journal_file: str | None = None) -> Any:
    if journal_file is None:
        return MemoryJournal()
    return DurableFileJournal(journal_file)


def install() -> None:
    _syncobj.createJournal = _create_journal
