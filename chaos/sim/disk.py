"""A simulated disk for one node: an append-only record list with a synced prefix.

The host writes records (`hs`, `entries`, `install`, `compact`) as a Ready is persisted and calls `sync()` before
it sends that Ready's messages. `crash(rng)` keeps the synced prefix, a random prefix of the unsynced records (a
real disk may have written some of them), and may tear the last surviving record (an entries record keeps only
some of its entries; any other torn record fails its checksum and is dropped). `load()` replays the records into
each group's `PersistedState`, as a restarted node would.
"""

from __future__ import annotations

import random

from cluster.raft.core.image import GroupImage, Record, records_for_ready
from cluster.raft.core.types import GroupId, HardState, Membership, NodeId, PersistedState, Ready, Snapshot

RECORDS_MAX = 2_000  # consolidate (rewrite the live state) beyond this many synced records


class SimDisk:
    def __init__(self, node: NodeId) -> None:
        self.node = node
        self.records: list[Record] = []
        self.synced = 0
        self.fsyncs = 0

    def write_ready(self, group: GroupId, ready: Ready) -> None:
        self.records.extend(records_for_ready(group, ready))

    def write_bootstrap(self, group: GroupId, hard_state: HardState) -> None:
        """A new group's bootstrap state (raft.bootstrap_state), unsynced: as in the runtime, it becomes durable
        with the group's first Ready. A re-bootstrap (the broken host of the tests) starts the group afresh."""
        if self.holds(group):
            self.records = [record for record in self.records if record.group != group]
            self.synced = len(self.records)
        self.records.append(Record(group, "hs", hard_state=hard_state))

    def holds(self, group: GroupId) -> bool:
        return any(record.group == group for record in self.records)

    def write_compaction(self, group: GroupId, snapshot: Snapshot) -> None:
        self.records.append(Record(group, "compact", snapshot=snapshot))

    def unsynced_count(self) -> int:
        return len(self.records) - self.synced

    def sync(self) -> None:
        if self.synced < len(self.records):
            self.fsyncs += 1
        self.synced = len(self.records)

    def crash(self, rng: random.Random) -> str:
        """Lose unsynced writes (keeping a random prefix, maybe torn). Returns a description for the trace."""
        unsynced = self.records[self.synced :]
        kept = rng.randint(0, len(unsynced))
        survivors = unsynced[:kept]
        torn = ""
        if survivors and rng.random() < 0.5:
            last = survivors.pop()
            if last.kind == "entries" and len(last.entries) > 1:
                cut = rng.randint(1, len(last.entries) - 1)
                survivors.append(Record(last.group, "entries", entries=last.entries[:cut]))
                torn = f" torn=entries[:{cut}]"
            else:
                torn = f" torn={last.kind}"
        self.records = self.records[: self.synced] + survivors
        self.synced = len(self.records)
        return f"lost={len(unsynced) - len(survivors)} kept={len(survivors)}{torn}"

    def load(self, memberships: dict[GroupId, Membership]) -> dict[GroupId, PersistedState]:
        images = {group: GroupImage.empty(membership) for group, membership in memberships.items()}
        for record in self.records:
            images[record.group].apply(record)
        return {group: image.persisted_state() for group, image in images.items()}

    def maybe_consolidate(self, memberships: dict[GroupId, Membership]) -> None:
        """Rewrite the live state compactly (as a log cleaner would) once everything is synced."""
        if self.synced != len(self.records) or len(self.records) <= RECORDS_MAX:
            return
        records: list[Record] = []
        for group, state in self.load(memberships).items():
            records.append(Record(group, "install", snapshot=state.snapshot))
            if state.entries:
                records.append(Record(group, "entries", entries=state.entries))
            records.append(Record(group, "hs", hard_state=state.hard_state))
        self.records = records
        self.synced = len(records)
