"""Benchmark of NodeLog recovery after a kill -9: time ``NodeLog.open`` and a full read of every stream.

Not a test (pytest does not collect it).  Run from the repository root:

    .venv/bin/python -m tests.log.bench_open [--records 1000000] [--payload-bytes 150] [--streams 4]
        [--template DIR] [--profile]

A child process writes the records (one commit per 1,000 appends, default ``LogConfig``) and is killed with
SIGKILL after its last commit returned, leaving the WAL and the active segments as an unclean stop does.  That
directory is kept as a template (``--template`` reuses one); each measurement opens a fresh copy.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pathlib
import pstats
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from cluster.log import NodeLog

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
COMMIT_EVERY_APPENDS = 1000


def write_and_kill(directory: pathlib.Path, records: int, payload_bytes: int, streams: int) -> float:
    """Fill ``directory`` in a child process and SIGKILL it once every record is committed; seconds taken."""
    script = (
        "import pathlib, sys; from cluster.log import NodeLog\n"
        "directory, records, size, streams = pathlib.Path(sys.argv[1]), *map(int, sys.argv[2:5])\n"
        "log = NodeLog.open(directory)\n"
        "names = [f'queue-{i}' for i in range(streams)]\n"
        "for i in range(records):\n"
        "    log.append(names[i % streams], i.to_bytes(8, 'little') * (size // 8), i)\n"
        f"    if (i + 1) % {COMMIT_EVERY_APPENDS} == 0:\n"
        "        log.commit()\n"
        "log.commit()\n"
        "print('done', flush=True)\n"
        "sys.stdin.read()\n"
    )
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-c", script, str(directory), str(records), str(payload_bytes),
                              str(streams)], cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdout is not None
    line = child.stdout.readline()
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert line.strip() == b"done", line
    return time.perf_counter() - start


def measure(template: pathlib.Path, records: int, profile: bool) -> tuple[float, float, float, float]:
    """Wall and CPU seconds for NodeLog.open, then for reading every record of every stream, on a fresh copy of
    ``template``: (open wall, read wall, open CPU, read CPU).  CPU time is the steadier number on a loaded host."""
    with tempfile.TemporaryDirectory(prefix="log-open-") as scratch:
        directory = pathlib.Path(scratch) / "log"
        shutil.copytree(template, directory)
        profiler = cProfile.Profile() if profile else None
        if profiler is not None:
            profiler.enable()
        start, start_cpu = time.perf_counter(), time.process_time()
        log = NodeLog.open(directory)
        opened, opened_cpu = time.perf_counter(), time.process_time()
        total = 0
        for stream in log.streams():
            _, entries = log.read(stream)
            for _ in entries:
                total += 1
        done, done_cpu = time.perf_counter(), time.process_time()
        if profiler is not None:
            profiler.disable()
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)
        log.close()
        assert total == records, (total, records)
        return opened - start, done - opened, opened_cpu - start_cpu, done_cpu - opened_cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--payload-bytes", type=int, default=150)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--template", type=pathlib.Path, default=None, help="reuse (or create) this kill -9 state")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    template = args.template or pathlib.Path(tempfile.mkdtemp(prefix="log-template-")) / "log"
    if not template.exists():
        seconds = write_and_kill(template, args.records, args.payload_bytes, args.streams)
        print(f"wrote {args.records:,} x {args.payload_bytes} B in {args.streams} streams in {seconds:.1f} s")
    size_mb = sum(p.stat().st_size for p in template.rglob("*") if p.is_file()) / 1e6
    wal_mb = sum(p.stat().st_size for p in (template / "wal").glob("*")) / 1e6
    print(f"template {template}: {size_mb:.0f} MB, of which WAL {wal_mb:.0f} MB; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for _ in range(args.repeat):
        open_s, read_s, open_cpu_s, read_cpu_s = measure(template, args.records, args.profile)
        print(f"open {open_s:.2f} s (CPU {open_cpu_s:.2f} s), read all {read_s:.2f} s (CPU {read_cpu_s:.2f} s), "
              f"total {open_s + read_s:.2f} s (CPU {open_cpu_s + read_cpu_s:.2f} s)")


if __name__ == "__main__":
    main()
