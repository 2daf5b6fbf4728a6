"""Test-only mode `test_drop_unsynced_on_kill` of node/runtime/store.py: what the last fsync covered, recorded and
enforced, so that a kill -9 loses what a power loss would (the chaos tests; never for production).

A SIGKILL of the process does not lose what it wrote (the OS page cache keeps it), so a plain kill -9 never tests
the fsyncs. In this mode, after every successful `NodeLog.commit()` (and after every compaction job batch, and
once right after `NodeLog.open`) the store records, durably (temp file, fsync,
rename, fsync the directory), the size of every append-only file of the log as it is right then: the WAL files
(`wal/*.wal`) and the segment files (`streams/*/*.log`). At the next start, before `NodeLog.open`, every
recorded file that has grown is cut back to its recorded size, and the record is removed (durably) before the
log is opened, so a crash during recovery never applies a stale record to files that recovery has rewritten
and fsynced.
Why this is what fsync covered: `commit()` writes the batch's WAL frames, then the same records to the
segments (plain writes), then fdatasyncs the WAL; when it returns, every WAL byte written so far is durable, and
every segment byte written so far is a copy of WAL frames written before it (so durable through WAL replay).
A segment byte is also durable by its own fsync at a roll or a checkpoint, both inside `commit()` or `open()`,
so they precede the next record. The record can over-approximate (keep a few bytes that were not fsynced):
an append that overflows its buffer may write WAL frames and segment records from the event-loop thread
while the fsync runs; it writes WAL first, so what is kept is still a state a real crash could leave
(everything written up to an instant survived). It never under-approximates for appends: files are only
appended to between records. Files absent from the record (a segment or WAL file created after it, by a roll
or a checkpoint a crash interrupted before the next record) are left as they are, and so are files written
atomically or with their own fsync (`snapshot`, `stream.name`, index files, `recovery-point`): dropping them
could drop data that was durable. Segment rolls (64 MiB) and snapshots do not happen in the chaos tests, so
there the drop is exactly "WAL and active segments back to the last fsync".
"""

from __future__ import annotations

import json
import os
from pathlib import Path

SYNCED_SIZES_FILE = "test-synced-sizes.json"  # test_drop_unsynced_on_kill: sizes as of the last fsync


def _append_only_files(directory: Path) -> list[Path]:
    """The log's files that are only ever appended to between fsyncs: WAL files and segment .log files."""
    return sorted([*directory.glob("wal/*.wal"), *directory.glob("streams/*/*.log")])


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def record_synced_sizes(directory: Path) -> None:
    """test_drop_unsynced_on_kill: durably record the size of every append-only log file (call right after an
    fsync returned; see the module docstring for why this is what the fsync covered)."""
    sizes: dict[str, int] = {}
    for path in _append_only_files(directory):
        try:
            sizes[str(path.relative_to(directory))] = path.stat().st_size
        except FileNotFoundError:
            continue  # deleted by a racing roll or snapshot
    target = directory / SYNCED_SIZES_FILE
    temporary = target.with_name(target.name + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, json.dumps(sizes).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, target)
    _fsync_directory(directory)


def drop_unsynced(directory: Path) -> int:
    """test_drop_unsynced_on_kill, before `NodeLog.open`: cut every recorded file back to its recorded size (what
    a power loss would have left), then remove the record durably. Returns the bytes dropped."""
    target = directory / SYNCED_SIZES_FILE
    try:
        sizes = json.loads(target.read_bytes())
    except FileNotFoundError:
        return 0
    dropped = 0
    for name, size in sizes.items():
        path = directory / name
        try:
            current = path.stat().st_size
        except FileNotFoundError:
            continue
        if current > size:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.ftruncate(fd, size)
                os.fsync(fd)
            finally:
                os.close(fd)
            dropped += current - size
    target.unlink()
    _fsync_directory(directory)
    return dropped
