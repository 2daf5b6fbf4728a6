"""Child process for the SIGKILL crash test: append + commit forever, acknowledging on stdout.

Usage: ``python -m tests.log.crash_child DIRECTORY SEED``; odd seeds commit from a worker thread while the main
thread appends (the runtime's pattern), even seeds append and commit in one thread, take snapshots and write-then-truncate conflicting records.  Each line written is ``stream offset`` for the highest
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


def doomed_payload_for(stream: str, offset: int) -> bytes:
    """Records a Raft-like conflict writes and then truncates away; never acknowledged."""
    return f"DOOMED:{stream}:{offset}".encode()


def heal_doomed_tails(log: NodeLog) -> None:
    """After a restart, truncate conflicting records a crash left behind (as Raft would on hearing the leader)."""
    for stream in STREAMS:
        end = log.end_offset(stream)
        keep = end - 1
        while keep > log.snapshot_offset(stream) and log.read_at(stream, keep).startswith(b"DOOMED:"):
            keep -= 1
        if keep < end - 1:
            log.truncate_after(stream, keep)
    log.commit()


def conflict_then_truncate(log: NodeLog, rng: random.Random) -> None:
    """Append records that lose a conflict, maybe make them durable, then truncate them away."""
    stream = rng.choice(STREAMS)
    keep = log.end_offset(stream) - 1
    for _ in range(rng.randint(1, 20)):
        offset = log.end_offset(stream)
        log.append(stream, doomed_payload_for(stream, offset), timestamp_ms=offset)
    if rng.random() < 0.5:
        log.commit()
    log.truncate_after(stream, max(keep, log.snapshot_offset(stream)))


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
        if rng.random() < 0.1:
            conflict_then_truncate(log, rng)
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
    heal_doomed_tails(log)
    if seed % 2:
        with_committer_thread(log, rng)
    else:
        single_threaded(log, rng)


if __name__ == "__main__":
    main()
