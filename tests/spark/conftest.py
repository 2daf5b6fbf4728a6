"""One SparkSession for the whole Spark test tier (JVM start-up is slow): local[2], 2 shuffle partitions, no UI,
bound to 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pyspark = pytest.importorskip("pyspark")

from pyspark.sql import SparkSession  # noqa: E402

from spark_analytics.session import SparkSettings, build_session  # noqa: E402


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    settings = SparkSettings(
        master="local[2]",
        app_name="raftmq-lag-tests",
        shuffle_partitions=2,
        ui_enabled=False,
        bind_loopback=True,
        extra_conf=(
            ("spark.default.parallelism", "2"),
            ("spark.sql.session.timeZone", "UTC"),
            # Tiny frames: compiling generated code costs more than it saves (halves this tier's time).
            ("spark.sql.codegen.wholeStage", "false"),
            ("spark.sql.codegen.factoryMode", "NO_CODEGEN"),
        ),
    )
    session = build_session(settings)
    yield session
    session.stop()
