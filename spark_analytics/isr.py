"""Pure DataFrame transforms over mirrored queues' `isr` records: time out of the ISR and shrink/expand episodes.

Mirrored-queue leaders write an `isr` record (docs/telemetry.md, `"kind": "mirror"`) whenever their ISR changes or
a new leader takes over: `group`, `ts_ms`, `term` (the leader epoch), `leader` and `isr` (replica names). Ordered by
(ts_ms, term) per group, they give the ISR over time, whichever node wrote them.

- `out_of_isr_episodes`: one row per maximal run of records in which a replica of the group (any name seen in one
  of its ISRs) is absent: `start_ts_ms` (the record that dropped it), `end_ts_ms` (the first record that has it
  again; null when the telemetry ends first: `recovered` false), `out_of_isr_ms` = end - start.
- `isr_changes`: per group, how many records shrank the ISR (a member dropped), expanded it (a member added),
  changed the leader, and the smallest ISR seen.
- `out_of_isr_summary`: per group and replica, the episodes and the total time out of the ISR (recovered
  episodes; the unrecovered ones are counted apart).
- `isr_followers`: the job's per-queue, per-replica ISR table: the summary above (zero for a replica that never
  left), the replica's largest lag in messages and time from the lag tables, and the queue's shrinks/expands.
Like transforms.py: no reads, writes, collects or clocks; tested on hand-built frames (tests/spark/test_isr.py).
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from spark_analytics.schema import RECORD_ISR


def isr_records(records: DataFrame) -> DataFrame:
    return records.where((F.col("type") == RECORD_ISR) & F.col("isr").isNotNull()).select(
        "group", "ts_ms", "term", "leader", "isr"
    )


def out_of_isr_episodes(records: DataFrame) -> DataFrame:
    changes = isr_records(records)
    replicas = changes.groupBy("group").agg(F.array_distinct(F.flatten(F.collect_list("isr"))).alias("replicas"))
    membership = (
        changes.join(replicas, "group")
        .select("group", "ts_ms", "term", "isr", F.explode("replicas").alias("replica"))
        .withColumn("out", ~F.expr("array_contains(isr, replica)"))
    )
    by_replica = Window.partitionBy("group", "replica").orderBy("ts_ms", "term")
    previous = F.coalesce(F.lag("out").over(by_replica), F.lit(False))
    numbered = (
        membership.withColumn("run_starts", F.col("out") & ~previous)
        .withColumn("next_ts_ms", F.lead("ts_ms").over(by_replica))
        .withColumn(
            "episode",
            F.sum(F.col("run_starts").cast("int")).over(by_replica.rowsBetween(Window.unboundedPreceding, 0)),
        )
    )
    episodes = (
        numbered.where(F.col("out"))
        .groupBy("group", "replica", "episode")
        .agg(F.min("ts_ms").alias("start_ts_ms"), F.max_by("next_ts_ms", "ts_ms").alias("end_ts_ms"))
    )
    return episodes.select(
        "group",
        "replica",
        "episode",
        "start_ts_ms",
        "end_ts_ms",
        (F.col("end_ts_ms") - F.col("start_ts_ms")).alias("out_of_isr_ms"),
        F.col("end_ts_ms").isNotNull().alias("recovered"),
    )


def isr_changes(records: DataFrame) -> DataFrame:
    by_group = Window.partitionBy("group").orderBy("ts_ms", "term")
    changes = isr_records(records)
    previous_isr = F.lag("isr").over(by_group)
    previous_leader = F.lag("leader").over(by_group)
    marked = (
        changes.withColumn("shrank", previous_isr.isNotNull() & (F.size(F.array_except(previous_isr, "isr")) > 0))
        .withColumn("expanded", previous_isr.isNotNull() & (F.size(F.array_except("isr", previous_isr)) > 0))
        .withColumn("leader_changed", previous_leader.isNotNull() & (previous_leader != F.col("leader")))
    )
    return marked.groupBy("group").agg(
        F.count(F.lit(1)).alias("isr_records"),
        F.sum(F.col("shrank").cast("int")).alias("shrinks"),
        F.sum(F.col("expanded").cast("int")).alias("expands"),
        F.sum(F.col("leader_changed").cast("int")).alias("leader_changes"),
        F.min(F.size("isr")).alias("min_isr_size"),
    )


def out_of_isr_summary(episodes: DataFrame) -> DataFrame:
    return episodes.groupBy("group", "replica").agg(
        F.count(F.lit(1)).alias("episodes"),
        F.sum(F.when(F.col("recovered"), F.col("out_of_isr_ms")).otherwise(0)).alias("out_of_isr_ms"),
        F.sum((~F.col("recovered")).cast("int")).alias("unrecovered"),
        F.max("out_of_isr_ms").alias("max_out_of_isr_ms"),
    )


def isr_replicas(records: DataFrame) -> DataFrame:
    """(group, replica) for every replica named in one of the group's ISRs or as its leader."""
    changes = isr_records(records)
    members = changes.select("group", F.explode("isr").alias("replica"))
    leaders = changes.select("group", F.col("leader").alias("replica")).where(F.col("replica").isNotNull())
    return members.unionByName(leaders).distinct()


def isr_followers(records: DataFrame, episodes: DataFrame, follower_summary: DataFrame) -> DataFrame:
    """Per mirrored queue and replica: time out of the ISR and its episodes (out_of_isr_summary; zero for a
    replica that never left), the largest lag in messages and in time while it followed (transforms'
    follower_summary: null when it never followed), and the queue's ISR shrinks, expands and leader changes."""
    keys = ["group", "replica"]
    lag = follower_summary.select(
        "group",
        F.col("follower").alias("replica"),
        F.col("lag_entries_max").alias("lag_messages_max"),
        "lag_ms_max",
    )
    out = out_of_isr_summary(episodes).withColumnRenamed("episodes", "out_of_isr_episodes")
    return (
        isr_replicas(records)
        .join(out, keys, "left")
        .fillna(0, ["out_of_isr_episodes", "out_of_isr_ms", "unrecovered"])
        .join(lag, keys, "left")
        .join(isr_changes(records).select("group", "shrinks", "expands", "leader_changes"), "group", "left")
        .select(
            *keys,
            "lag_messages_max",
            "lag_ms_max",
            "out_of_isr_ms",
            "out_of_isr_episodes",
            "unrecovered",
            "max_out_of_isr_ms",
            "shrinks",
            "expands",
            "leader_changes",
        )
    )
