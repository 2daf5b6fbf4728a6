"""The explicit Spark schema of the replication telemetry records (docs/telemetry.md, schema v1).

Telemetry is JSON lines; Spark is never asked to infer a schema (inference scans the data twice and guesses types
from whatever sample it sees). Every field of every record type is listed here, nullable, so one reader handles
`state`, `append` and `commit` records alike; fields a record type does not carry read as null.
"""

from __future__ import annotations

from pyspark.sql.types import (
    ArrayType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

SCHEMA_VERSION = 1

RECORD_STATE = "state"
RECORD_APPEND = "append"
RECORD_COMMIT = "commit"
RECORD_ISR = "isr"  # mirrored queues only: the leader's ISR changed (or a new leader took over)
RECORD_TRUNCATE = "truncate"  # mirrored queues only: a replica cut its log (from_index -> to_index, how)

ROLE_LEADER = "leader"
ROLE_FOLLOWER = "follower"

FOLLOWER_PROGRESS = StructType(
    [
        StructField("match_index", LongType(), True),
        StructField("match_bytes", LongType(), True),
    ]
)

TELEMETRY_SCHEMA = StructType(
    [
        StructField("v", IntegerType(), True),
        StructField("kind", StringType(), True),
        StructField("type", StringType(), True),
        StructField("ts_ms", LongType(), True),
        StructField("node", StringType(), True),
        StructField("group", StringType(), True),
        StructField("term", LongType(), True),
        # state and append
        StructField("role", StringType(), True),
        StructField("last_index", LongType(), True),
        StructField("log_bytes", LongType(), True),
        # state and commit
        StructField("commit_index", LongType(), True),
        # state, leader only
        StructField("followers", MapType(StringType(), FOLLOWER_PROGRESS, True), True),
        # append only
        StructField("first_index", LongType(), True),
        StructField("bytes", LongType(), True),
        # append only, optional: the term of the batch's last entry (absent in older telemetry)
        StructField("entries_term", LongType(), True),
        # mirrored queues ("kind": "mirror"): isr records (and leader state records) carry the ISR, isr the leader
        StructField("isr", ArrayType(StringType(), True), True),
        StructField("leader", StringType(), True),
        # mirrored queues: truncate records (the replica's log end before and after, and the reason)
        StructField("from_index", LongType(), True),
        StructField("to_index", LongType(), True),
        StructField("how", StringType(), True),
    ]
)
