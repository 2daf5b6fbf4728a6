"""Deleting removed groups' streams in the background, so the Raft loop does not stop for it.

A stream's deletion (`RaftStorage.delete`, NodeLog's `delete_stream`) checkpoints the whole node log: fsyncs of
every dirty segment, tens of ms on a loaded disk. The loop used to await it when a group was removed, and every
other group of the node waited meanwhile (no stepping, routing or commits): one queue's deletion held up the next
queue's first consume. Now the loop forgets the group at once and `StreamDeleter.run` deletes the streams, one at a
time, in a worker thread (NodeLog allows a delete beside the loop's appends and the fsync thread's commits:
node_log.py, "Threading contract"). A group added again under the same id waits for its stream's deletion
(`wait_for`); when the runtime stops, the deletions still queued are done at once (`finish`).
"""

from __future__ import annotations

import logging
from collections import deque

import trio

from cluster.raft.core.types import GroupId
from cluster.raft.runtime.storage import RaftStorage

log = logging.getLogger(__name__)


class StreamDeleter:
    def __init__(self) -> None:
        self._queued: deque[GroupId] = deque()
        self._pending: set[GroupId] = set()  # the groups in `_queued`
        self._wake = trio.Event()
        self._deleted = trio.Event()  # set (and replaced) after each deletion

    def queue(self, group: GroupId) -> None:
        """Delete the group's stream soon (the group is removed from the MultiRaft and storage's images already)."""
        self._pending.add(group)
        self._queued.append(group)
        self._wake.set()

    async def wait_for(self, group: GroupId) -> None:
        """Return once no deletion of the group's stream is queued or running."""
        while group in self._pending:
            await self._deleted.wait()

    async def run(self, storage: RaftStorage) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            while self._queued:
                group = self._queued[0]
                try:
                    await trio.to_thread.run_sync(storage.delete, group)
                finally:
                    self._queued.popleft()
                    if group not in self._queued:
                        self._pending.discard(group)
                    self._deleted.set()
                    self._deleted = trio.Event()

    def finish(self, storage: RaftStorage) -> None:
        """Stopping: the deletions still queued, now, in this thread."""
        while self._queued:
            group = self._queued.popleft()
            try:
                storage.delete(group)
            except Exception:
                log.exception("raft: deleting the stream of removed group %s failed", group)
        self._pending.clear()
