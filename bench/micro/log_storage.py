"""Benchmark of cluster.log: record encoding, append+fsync throughput, group commit, recovery time.

Run: ``.venv/bin/python -m bench.micro.log_storage [--directory DIR] [--recovery-records 1000000]``.
Measures, with fsync on (the directory's file system decides what an fsync costs):
- struct vs cbor2 for encoding/decoding a record header (why format.py uses struct);
- appends/s and MB/s for 1 stream, one fsync per append and per batch;
- appends/s for 1,000 streams with group commit of N appends per fsync;
- recovery time (NodeLog.open, then reading every record) for N records, after a clean close and after a crash
  (the WAL still full, so open must replay it).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable

import cbor2

from cluster.log import LogConfig, NodeLog


def rate(count: int, seconds: float) -> str:
    return f"{count / seconds:,.0f}/s"


def encoding_comparison(iterations: int = 200_000) -> None:
    payload = b"x" * 100
    header = struct.Struct("<Iqq")

    def with_struct() -> None:
        for i in range(iterations):
            head = header.pack(len(payload), i, 0)
            blob = struct.pack("<I", zlib.crc32(payload, zlib.crc32(head))) + head + payload
            header.unpack_from(blob, 4)

    def with_cbor() -> None:
        for i in range(iterations):
            blob = cbor2.dumps([i, 0, payload])
            crc = zlib.crc32(blob)
            cbor2.loads(blob)
            del crc

    for name, function in (("struct", with_struct), ("cbor2", with_cbor)):
        start = time.perf_counter()
        function()
        elapsed = time.perf_counter() - start
        print(f"encode+decode record with {name:6s}: {rate(iterations, elapsed)} ({elapsed / iterations * 1e6:.2f} us)")


def timed(label: str, count: int, payload_bytes: int, body: Callable[[], None]) -> float:
    start = time.perf_counter()
    body()
    elapsed = time.perf_counter() - start
    megabytes = count * payload_bytes / 1e6 / elapsed
    print(f"{label:58s} {rate(count, elapsed):>14s} appends, {megabytes:8.1f} MB/s")
    return elapsed


def single_stream(root: pathlib.Path, payload_bytes: int, per_fsync: int, appends: int) -> None:
    directory = root / f"single-{payload_bytes}-{per_fsync}"
    log = NodeLog.open(directory)
    payload = b"p" * payload_bytes

    def body() -> None:
        for i in range(appends):
            log.append("queue", payload)
            if (i + 1) % per_fsync == 0:
                log.commit()
        log.commit()

    timed(f"1 stream, {payload_bytes} B, {per_fsync} append(s)/fsync", appends, payload_bytes, body)
    log.close()
    shutil.rmtree(directory)


def many_streams(root: pathlib.Path, streams: int, payload_bytes: int, per_fsync: int, appends: int) -> None:
    directory = root / f"many-{per_fsync}"
    log = NodeLog.open(directory)
    payload = b"m" * payload_bytes
    names = [f"queue-{i}" for i in range(streams)]
    for name in names:  # warm-up: create every stream's directory and first segment outside the measurement
        log.append(name, payload)
    log.commit()

    def body() -> None:
        for i in range(appends):
            log.append(names[i % streams], payload)
            if (i + 1) % per_fsync == 0:
                log.commit()
        log.commit()

    timed(f"{streams} streams, {payload_bytes} B, group commit of {per_fsync}/fsync", appends, payload_bytes, body)
    log.close()
    shutil.rmtree(directory)


def recovery(root: pathlib.Path, records: int, payload_bytes: int, streams: int, crash: bool,
             whole_wal: bool = False) -> None:
    directory = root / f"recovery-{crash}-{whole_wal}"
    config = LogConfig(wal_size_bytes_max=1 << 40) if whole_wal else LogConfig()
    log = NodeLog.open(directory, config)
    payload = b"r" * payload_bytes
    names = [f"queue-{i}" for i in range(streams)]
    start = time.perf_counter()
    for i in range(records):
        log.append(names[i % streams], payload)
        if (i + 1) % 1000 == 0:
            log.commit()
    log.commit()
    write_seconds = time.perf_counter() - start
    if not crash:
        log.close()  # crash: the object is dropped with the whole WAL still on disk
    start = time.perf_counter()
    reopened = NodeLog.open(directory, config)
    open_seconds = time.perf_counter() - start
    total = 0
    for name in reopened.streams():
        total += sum(1 for _ in reopened.read(name)[1])
    read_seconds = time.perf_counter() - start - open_seconds
    assert total == records, (total, records)
    kind = "clean close"
    if crash:
        kind = "crash, all records in the WAL" if whole_wal else "crash, default WAL checkpoints"
    print(f"recovery of {records:,} x {payload_bytes} B records in {streams} streams after {kind}: "
          f"open {open_seconds:.2f} s, open+read all {open_seconds + read_seconds:.2f} s "
          f"(writing them took {write_seconds:.1f} s, {rate(records, write_seconds)})")
    reopened.close()
    if not crash:
        print(f"  resident memory of a fresh process after NodeLog.open on that log: {open_rss_mb(directory):.0f} MB")
    shutil.rmtree(directory)


def open_rss_mb(directory: pathlib.Path) -> float:
    """VmRSS of a new interpreter that only opens the log (indexes and metadata; bodies stay on disk)."""
    script = ("import pathlib, sys; from cluster.log import NodeLog; log = NodeLog.open(pathlib.Path(sys.argv[1]));"
              "print([l for l in open('/proc/self/status') if l.startswith('VmRSS')][0].split()[1])")
    repo = pathlib.Path(__file__).resolve().parents[1]
    output = subprocess.run([sys.executable, "-c", script, str(directory)], cwd=repo, capture_output=True,
                            text=True, check=True).stdout
    return int(output.strip()) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--directory", type=pathlib.Path, default=None)
    parser.add_argument("--recovery-records", type=int, default=1_000_000)
    parser.add_argument("--quick", action="store_true", help="small counts, for a smoke run")
    args = parser.parse_args()
    scale = 10 if args.quick else 1
    root = pathlib.Path(tempfile.mkdtemp(prefix="log-bench-", dir=args.directory))
    print(f"directory {root}, load average at start {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    try:
        encoding_comparison(200_000 // scale)
        for payload_bytes in (100, 1024):
            single_stream(root, payload_bytes, per_fsync=1, appends=2000 // scale)
            single_stream(root, payload_bytes, per_fsync=100, appends=200_000 // scale)
        for per_fsync in (1, 10, 100, 1000):
            many_streams(root, 1000, 1024, per_fsync, appends=min(200_000, 2000 * per_fsync) // scale)
        recovery(root, args.recovery_records // scale, 100, 100, crash=False)
        recovery(root, args.recovery_records // scale, 100, 100, crash=True)
        recovery(root, args.recovery_records // scale, 100, 100, crash=True, whole_wal=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
