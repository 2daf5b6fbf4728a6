"""What a group's storage holds, rebuilt by replaying its records in order (pure; the sim disk and the runtime
storage both use it).

Records: `hs` (a hard state), `entries` (replaces every stored entry at index >= the first one, then appends),
`install` (a received snapshot: replaces the whole log), `compact` (a local snapshot: drops the entries it covers).

`must_sync` says whether a Ready's records must be durable before its messages leave (etcd's `MustSync`): entries,
a snapshot, a new term or vote, or a newly committed membership change. A hard state that only moves `commit` need
not be: the commit index is volatile state in Raft (a restarted node learns it again from the leader), so such a
record is written and made durable by the next fsync, and a crash before it only leaves the stored commit lower.
A *volatile* group (the host's word: its state dies with its node's next life anyway, e.g. a non-durable queue
whose one voter is that node) must sync only a new term or vote and a received snapshot: its entries count as
persisted once written, so its one voter commits them without waiting for an fsync.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cluster.raft.core.types import (
    INDEX_ZERO,
    TERM_ZERO,
    Entry,
    EntryKind,
    GroupId,
    HardState,
    Index,
    Membership,
    PersistedState,
    Ready,
    Snapshot,
)


@dataclass(frozen=True, slots=True)
class Record:
    group: GroupId
    kind: str  # "hs" | "entries" | "install" | "compact"
    hard_state: HardState | None = None
    entries: tuple[Entry, ...] = ()
    snapshot: Snapshot | None = None


def records_for_ready(group: GroupId, ready: Ready) -> list[Record]:
    """The records that make a Ready durable, in the Ready order (snapshot, entries, hard state)."""
    records: list[Record] = []
    if ready.snapshot is not None:
        records.append(Record(group, "install", snapshot=ready.snapshot))
    if ready.entries:
        records.append(Record(group, "entries", entries=ready.entries))
    if ready.hard_state is not None:
        records.append(Record(group, "hs", hard_state=ready.hard_state))
    return records


def must_sync(previous: HardState, ready: Ready, volatile: bool = False) -> bool:
    """Whether `ready`'s records must be fsynced before its messages are sent and it is advanced, given the hard
    state stored before it (see the module header). A committed membership change keeps the commit durable: a
    restarted node's membership is the one its stored commit reached (`committed_membership`)."""
    hard_state = ready.hard_state
    if hard_state is not None and (hard_state.term != previous.term or hard_state.vote != previous.vote):
        return True
    if ready.snapshot is not None:
        return True
    if volatile:
        return False
    if ready.entries:
        return True
    return any(entry.kind is EntryKind.CONF_CHANGE for entry in ready.committed_entries)


@dataclass(slots=True)
class GroupImage:
    hard_state: HardState
    snapshot: Snapshot
    entries: dict[Index, Entry] = field(default_factory=dict)

    @staticmethod
    def empty(membership: Membership) -> GroupImage:
        return GroupImage(HardState(TERM_ZERO, None, INDEX_ZERO), Snapshot(INDEX_ZERO, TERM_ZERO, membership))

    def apply(self, record: Record) -> None:
        if record.kind == "hs":
            assert record.hard_state is not None
            self.hard_state = record.hard_state
        elif record.kind == "entries":
            self._truncate_from(record.entries[0].index)
            stored = self.entries
            for entry in record.entries:
                stored[entry.index] = entry
        elif record.kind == "install":
            assert record.snapshot is not None
            self.snapshot = record.snapshot
            self.entries = {}
        elif record.kind == "compact":
            assert record.snapshot is not None
            if record.snapshot.index > self.snapshot.index:
                self.snapshot = record.snapshot
                self.entries = {i: e for i, e in self.entries.items() if i > record.snapshot.index}
        else:
            raise ValueError(f"unknown record kind {record.kind!r}")

    def _truncate_from(self, first: Index) -> None:
        """Drop every stored entry at index >= first: O(entries dropped), not O(log). Records append in
        ascending index order (and `compact` keeps that order), so the dict's last key is the largest index."""
        stored = self.entries
        if not stored:
            return
        last = next(reversed(stored))
        if first > last:
            return  # the usual case: a pure append
        if last - first + 1 > len(stored):  # gaps (never written by Raft): scan instead
            for index in [index for index in stored if index >= first]:
                del stored[index]
            return
        for position in range(first, last + 1):
            stored.pop(Index(position), None)

    def persisted_state(self) -> PersistedState:
        entries: list[Entry] = []
        index = Index(self.snapshot.index + 1)
        while index in self.entries:
            entries.append(self.entries[index])
            index = Index(index + 1)
        return PersistedState(self.hard_state, self.snapshot, tuple(entries))
