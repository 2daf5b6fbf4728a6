"""The replication-lag job: telemetry JSON lines in; Parquet, CSV, PNG charts and a text report out.

`run_job(spark, spec)` reads every input path with the explicit schema (any path Spark reads: files, globs,
directories, hdfs:// or s3a:// URIs; a local node data dir is expanded to its `telemetry/*.jsonl` and
`*/telemetry/*.jsonl` files, e.g. a cluster node's `raft/telemetry/`), runs the transforms of transforms.py (and
isr.py's for mirrored queues' `isr` records: `isr_episodes`, `isr_followers`, `isr_changes`, only when the input
has such records; truncations.py's `truncations` for their `truncate` records, likewise),
and writes one Parquet table and one CSV table per result under the output URI.
Charts and the report are drawn on the driver from small aggregates only (per-window rows of the charted queues,
the summaries): raw telemetry is never collected. They are written under the output when it is a local path, else
into `local_report_dir` on the driver.

Shuffle partitions: unless set (`--shuffle-partitions`, `--conf`), a job whose inputs are all local files gets
`shuffle_partitions_for(bytes, cores)`: one partition per `SHUFFLE_PARTITION_BYTES` of telemetry, at least one per
core, at most Spark's default of 200, so a small input is not written as many tiny part files per table
(figures: docs/spark.md). Inputs on a remote filesystem keep Spark's setting.
"""

from __future__ import annotations

import glob
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pyspark import StorageLevel
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from spark_analytics import isr as I
from spark_analytics import transforms as T
from spark_analytics import truncations as TR
from spark_analytics.charts import IsrSeries, QueueSeries, draw_isr_chart, draw_queue_chart
from spark_analytics.report import render_report
from spark_analytics.schema import TELEMETRY_SCHEMA

DEFAULT_LOCAL_REPORT_DIR = "raftmq-lag-report"
TELEMETRY_GLOB = "telemetry/*.jsonl"
SHUFFLE_PARTITION_BYTES = 32 * 1024 * 1024
SHUFFLE_PARTITIONS_MAX = 200


@dataclass(frozen=True, slots=True)
class JobSpec:
    inputs: tuple[str, ...]
    output: str
    config: T.LagConfig = field(default_factory=T.LagConfig)
    local_report_dir: str = DEFAULT_LOCAL_REPORT_DIR
    charts_max: int = 50
    report_rows: int = 20
    write_csv: bool = True


@dataclass(frozen=True, slots=True)
class JobResult:
    records: int
    seconds: float
    tables: tuple[str, ...]
    charts: tuple[str, ...]
    report_path: str
    report: str


def local_path(uri: str) -> Path | None:
    """The local filesystem path of `uri` (plain path or file:), else None."""
    parsed = urlparse(uri)
    if parsed.scheme == "":
        return Path(uri)
    if parsed.scheme == "file":
        return Path(parsed.path)
    return None


def resolve_input(uri: str) -> list[str]:
    """A local node data dir becomes its telemetry globs; everything else goes to Spark unchanged.

    A node data dir is a directory with a `telemetry/` subdirectory, or with subdirectories that have one (a
    cluster node writes its Raft telemetry under `<data_dir>/raft/telemetry/`); one glob per telemetry directory.
    """
    path = local_path(uri)
    if path is None or not path.is_dir():
        return [uri]
    candidates = [path, *sorted(child for child in path.iterdir() if child.is_dir())]
    globs = [
        str(directory / TELEMETRY_GLOB) for directory in candidates if (directory / "telemetry").is_dir()
    ]
    return globs or [uri]


def local_input_bytes(inputs: tuple[str, ...]) -> int | None:
    """The total size of the local files the inputs name (directories counted whole), or None if any is remote."""
    total = 0
    for uri in inputs:
        for pattern in resolve_input(uri):
            path = local_path(pattern)
            if path is None:
                return None
            for match in map(Path, glob.glob(str(path))):
                files = [match] if match.is_file() else [f for f in match.rglob("*") if f.is_file()]
                total += sum(f.stat().st_size for f in files)
    return total


def shuffle_partitions_for(input_bytes: int, cores: int) -> int:
    """One shuffle partition per SHUFFLE_PARTITION_BYTES of input, at least `cores`, at most the maximum."""
    by_size = -(-input_bytes // SHUFFLE_PARTITION_BYTES)
    return max(1, cores, min(SHUFFLE_PARTITIONS_MAX, by_size))


def read_telemetry(spark: SparkSession, inputs: tuple[str, ...]) -> DataFrame:
    """All records of all inputs with the explicit schema; malformed lines read as nulls and are dropped later."""
    return (
        spark.read.schema(TELEMETRY_SCHEMA)
        .option("mode", "PERMISSIVE")
        .json([glob for uri in inputs for glob in resolve_input(uri)])
    )


@dataclass(frozen=True, slots=True)
class LagTables:
    follower_windows: DataFrame
    commit_windows: DataFrame
    catch_up_episodes: DataFrame
    follower_summary: DataFrame
    cluster_summary: DataFrame
    isr_episodes: DataFrame  # mirrored queues (spark_analytics/isr.py): one row per replica's time out of the ISR
    isr_followers: DataFrame  # per mirrored queue and replica: lag, time out of the ISR, shrinks/expands
    isr_changes: DataFrame  # per mirrored queue: ISR shrinks, expands, leader changes, smallest ISR
    cached: tuple[DataFrame, ...]
    mirrored: bool = False  # the input has mirrored queues' `isr` records: the isr_* tables are written
    truncations: DataFrame | None = None  # per mirrored queue, replica and mode: truncations and offsets dropped
    truncated: bool = False  # the input has `truncate` records: the truncations table is written

    def named(self) -> dict[str, DataFrame]:
        names = (
            "follower_windows",
            "commit_windows",
            "catch_up_episodes",
            "follower_summary",
            "cluster_summary",
            *(("isr_episodes", "isr_followers", "isr_changes") if self.mirrored else ()),
            *(("truncations",) if self.truncated else ()),
        )
        return {name: getattr(self, name) for name in names}


def compute_tables(records: DataFrame, config: T.LagConfig) -> LagTables:
    """Every result table from valid records; intermediate frames reused several times are cached."""
    samples = T.with_out_of_sync(T.with_time_lag(T.follower_samples(records), records, config), config)
    samples = samples.persist(StorageLevel.MEMORY_AND_DISK)
    persist = T.append_to_persist(records, config).persist(StorageLevel.MEMORY_AND_DISK)
    commits = T.append_to_commit(records, config).persist(StorageLevel.MEMORY_AND_DISK)
    episodes = T.catch_up_episodes(samples).persist(StorageLevel.MEMORY_AND_DISK)
    # The result tables are small aggregates, each written twice and partly collected: cache them too.
    results = [
        T.follower_windows(samples, persist, config),
        T.commit_windows(commits, config),
        T.follower_summary(samples, persist, episodes, config),
        T.cluster_summary(samples, persist, commits, episodes, config),
    ]
    windows, commit_windows, followers, cluster = (
        frame.persist(StorageLevel.MEMORY_AND_DISK) for frame in results
    )
    isr_episodes = I.out_of_isr_episodes(records).persist(StorageLevel.MEMORY_AND_DISK)
    isr_tables = [I.isr_followers(records, isr_episodes, followers), I.isr_changes(records)]
    isr_followers, isr_changes = (frame.persist(StorageLevel.MEMORY_AND_DISK) for frame in isr_tables)
    truncations = TR.truncations(records).persist(StorageLevel.MEMORY_AND_DISK)
    return LagTables(
        follower_windows=windows,
        commit_windows=commit_windows,
        catch_up_episodes=episodes,
        follower_summary=followers,
        cluster_summary=cluster,
        isr_episodes=isr_episodes,
        isr_followers=isr_followers,
        isr_changes=isr_changes,
        cached=(samples, persist, commits, episodes, *results, isr_episodes, isr_followers, isr_changes,
                truncations),
        mirrored=bool(I.isr_records(records).limit(1).count()),
        truncations=truncations,
        truncated=bool(TR.truncate_records(records).limit(1).count()),
    )


def join_uri(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name


def write_tables(tables: LagTables, output: str, write_csv: bool) -> list[str]:
    """Parquet under `<output>/<table>`, CSV (one file, with header) under `<output>/csv/<table>`."""
    written = []
    for name, frame in tables.named().items():
        frame.write.mode("overwrite").parquet(join_uri(output, name))
        written.append(join_uri(output, name))
        if write_csv:
            frame.coalesce(1).write.mode("overwrite").option("header", "true").csv(
                join_uri(output, f"csv/{name}")
            )
    return written


def report_dir(spec: JobSpec) -> Path:
    path = local_path(spec.output)
    return path if path is not None else Path(spec.local_report_dir)


def safe_file_name(group: str) -> str:
    return re.sub(r"[^A-Za-z0-9._%-]", "_", group)


def charted_groups(follower_summary: DataFrame, charts_max: int) -> list[str]:
    """The queues to chart: the worst `charts_max` by out-of-sync time, then by max lag in entries."""
    worst = (
        follower_summary.groupBy("group")
        .agg(F.sum("out_of_sync_ms").alias("oos"), F.max("lag_entries_max").alias("lag"))
        .orderBy(F.desc("oos"), F.desc_nulls_last("lag"), "group")
        .limit(charts_max)
    )
    return [row["group"] for row in worst.collect()]


def collect_series(windows: DataFrame, groups: list[str]) -> dict[str, QueueSeries]:
    """Per charted queue, its per-window aggregates (small: one row per follower and window)."""
    columns = ["group", "follower", "window_start_ms", "lag_entries_max", "lag_ms_max"]
    rows: list[Row] = (
        windows.where(F.col("group").isin(groups)).select(*columns).orderBy("window_start_ms").collect()
    )
    series: dict[str, QueueSeries] = {group: QueueSeries(group) for group in groups}
    for row in rows:
        series[row["group"]].add(
            row["follower"],
            row["window_start_ms"],
            row["lag_entries_max"],
            row["lag_ms_max"],
        )
    return series


def draw_charts(tables: LagTables, spec: JobSpec, directory: Path) -> list[str]:
    groups = charted_groups(tables.follower_summary, spec.charts_max)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for group, series in collect_series(tables.follower_windows, groups).items():
        path = directory / f"lag-{safe_file_name(group)}.png"
        draw_queue_chart(series, spec.config, path)
        paths.append(str(path))
    for group, isr_series in (collect_isr_series(tables, spec.charts_max) if tables.mirrored else {}).items():
        path = directory / f"isr-{safe_file_name(group)}.png"
        draw_isr_chart(isr_series, path)
        paths.append(str(path))
    return paths


def collect_isr_series(tables: LagTables, charts_max: int) -> dict[str, IsrSeries]:
    """Per mirrored queue (the `charts_max` with the most time out of the ISR), its replicas' out-of-ISR episodes
    and its ISR changes' time span (small: one row per episode)."""
    worst = (
        tables.isr_followers.groupBy("group")
        .agg(F.sum("out_of_isr_ms").alias("out"), F.sum("out_of_isr_episodes").alias("episodes"))
        .orderBy(F.desc("out"), F.desc("episodes"), "group")
        .limit(charts_max)
    )
    groups = [row["group"] for row in worst.collect()]
    series = {group: IsrSeries(group) for group in groups}
    for row in tables.isr_followers.where(F.col("group").isin(groups)).select("group", "replica").collect():
        series[row["group"]].replicas.add(row["replica"])
    columns = ["group", "replica", "start_ts_ms", "end_ts_ms"]
    for row in tables.isr_episodes.where(F.col("group").isin(groups)).select(*columns).collect():
        series[row["group"]].episodes.append((row["replica"], row["start_ts_ms"], row["end_ts_ms"]))
    return series


def collect_isr_rows(tables: LagTables, limit: int) -> list[dict[str, Any]]:
    """The mirrored queues' replicas, longest time out of the ISR first (at most `limit`)."""
    rows = tables.isr_followers.orderBy(
        F.desc("out_of_isr_ms"), F.desc("out_of_isr_episodes"), F.desc_nulls_last("lag_messages_max"), "group",
        "replica"
    ).limit(limit)
    return [row.asDict() for row in rows.collect()]


def collect_truncation_rows(tables: LagTables, limit: int) -> list[dict[str, Any]]:
    """The mirrored queues' truncations per replica and mode, unsafe ones and the most offsets dropped first."""
    if tables.truncations is None:
        return []
    rows = tables.truncations.orderBy(
        F.desc("unsafe"), F.desc("offsets_dropped"), F.desc("truncations"), "group", "replica", "how"
    ).limit(limit)
    return [row.asDict() for row in rows.collect()]


def collect_report_rows(
    tables: LagTables, limit: int
) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """The summary row, the worst followers and the longest catch-ups, as dicts (at most `limit` of each)."""
    cluster = tables.cluster_summary.collect()
    followers = tables.follower_summary.orderBy(
        F.desc("out_of_sync_ms"), F.desc_nulls_last("lag_entries_max"), "group", "follower"
    ).limit(limit)
    episodes = tables.catch_up_episodes.orderBy(F.desc_nulls_first("catch_up_ms"), "group", "follower").limit(
        limit
    )
    return (
        cluster[0].asDict() if cluster else {},
        [row.asDict() for row in followers.collect()],
        [row.asDict() for row in episodes.collect()],
    )


def run_job(spark: SparkSession, spec: JobSpec) -> JobResult:
    """Reads, computes, writes; returns what was written and the report text."""
    started = time.perf_counter()
    wanted = [column.name for column in TELEMETRY_SCHEMA.fields if column.name not in ("kind", "bytes")]
    records = T.valid_records(read_telemetry(spark, spec.inputs)).select(*wanted)
    records = records.persist(StorageLevel.MEMORY_AND_DISK)
    record_count = records.count()
    tables = compute_tables(records, spec.config)
    written = write_tables(tables, spec.output, spec.write_csv)
    directory = report_dir(spec)
    charts = draw_charts(tables, spec, directory / "charts")
    seconds = time.perf_counter() - started
    report = render_report(*collect_report_rows(tables, spec.report_rows), spec.config, record_count, seconds,
                           isr=collect_isr_rows(tables, spec.report_rows) if tables.mirrored else None,
                           truncations=collect_truncation_rows(tables, spec.report_rows) if tables.truncated else None)
    report_path = directory / "report.txt"
    report_path.write_text(report)
    for frame in (records, *tables.cached):
        frame.unpersist()
    return JobResult(record_count, seconds, tuple(written), tuple(charts), str(report_path), report)
