"""The telemetry writer follows docs/telemetry.md: record shapes, rotation, the bound on files."""

from __future__ import annotations

import json
import pathlib

from cluster.raft.core.raft import RaftConfig, RaftCore
from cluster.raft.core.types import GroupId, Membership, NodeId
from cluster.raft.runtime.telemetry import LogBytes, TelemetryWriter

G = GroupId("%2F/orders")
N1 = NodeId("n1")
COMMON = {"v", "kind", "type", "ts_ms", "node", "group", "term"}


def _records(directory: pathlib.Path) -> list[dict[str, object]]:
    lines = []
    for path in sorted((directory / "telemetry").glob("*.jsonl")):
        lines += [json.loads(line) for line in path.read_text().splitlines()]
    return lines


def test_append_commit_and_state_records_have_the_documented_fields(tmp_path: pathlib.Path) -> None:
    writer = TelemetryWriter(tmp_path, "n1", lambda: 1_700_000_000_000)
    core = RaftCore(N1, RaftConfig(), lambda low, high: low, Membership(frozenset({N1})))
    core.campaign()
    for i in range(3):
        core.propose(f"m{i}".encode())
        for _ in range(2):
            ready = core.ready()
            writer.on_durable(G, core, ready)
            core.advance(ready)
    writer.sample({G: core}, force=True)
    writer.sample({G: core}, force=True)  # unchanged: no second state record
    writer.close()
    records = _records(tmp_path)
    kinds = [record["type"] for record in records]
    assert kinds.count("state") == 1 and "append" in kinds and "commit" in kinds
    for record in records:
        assert record.keys() >= COMMON and record["v"] == 1 and record["kind"] == "raft"
    append = next(record for record in records if record["type"] == "append")
    assert {"role", "first_index", "last_index", "bytes", "log_bytes"} <= append.keys()
    state = next(record for record in records if record["type"] == "state")
    assert state["role"] == "leader" and state["followers"] == {} and state["log_bytes"] == 6


def test_files_rotate_and_the_oldest_are_deleted(tmp_path: pathlib.Path) -> None:
    writer = TelemetryWriter(tmp_path, "n1", lambda: 0, file_bytes_max=2_000, files_max=3)
    core = RaftCore(N1, RaftConfig(), lambda low, high: low, Membership(frozenset({N1})))
    core.campaign()
    for i in range(200):
        core.propose(b"x" * 10)
        ready = core.ready()
        writer.on_durable(G, core, ready)
        core.advance(ready)
        del i
    writer.close()
    files = sorted((tmp_path / "telemetry").glob("*.jsonl"))
    assert len(files) == 3
    assert all(path.stat().st_size <= 2_000 for path in files)


def test_log_bytes_follow_truncation() -> None:
    log_bytes = LogBytes()
    assert log_bytes.record(1, [10, 10, 10]) == 30
    assert log_bytes.record(2, [5]) == 15  # index 2 onward replaced
    assert log_bytes.through(1) == 10 and log_bytes.through(2) == 15 and log_bytes.through(9) == 15


def test_a_follower_the_new_leader_has_not_heard_from_is_left_out() -> None:
    """Right after an election every follower is at match 0 in probe: reporting it would be a false lag."""
    from cluster.raft.core.progress import Inflights, Progress, ProgressState
    from cluster.raft.core.types import Index
    from cluster.raft.runtime.telemetry import _position_known

    unknown = Progress(Index(0), Index(11), Inflights(8, 1 << 20))
    assert not _position_known(unknown)
    answered = Progress(Index(7), Index(8), Inflights(8, 1 << 20))
    assert _position_known(answered)
    replicating_from_empty = Progress(Index(0), Index(1), Inflights(8, 1 << 20), state=ProgressState.REPLICATE)
    assert _position_known(replicating_from_empty)
