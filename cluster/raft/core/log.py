"""The in-memory Raft log of one group: a snapshot, the entries after it, and the persisted/committed/applied marks.

Entries live in a list starting at `snapshot.index + 1`. `handed` is the last index handed to the host by a Ready
(entries after it go out with the next Ready); `persisted` is the last index the host has reported durable
(`advance`), so `persisted <= handed`: several Readies may be in the host's hands at once (pipelined writes). A
Ready's entries count as durable only as far as they are still in the log (`persist_through`): a truncation while
they were being written replaced the rest. `committed` and `applied` only move forward. A truncation happens only
at a real conflict and never at or below `committed`.
"""

from __future__ import annotations

from cluster.raft.core.types import INDEX_ZERO, Entry, Index, Snapshot, Term


class CompactedError(Exception):
    """The requested index is inside the snapshot."""


class RaftLog:
    def __init__(self, snapshot: Snapshot, entries: tuple[Entry, ...] = (), committed: Index = INDEX_ZERO) -> None:
        self.snapshot = snapshot
        self._entries: list[Entry] = list(entries)
        for offset, entry in enumerate(self._entries):
            assert entry.index == snapshot.index + 1 + offset, "entries must follow the snapshot contiguously"
        self.persisted = self.last_index()
        self.handed = self.persisted
        self.committed = Index(max(snapshot.index, min(committed, self.last_index())))
        self.applied = snapshot.index
        self.pending_snapshot: Snapshot | None = None  # received, not yet handed out by a Ready

    # --- queries -----------------------------------------------------------------------------------------
    def first_index(self) -> Index:
        return Index(self.snapshot.index + 1)

    def last_index(self) -> Index:
        return Index(self.snapshot.index + len(self._entries))

    def last_term(self) -> Term:
        return self.term(self.last_index()) or self.snapshot.term

    def term(self, index: Index) -> Term | None:
        """The term of `index`; None if it is compacted away (below the snapshot) or beyond the end."""
        if index == self.snapshot.index:
            return self.snapshot.term
        if index < self.snapshot.index or index > self.last_index():
            return None
        return self._entries[index - self.snapshot.index - 1].term

    def matches(self, index: Index, term: Term) -> bool:
        return self.term(index) == term

    def is_up_to_date(self, last_index: Index, last_term: Term) -> bool:
        """Section 5.4.1: a candidate's log at least as up to date as ours."""
        return (last_term, last_index) >= (self.last_term(), self.last_index())

    def slice(self, low: Index, high: Index, size_bytes_max: int | None = None) -> tuple[Entry, ...]:
        """Entries [low, high], cut after the first entry that reaches `size_bytes_max`."""
        if low <= self.snapshot.index:
            raise CompactedError(low)
        high = Index(min(high, self.last_index()))
        if low > high:
            return ()
        chosen = self._entries[low - self.snapshot.index - 1 : high - self.snapshot.index]
        if size_bytes_max is None:
            return tuple(chosen)
        out: list[Entry] = []
        total = 0
        for entry in chosen:
            out.append(entry)
            total += entry.size_bytes
            if total >= size_bytes_max:
                break
        return tuple(out)

    def unstable_entries(self) -> tuple[Entry, ...]:
        """Entries not yet handed to the host."""
        return self.slice(Index(self.handed + 1), self.last_index()) if self.handed < self.last_index() else ()

    def persist_through(self, entries: tuple[Entry, ...]) -> None:
        """The host made `entries` (one Ready's) durable: `persisted` moves to the last of them still in the log
        with the same term (a conflict may have replaced a suffix while they were written; log matching: an
        entry with the same index and term is the same entry, with the same entries before it)."""
        for entry in reversed(entries):
            if entry.index <= self.persisted:
                return
            if self.term(entry.index) == entry.term:
                self.persisted = entry.index
                return

    def find_conflict_by_term(self, index: Index, term: Term) -> tuple[Index, Term]:
        """The largest index <= `index` whose term is <= `term` (Kafka's and etcd's fast backtracking)."""
        index = Index(min(index, self.last_index()))
        while index > self.snapshot.index:
            entry_term = self.term(index)
            assert entry_term is not None
            if entry_term <= term:
                return index, entry_term
            index = Index(index - 1)
        return self.snapshot.index, self.snapshot.term

    # --- changes -----------------------------------------------------------------------------------------
    def append(self, entries: tuple[Entry, ...]) -> None:
        if not entries:
            return
        assert entries[0].index == self.last_index() + 1, "append must extend the log contiguously"
        self._entries.extend(entries)

    def truncate_from(self, index: Index) -> None:
        """Drop every entry at index >= `index` (a real conflict only)."""
        assert index > self.committed, f"refusing to truncate committed entry {index} <= {self.committed}"
        assert index > self.snapshot.index
        del self._entries[index - self.snapshot.index - 1 :]
        self.persisted = Index(min(self.persisted, index - 1))
        self.handed = Index(min(self.handed, index - 1))

    def commit_to(self, index: Index) -> bool:
        index = Index(min(index, self.last_index()))
        if index > self.committed:
            self.committed = index
            return True
        return False

    def restore(self, snapshot: Snapshot) -> None:
        """Replace the whole log with a received snapshot (it is newer than anything we had committed)."""
        self.snapshot = snapshot
        self._entries = []
        self.persisted = snapshot.index
        self.handed = snapshot.index
        self.committed = snapshot.index
        self.pending_snapshot = snapshot

    def compact(self, snapshot: Snapshot) -> None:
        """The host took a snapshot at an applied index: drop the entries it covers."""
        assert snapshot.index <= min(self.applied, self.persisted), "can only compact what is applied and durable"
        if snapshot.index <= self.snapshot.index:
            return
        assert self.term(snapshot.index) == snapshot.term
        del self._entries[: snapshot.index - self.snapshot.index]
        self.snapshot = snapshot
