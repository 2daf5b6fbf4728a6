"""Hand-built telemetry frames for the transform tests."""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame, Row, SparkSession

from spark_analytics.schema import TELEMETRY_SCHEMA


def telemetry(spark: SparkSession, rows: list[dict[str, Any]]) -> DataFrame:
    """A telemetry DataFrame from dicts; v defaults to 1, kind to raft, absent fields are null."""
    names = TELEMETRY_SCHEMA.fieldNames()
    filled = [{"v": 1, "kind": "raft", **row} for row in rows]
    return spark.createDataFrame([tuple(row.get(name) for name in names) for row in filled], TELEMETRY_SCHEMA)


def rows_of(frame: DataFrame, *columns: str) -> list[tuple[Any, ...]]:
    """The chosen columns of every row, sorted, as plain tuples."""
    collected: list[Row] = frame.select(*columns).collect()
    return sorted(tuple(row) for row in collected)
