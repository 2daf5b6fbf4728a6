"""`raftmq lag`: replication lag analysis on Spark, and `raftmq lag generate`: synthetic telemetry.

    raftmq lag --input DIR_OR_URI [--input ...] --output URI [--master M] [--window 10s] [--lag-threshold 10s]
               [--lag-threshold-entries 10000] [--shuffle-partitions N] [--report-dir DIR] [--no-csv] [--conf k=v]
    raftmq lag generate --records N --output DIR [--seed S] [--nodes 3] [--groups 4] [--duration 120s] [--workers N]

The same module runs under spark-submit (`spark-submit ... spark_analytics/cli.py --input ...`): without --master
the master is whatever spark-submit was given.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

from spark_analytics.generate import GenerateSpec, default_workers, generate
from spark_analytics.transforms import LagConfig

_DURATION = re.compile(r"^(\d+)(ms|s|m|h)$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}


def duration_ms(text: str) -> int:
    """'250ms', '10s', '2m', '1h' -> milliseconds; a unit is required."""
    match = _DURATION.match(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (use e.g. 500ms, 10s, 2m)")
    return int(match.group(1)) * _UNIT_MS[match.group(2)]


def conf_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    return key, value


def lag_parser() -> argparse.ArgumentParser:
    defaults = LagConfig()
    parser = argparse.ArgumentParser(prog="raftmq lag", description="replication lag analysis on Spark")
    parser.add_argument("--input", action="append", required=True, help="node data dir, file, glob or URI")
    parser.add_argument("--output", required=True, help="output directory or URI (Parquet and CSV)")
    parser.add_argument("--master", default=None, help="Spark master (default: local[*] or spark-submit's)")
    parser.add_argument("--window", type=duration_ms, default=defaults.window_ms, help="window length (10s)")
    parser.add_argument(
        "--lag-threshold",
        type=duration_ms,
        default=defaults.lag_threshold_ms,
        help="out-of-sync time lag (10s)",
    )
    parser.add_argument(
        "--lag-threshold-entries",
        type=int,
        default=defaults.lag_threshold_entries,
        help="out-of-sync lag (entries)",
    )
    parser.add_argument("--shuffle-partitions", type=int, default=None,
                        help="spark.sql.shuffle.partitions (default: sized to local input, else Spark's)")
    parser.add_argument(
        "--report-dir", default=None, help="driver-local dir for charts/report (non-local output)"
    )
    parser.add_argument(
        "--charts-max", type=int, default=50, help="chart at most this many queues (worst first)"
    )
    parser.add_argument("--no-csv", action="store_true", help="write Parquet only")
    parser.add_argument(
        "--conf", type=conf_pair, action="append", default=[], help="extra Spark conf key=value"
    )
    return parser


def generate_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="raftmq lag generate", description="write synthetic replication telemetry"
    )
    parser.add_argument("--records", type=int, required=True, help="about this many records")
    parser.add_argument("--output", required=True, help="local directory (one <node>/telemetry/ per node)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--groups", type=int, default=4, help="queues (Raft groups)")
    parser.add_argument("--duration", type=duration_ms, default=120_000, help="simulated time (120s)")
    parser.add_argument("--workers", type=int, default=default_workers(), help="processes")
    return parser


def run_generate(argv: list[str]) -> int:
    args = generate_parser().parse_args(argv)
    spec = GenerateSpec(
        records=args.records,
        output=args.output,
        seed=args.seed,
        nodes=args.nodes,
        groups=args.groups,
        duration_s=max(1, args.duration // 1000),
        workers=args.workers,
    )
    result = generate(spec)
    rate = result.records / result.seconds if result.seconds > 0 else 0.0
    print(
        f"wrote {result.records:,} records in {len(result.files)} files in {result.seconds:.1f} s ({rate:,.0f}/s)"
    )
    print(
        f"lagging follower: {result.lagging_follower} of {result.lagging_group}, paused {result.fault_start_ms}"
        f"..{result.fault_end_ms} ms"
    )
    return 0


def run_lag(argv: list[str]) -> int:
    args = lag_parser().parse_args(argv)
    # Spark is imported only here, so `raftmq lag generate` and --help work without a JVM.
    from spark_analytics.job import (
        DEFAULT_LOCAL_REPORT_DIR,
        JobSpec,
        local_input_bytes,
        run_job,
        shuffle_partitions_for,
    )
    from spark_analytics.session import SparkSettings, build_session

    config = LagConfig(
        window_ms=args.window,
        lag_threshold_ms=args.lag_threshold,
        lag_threshold_entries=args.lag_threshold_entries,
    )
    spec = JobSpec(
        inputs=tuple(args.input),
        output=args.output,
        config=config,
        local_report_dir=args.report_dir or DEFAULT_LOCAL_REPORT_DIR,
        charts_max=args.charts_max,
        write_csv=not args.no_csv,
    )
    partitions = args.shuffle_partitions
    if partitions is None and not any(conf.startswith("spark.sql.shuffle.partitions=") for conf in args.conf):
        input_bytes = local_input_bytes(spec.inputs)
        if input_bytes is not None:
            partitions = shuffle_partitions_for(input_bytes, os.cpu_count() or 1)
    settings = SparkSettings(master=args.master, shuffle_partitions=partitions, extra_conf=tuple(args.conf))
    spark = build_session(settings)
    try:
        result = run_job(spark, spec)
    finally:
        spark.stop()
    print(result.report, end="")
    print(f"tables: {', '.join(result.tables)}")
    print(f"charts: {len(result.charts)}, report: {result.report_path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["generate"]:
        return run_generate(args[1:])
    return run_lag(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
