"""Pure DataFrame transforms over mirrored queues' `truncate` records: how often each replica cut its log, and how.

A mirrored-queue replica writes a `truncate` record (docs/telemetry.md, `"kind": "mirror"`) whenever it cuts its
log: `group`, `node` (the replica), `ts_ms`, `term` (its epoch then), `from_index` and `to_index` (its log end
before and after, so `from_index - to_index` messages were dropped) and `how`, the reason: `leader-epoch` (KIP-101's
safe truncation to the leader's end of the replica's last epoch) and `leader-epoch (another round)` (KIP-279's
repeat), `out-of-range` (the leader's log ends below the replica's), or the unsafe demonstration modes `hw (unsafe)`
(truncation to the checkpointed high watermark, as Kafka before KIP-101) and `leader-epoch-v0` (KIP-101 without
KIP-279's rounds).

- `truncations`: per group, replica and `how`: `truncations` (count), `offsets_dropped` (the sum of the cuts),
  `max_dropped` (the largest cut), `first_ts_ms`, `last_ts_ms` and `unsafe` (the mode is one of the unsafe ones).
Like transforms.py: no reads, writes, collects or clocks; tested on hand-built frames (tests/spark/test_isr.py).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_analytics.schema import RECORD_TRUNCATE

UNSAFE_MODES = ("hw (unsafe)", "hw", "leader-epoch-v0")


def truncate_records(records: DataFrame) -> DataFrame:
    return records.where(
        (F.col("type") == RECORD_TRUNCATE) & F.col("from_index").isNotNull() & F.col("to_index").isNotNull()
    ).select("group", F.col("node").alias("replica"), "ts_ms", "term", "from_index", "to_index",
             F.coalesce(F.col("how"), F.lit("unknown")).alias("how"))


def _dropped() -> Column:
    return F.greatest(F.col("from_index") - F.col("to_index"), F.lit(0))


def truncations(records: DataFrame) -> DataFrame:
    return (
        truncate_records(records)
        .groupBy("group", "replica", "how")
        .agg(
            F.count(F.lit(1)).alias("truncations"),
            F.sum(_dropped()).alias("offsets_dropped"),
            F.max(_dropped()).alias("max_dropped"),
            F.min("ts_ms").alias("first_ts_ms"),
            F.max("ts_ms").alias("last_ts_ms"),
        )
        .withColumn("unsafe", F.col("how").isin(*UNSAFE_MODES))
    )
