"""The small JSON file in which a node records the queue groups it hosts (group -> incarnation).

The runtime writes it before it adds a queue group (atomically: temp file, fsync, rename) and reads it at start, so
a recorded group the metadata no longer has (or has under another incarnation) is deleted before Raft runs
(`node.clustering.proposals.stale_groups`; the rules are in `node/clustering/incarnations.py`).
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
from collections.abc import Mapping

log = logging.getLogger("raftmq.cluster")

INCARNATIONS_FILE = "queue-incarnations.json"


class IncarnationFile:
    """group -> incarnation of the queue groups this node hosts, in one small JSON file."""

    def __init__(self, data_dir: pathlib.Path) -> None:
        self.path = pathlib.Path(data_dir) / INCARNATIONS_FILE

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

    def save(self, incarnations: Mapping[str, int]) -> None:
        """Replace the file atomically (temp file, fsync, rename); an error is logged, not raised."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "w") as out:
                json.dump(dict(incarnations), out, sort_keys=True)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path)
        except OSError:
            log.exception("cluster: cannot write %s", self.path)
