"""Queue incarnations in cluster mode: which declaration of a queue each local Raft group belongs to.

What it is for: every declaration of a queue gets an incarnation (`QueueRecord.incarnation`, chosen by the
declaring node's DeclareQueue command), and the queue's Raft group id includes it (`queue_group_id(vhost, name,
incarnation)`: `q/<vhost>/<name>/i<hex>`; incarnation 0, a queue declared before incarnations, keeps the legacy
`q/<vhost>/<name>`). So a queue deleted and declared again is another Raft group: a node that was down, partitioned
or slow meanwhile still runs the old group, but nobody else hosts it, so its messages (votes of a higher term, a
longer log) are dropped by the receivers (cluster/raft's MultiRaft ignores groups it does not host) and it cannot
disturb the new group; it removes the old group when its metadata shows the change.

`QueueGroups` maps group -> (vhost, name) and back from the queue's key (`queue_key`: the incarnation-less id, which
the proposal tracker and the leader log line use, as they follow the queue across incarnations). Each node records,
in `<data_dir>/queue-incarnations.json`, the groups it hosts (`node/runtime/cluster/incarnation_file.py`, written
atomically before a group is added; removals and non-durable classic queues' groups by a worker thread); at start a recorded group the metadata does not have has its local state (stream) deleted before Raft
runs (node/runtime/cluster/runtime.py), which also frees the old groups of a node that was down. While running, `redeclared`
finds queues whose incarnation changed in one metadata step (deleted and declared again before this node looked)
and `without_queues` is the state between the two, so the broker drops the old queue before the new one is
mirrored.

A client deleting and at once redeclaring a queue on this node is the delicate case: the broker deletes and
re-creates its local queue immediately, long before the metadata has the new incarnation. Until it has, the old
group instance must neither take the new queue's proposals nor feed it entries (a publish confirmed there would
vanish when the group is removed), and the metadata's deletion step must not delete the client's new queue from the
broker. So the runtime quarantines the group from the moment the deletion reaches it (`deleted_queues`) until the
metadata settled it, and drops a mirrored deletion of a queue this node still has to create
(`queues_pending_creation`, `without_queue_deletions`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, MutableMapping
from typing import Any

from cluster.metadata import model as md
from cluster.queue.group_ids import queue_group_id
from cluster.raft.core.types import GroupId
from node.broker import records as br


def queue_key(vhost: str, name: str) -> str:
    """A queue's key across its incarnations: its group id without the incarnation (`q/<vhost>/<name>`)."""
    return queue_group_id(vhost, name)


def group_of_record(queue: md.QueueRecord) -> GroupId:
    """The Raft group id of a metadata queue record (its declaration's incarnation and its generation included)."""
    return GroupId(queue_group_id(queue.vhost, queue.name, queue.incarnation, queue.generation))


class QueueGroups(MutableMapping[GroupId, tuple[str, str]]):
    """group -> (vhost, name) of the queue groups this node hosts, and queue key -> group (`group_of`)."""

    def __init__(self) -> None:
        self._queues: dict[GroupId, tuple[str, str]] = {}
        self._groups: dict[str, GroupId] = {}

    def __getitem__(self, group: GroupId) -> tuple[str, str]:
        return self._queues[group]

    def __setitem__(self, group: GroupId, queue: tuple[str, str]) -> None:
        if group in self._queues:
            del self[group]
        self._queues[group] = queue
        self._groups[queue_key(*queue)] = group

    def __delitem__(self, group: GroupId) -> None:
        key = queue_key(*self._queues.pop(group))
        if self._groups.get(key) == group:
            del self._groups[key]

    def __contains__(self, group: object) -> bool:
        return group in self._queues

    def __iter__(self) -> Iterator[GroupId]:
        return iter(self._queues)

    def __len__(self) -> int:
        return len(self._queues)

    def get(self, group: GroupId, default: Any = None) -> Any:  # the hot path: no mixin indirection
        return self._queues.get(group, default)

    def group_of(self, key: str) -> GroupId | None:
        """The group hosted for the queue with that `queue_key` (None: none, e.g. declared here, not yet mirrored)."""
        return self._groups.get(key)


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
