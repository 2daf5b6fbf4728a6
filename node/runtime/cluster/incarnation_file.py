"""The small JSON file in which a node records the queue groups it hosts (group -> incarnation).

The runtime writes it (atomically: temp file, fsync, rename) before it adds a queue group and reads it at start, so
a recorded group the metadata no longer has (or has under another incarnation) is deleted before Raft runs
(`node.clustering.proposals.stale_groups`; the rules are in `node/clustering/incarnations.py`). A removal, and the
addition of a volatile group (a non-durable classic queue), need not wait for the disk: the runtime has them written
by a worker thread (`IncarnationRecording._write_incarnations`, a mixin of the runtime), so every `save` carries the version of the map it writes and
an older map never replaces a newer one.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import threading
from collections.abc import Mapping

import trio

log = logging.getLogger("raftmq.cluster")

INCARNATIONS_FILE = "queue-incarnations.json"


class IncarnationFile:
    """group -> incarnation of the queue groups this node hosts, in one small JSON file."""

    def __init__(self, data_dir: pathlib.Path) -> None:
        self.path = pathlib.Path(data_dir) / INCARNATIONS_FILE
        self._lock = threading.Lock()  # saves come from the trio thread and from a worker thread
        self.saved_version = 0  # the version of the map the file holds (`save`)

    def load(self) -> dict[str, int]:
        """What was recorded; {} when there is no file (or it is unreadable: then no group counts as stale)."""
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError):
            log.exception("cluster: %s unreadable; no queue group is treated as stale", self.path)
            return {}
        if not isinstance(data, dict):
            return {}
        return {str(group): int(incarnation) for group, incarnation in data.items()}

    def save(self, incarnations: Mapping[str, int], version: int | None = None) -> None:
        """Replace the file atomically (temp file, fsync, rename), unless it holds a later `version` of the map
        already (None: write regardless); an error is logged, not raised."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        with self._lock:
            if version is not None and version <= self.saved_version:
                return
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with open(tmp, "w") as out:
                    json.dump(dict(incarnations), out, sort_keys=True)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(tmp, self.path)
            except OSError:
                log.exception("cluster: cannot write %s", self.path)
                return
            if version is not None:
                self.saved_version = version


class IncarnationRecording:
    """The runtime's side of the file (a mixin of `ClusterRuntime`): the map kept in step with it, and its writer."""

    incarnation_file: IncarnationFile
    recorded_incarnations: dict[str, int]
    _incarnations_version: int  # bumped at each change of recorded_incarnations (the file's `save`)
    _incarnations_wake: trio.Event | None  # set: `_write_incarnations` runs (and is woken by it)

    def _record_incarnation(self, group: str, incarnation: int | None, durable_first: bool = False) -> None:
        """Keep the incarnation file in step. An addition with `durable_first` is on disk before the group is
        added (a crash never leaves a hosted group unrecorded); a removal (a crash before it is written leaves a
        recorded group that the next start finds stale and deletes again) and a volatile group's addition (a
        non-durable classic queue's: the fsync would hold up the trio thread, and every other queue, for each
        declaration; a crash before the write, then the queue deleted before this node's next start, leaves its
        small stream behind) are written by `_write_incarnations`, once it runs."""
        if self.recorded_incarnations.get(group) == incarnation:
            return
        if incarnation is None:
            self.recorded_incarnations.pop(group, None)
        else:
            self.recorded_incarnations[group] = incarnation
        self._incarnations_version += 1
        if durable_first or self._incarnations_wake is None:
            self.incarnation_file.save(self.recorded_incarnations, self._incarnations_version)
        else:
            self._incarnations_wake.set()

    async def _write_incarnations(self) -> None:
        """Write the incarnation file in a worker thread whenever `_record_incarnation` asks (the latest map)."""
        while True:
            assert self._incarnations_wake is not None
            await self._incarnations_wake.wait()
            self._incarnations_wake = trio.Event()
            await trio.to_thread.run_sync(self.incarnation_file.save, dict(self.recorded_incarnations),
                                          self._incarnations_version)

    def _save_unwritten_incarnations(self) -> None:
        """At close: write what the writer had not written yet."""
        if self._incarnations_version > self.incarnation_file.saved_version:
            self.incarnation_file.save(self.recorded_incarnations, self._incarnations_version)
