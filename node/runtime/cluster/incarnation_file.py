"""The small JSON file in which a node records the queue groups it hosts (group -> incarnation).

The runtime writes it (atomically: temp file, fsync, rename) before it adds a queue group and reads it at start, so
a recorded group the metadata no longer has (or has under another incarnation) is deleted before Raft runs
(`node.clustering.proposals.stale_groups`; the rules are in `node/clustering/incarnations.py`). A removal, and the
addition of a volatile group (a non-durable classic queue), need not wait for the disk: the runtime has them written
by a worker thread (runtime.py `_write_incarnations`), so every `save` carries the version of the map it writes and
an older map never replaces a newer one.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import threading
from collections.abc import Mapping

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
