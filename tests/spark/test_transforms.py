"""Every transform of spark_analytics.transforms on tiny hand-built telemetry, with exact expected values."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("pyspark")

from pyspark.sql import DataFrame, SparkSession

from spark_analytics import transforms as T
from tests.spark.frames import rows_of, telemetry

pytestmark = pytest.mark.spark

G = "%2F/orders"


def state(
    ts: int, node: str, last: int, log_bytes: int, followers: dict[str, tuple[int, int]], term: int = 1
) -> dict[str, Any]:
    progress = {name: {"match_index": m, "match_bytes": b} for name, (m, b) in followers.items()}
    return {
        "type": "state",
        "ts_ms": ts,
        "node": node,
        "group": G,
        "term": term,
        "role": "leader",
        "last_index": last,
        "commit_index": last,
        "log_bytes": log_bytes,
        "followers": progress,
    }


def append(
    ts: int,
    node: str,
    first: int,
    last: int,
    role: str = "follower",
    term: int = 1,
    entries_term: int | None = None,
) -> dict[str, Any]:
    return {
        "entries_term": entries_term,
        "type": "append",
        "ts_ms": ts,
        "node": node,
        "group": G,
        "term": term,
        "role": role,
        "first_index": first,
        "last_index": last,
        "bytes": 10 * (last - first + 1),
        "log_bytes": 10 * last,
    }


def commit(ts: int, node: str, index: int, term: int = 1) -> dict[str, Any]:
    return {"type": "commit", "ts_ms": ts, "node": node, "group": G, "term": term, "commit_index": index}


def sample(
    ts: int, follower: str, lag_entries: int, lag_ms: int | None, lag_bytes: int = 0
) -> dict[str, Any]:
    return {
        "group": G,
        "follower": follower,
        "leader": "n1",
        "term": 1,
        "ts_ms": ts,
        "lag_entries": lag_entries,
        "lag_bytes": lag_bytes,
        "lag_ms": lag_ms,
    }


def samples_frame(spark: SparkSession, rows: list[dict[str, Any]]) -> DataFrame:
    schema = (
        "group string, follower string, leader string, term long, ts_ms long, "
        "lag_entries long, lag_bytes long, lag_ms long"
    )
    columns = ["group", "follower", "leader", "term", "ts_ms", "lag_entries", "lag_bytes", "lag_ms"]
    return spark.createDataFrame([tuple(row[c] for c in columns) for row in rows], schema)


CONFIG = T.LagConfig(window_ms=10_000, lag_threshold_entries=3, lag_threshold_ms=500, index_bucket_entries=2)


def test_valid_records_keeps_only_v1_records_of_known_types(spark: SparkSession) -> None:
    frame = telemetry(
        spark,
        [
            commit(1, "n1", 1),
            {**commit(2, "n1", 2), "v": 2},
            {**commit(3, "n1", 3), "node": None},
            {**commit(4, "n1", 4), "type": "gossip"},
            {**commit(5, "n1", 5), "ts_ms": None},
        ],
    )
    assert rows_of(T.valid_records(frame), "ts_ms") == [(1,)]


def test_follower_samples_take_lag_from_leader_state_only(spark: SparkSession) -> None:
    frame = telemetry(
        spark,
        [
            state(1000, "n1", 1042, 106284, {"n2": (1040, 106080), "n3": (998, 101796)}),
            {
                "type": "state",
                "ts_ms": 1000,
                "node": "n2",
                "group": G,
                "term": 1,
                "role": "follower",
                "last_index": 1040,
                "commit_index": 1040,
                "log_bytes": 106080,
            },
        ],
    )
    result = T.follower_samples(frame)
    assert rows_of(result, "follower", "leader", "ts_ms", "match_index", "lag_entries", "lag_bytes") == [
        ("n2", "n1", 1000, 1040, 2, 204),
        ("n3", "n1", 1000, 998, 44, 4488),
    ]


def test_append_to_persist_matches_the_follower_batch_holding_each_leader_batch(spark: SparkSession) -> None:
    frame = telemetry(
        spark,
        [
            append(100, "n1", 1, 2, role="leader"),
            append(110, "n1", 3, 5, role="leader"),
            append(104, "n2", 1, 2),
            append(130, "n2", 3, 5),
            append(200, "n3", 1, 5),  # one catch-up batch spanning three index buckets
            append(50, "n3", 1, 5, term=0),  # an older term never matches
        ],
    )
    result = T.append_to_persist(frame, CONFIG)
    assert rows_of(result, "follower", "last_index", "append_ts_ms", "persist_ts_ms", "persist_lag_ms") == [
        ("n2", 2, 100, 104, 4),
        ("n2", 5, 110, 130, 20),
        ("n3", 2, 100, 200, 100),
        ("n3", 5, 110, 200, 90),
    ]


def test_append_to_persist_pairs_on_the_entries_term_across_a_leader_change(spark: SparkSession) -> None:
    frame = telemetry(
        spark,
        [
            append(100, "n1", 1, 2, role="leader", term=1, entries_term=1),
            append(110, "n1", 3, 3, role="leader", term=1, entries_term=1),  # overwritten after the change
            append(105, "n2", 1, 2, term=1, entries_term=1),
            append(200, "n2", 3, 3, role="leader", term=2, entries_term=2),  # n2 leads term 2
            # n3 was away; in term 2 it catches up on n1's term-1 entries, then gets n2's index 3.
            append(300, "n3", 1, 2, term=2, entries_term=1),
            append(310, "n3", 3, 3, term=2, entries_term=2),
            append(115, "n4", 3, 3, term=1, entries_term=1),  # n1's index 3 (later overwritten) on n4
        ],
    )
    result = T.append_to_persist(frame, CONFIG)
    columns = (
        "follower",
        "leader",
        "entries_term",
        "last_index",
        "append_ts_ms",
        "persist_ts_ms",
        "persist_lag_ms",
    )
    assert rows_of(result, *columns) == [
        ("n2", "n1", 1, 2, 100, 105, 5),
        ("n3", "n1", 1, 2, 100, 300, 200),
        ("n3", "n2", 2, 3, 200, 310, 110),
        ("n4", "n1", 1, 3, 110, 115, 5),
    ]


def test_append_to_persist_falls_back_to_the_writers_term_without_entries_term(spark: SparkSession) -> None:
    frame = telemetry(
        spark,
        [
            append(100, "n1", 1, 2, role="leader", term=1),
            append(104, "n2", 1, 2, term=1),  # older telemetry: no entries_term, same term: paired
            append(300, "n3", 1, 2, term=2),  # caught up in a later term: unknown entries, not paired
            append(120, "n4", 1, 2, term=2, entries_term=1),  # a mix of old and new writers still pairs
        ],
    )
    result = T.append_to_persist(frame, CONFIG)
    assert rows_of(result, "follower", "entries_term", "persist_lag_ms") == [("n2", 1, 4), ("n4", 1, 20)]


def test_commit_ranges_cover_what_each_commit_record_newly_committed(spark: SparkSession) -> None:
    frame = telemetry(spark, [commit(105, "n1", 2), commit(125, "n1", 5), commit(126, "n2", 5)])
    assert rows_of(T.commit_ranges(frame), "node", "commit_ts_ms", "first_index", "last_index") == [
        ("n1", 105, 2, 2),
        ("n1", 125, 3, 5),
        ("n2", 126, 5, 5),
    ]


def test_append_to_commit_uses_the_leader_nodes_commit_record(spark: SparkSession) -> None:
    frame = telemetry(
        spark,
        [
            append(100, "n1", 1, 2, role="leader"),
            append(110, "n1", 3, 5, role="leader"),
            commit(100, "n1", 0),
            commit(105, "n1", 2),
            commit(125, "n1", 5),
            commit(107, "n2", 5),  # a follower's commit record is not the leader's
        ],
    )
    result = T.append_to_commit(frame, CONFIG)
    assert rows_of(result, "leader", "last_index", "commit_ts_ms", "commit_lag_ms") == [
        ("n1", 2, 105, 5),
        ("n1", 5, 125, 15),
    ]


def test_time_lag_is_the_age_of_the_oldest_missing_entry(spark: SparkSession) -> None:
    frame = telemetry(
        spark,
        [
            append(100, "n1", 1, 2, role="leader"),
            append(110, "n1", 3, 5, role="leader"),
            append(120, "n1", 6, 6, role="leader"),
            append(90, "n9", 3, 3, role="leader", term=2),  # a later term than the sample: ignored
            state(1000, "n1", 6, 60, {"n2": (6, 60), "n3": (2, 20), "n4": (5, 50)}),
        ],
    )
    result = T.with_time_lag(T.follower_samples(frame), frame, CONFIG)
    assert rows_of(result, "follower", "lag_entries", "lag_ms") == [
        ("n2", 0, 0),
        ("n3", 4, 890),
        ("n4", 1, 880),
    ]


def test_time_lag_is_null_when_the_append_record_is_missing(spark: SparkSession) -> None:
    frame = telemetry(spark, [state(1000, "n1", 6, 60, {"n3": (2, 20)})])
    result = T.with_time_lag(T.follower_samples(frame), frame, CONFIG)
    assert result.select("lag_ms").collect()[0][0] is None


FOLLOWER_TIMELINE = [
    sample(0, "n2", 0, 0),
    sample(1000, "n2", 5, 100),  # over the entries threshold (3)
    sample(2500, "n2", 1, 600),  # over the time threshold (500 ms)
    sample(3000, "n2", 0, 0),
    sample(0, "n3", 0, 0),
    sample(1000, "n3", 9, 900),  # never recovers
]


def test_out_of_sync_flags_either_threshold_and_measures_intervals(spark: SparkSession) -> None:
    result = T.with_out_of_sync(samples_frame(spark, FOLLOWER_TIMELINE), CONFIG)
    assert rows_of(result, "follower", "ts_ms", "out_of_sync", "interval_ms") == [
        ("n2", 0, False, 1000),
        ("n2", 1000, True, 1500),
        ("n2", 2500, True, 500),
        ("n2", 3000, False, 0),
        ("n3", 0, False, 1000),
        ("n3", 1000, True, 0),
    ]


def test_catch_up_episodes_run_from_crossing_the_threshold_to_the_next_in_sync_sample(
    spark: SparkSession,
) -> None:
    timeline = [*FOLLOWER_TIMELINE, sample(4000, "n2", 7, 0), sample(4200, "n2", 0, 0)]
    flagged = T.with_out_of_sync(samples_frame(spark, timeline), CONFIG)
    episodes = T.catch_up_episodes(flagged).fillna(-1, ["end_ts_ms", "catch_up_ms"])
    columns = (
        "follower",
        "start_ts_ms",
        "end_ts_ms",
        "catch_up_ms",
        "recovered",
        "max_lag_entries",
        "max_lag_ms",
    )
    assert rows_of(episodes, *columns) == [
        ("n2", 1000, 3000, 2000, True, 5, 600),
        ("n2", 4000, 4200, 200, True, 7, 0),
        ("n3", 1000, -1, -1, False, 9, 900),
    ]


def test_with_window_floors_to_the_window_start(spark: SparkSession) -> None:
    frame = spark.createDataFrame([(0,), (9_999,), (10_000,), (25_001,)], "ts_ms long")
    assert rows_of(T.with_window(frame, "ts_ms", 10_000), "ts_ms", "window_start_ms") == [
        (0, 0),
        (9_999, 0),
        (10_000, 10_000),
        (25_001, 20_000),
    ]


def persist_frame(spark: SparkSession, rows: list[tuple[str, int, int]]) -> DataFrame:
    return spark.createDataFrame(
        [(G, follower, ts, lag) for follower, ts, lag in rows],
        "group string, follower string, append_ts_ms long, persist_lag_ms long",
    )


def test_follower_windows_give_percentiles_and_out_of_sync_time_per_window(spark: SparkSession) -> None:
    timeline = [
        sample(ts, "n2", lag, lag * 10, lag * 100) for ts, lag in [(0, 1), (1000, 2), (2000, 3), (3000, 4)]
    ]
    timeline += [sample(10_000, "n2", 0, 0)]
    flagged = T.with_out_of_sync(samples_frame(spark, timeline), CONFIG)
    persist = persist_frame(spark, [("n2", 5, 4), ("n2", 6, 8), ("n2", 12_000, 1)])
    result = T.follower_windows(flagged, persist, CONFIG)
    columns = (
        "window_start_ms",
        "samples",
        "lag_entries_p50",
        "lag_entries_p95",
        "lag_entries_max",
        "lag_bytes_p99",
        "lag_ms_p50",
        "out_of_sync_ms",
        "batches",
        "persist_lag_ms_p50",
        "persist_lag_ms_max",
    )
    assert rows_of(result, *columns) == [
        (0, 4, 2, 4, 4, 400, 20, 7000, 2, 4, 8),
        (10_000, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1),
    ]


def test_commit_windows_give_commit_lag_percentiles(spark: SparkSession) -> None:
    commits = spark.createDataFrame(
        [(G, ts, lag) for ts, lag in [(1, 5), (2, 15), (3, 10), (10_001, 7)]],
        "group string, append_ts_ms long, commit_lag_ms long",
    )
    result = T.commit_windows(commits, CONFIG)
    columns = ("window_start_ms", "batches", "commit_lag_ms_p50", "commit_lag_ms_p99", "commit_lag_ms_max")
    assert rows_of(result, *columns) == [(0, 3, 10, 15, 15), (10_000, 1, 7, 7, 7)]


def test_summaries_total_out_of_sync_time_and_catch_up(spark: SparkSession) -> None:
    flagged = T.with_out_of_sync(samples_frame(spark, FOLLOWER_TIMELINE), CONFIG)
    persist = persist_frame(spark, [("n2", 5, 4), ("n3", 6, 8)])
    commits = spark.createDataFrame([(G, 5, 6)], "group string, append_ts_ms long, commit_lag_ms long")
    episodes = T.catch_up_episodes(flagged)
    per_follower = T.follower_summary(flagged, persist, episodes, CONFIG)
    assert rows_of(
        per_follower,
        "follower",
        "samples",
        "lag_entries_max",
        "out_of_sync_ms",
        "episodes",
        "max_catch_up_ms",
        "persist_lag_ms_max",
    ) == [
        ("n2", 4, 5, 2000, 1, 2000, 4),
        ("n3", 2, 9, 0, 1, None, 8),
    ]
    cluster = T.cluster_summary(flagged, persist, commits, episodes, CONFIG).collect()
    assert len(cluster) == 1
    row = cluster[0].asDict()
    expected = {
        "groups": 1,
        "followers": 2,
        "followers_out_of_sync": 2,
        "samples": 6,
        "lag_entries_max": 9,
        "out_of_sync_ms": 2000,
        "persist_lag_ms_max": 8,
        "commit_lag_ms_p50": 6,
        "episodes": 2,
        "max_catch_up_ms": 2000,
        "unrecovered_episodes": 1,
    }
    assert {key: row[key] for key in expected} == expected
