"""End to end: generated telemetry through the whole job; only the paused follower shows lag and out-of-sync time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from pyspark.sql import SparkSession

from spark_analytics.generate import GenerateResult, GenerateSpec, generate
from spark_analytics.job import (
    SHUFFLE_PARTITION_BYTES,
    SHUFFLE_PARTITIONS_MAX,
    JobResult,
    JobSpec,
    local_input_bytes,
    resolve_input,
    run_job,
    shuffle_partitions_for,
)
from spark_analytics.transforms import LagConfig

# The module fixture starts the JVM (if first) and runs the whole job: ~30 s on an idle 2-core machine, but
# ~200 s was seen with the machine 6x oversubscribed, so it gets headroom over the default 300 s.
pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

CONFIG = LagConfig()  # the documented defaults: 10 s windows, out of sync beyond 10 s or 10,000 entries


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, GenerateResult]:
    root = tmp_path_factory.mktemp("telemetry")
    # 100 s of 2 queues on 3 nodes; n3 of q0000 paused from 40 s to 60 s (20 s, past the 10 s threshold);
    # q0001 changes leader from n2 to n3 at 50 s.
    spec = GenerateSpec(records=4_000, output=str(root), groups=2, duration_s=100, seed=7)
    return root, generate(spec)


@pytest.fixture(scope="module")
def job(
    spark: SparkSession, generated: tuple[Path, GenerateResult], tmp_path_factory: pytest.TempPathFactory
) -> JobResult:
    root, _ = generated
    output = tmp_path_factory.mktemp("lag") / "out"
    inputs = (
        str(root / "n1"),  # a node data dir
        str(root / "n2" / "telemetry" / "*.jsonl"),  # a glob
        (root / "n3" / "telemetry").as_uri(),  # a directory URI
    )
    return run_job(spark, JobSpec(inputs=inputs, output=str(output), config=CONFIG))


def summary_by_follower(spark: SparkSession, job: JobResult) -> dict[tuple[str, str], dict[str, Any]]:
    table = next(path for path in job.tables if path.endswith("follower_summary"))
    return {(row["group"], row["follower"]): row.asDict() for row in spark.read.parquet(table).collect()}


def test_every_generated_record_is_read(job: JobResult, generated: tuple[Path, GenerateResult]) -> None:
    assert job.records == generated[1].records


def test_only_the_paused_follower_lags_and_falls_out_of_sync(
    spark: SparkSession, job: JobResult, generated: tuple[Path, GenerateResult]
) -> None:
    result = generated[1]
    followers = summary_by_follower(spark, job)
    lagging = (result.lagging_group, result.lagging_follower)
    assert len(followers) == 5  # 2 followers per queue, plus the old leader of q0001 after its leader change
    victim = followers.pop(lagging)
    assert victim["out_of_sync_ms"] > 0
    assert victim["episodes"] == 1
    assert victim["lag_ms_max"] > CONFIG.lag_threshold_ms
    assert victim["lag_entries_max"] > 0
    assert victim["max_catch_up_ms"] > 0
    for key, healthy in followers.items():
        assert healthy["out_of_sync_ms"] == 0, key
        assert healthy["episodes"] == 0, key
        assert healthy["lag_ms_max"] < 1_000, key
        assert healthy["persist_lag_ms_max"] < 1_000, key


def test_the_catch_up_episode_lies_inside_the_fault(
    spark: SparkSession, job: JobResult, generated: tuple[Path, GenerateResult]
) -> None:
    result = generated[1]
    table = next(path for path in job.tables if path.endswith("catch_up_episodes"))
    (episode,) = spark.read.parquet(table).collect()
    assert (episode["group"], episode["follower"]) == (result.lagging_group, result.lagging_follower)
    assert episode["recovered"]
    assert result.fault_start_ms + CONFIG.lag_threshold_ms <= episode["start_ts_ms"] < result.fault_end_ms
    assert result.fault_end_ms <= episode["end_ts_ms"] < result.fault_end_ms + 5_000


def test_outputs_exist(job: JobResult) -> None:
    for table in job.tables:
        assert (Path(table) / "_SUCCESS").exists()
        assert list(Path(table).glob("*.parquet"))
        name = Path(table).name
        assert list((Path(table).parent / "csv" / name).glob("*.csv"))
    assert len(job.charts) == 2
    for chart in job.charts:
        assert Path(chart).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = Path(job.report_path).read_text()
    assert report == job.report
    assert "%2F/q0000 n3: out of sync" in report


def test_a_node_data_dir_is_expanded_to_its_telemetry_files(
    generated: tuple[Path, GenerateResult], tmp_path: Path
) -> None:
    root = generated[0]
    assert resolve_input(str(root / "n1")) == [str(root / "n1" / "telemetry" / "*.jsonl")]
    assert resolve_input("hdfs://namenode/raftmq/*/telemetry") == ["hdfs://namenode/raftmq/*/telemetry"]
    # A cluster node's data dir: Raft telemetry one level down, under raft/telemetry.
    (tmp_path / "raft" / "telemetry").mkdir(parents=True)
    (tmp_path / "metadata").mkdir()
    assert resolve_input(str(tmp_path)) == [str(tmp_path / "raft" / "telemetry" / "*.jsonl")]
    assert resolve_input(str(tmp_path / "metadata")) == [str(tmp_path / "metadata")]


def test_shuffle_partitions_are_sized_to_the_input(tmp_path: Path) -> None:
    assert shuffle_partitions_for(0, cores=2) == 2
    assert shuffle_partitions_for(31 * 1024 * 1024, cores=2) == 2
    assert shuffle_partitions_for(10 * SHUFFLE_PARTITION_BYTES + 1, cores=2) == 11
    assert shuffle_partitions_for(10**12, cores=2) == SHUFFLE_PARTITIONS_MAX
    assert shuffle_partitions_for(10, cores=8) == 8
    node = tmp_path / "n1" / "telemetry"
    node.mkdir(parents=True)
    (node / "replication-n1.jsonl").write_bytes(b"x" * 1000)
    (node / "ignored.txt").write_bytes(b"x" * 5)
    assert local_input_bytes((str(tmp_path),)) == 1000
    assert local_input_bytes((str(node / "replication-n1.jsonl"), str(tmp_path / "n1"))) == 2000
    assert local_input_bytes(("s3a://bucket/telemetry",)) is None
