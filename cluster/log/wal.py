"""The shared per-node write-ahead log: one file of interleaved frames of every stream, fsynced in groups.

``write`` appends a batch of encoded frames (one ``pwrite``); ``sync`` is the one fsync that makes every frame
written so far durable (group commit).  A failed write cuts the file back to its previous size, so the file never
holds a partial frame that a later write would bury.  Files are numbered; at a checkpoint (every frame is in the
segment files, and those are fsynced) a new file starts and the old ones are deleted, so the WAL stays bounded.
``replay_needed`` (what ``NodeLog.open`` uses) yields, oldest file first, the valid frames not yet in the segments,
stepping over the others by header.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterator, Mapping

from cluster.log import format as fmt
from cluster.log.scan import iter_wal_needed
from cluster.log.segment import fsync_directory, pwrite_all, raise_disk_full_or

WAL_SUFFIX = ".wal"


def wal_files(directory: pathlib.Path) -> list[pathlib.Path]:
    return sorted(p for p in directory.glob("*" + WAL_SUFFIX) if p.stem.isdigit())


def replay_needed(directory: pathlib.Path, applied_below: Mapping[str, int]) -> Iterator[fmt.WalFrame]:
    """The valid frames of every WAL file, oldest first; APPEND frames with an offset below
    ``applied_below[stream]`` (already in the segments) are skipped cheaply (by header: no CRC, no payload copy), and files are not cut: the caller checkpoints, which
    deletes them."""
    for path in wal_files(directory):
        yield from iter_wal_needed(path, applied_below)


class WalWriter:
    """Appends to the newest WAL file.  ``write`` runs under the node's I/O lock; ``sync`` may run beside it."""

    def __init__(self, directory: pathlib.Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        existing = wal_files(directory)
        self._number = int(existing[-1].stem) + 1 if existing else 0
        self._fd = -1
        self.size_bytes = 0
        self._synced_size_bytes = 0
        self._open_new_file()

    @property
    def path(self) -> pathlib.Path:
        return self.directory / f"{self._number:020d}{WAL_SUFFIX}"

    def _open_new_file(self) -> None:
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self.size_bytes = 0
        self._synced_size_bytes = 0
        fsync_directory(self.directory)

    def write(self, data: bytes) -> None:
        try:
            pwrite_all(self._fd, data, self.size_bytes)
        except OSError as error:
            os.ftruncate(self._fd, self.size_bytes)
            raise_disk_full_or(error)
        self.size_bytes += len(data)

    def sync(self) -> None:
        """fdatasync everything written so far (skipped when nothing was written since the last sync: idle nodes).

        fdatasync also flushes the file size a write extended, which is all recovery needs of the metadata."""
        target_size = self.size_bytes  # read before the fsync: concurrent later writes are not claimed as synced
        if target_size == self._synced_size_bytes:
            return
        try:
            os.fdatasync(self._fd)
        except OSError as error:
            raise_disk_full_or(error)
        self._synced_size_bytes = max(self._synced_size_bytes, target_size)

    def start_new_file(self) -> None:
        """Checkpoint: the caller has made every frame durable elsewhere; older files are deleted."""
        old_files = wal_files(self.directory)
        os.close(self._fd)
        self._number += 1
        self._open_new_file()
        for path in old_files:
            path.unlink(missing_ok=True)
        fsync_directory(self.directory)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
