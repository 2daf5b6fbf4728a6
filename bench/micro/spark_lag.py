"""Benchmark of the replication-lag job: telemetry records per second, and how it scales with partitions.

Run: ``.venv/bin/python -m bench.micro.spark_lag [--records 10000000] [--partitions 2,4,8,16] [--master local[*]]
[--work-dir /tmp/raftmq-spark-bench] [--driver-memory 4g]``.

1. Generates `--records` telemetry records (spark_analytics.generate, one process per core) unless the work dir
   already holds the same amount, and reports the generator's records/s.
2. In one SparkSession, for each N in `--partitions`: input split into about N partitions
   (spark.sql.files.maxPartitionBytes = input bytes / N) and N shuffle partitions (adaptive coalescing off so N
   is what runs), then the whole job (read, transforms, Parquet + CSV, charts, report). Prints seconds and
   records/s per N. Results depend on how many cores the master has and on what else the machine is doing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

from spark_analytics.generate import GenerateSpec, default_workers, generate
from spark_analytics.job import JobSpec, run_job
from spark_analytics.session import SparkSettings, build_session


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--partitions", default="2,4,8,16")
    parser.add_argument("--master", default=None)
    parser.add_argument("--work-dir", default="/tmp/raftmq-spark-bench")
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--duration-s", type=int, default=600)
    return parser.parse_args()


def ensure_telemetry(args: argparse.Namespace, input_dir: Path) -> int:
    marker = input_dir / "generated.json"
    if marker.exists() and json.loads(marker.read_text())["target"] == args.records:
        records: int = json.loads(marker.read_text())["records"]
        print(f"reusing {records:,} records in {input_dir}")
        return records
    spec = GenerateSpec(
        records=args.records,
        output=str(input_dir),
        groups=args.groups,
        duration_s=args.duration_s,
        workers=default_workers(),
    )
    result = generate(spec)
    print(
        f"generated {result.records:,} records in {len(result.files)} files, {result.seconds:.1f} s"
        f" ({result.records / result.seconds:,.0f} records/s, {spec.workers} processes)"
    )
    marker.write_text(json.dumps({"target": args.records, "records": result.records}))
    return result.records


def input_bytes(input_dir: Path) -> int:
    return sum(path.stat().st_size for path in input_dir.rglob("*.jsonl"))


def main() -> int:
    args = parse_args()
    work = Path(args.work_dir)
    input_dir = work / "telemetry"
    records = ensure_telemetry(args, input_dir)
    total_bytes = input_bytes(input_dir)
    print(
        f"input: {total_bytes / 2**20:,.0f} MiB; cores: {os.cpu_count()}; master: {args.master or 'local[*]'}"
    )
    settings = SparkSettings(
        master=args.master,
        app_name="raftmq-lag-bench",
        ui_enabled=False,
        extra_conf=(
            ("spark.driver.memory", args.driver_memory),
            ("spark.sql.adaptive.coalescePartitions.enabled", "false"),
        ),
    )
    spark = build_session(settings)
    nodes = sorted(str(path) for path in input_dir.iterdir() if path.is_dir())
    results = []
    try:
        for partitions in [int(part) for part in args.partitions.split(",")]:
            spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
            spark.conf.set("spark.sql.files.maxPartitionBytes", str(math.ceil(total_bytes / partitions)))
            spark.conf.set("spark.sql.files.openCostInBytes", "0")
            spec = JobSpec(inputs=tuple(nodes), output=str(work / f"out-{partitions}"))
            started = time.perf_counter()
            result = run_job(spark, spec)
            seconds = time.perf_counter() - started
            assert result.records == records, (result.records, records)
            results.append((partitions, seconds, records / seconds))
            print(
                f"partitions={partitions:>3}: {seconds:7.1f} s, {records / seconds:10,.0f} records/s",
                flush=True,
            )
    finally:
        spark.stop()
    print("\n| partitions | seconds | records/s |\n|---:|---:|---:|")
    for partitions, seconds, rate in results:
        print(f"| {partitions} | {seconds:.1f} | {rate:,.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
