"""SIGKILL crash tests: a child appends and commits in a loop and is killed at random moments, many times.

After every kill the log is reopened and checked: every acknowledged record (its commit() had returned) is there,
records are contiguous from the snapshot on, in order, and each payload is exactly what was written.
Set RAFTMQ_LOG_CRASH_KILLS (default 20) for a longer run.
"""

from __future__ import annotations

import os
import pathlib
import random
import select
import signal
import subprocess
import sys
import time

from cluster.log import NodeLog
from tests.log.crash_child import CRASH_CONFIG, STREAMS, doomed_payload_for, payload_for, snapshot_state

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
KILLS = int(os.environ.get("RAFTMQ_LOG_CRASH_KILLS", "20"))
FIRST_ACK_WAIT_SECONDS_MAX = 120.0  # a generous bound, only so a hung child fails the test instead of blocking it


def run_child_and_kill(directory: pathlib.Path, seed: int, run_seconds: float) -> dict[str, int]:
    """Start the child, let it work for a while, SIGKILL it; return the highest acked offset per stream."""
    child = subprocess.Popen([sys.executable, "-m", "tests.log.crash_child", str(directory), str(seed)],
                             cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert child.stdout is not None
    # Wait (however loaded the machine) until the child has committed once; a child that never does is a bug.
    readable, _, _ = select.select([child.stdout], [], [], FIRST_ACK_WAIT_SECONDS_MAX)
    first_ack = child.stdout.readline() if readable else b""
    time.sleep(run_seconds)  # where the kill lands after that is random; nothing asserts on time
    child.send_signal(signal.SIGKILL)
    stdout = child.stdout.read()  # through the same buffered reader as readline(): nothing it buffered is lost
    child.wait()
    assert child.stderr is not None
    stderr = child.stderr.read()
    child.stdout.close()
    child.stderr.close()
    assert child.returncode == -signal.SIGKILL, stderr.decode()
    assert first_ack, stderr.decode()
    acked: dict[str, int] = {}
    for line in (first_ack + stdout).decode().splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in STREAMS:  # the kill may cut the last line short
            acked[parts[0]] = max(acked.get(parts[0], -1), int(parts[1]))
    return acked


def check_log(directory: pathlib.Path, acked_ever: dict[str, int]) -> None:
    log = NodeLog.open(directory, CRASH_CONFIG)
    try:
        for stream, acked_offset in acked_ever.items():
            state, iterator = log.read(stream)
            first = 0
            if state is not None:
                first = int(state.decode().rsplit("-", 1)[1]) + 1
                assert state == snapshot_state(first - 1)
            last = first - 1
            for offset, payload in iterator:
                assert offset == last + 1, f"{stream}: gap or disorder at {offset} after {last}"
                if offset <= acked_offset:
                    assert payload == payload_for(stream, offset), f"{stream}: wrong payload at {offset}"
                else:  # unacknowledged: either a real record or a conflicting one not yet truncated
                    assert payload in (payload_for(stream, offset), doomed_payload_for(stream, offset))
                last = offset
            assert last >= acked_offset, f"{stream}: acked {acked_offset} but log ends at {last}"
            if first <= acked_offset:
                assert log.read_at(stream, acked_offset) == payload_for(stream, acked_offset)
    finally:
        log.close()


def test_sigkill_at_random_moments_loses_no_acknowledged_record(tmp_path: pathlib.Path) -> None:
    rng = random.Random(20261122)
    acked_ever: dict[str, int] = {}
    for kill in range(KILLS):
        acked = run_child_and_kill(tmp_path, seed=kill, run_seconds=rng.uniform(0.0, 0.3))
        for stream, offset in acked.items():
            acked_ever[stream] = max(acked_ever.get(stream, -1), offset)
        check_log(tmp_path, acked_ever)
    assert sum(offset + 1 for offset in acked_ever.values()) >= KILLS  # every child acknowledged something
