"""Raft storage on cluster/log's NodeLog: one stream per group, every group's writes in one fsync.

Each group's stream holds one cbor record per Ready (`["f", snapshot?, hard_state?, *flat entries]`, see
`_encode_ready`; the older `["r", ...]` records still load; NodeLog's cost is per record) replayed by `GroupImage` at open (an `entries` record implicitly truncates the conflicting tail, so the log is
append-only). `write_ready` queues a Ready's records (no syscall); `commit()` is NodeLog's group commit (one WAL
fsync for every group) and must finish before the Ready's messages are sent — that is what puts term and vote on
disk before any message that depends on them. `compact` stores the group's whole image as the stream's NodeLog
snapshot, so older segments are deleted. Blocking calls (`open`, `load`, `commit`, `compact`, `delete`) belong in worker threads.
"""

from __future__ import annotations

import pathlib
from typing import Any

import cbor2

from cluster.log.node_log import NodeLog
from cluster.raft.core.image import GroupImage, Record, records_for_ready
from cluster.raft.core.types import Entry, GroupId, Membership, PersistedState, Ready, Snapshot
from cluster.raft.runtime.codec import (
    decode_hard_state,
    encode_hard_state,
    entries_from_flat,
    entries_to_flat,
    entry_from_plain,
    entry_to_plain,
    snapshot_from_plain,
    snapshot_to_plain,
)


def stream_name(group: GroupId) -> str:
    return "raft-" + group.encode().hex()  # group ids may hold '/', '%': keep file names safe


def _encode_ready(group: GroupId, ready: Ready) -> bytes:
    """One record per group per Ready (NodeLog's cost is per record), entries flat (codec.entries_to_flat):
    ["f", snapshot?, hard_state?, term_0, index_0, kind_0, data_0, term_1, ...]."""
    head: list[Any] = [
        "f",
        None if ready.snapshot is None else snapshot_to_plain(ready.snapshot),
        None if ready.hard_state is None else encode_hard_state(ready.hard_state),
    ]
    return cbor2.dumps(entries_to_flat(ready.entries, head))


def _records(group: GroupId, snapshot: Any, entries: tuple[Entry, ...], hard_state: Any) -> list[Record]:
    records: list[Record] = []
    if snapshot is not None:
        records.append(Record(group, "install", snapshot=snapshot_from_plain(snapshot)))
    if entries:
        records.append(Record(group, "entries", entries=entries))
    if hard_state is not None:
        records.append(Record(group, "hs", hard_state=decode_hard_state(hard_state)))
    return records


def _decode(group: GroupId, payload: bytes) -> list[Record]:
    """A stored record: the flat "f" layout, or the older nested ["r", snapshot?, [entry, ...], hard_state?]."""
    plain = cbor2.loads(payload)
    kind = plain[0]
    if kind == "f":
        return _records(group, plain[1], entries_from_flat(plain, 3), plain[2])
    assert kind == "r", f"unknown raft record {kind!r}"
    _, snapshot, entries, hard_state = plain
    return _records(group, snapshot, tuple(entry_from_plain(item) for item in entries), hard_state)


def _image_to_bytes(image: GroupImage) -> bytes:
    state = image.persisted_state()
    plain: list[Any] = [encode_hard_state(state.hard_state), snapshot_to_plain(state.snapshot),
                        [entry_to_plain(entry) for entry in state.entries]]
    return cbor2.dumps(plain)


def _image_from_bytes(data: bytes) -> GroupImage:
    hard_state, snapshot, entries = cbor2.loads(data)
    image = GroupImage(decode_hard_state(hard_state), snapshot_from_plain(snapshot))
    for plain in entries:
        entry = entry_from_plain(plain)
        image.entries[entry.index] = entry
    return image


class RaftStorage:
    def __init__(self, log: NodeLog) -> None:
        self.log = log
        self._images: dict[GroupId, GroupImage] = {}
        self.bytes_queued = 0

    @classmethod
    def open(cls, directory: pathlib.Path) -> RaftStorage:
        return cls(NodeLog.open(directory))

    def load(self, group: GroupId, membership: Membership) -> PersistedState | None:
        """The group's persisted state, or None if it has never written anything."""
        stream = stream_name(group)
        if stream not in self.log.streams():
            self._images[group] = GroupImage.empty(membership)
            return None
        snapshot_state, records = self.log.read(stream)
        image = _image_from_bytes(snapshot_state) if snapshot_state else GroupImage.empty(membership)
        for _, payload in records:
            for record in _decode(group, payload):
                image.apply(record)
        self._images[group] = image
        return image.persisted_state()

    def write_ready(self, group: GroupId, ready: Ready) -> None:
        records = records_for_ready(group, ready)
        if not records:
            return
        payload = _encode_ready(group, ready)
        self.bytes_queued += len(payload)
        self.log.append(stream_name(group), payload)
        image = self._images[group]
        for record in records:
            image.apply(record)

    def commit(self) -> None:
        """fsync every group's queued records (group commit). Call from a worker thread."""
        self.log.commit()
        self.bytes_queued = 0

    def compact(self, group: GroupId, snapshot: Snapshot) -> None:
        """Make a local snapshot durable and drop what it covers. Call from a worker thread."""
        image = self._images[group]
        image.apply(Record(group, "compact", snapshot=snapshot))
        stream = stream_name(group)
        self.log.commit()
        self.log.write_snapshot(stream, self.log.end_offset(stream) - 1, _image_to_bytes(image))

    def forget(self, group: GroupId) -> None:
        """Stop tracking a removed group (its stream stays until `delete`)."""
        self._images.pop(group, None)

    def delete(self, group: GroupId) -> None:
        """Delete a removed group's stream, durably. Call from a worker thread, with no commit running."""
        stream = stream_name(group)
        if stream in self.log.streams():
            self.log.delete_stream(stream)

    def close(self) -> None:
        self.log.close()
