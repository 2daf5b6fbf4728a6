"""The shared per-node write-ahead log: one file of interleaved frames of every stream, fsynced in groups.

``write`` appends a batch of encoded frames (one ``pwrite``); ``sync`` is the one fsync that makes every frame
written so far durable (group commit). Syncs may overlap (``begin_sync``/``sync_fd``/``end_sync``: NodeLog starts a
commit's fsync while an earlier one runs, so a batch written meanwhile need not wait for it to end): each running
sync has a descriptor of its own, opened with the file, because a writeback error is reported once per open file
description, and two fsyncs sharing one could see it reported to the other only. A finished sync vouches for
every byte written before it began, whatever the other syncs do.  A failed write cuts the file back to its previous size, so the file never
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
SYNC_DESCRIPTORS = 2  # syncs that may run at once without opening another descriptor


def wal_files(directory: pathlib.Path) -> list[pathlib.Path]:
    return sorted(p for p in directory.glob("*" + WAL_SUFFIX) if p.stem.isdigit())


def replay_needed(directory: pathlib.Path, applied_below: Mapping[str, int]) -> Iterator[fmt.WalFrame]:
    """The valid frames of every WAL file, oldest first; APPEND frames with an offset below
    ``applied_below[stream]`` (already in the segments) are skipped cheaply (by header: no CRC, no payload copy), and files are not cut: the caller checkpoints, which
    deletes them."""
    for path in wal_files(directory):
        yield from iter_wal_needed(path, applied_below)


class WalWriter:
    """Appends to the newest WAL file.  ``write`` runs under the node's I/O lock; syncs may run beside it and beside
    each other (the caller serialises ``begin_sync``/``end_sync``, ``start_new_file`` and ``close`` with them)."""

    def __init__(self, directory: pathlib.Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        existing = wal_files(directory)
        self._number = int(existing[-1].stem) + 1 if existing else 0
        self._fd = -1
        self._sync_fds: list[int] = []  # free descriptors of the current file for syncs
        self.syncs_running = 0
        self.size_bytes = 0
        self._synced_size_bytes = 0
        self._open_new_file()

    @property
    def path(self) -> pathlib.Path:
        return self.directory / f"{self._number:020d}{WAL_SUFFIX}"

    def _open_new_file(self) -> None:
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self._sync_fds = [os.open(self.path, os.O_RDONLY) for _ in range(SYNC_DESCRIPTORS)]
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
        claim = self.begin_sync()
        if claim is None:
            return
        ok = False
        try:
            self.sync_fd(claim[0])
            ok = True
        finally:
            self.end_sync(claim, ok)

    def begin_sync(self) -> tuple[int, int] | None:
        """Claim a descriptor for one sync of what is written so far: (descriptor, size it will vouch for), or None
        when a finished sync covers it already. Call under the caller's lock; then `sync_fd` outside it."""
        target_size = self.size_bytes  # read before the fsync: concurrent later writes are not claimed as synced
        if target_size <= self._synced_size_bytes:
            return None
        fd = self._sync_fds.pop() if self._sync_fds else os.open(self.path, os.O_RDONLY)
        self.syncs_running += 1
        return fd, target_size

    @staticmethod
    def sync_fd(fd: int) -> None:
        """The fdatasync of a claimed descriptor (no lock needed)."""
        try:
            os.fdatasync(fd)
        except OSError as error:
            raise_disk_full_or(error)

    def end_sync(self, claim: tuple[int, int], ok: bool) -> None:
        """Give the descriptor back; when the sync succeeded, what it covered is durable. Under the caller's lock."""
        fd, target_size = claim
        self.syncs_running -= 1
        if len(self._sync_fds) < SYNC_DESCRIPTORS:
            self._sync_fds.append(fd)
        else:
            os.close(fd)
        if ok:
            self._synced_size_bytes = max(self._synced_size_bytes, target_size)

    def _close_sync_fds(self) -> None:
        assert self.syncs_running == 0, "a sync runs on this file"
        for fd in self._sync_fds:
            os.close(fd)
        self._sync_fds = []

    def start_new_file(self) -> None:
        """Checkpoint: the caller has made every frame durable elsewhere; older files are deleted."""
        old_files = wal_files(self.directory)
        self._close_sync_fds()
        os.close(self._fd)
        self._number += 1
        self._open_new_file()
        for path in old_files:
            path.unlink(missing_ok=True)
        fsync_directory(self.directory)

    def close(self) -> None:
        if self._fd >= 0:
            self._close_sync_fds()
            os.close(self._fd)
            self._fd = -1
