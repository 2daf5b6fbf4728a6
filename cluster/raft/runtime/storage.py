"""Raft storage on cluster/log's NodeLog: one stream per group, every group's writes in one fsync.

Each group's stream holds one cbor record per Ready (`["f", snapshot?, hard_state?, *flat entries]`, see
`_encode_ready`; the older `["r", ...]` records still load; NodeLog's cost is per record) replayed by `GroupImage` at open (an `entries` record implicitly truncates the conflicting tail, so the log is
append-only). `write_ready` queues a Ready's records (no syscall); `commit()` is NodeLog's group commit (one WAL
fsync for every group) and must finish before the Ready's messages are sent when `write_ready` said so — that is
what puts entries, term and vote on disk before any message that depends on them (a hard state that only moves the
commit index need not wait: `image.must_sync`; the next `commit()` covers it). `compact` stores the group's whole image as the stream's NodeLog
snapshot, so older segments are deleted. Blocking calls (`open`, `load`, `commit`, `compact`, `delete`) belong in worker threads.

A group's membership comes from its own durable state once it exists, never from whoever re-declares it: `load`
of a group without a stream queues a `["m", voters, learners]` record first (the initial membership; the caller
commits it before the group runs; a group bootstrapped with a named first leader, `raft.bootstrap_state`, has
`["m", voters, learners, term, vote]`: its initial term and vote are in the same record, so they are durable
together or not at all), and on reopen that record (or, after compaction or a received snapshot, the
snapshot's membership) is the base the log's membership changes replay on. The membership the caller passes is
then ignored (a WARNING when it differs from the stored one with the committed changes applied): changing a
group's membership takes the Raft membership-change path. A stream from before this record gets one (the declared
membership, pinned) the first time it is loaded.
"""

from __future__ import annotations

import logging
import pathlib
from typing import Any

import cbor2

from cluster.log.node_log import NodeLog
from cluster.raft.core.image import GroupImage, Record, must_sync, records_for_ready
from cluster.raft.core.types import (
    INDEX_ZERO,
    TERM_ZERO,
    ConfChange,
    Entry,
    EntryKind,
    GroupId,
    HardState,
    Membership,
    NodeId,
    PersistedState,
    Ready,
    Snapshot,
    Term,
)
from cluster.raft.runtime.codec import (
    CodecError,
    decode_hard_state,
    encode_hard_state,
    entries_from_flat,
    entries_to_flat,
    entry_from_plain,
    entry_to_plain,
    snapshot_from_plain,
    snapshot_to_plain,
)

log = logging.getLogger(__name__)
MEMBERSHIP_RECORD = "m"


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


def _encode_membership(membership: Membership, bootstrap: HardState | None = None) -> bytes:
    plain: list[Any] = [MEMBERSHIP_RECORD, sorted(membership.voters), sorted(membership.learners)]
    if bootstrap is not None:
        plain += [bootstrap.term, bootstrap.vote]
    return cbor2.dumps(plain)


def _bootstrap_from_plain(plain: Any) -> HardState | None:
    """The initial (term, vote) of a membership record written for a bootstrapped group, else None."""
    if len(plain) != 5:
        return None
    term, vote = plain[3], plain[4]
    if type(term) is not int or term < 1 or type(vote) is not str:
        raise CodecError("a bootstrap membership record ends with term >= 1 and the vote")
    return HardState(Term(term), NodeId(vote), INDEX_ZERO)


def _membership_from_plain(plain: Any) -> Membership:
    if len(plain) not in (3, 5) or not all(type(nodes) is list for nodes in plain[1:3]):
        raise CodecError("a membership record is [\"m\", voters, learners] or [\"m\", voters, learners, term, vote]")
    voters, learners = plain[1], plain[2]
    if not all(type(node) is str for node in voters + learners):
        raise CodecError("membership node ids are strings")
    return Membership(frozenset(NodeId(node) for node in voters), frozenset(NodeId(node) for node in learners))


def _decode(group: GroupId, payload: bytes) -> list[Record]:
    return _decode_plain(group, cbor2.loads(payload))


def _decode_plain(group: GroupId, plain: Any) -> list[Record]:
    """A stored record: the flat "f" layout, or the older nested ["r", snapshot?, [entry, ...], hard_state?]."""
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


def committed_membership(state: PersistedState) -> Membership:
    """The membership a restarted core reaches once it has re-applied its committed entries: the snapshot's, with
    every committed membership change after it (a change takes effect when applied, as in RaftCore)."""
    membership = state.snapshot.membership
    for entry in state.entries:
        if entry.index > state.hard_state.commit:
            break
        if entry.kind is EntryKind.CONF_CHANGE:
            membership = membership.changed(ConfChange.decode(entry.data))
    return membership


def _describe(membership: Membership) -> str:
    return f"voters={sorted(membership.voters)} learners={sorted(membership.learners)}"


class RaftStorage:
    def __init__(self, log: NodeLog) -> None:
        self.log = log
        self._images: dict[GroupId, GroupImage] = {}
        self.bytes_queued = 0

    @classmethod
    def open(cls, directory: pathlib.Path) -> RaftStorage:
        return cls(NodeLog.open(directory))

    def exists(self, group: GroupId) -> bool:
        """Whether the group has a stream (`load` of a group without one reads nothing: the caller may skip the
        worker thread)."""
        return stream_name(group) in self.log.streams()

    def load(self, group: GroupId, declared: Membership, bootstrap: HardState | None = None
             ) -> PersistedState | None:
        """The group's persisted state, or None if it is new: then `declared` is its initial membership (and
        `bootstrap`, if given, its initial hard state: `raft.bootstrap_state`), queued as the stream's first record
        (`commit` makes it durable; do so before the group runs). For a group that exists, the stored membership
        wins over `declared` and `bootstrap` is ignored."""
        stream = stream_name(group)
        if stream not in self.log.streams():
            image = GroupImage.empty(declared)
            if bootstrap is not None:
                image.hard_state = bootstrap
            self._images[group] = image
            self._queue_membership(stream, declared, bootstrap)
            return None
        image, pinned = self._replay(group, stream, declared)
        self._images[group] = image
        state = image.persisted_state()
        if not pinned:
            log.warning("raft group %s: its stream holds no membership record (written before they existed); "
                        "pinning the declared membership %s", group, _describe(declared))
            self._queue_membership(stream, declared)
            return state
        stored = committed_membership(state)
        if stored != declared:
            log.warning("raft group %s: declared membership %s differs from its stored membership %s; the stored "
                        "one is used (change membership through Raft membership changes)", group,
                        _describe(declared), _describe(stored))
        return state

    def _replay(self, group: GroupId, stream: str, declared: Membership) -> tuple[GroupImage, bool]:
        """The group's image from its stream, and whether its membership came from the stream (a membership record
        or a snapshot) rather than from `declared`."""
        snapshot_state, records = self.log.read(stream)
        image = _image_from_bytes(snapshot_state) if snapshot_state else GroupImage.empty(declared)
        pinned = snapshot_state is not None and len(snapshot_state) > 0
        for _, payload in records:
            plain = cbor2.loads(payload)
            if plain[0] == MEMBERSHIP_RECORD:
                if image.snapshot.index == INDEX_ZERO:  # a later snapshot carries the membership in force there
                    image.snapshot = Snapshot(INDEX_ZERO, TERM_ZERO, _membership_from_plain(plain))
                    bootstrap = _bootstrap_from_plain(plain)
                    if bootstrap is not None and image.hard_state.term == TERM_ZERO:
                        image.hard_state = bootstrap
                pinned = True
                continue
            for record in _decode_plain(group, plain):
                image.apply(record)
                pinned = pinned or record.kind == "install"
        return image, pinned

    def _queue_membership(self, stream: str, membership: Membership, bootstrap: HardState | None = None) -> None:
        payload = _encode_membership(membership, bootstrap)
        self.bytes_queued += len(payload)
        self.log.append(stream, payload)

    def write_ready(self, group: GroupId, ready: Ready, volatile: bool = False) -> bool:
        """Queue a Ready's records; whether they must be durable before its messages leave (`image.must_sync`:
        not for a hard state that only moves the commit index, which the next `commit()` makes durable, nor for a
        `volatile` group's entries)."""
        records = records_for_ready(group, ready)
        if not records:
            return False
        image = self._images[group]
        sync = must_sync(image.hard_state, ready, volatile)
        payload = _encode_ready(group, ready)
        self.bytes_queued += len(payload)
        self.log.append(stream_name(group), payload)
        for record in records:
            image.apply(record)
        return sync

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
