"""Building the SparkSession the lag job runs in.

Nothing here assumes local mode: the master comes from the command line; when it is not given (None) it is left to
Spark, which means local[*] under plain `python`/`raftmq`, and whatever `spark-submit --master` or spark-defaults
say under spark-submit (setting local[*] ourselves would override those). Tests pass a small number of shuffle partitions, the
UI off and the driver bound to 127.0.0.1.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyspark.sql import SparkSession

DEFAULT_MASTER: str | None = None


@dataclass(frozen=True, slots=True)
class SparkSettings:
    """How to start Spark; `extra_conf` is passed through as `spark.*` key/value pairs."""

    master: str | None = DEFAULT_MASTER
    app_name: str = "raftmq-lag"
    shuffle_partitions: int | None = None
    ui_enabled: bool = True
    bind_loopback: bool = False
    extra_conf: tuple[tuple[str, str], ...] = field(default_factory=tuple)


def build_session(settings: SparkSettings) -> SparkSession:
    """Gets or creates the SparkSession described by `settings`."""
    builder = SparkSession.builder.appName(settings.app_name)
    if settings.master is not None:
        builder = builder.master(settings.master)
    if settings.shuffle_partitions is not None:
        builder = builder.config("spark.sql.shuffle.partitions", str(settings.shuffle_partitions))
    builder = builder.config("spark.ui.enabled", "true" if settings.ui_enabled else "false").config(
        "spark.ui.showConsoleProgress", "false"
    )
    if settings.bind_loopback:
        builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config(
            "spark.driver.host", "127.0.0.1"
        )
    for key, value in settings.extra_conf:
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session
