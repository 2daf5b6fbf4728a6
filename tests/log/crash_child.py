"""Child process for the SIGKILL crash test: append + commit forever, acknowledging on stdout.

Usage: ``python -m tests.log.crash_child DIRECTORY SEED``; odd seeds commit from a worker thread while the main
thread appends (the runtime's pattern), even seeds append and commit in one thread and take snapshots.  Each line written is ``stream offset`` for the highest
offset of that stream whose ``commit()`` has returned; the parent kills us at a random moment and checks that the
log holds every acknowledged record, in order, uncorrupted.  Payloads are a pure function of (stream, offset).
"""

from __future__ import annotations

import pathlib
import random
import sys
import threading

from cluster.log import LogConfig, NodeLog

CRASH_CONFIG = LogConfig(segment_size_bytes_max=8192, index_interval_bytes=256, wal_size_bytes_max=64 * 1024,
                         append_buffer_bytes_max=16 * 1024)
STREAMS = [f"queue-{i}" for i in range(6)]


def payload_for(stream: str, offset: int) -> bytes:
    size = (offset * 7919 + len(stream) * 31) % 700
    return f"{stream}:{offset}:".encode() + bytes((offset + i) % 251 for i in range(size))


def snapshot_state(offset: int) -> bytes:
    return f"snapshot-through-{offset}".encode()


def single_threaded(log: NodeLog, rng: random.Random) -> None:
    """Append a burst, commit, acknowledge; now and then snapshot a stream."""
    while True:
        touched: dict[str, int] = {}
        for _ in range(rng.randint(1, 40)):
            stream = rng.choice(STREAMS)
            offset = log.end_offset(stream)
            assert log.append(stream, payload_for(stream, offset), timestamp_ms=offset) == offset
            touched[stream] = offset
        log.commit()
        acknowledge(touched)
        if rng.random() < 0.05:
            stream = rng.choice(STREAMS)
            end = log.end_offset(stream)
            if end > 0:
                through = rng.randint(max(0, end - 30), end - 1)
                log.write_snapshot(stream, through, snapshot_state(through))


def with_committer_thread(log: NodeLog, rng: random.Random) -> None:
    """The runtime's pattern: the main thread appends while a worker thread group-commits."""

    def committer() -> None:
        while True:
            ends = {stream: log.end_offset(stream) for stream in STREAMS}  # all appended before commit() starts
            log.commit()
            acknowledge({stream: end - 1 for stream, end in ends.items() if end > 0})

    threading.Thread(target=committer, daemon=True).start()
    while True:
        stream = rng.choice(STREAMS)
        offset = log.end_offset(stream)
        assert log.append(stream, payload_for(stream, offset), timestamp_ms=offset) == offset


def acknowledge(touched: dict[str, int]) -> None:
    sys.stdout.write("".join(f"{stream} {offset}\n" for stream, offset in touched.items()))
    sys.stdout.flush()


def main() -> None:
    directory, seed = pathlib.Path(sys.argv[1]), int(sys.argv[2])
    rng = random.Random(seed)
    log = NodeLog.open(directory, CRASH_CONFIG)
    if seed % 2:
        with_committer_thread(log, rng)
    else:
        single_threaded(log, rng)


if __name__ == "__main__":
    main()
