"""spark_analytics.isr on hand-built mirrored-queue `isr` records, with exact expected values."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("pyspark")

from pyspark.sql import SparkSession

from spark_analytics import isr as I
from tests.spark.frames import rows_of, telemetry

pytestmark = pytest.mark.spark

G = "mirror/%2F/q"


def isr(ts: int, leader: str, members: list[str], term: int = 0) -> dict[str, Any]:
    return {"kind": "mirror", "type": "isr", "ts_ms": ts, "node": leader, "group": G, "term": term,
            "leader": leader, "isr": members}


RECORDS = [
    isr(1000, "a", ["a", "b", "c"]),
    isr(2000, "a", ["a", "c"]),  # b shrunk out
    isr(2500, "a", ["a"]),  # c too
    isr(4000, "a", ["a", "b"]),  # b back
    isr(5000, "b", ["b"], term=1),  # a dies: b leads epoch 1 (a out; c still out)
    {"type": "commit", "ts_ms": 5100, "node": "b", "group": G, "term": 1, "commit_index": 7},  # not an isr record
]


def test_out_of_isr_episodes_per_replica(spark: SparkSession) -> None:
    episodes = I.out_of_isr_episodes(telemetry(spark, RECORDS))
    assert rows_of(episodes, "replica", "start_ts_ms", "end_ts_ms", "out_of_isr_ms", "recovered") == [
        ("a", 5000, None, None, False),
        ("b", 2000, 4000, 2000, True),
        ("c", 2500, None, None, False),
    ]
    summary = I.out_of_isr_summary(episodes)
    assert rows_of(summary, "replica", "episodes", "out_of_isr_ms", "unrecovered") == [
        ("a", 1, 0, 1), ("b", 1, 2000, 0), ("c", 1, 0, 1)]


def test_isr_changes_count_shrinks_expands_and_leader_changes(spark: SparkSession) -> None:
    changes = I.isr_changes(telemetry(spark, RECORDS))
    assert rows_of(changes, "group", "isr_records", "shrinks", "expands", "leader_changes", "min_isr_size") == [
        (G, 5, 3, 1, 1, 1)]
