"""Queue incarnations in cluster mode: which declaration of a queue each local Raft group belongs to.

What it is for: a queue's Raft group id is `q/<vhost>/<name>` (`queue_group_id`), so a queue deleted and declared
again under its name gets the same group id. A node that was down meanwhile still holds the old queue's log under
that id and must not bring it back. Every declaration therefore gets an incarnation (`QueueRecord.incarnation`,
chosen by the declaring node's DeclareQueue command), and each node records, in `<data_dir>/queue-incarnations.json`,
the incarnation of every queue group it hosts (`IncarnationFile`, written before a group is added, atomically).
At start, a recorded group whose queue is gone or has another incarnation has its local state deleted before Raft
runs (node/runtime/cluster.py). While running, `redeclared` finds queues whose incarnation changed in one metadata
step (deleted and declared again before this node looked) and `without_queues` is the state between the two, so the
broker drops the old queue before the new one is mirrored.

A client deleting and at once redeclaring a queue on this node is the delicate case: the broker deletes and
re-creates its local queue immediately, long before the metadata has the new incarnation. Until it has, the old
group instance must neither take the new queue's proposals nor feed it entries (a publish confirmed there would
vanish when the group is reset), and the metadata's deletion step must not delete the client's new queue from the
broker. So the runtime quarantines the group from the moment the deletion reaches it (`deleted_queues`) until the
metadata settled it, and drops a mirrored deletion of a queue this node still has to create
(`queues_pending_creation`, `without_queue_deletions`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pathlib
from collections.abc import Iterable, Mapping
from typing import Any

from cluster.metadata import model as md
from node.broker import records as br

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


def redeclared(old: md.MetadataState, new: md.MetadataState) -> set[tuple[str, str]]:
    """Queues present in both states under different incarnations (deleted and declared again meanwhile)."""
    if old.queues is new.queues:
        return set()
    return {key for key, queue in new.queues.items()
            if key in old.queues and old.queues[key].incarnation != queue.incarnation}


def without_queues(state: md.MetadataState, keys: set[tuple[str, str]]) -> md.MetadataState:
    """`state` without those queues and the bindings to them (as a DeleteQueue leaves it)."""
    queues = {k: q for k, q in state.queues.items() if k not in keys}
    bindings = {k: b for k, b in state.bindings.items() if not (k[2] == "queue" and (k[0], k[3]) in keys)}
    return dataclasses.replace(state, queues=queues, bindings=bindings)


def deleted_queues(records: Iterable[Any]) -> list[tuple[str, str]]:
    """(vhost, name) of every queue a broker Persist deletes."""
    return [(r.vhost, r.name) for r in records if isinstance(r, br.QueueRecord) and r.deleted]


def queues_pending_creation(persists: Iterable[tuple[int, tuple[Any, ...]]]) -> set[tuple[str, str]]:
    """Queues whose last change among the Persists still waiting for the metadata is a creation."""
    last: dict[tuple[str, str], bool] = {}
    for _token, records in persists:
        for record in records:
            if isinstance(record, br.QueueRecord):
                last[(record.vhost, record.name)] = not record.deleted
    return {key for key, created in last.items() if created}


def without_queue_deletions(records: list[Any], keys: set[tuple[str, str]]) -> list[Any]:
    """`records` minus the deletions of those queues (a local client re-created them; its Persist follows)."""
    if not keys:
        return records
    return [r for r in records
            if not (isinstance(r, br.QueueRecord) and r.deleted and (r.vhost, r.name) in keys)]
