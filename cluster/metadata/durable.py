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

Known limits (see docs/metadata.md): the record format has no checksums, so a torn write of the last record on
power loss is not detected by pysyncobj; log compaction is left off by the store for that reason and because
pysyncobj's full-dump file is not fsynced either.
"""

from __future__ import annotations

import os
from typing import Any

import pysyncobj.syncobj as _syncobj
from pysyncobj.journal import FileJournal, MemoryJournal, MetaStorer
from pysyncobj.pickle import dumps as _pysyncobj_dumps

FSYNC_COUNTER = {"journal": 0, "meta": 0}  # observability for tests and status


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
        fsync_dir(journal_file)

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


def _create_journal(journal_file: str | None = None) -> Any:
    if journal_file is None:
        return MemoryJournal()
    return DurableFileJournal(journal_file)


def install() -> None:
    _syncobj.createJournal = _create_journal
