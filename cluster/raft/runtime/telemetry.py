"""Replication telemetry (docs/telemetry.md, schema v1): JSON lines under <data_dir>/telemetry/, rotated, bounded.

The node driver calls `on_durable(group, core, ready)` after a Ready's fsync (an `append` record for the entries
it made durable, with `entries_term`, the term of the last of them; a `commit` record when the commit index moved)
and `sample(now)` from its timer (a `state` record per group every `sample_interval_ms` while the group changes,
and only on change while it is idle). Cumulative log bytes per index are tracked per group (`LogBytes`, bounded by
`tracked_entries_max`) so a leader can report each follower's `match_bytes`. Files are
`replication-<node>-<seq>.jsonl`; a file rotates at `file_bytes_max` and the oldest files beyond `files_max` are
deleted, so telemetry never fills a disk. A leader leaves out followers whose position it has not learned yet
(match 0, still probing: every follower right after an election), so a new leader shows no false lag. `forget(group)` drops a removed group's tracking.
"""

from __future__ import annotations

import json
import pathlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cluster.raft.core.progress import Progress, ProgressState
from cluster.raft.core.raft import RaftCore
from cluster.raft.core.types import GroupId, Index, Ready, Role


def _position_known(progress: Progress) -> bool:
    """False for a follower whose log position this leader has not learned yet: a new leader starts every follower
    at match 0 in probe, and reporting that would show a false lag right after each election."""
    return progress.match > 0 or progress.state is not ProgressState.PROBE


ROLE_NAMES = {Role.LEADER: "leader", Role.FOLLOWER: "follower", Role.CANDIDATE: "candidate",
              Role.PRE_CANDIDATE: "candidate"}


@dataclass(slots=True)
class LogBytes:
    """Cumulative entry bytes through each recent index (a bounded window; older indexes answer approximately)."""

    tracked_entries_max: int = 100_000
    _points: deque[tuple[int, int]] = field(default_factory=deque)  # (index, cumulative bytes), increasing

    def record(self, first_index: int, sizes: list[int]) -> int:
        while self._points and self._points[-1][0] >= first_index:
            self._points.pop()  # a conflicting tail was replaced
        total = self._points[-1][1] if self._points else 0
        for offset, size in enumerate(sizes):
            total += size
            self._points.append((first_index + offset, total))
        while len(self._points) > self.tracked_entries_max:
            self._points.popleft()
        return total

    def through(self, index: int) -> int:
        if not self._points or index < self._points[0][0]:
            return 0
        low, high = 0, len(self._points) - 1
        while low < high:  # the last point with point.index <= index
            middle = (low + high + 1) // 2
            if self._points[middle][0] <= index:
                low = middle
            else:
                high = middle - 1
        return self._points[low][1]

    def total(self) -> int:
        return self._points[-1][1] if self._points else 0


class TelemetryWriter:
    def __init__(
        self,
        data_dir: pathlib.Path,
        node: str,
        clock_ms: Callable[[], int],
        file_bytes_max: int = 16 * 1024 * 1024,
        files_max: int = 8,
        sample_interval_ms: int = 1000,
    ) -> None:
        self.directory = data_dir / "telemetry"
        self.directory.mkdir(parents=True, exist_ok=True)
        self.node = node
        self._clock_ms = clock_ms
        self._file_bytes_max = file_bytes_max
        self._files_max = files_max
        self._sample_interval_ms = sample_interval_ms
        self._log_bytes: dict[GroupId, LogBytes] = {}
        self._commit: dict[GroupId, int] = {}
        self._last_state: dict[GroupId, tuple[Any, ...]] = {}
        self._last_sample_ms = 0
        existing = sorted(self._files())
        self._seq = int(existing[-1].stem.rsplit("-", 1)[1]) + 1 if existing else 0
        self._size = 0
        self._file = self._open()

    def _files(self) -> list[pathlib.Path]:
        return sorted(self.directory.glob(f"replication-{self.node}-*.jsonl"),
                      key=lambda path: int(path.stem.rsplit("-", 1)[1]))

    def _open(self) -> Any:
        path = self.directory / f"replication-{self.node}-{self._seq}.jsonl"
        self._size = path.stat().st_size if path.exists() else 0
        return path.open("a", encoding="utf-8")

    def _write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":")) + "\n"
        if self._size + len(line) > self._file_bytes_max and self._size > 0:
            self._file.close()
            self._seq += 1
            self._file = self._open()
            for old in self._files()[: -self._files_max]:
                old.unlink(missing_ok=True)
        self._file.write(line)
        self._size += len(line)

    @staticmethod
    def _role(core: RaftCore) -> str:
        return "learner" if core.id in core.membership.learners else ROLE_NAMES[core.role]

    def _base(self, kind: str, group: GroupId, core: RaftCore) -> dict[str, Any]:
        return {"v": 1, "kind": "raft", "type": kind, "ts_ms": self._clock_ms(), "node": self.node,
                "group": group, "term": core.term}

    def on_durable(self, group: GroupId, core: RaftCore, ready: Ready) -> None:
        log_bytes = self._log_bytes.setdefault(group, LogBytes())
        if ready.entries:
            sizes = [len(entry.data) for entry in ready.entries]
            total = log_bytes.record(ready.entries[0].index, sizes)
            record = self._base("append", group, core)
            record.update(role=self._role(core), first_index=ready.entries[0].index,
                          last_index=ready.entries[-1].index, bytes=sum(sizes), log_bytes=total,
                          entries_term=ready.entries[-1].term)
            self._write(record)
        commit = core.log.committed
        if commit > self._commit.get(group, 0):
            self._commit[group] = commit
            record = self._base("commit", group, core)
            record["commit_index"] = commit
            self._write(record)

    def sample(self, groups: dict[GroupId, RaftCore], force: bool = False) -> None:
        """State records: due every interval for groups that changed since their last record."""
        now_ms = self._clock_ms()
        if not force and now_ms - self._last_sample_ms < self._sample_interval_ms:
            return
        self._last_sample_ms = now_ms
        for group, core in groups.items():
            log_bytes = self._log_bytes.setdefault(group, LogBytes())
            followers = {}
            if core.role is Role.LEADER:
                followers = {node: {"match_index": pr.match, "match_bytes": log_bytes.through(Index(pr.match))}
                             for node, pr in sorted(core.prs.items()) if node != core.id and _position_known(pr)}
            key = (core.term, core.role, core.log.last_index(), core.log.committed,
                   tuple((node, value["match_index"]) for node, value in followers.items()))
            if self._last_state.get(group) == key:
                continue  # idle: a state record only on change
            self._last_state[group] = key
            record = self._base("state", group, core)
            record.update(role=self._role(core), last_index=core.log.last_index(),
                          commit_index=core.log.committed, log_bytes=log_bytes.through(core.log.last_index()))
            if core.role is Role.LEADER:
                record["followers"] = followers
            self._write(record)
        self._file.flush()  # once per sample interval: readers (the lag job, tests) see records within a second

    def forget(self, group: GroupId) -> None:
        """A removed group: drop what is tracked for it (a re-added group starts afresh)."""
        self._log_bytes.pop(group, None)
        self._commit.pop(group, None)
        self._last_state.pop(group, None)

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()
