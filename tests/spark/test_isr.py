"""spark_analytics.isr and spark_analytics.truncations on hand-built mirrored-queue `isr` and `truncate` records,
with exact expected values; and the job's ISR and truncation tables, report lines and chart from them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from pyspark.sql import SparkSession

from spark_analytics import isr as I
from spark_analytics import truncations as TR
from spark_analytics.job import (
    JobSpec,
    collect_isr_rows,
    collect_report_rows,
    collect_truncation_rows,
    compute_tables,
    draw_charts,
)
from spark_analytics.report import render_report
from spark_analytics.transforms import LagConfig
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



def truncate(ts: int, replica: str, from_index: int, to_index: int, how: str, term: int = 1) -> dict[str, Any]:
    return {"kind": "mirror", "type": "truncate", "ts_ms": ts, "node": replica, "group": G, "term": term,
            "role": "follower", "from_index": from_index, "to_index": to_index, "how": how}


TRUNCATES = [
    truncate(5200, "a", 9, 7, "leader-epoch"),  # a back: its unreplicated tail above b's epoch-0 end goes
    truncate(5300, "c", 7, 7, "leader-epoch"),  # nothing to cut (still a truncation round)
    truncate(6000, "c", 8, 5, "hw (unsafe)"),  # c cut to its stale HW checkpoint
    truncate(7000, "c", 6, 5, "hw (unsafe)"),
]


def test_truncations_per_replica_and_mode(spark: SparkSession) -> None:
    table = TR.truncations(telemetry(spark, RECORDS + TRUNCATES))
    assert rows_of(table, "replica", "how", "truncations", "offsets_dropped", "max_dropped", "first_ts_ms",
                   "last_ts_ms", "unsafe") == [
        ("a", "leader-epoch", 1, 2, 2, 5200, 5200, False),
        ("c", "hw (unsafe)", 2, 4, 3, 6000, 7000, True),
        ("c", "leader-epoch", 1, 0, 0, 5300, 5300, False),
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


def test_isr_followers_joins_time_out_of_the_isr_with_lag_and_the_queues_changes(spark: SparkSession) -> None:
    records = telemetry(spark, RECORDS)
    lag = spark.createDataFrame([(G, "b", 12, 800), (G, "c", 3, 100)],
                                "group string, follower string, lag_entries_max long, lag_ms_max long")
    table = I.isr_followers(records, I.out_of_isr_episodes(records), lag)
    assert rows_of(table, "replica", "lag_messages_max", "lag_ms_max", "out_of_isr_ms", "out_of_isr_episodes",
                   "unrecovered", "shrinks", "expands", "leader_changes") == [
        ("a", None, None, 0, 1, 1, 3, 1, 1),
        ("b", 12, 800, 2000, 1, 0, 3, 1, 1),
        ("c", 3, 100, 0, 1, 1, 3, 1, 1),
    ]


def test_the_job_computes_the_isr_tables_and_draws_the_report_and_chart(spark: SparkSession, tmp_path: Path) -> None:
    """The job's steps after the read, without the writes (every table is written the same way; test_job.py)."""
    tables = compute_tables(telemetry(spark, [{"kind": "mirror", **row} for row in RECORDS + TRUNCATES]),
                            LagConfig())
    assert tables.mirrored and tables.truncated
    assert {"isr_episodes", "isr_followers", "isr_changes", "truncations"} <= set(tables.named())
    charts = draw_charts(tables, JobSpec(inputs=(), output=str(tmp_path)), tmp_path / "charts")
    assert [Path(c).name for c in charts] == ["isr-mirror_%2F_q.png"]
    assert Path(charts[0]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = render_report(*collect_report_rows(tables, 20), LagConfig(), 10, 0.0, isr=collect_isr_rows(tables, 20),
                           truncations=collect_truncation_rows(tables, 20))
    assert f"{G} b: out of the ISR 2.0 s in 1 episode(s), max lag - messages / -;" in report
    truncation_lines = report.split("truncations per replica and mode (unsafe modes first):\n")[1].splitlines()
    assert truncation_lines == [
        f"  {G} c: 2 truncation(s) by hw (unsafe) (UNSAFE), 4 message(s) dropped (largest cut 3)",
        f"  {G} a: 1 truncation(s) by leader-epoch, 2 message(s) dropped (largest cut 2)",
        f"  {G} c: 1 truncation(s) by leader-epoch, 0 message(s) dropped (largest cut 0)",
    ]
    for frame in tables.cached:
        frame.unpersist()
