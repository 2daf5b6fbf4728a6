"""The telemetry generator: deterministic from its seed, independent of the number of workers, schema-shaped."""

from __future__ import annotations

import json
from pathlib import Path

from spark_analytics.generate import GenerateSpec, generate


def lines_of(root: Path) -> list[str]:
    return sorted(line for path in root.rglob("*.jsonl") for line in path.read_text().splitlines())


def test_same_seed_same_telemetry_whatever_the_workers(tmp_path: Path) -> None:
    one = generate(GenerateSpec(records=3_000, output=str(tmp_path / "a"), groups=2, seed=5))
    two = generate(GenerateSpec(records=3_000, output=str(tmp_path / "b"), groups=2, seed=5, workers=2))
    generate(GenerateSpec(records=3_000, output=str(tmp_path / "c"), groups=2, seed=6))
    assert lines_of(tmp_path / "a") == lines_of(tmp_path / "b")
    assert lines_of(tmp_path / "a") != lines_of(tmp_path / "c")
    assert one.records == two.records == len(lines_of(tmp_path / "a"))
    assert abs(one.records - 3_000) < 300


def test_records_follow_the_telemetry_schema(tmp_path: Path) -> None:
    result = generate(GenerateSpec(records=2_000, output=str(tmp_path), groups=2, nodes=3))
    assert sorted(Path(path).relative_to(tmp_path).parts[0] for path in result.files) == ["n1", "n2", "n3"]
    required = {
        "state": {"role", "last_index", "commit_index", "log_bytes"},
        "append": {"role", "first_index", "last_index", "bytes", "log_bytes", "entries_term"},
        "commit": {"commit_index"},
    }
    seen = set()
    for line in lines_of(tmp_path):
        record = json.loads(line)
        assert record["v"] == 1 and record["kind"] == "raft"
        assert {"ts_ms", "node", "group", "term"} <= record.keys()
        assert required[record["type"]] <= record.keys()
        if record["type"] == "state" and record["role"] == "leader":
            assert record["node"] not in record["followers"]
        seen.add(record["type"])
    assert seen == {"state", "append", "commit"}


def test_the_paused_follower_writes_nothing_during_the_fault(tmp_path: Path) -> None:
    result = generate(GenerateSpec(records=4_000, output=str(tmp_path), groups=2))
    victim_lines = [
        json.loads(line)
        for line in (tmp_path / "n3" / "telemetry").glob("*.jsonl").__next__().read_text().splitlines()
    ]
    during = [
        r
        for r in victim_lines
        if r["group"] == result.lagging_group and result.fault_start_ms <= r["ts_ms"] < result.fault_end_ms
    ]
    assert during == []
    assert any(r["group"] == result.lagging_group and r["ts_ms"] >= result.fault_end_ms for r in victim_lines)
