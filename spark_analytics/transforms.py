"""Pure DataFrame -> DataFrame transforms that turn raw replication telemetry into lag metrics.

Each function takes DataFrames and returns a new one; none reads, writes, collects or touches a clock, so every one
is tested on tiny hand-built frames. The pipeline (job.py wires it):

1. `valid_records` keeps schema-v1 records with their identifying fields.
2. `follower_samples` explodes each leader `state` record into one row per follower: lag in entries
   (leader last_index - follower match_index) and in bytes (leader log_bytes - match_bytes).
3. `with_time_lag` adds each sample's lag in time: the age of the oldest entry the follower does not have yet
   (sample ts minus the leader's append ts of index match_index + 1; 0 when caught up). This is the quantity
   Kafka's replica.lag.time.max.ms bounds.
4. `with_out_of_sync` flags a sample out of sync when its lag exceeds `lag_threshold_entries` or
   `lag_threshold_ms`, and gives it the time until the follower's next sample (`interval_ms`).
5. `append_to_persist` joins each leader append batch to the follower batch holding its last index (same group and
   entries term, i.e. the same entries): persist ts - append ts. `append_to_commit` joins it to the leader's commit record that covered it.
6. Windowed percentiles (`follower_windows`, `commit_windows`), out-of-sync episodes (`catch_up_episodes`) and the
   summaries (`follower_summary`, `cluster_summary`).

Joins "index inside a range" are turned into equi-joins on an index bucket (index // bucket_entries; a range is
exploded into the buckets it spans) so Spark can hash-partition them instead of running a nested loop.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from spark_analytics.schema import (
    RECORD_APPEND,
    RECORD_COMMIT,
    RECORD_ISR,
    RECORD_STATE,
    RECORD_TRUNCATE,
    ROLE_LEADER,
    SCHEMA_VERSION,
)

PERCENTILES = (0.5, 0.95, 0.99)
PERCENTILE_NAMES = ("p50", "p95", "p99")


@dataclass(frozen=True, slots=True)
class LagConfig:
    """Knobs of the lag computation; the defaults are documented in docs/spark.md."""

    window_ms: int = 10_000
    lag_threshold_entries: int = 10_000
    lag_threshold_ms: int = 10_000
    index_bucket_entries: int = 64
    percentile_accuracy: int = 10_000


# --- selection -----------------------------------------------------------------------------------------------


def valid_records(records: DataFrame) -> DataFrame:
    """Schema-v1 records of a known type with every identifying field present."""
    return records.where(
        (F.col("v") == SCHEMA_VERSION)
        & F.col("type").isin(RECORD_STATE, RECORD_APPEND, RECORD_COMMIT, RECORD_ISR, RECORD_TRUNCATE)
        & F.col("ts_ms").isNotNull()
        & F.col("node").isNotNull()
        & F.col("group").isNotNull()
    )


def follower_samples(records: DataFrame) -> DataFrame:
    """One row per (leader state record, follower): lag in entries and bytes as the leader saw it."""
    leader_states = records.where(
        (F.col("type") == RECORD_STATE) & (F.col("role") == ROLE_LEADER) & F.col("followers").isNotNull()
    )
    exploded = leader_states.select(
        "group",
        "term",
        "ts_ms",
        F.col("node").alias("leader"),
        F.col("last_index").alias("leader_last_index"),
        F.col("log_bytes").alias("leader_log_bytes"),
        F.explode("followers").alias("follower", "progress"),
    )
    return exploded.select(
        "group",
        "follower",
        "leader",
        "term",
        "ts_ms",
        "leader_last_index",
        F.col("progress.match_index").alias("match_index"),
        (F.col("leader_last_index") - F.col("progress.match_index")).alias("lag_entries"),
        (F.col("leader_log_bytes") - F.col("progress.match_bytes")).alias("lag_bytes"),
    )


def entries_term() -> Column:
    """The term of an append record's entries: `entries_term` when written, else the writer's `term`.

    Older telemetry has no `entries_term`; there the writer's term is the best guess (right for a leader, and for a
    follower except while it catches up on entries of an earlier term).
    """
    return F.coalesce(F.col("entries_term"), F.col("term"))


def leader_appends(records: DataFrame) -> DataFrame:
    """The leaders' append batches: group, term, entries_term, leader, first_index, last_index, append_ts_ms."""
    return records.where((F.col("type") == RECORD_APPEND) & (F.col("role") == ROLE_LEADER)).select(
        "group",
        "term",
        entries_term().alias("entries_term"),
        F.col("node").alias("leader"),
        "first_index",
        "last_index",
        F.col("ts_ms").alias("append_ts_ms"),
    )


def follower_appends(records: DataFrame) -> DataFrame:
    """Batches made durable on non-leaders: group, term, entries_term, follower, first/last_index, persist_ts_ms."""
    return records.where((F.col("type") == RECORD_APPEND) & (F.col("role") != ROLE_LEADER)).select(
        "group",
        "term",
        entries_term().alias("entries_term"),
        F.col("node").alias("follower"),
        "first_index",
        "last_index",
        F.col("ts_ms").alias("persist_ts_ms"),
    )


def commit_ranges(records: DataFrame) -> DataFrame:
    """Each commit record as the index range it newly committed on its node: (previous commit, commit_index]."""
    commits = records.where((F.col("type") == RECORD_COMMIT) & F.col("commit_index").isNotNull())
    by_node = Window.partitionBy("group", "node").orderBy("ts_ms", "commit_index")
    previous = F.lag("commit_index").over(by_node)
    return commits.select(
        "group",
        "node",
        "term",
        F.col("ts_ms").alias("commit_ts_ms"),
        F.coalesce(previous + 1, F.col("commit_index")).alias("first_index"),
        F.col("commit_index").alias("last_index"),
    ).where(F.col("first_index") <= F.col("last_index"))


# --- index-in-range joins ------------------------------------------------------------------------------------


def _bucket_of(index: Column, bucket_entries: int) -> Column:
    return F.floor(index / F.lit(bucket_entries)).cast("long")


def _explode_range_buckets(ranges: DataFrame, bucket_entries: int) -> DataFrame:
    """One row per index bucket a [first_index, last_index] range overlaps, in column `index_bucket`."""
    buckets = F.sequence(
        _bucket_of(F.col("first_index"), bucket_entries), _bucket_of(F.col("last_index"), bucket_entries)
    )
    return ranges.withColumn("index_bucket", F.explode(buckets))


def append_to_persist(records: DataFrame, config: LagConfig) -> DataFrame:
    """Per leader batch and follower: persist_lag_ms = follower's append ts - leader's append ts of that batch.

    The follower batch matched is the one of the same group whose entries have the same term (`entries_term`, so
    the same entries: Raft's log matching) and that contains the leader batch's last index. Pairing on the entries'
    term rather than the writer's term keeps a follower that catches up after a leader change paired with the
    leader that wrote those entries, and never pairs it with a different entry at the same index (one overwritten
    after a leader change). Without `entries_term` (older telemetry) the writer's term stands in for it.
    """
    leader = leader_appends(records).withColumn(
        "index_bucket", _bucket_of(F.col("last_index"), config.index_bucket_entries)
    )
    follower = _explode_range_buckets(follower_appends(records), config.index_bucket_entries).select(
        "group",
        "entries_term",
        "index_bucket",
        "follower",
        F.col("first_index").alias("f_first_index"),
        F.col("last_index").alias("f_last_index"),
        "persist_ts_ms",
    )
    joined = leader.join(follower, ["group", "entries_term", "index_bucket"]).where(
        (F.col("f_first_index") <= F.col("last_index")) & (F.col("last_index") <= F.col("f_last_index"))
    )
    return joined.select(
        "group",
        "follower",
        "leader",
        "term",
        "entries_term",
        "first_index",
        "last_index",
        "append_ts_ms",
        "persist_ts_ms",
        (F.col("persist_ts_ms") - F.col("append_ts_ms")).alias("persist_lag_ms"),
    )


def append_to_commit(records: DataFrame, config: LagConfig) -> DataFrame:
    """Per leader batch: commit_lag_ms = ts of the leader node's commit record covering its last index - append ts."""
    leader = leader_appends(records).withColumn(
        "index_bucket", _bucket_of(F.col("last_index"), config.index_bucket_entries)
    )
    commits = _explode_range_buckets(commit_ranges(records), config.index_bucket_entries).select(
        "group",
        F.col("node").alias("leader"),
        "index_bucket",
        F.col("first_index").alias("c_first_index"),
        F.col("last_index").alias("c_last_index"),
        "commit_ts_ms",
    )
    joined = leader.join(commits, ["group", "leader", "index_bucket"]).where(
        (F.col("c_first_index") <= F.col("last_index")) & (F.col("last_index") <= F.col("c_last_index"))
    )
    return joined.select(
        "group",
        "leader",
        "term",
        "first_index",
        "last_index",
        "append_ts_ms",
        "commit_ts_ms",
        (F.col("commit_ts_ms") - F.col("append_ts_ms")).alias("commit_lag_ms"),
    )


def with_time_lag(samples: DataFrame, records: DataFrame, config: LagConfig) -> DataFrame:
    """Adds lag_ms: age at sample time of the oldest entry the follower lacks (0 when caught up).

    The entry is match_index + 1; its append ts is the leader append record (any leader of the group, latest
    entries term not after the sample's term) holding it. Null when no such record was read (e.g. rotated away).
    """
    keys = ["group", "follower", "leader", "term", "ts_ms"]
    behind = samples.where(F.col("lag_entries") > 0).select(
        *keys,
        (F.col("match_index") + 1).alias("missing_index"),
        _bucket_of(F.col("match_index") + 1, config.index_bucket_entries).alias("index_bucket"),
    )
    appends = _explode_range_buckets(leader_appends(records), config.index_bucket_entries).select(
        "group",
        "index_bucket",
        F.col("entries_term").alias("a_term"),
        F.col("first_index").alias("a_first_index"),
        F.col("last_index").alias("a_last_index"),
        "append_ts_ms",
    )
    matched = (
        behind.join(appends, ["group", "index_bucket"])
        .where(
            (F.col("a_first_index") <= F.col("missing_index"))
            & (F.col("missing_index") <= F.col("a_last_index"))
            & (F.col("a_term") <= F.col("term"))
        )
        .groupBy(*keys)
        .agg(F.max_by("append_ts_ms", "a_term").alias("oldest_missing_append_ts_ms"))
    )
    lag_ms = (
        F.when(F.col("lag_entries") <= 0, F.lit(0))
        .otherwise(F.col("ts_ms") - F.col("oldest_missing_append_ts_ms"))
        .cast("long")
    )
    return (
        samples.join(matched, keys, "left").withColumn("lag_ms", lag_ms).drop("oldest_missing_append_ts_ms")
    )


def with_out_of_sync(samples: DataFrame, config: LagConfig) -> DataFrame:
    """Adds out_of_sync (lag over either threshold) and interval_ms (time to the follower's next sample, else 0)."""
    by_follower = Window.partitionBy("group", "follower").orderBy("ts_ms", "term")
    over_threshold = (F.col("lag_entries") > config.lag_threshold_entries) | (
        F.coalesce(F.col("lag_ms"), F.lit(0)) > config.lag_threshold_ms
    )
    next_ts = F.lead("ts_ms").over(by_follower)
    return samples.withColumn("out_of_sync", over_threshold).withColumn(
        "interval_ms", F.coalesce(next_ts - F.col("ts_ms"), F.lit(0)).cast("long")
    )


# --- windows and summaries -----------------------------------------------------------------------------------


def with_window(frame: DataFrame, ts_column: str, window_ms: int) -> DataFrame:
    """Adds window_start_ms: the start of the tumbling window of `window_ms` holding `ts_column`."""
    ts = F.col(ts_column)
    return frame.withColumn("window_start_ms", (ts - F.pmod(ts, F.lit(window_ms))).cast("long"))


def _percentile_aggs(column: str, accuracy: int) -> list[Column]:
    """percentile_approx into one array column `<column>_pct`, plus `<column>_max`."""
    return [
        F.percentile_approx(column, list(PERCENTILES), accuracy).alias(f"{column}_pct"),
        F.max(column).alias(f"{column}_max"),
    ]


def _expand_percentiles(frame: DataFrame, columns: list[str]) -> DataFrame:
    """Turns each `<column>_pct` array into `<column>_p50`, `_p95`, `_p99` columns."""
    arrays = {f"{column}_pct": column for column in columns}
    kept = [F.col(name) for name in frame.columns if name not in arrays]
    expanded = [
        F.col(array)[position].alias(f"{column}_{name}")
        for array, column in arrays.items()
        for position, name in enumerate(PERCENTILE_NAMES)
    ]
    return frame.select(
        *kept, *expanded
    )  # one projection: withColumn in a loop re-analyses the plan each time


def follower_windows(samples: DataFrame, persist: DataFrame, config: LagConfig) -> DataFrame:
    """Per group, follower and window: lag percentiles (entries, bytes, ms, persist ms) and out-of-sync time."""
    keys = ["group", "follower", "window_start_ms"]
    acc = config.percentile_accuracy
    from_samples = (
        with_window(samples, "ts_ms", config.window_ms)
        .groupBy(*keys)
        .agg(
            F.count(F.lit(1)).alias("samples"),
            *_percentile_aggs("lag_entries", acc),
            *_percentile_aggs("lag_bytes", acc),
            *_percentile_aggs("lag_ms", acc),
            F.sum(F.when(F.col("out_of_sync"), F.col("interval_ms")).otherwise(0)).alias("out_of_sync_ms"),
        )
    )
    from_persist = (
        with_window(persist, "append_ts_ms", config.window_ms)
        .groupBy(*keys)
        .agg(F.count(F.lit(1)).alias("batches"), *_percentile_aggs("persist_lag_ms", acc))
    )
    joined = from_samples.join(from_persist, keys, "full_outer").fillna(
        0, ["samples", "batches", "out_of_sync_ms"]
    )
    return _expand_percentiles(joined, ["lag_entries", "lag_bytes", "lag_ms", "persist_lag_ms"])


def commit_windows(commits: DataFrame, config: LagConfig) -> DataFrame:
    """Per group and window: append-to-commit lag percentiles of the leaders' batches."""
    aggregated = (
        with_window(commits, "append_ts_ms", config.window_ms)
        .groupBy("group", "window_start_ms")
        .agg(
            F.count(F.lit(1)).alias("batches"), *_percentile_aggs("commit_lag_ms", config.percentile_accuracy)
        )
    )
    return _expand_percentiles(aggregated, ["commit_lag_ms"])


def catch_up_episodes(samples: DataFrame) -> DataFrame:
    """One row per maximal run of out-of-sync samples of a follower.

    start_ts_ms is the first out-of-sync sample; end_ts_ms the first in-sync sample after the run (null when the
    telemetry ends first, recovered = false); catch_up_ms = end - start.
    """
    by_follower = Window.partitionBy("group", "follower").orderBy("ts_ms", "term")
    previous = F.coalesce(F.lag("out_of_sync").over(by_follower), F.lit(False))
    marked = samples.withColumn("run_starts", F.col("out_of_sync") & ~previous).withColumn(
        "next_ts_ms", F.lead("ts_ms").over(by_follower)
    )
    numbered = marked.withColumn(
        "episode",
        F.sum(F.col("run_starts").cast("int")).over(by_follower.rowsBetween(Window.unboundedPreceding, 0)),
    )
    episodes = (
        numbered.where(F.col("out_of_sync"))
        .groupBy("group", "follower", "episode")
        .agg(
            F.min("ts_ms").alias("start_ts_ms"),
            F.max_by("next_ts_ms", "ts_ms").alias("end_ts_ms"),
            F.max("lag_entries").alias("max_lag_entries"),
            F.max("lag_ms").alias("max_lag_ms"),
        )
    )
    return episodes.select(
        "group",
        "follower",
        "episode",
        "start_ts_ms",
        "end_ts_ms",
        (F.col("end_ts_ms") - F.col("start_ts_ms")).alias("catch_up_ms"),
        F.col("end_ts_ms").isNotNull().alias("recovered"),
        "max_lag_entries",
        "max_lag_ms",
    )


def follower_summary(
    samples: DataFrame, persist: DataFrame, episodes: DataFrame, config: LagConfig
) -> DataFrame:
    """Per group and follower over the whole input: lag percentiles, out-of-sync time and catch-up episodes."""
    keys = ["group", "follower"]
    acc = config.percentile_accuracy
    from_samples = samples.groupBy(*keys).agg(
        F.count(F.lit(1)).alias("samples"),
        *_percentile_aggs("lag_entries", acc),
        *_percentile_aggs("lag_bytes", acc),
        *_percentile_aggs("lag_ms", acc),
        F.sum(F.when(F.col("out_of_sync"), F.col("interval_ms")).otherwise(0)).alias("out_of_sync_ms"),
    )
    from_persist = persist.groupBy(*keys).agg(*_percentile_aggs("persist_lag_ms", acc))
    from_episodes = episodes.groupBy(*keys).agg(
        F.count(F.lit(1)).alias("episodes"), F.max("catch_up_ms").alias("max_catch_up_ms")
    )
    joined = (
        from_samples.join(from_persist, keys, "full_outer")
        .join(from_episodes, keys, "left")
        .fillna(0, ["samples", "out_of_sync_ms", "episodes"])
    )
    return _expand_percentiles(joined, ["lag_entries", "lag_bytes", "lag_ms", "persist_lag_ms"])


def cluster_summary(
    samples: DataFrame, persist: DataFrame, commits: DataFrame, episodes: DataFrame, config: LagConfig
) -> DataFrame:
    """One row for the whole cluster: counts, lag percentiles, total out-of-sync time and the worst catch-up."""
    acc = config.percentile_accuracy
    from_samples = samples.agg(
        F.countDistinct("group").alias("groups"),
        F.countDistinct("group", "follower").alias("followers"),
        F.countDistinct(F.when(F.col("out_of_sync"), F.struct("group", "follower"))).alias(
            "followers_out_of_sync"
        ),
        F.count(F.lit(1)).alias("samples"),
        *_percentile_aggs("lag_entries", acc),
        *_percentile_aggs("lag_ms", acc),
        F.coalesce(F.sum(F.when(F.col("out_of_sync"), F.col("interval_ms")).otherwise(0)), F.lit(0)).alias(
            "out_of_sync_ms"
        ),
    )
    from_persist = persist.agg(*_percentile_aggs("persist_lag_ms", acc))
    from_commits = commits.agg(*_percentile_aggs("commit_lag_ms", acc))
    from_episodes = episodes.agg(
        F.count(F.lit(1)).alias("episodes"),
        F.max("catch_up_ms").alias("max_catch_up_ms"),
        F.sum((~F.col("recovered")).cast("int")).alias("unrecovered_episodes"),
    )
    joined = from_samples.crossJoin(from_persist).crossJoin(from_commits).crossJoin(from_episodes)
    return _expand_percentiles(joined, ["lag_entries", "lag_ms", "persist_lag_ms", "commit_lag_ms"])
