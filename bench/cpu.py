"""CPU time of the broker under test, read from /proc: how much of the machine it actually got during a run.

On a shared machine the broker's throughput follows the CPU share it gets. `CpuWindow` samples a process's
utime+stime (all threads; summed over a cluster's nodes) when the warm-up ends and when the run ends, on timer threads, and reports cores used
(CPU seconds per wall second); `listening_pid` finds the local process behind a port with `ss -p`. Throughput
divided by cores gives a per-message CPU cost that is far less sensitive to other jobs than throughput itself.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Sequence

_CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


def listening_pid(port: int) -> int | None:
    """The pid of the local process listening on TCP `port` (from `ss -ltnpH`), or None."""
    try:
        output = subprocess.run(["ss", "-Hltnp", f"sport = :{port}"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_ss_pid(output)


def parse_ss_pid(ss_output: str) -> int | None:
    """Pure: the first `pid=N` in `ss -p` output."""
    marker = "pid="
    start = ss_output.find(marker)
    if start < 0:
        return None
    digits = ""
    for char in ss_output[start + len(marker):]:
        if not char.isdigit():
            break
        digits += char
    return int(digits) if digits else None


def process_cpu_s(pid: int) -> float | None:
    """utime + stime of a process (all its threads), in seconds; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat_file:
            fields = stat_file.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS_PER_S  # fields 14 and 15 of proc(5)


class CpuWindow:
    """Samples the summed CPU time of some processes (a broker's nodes) when the warm-up ends and when the run ends
    (on timer threads); `cores()` is None when a process was missing at either sample or there are none."""

    def __init__(self, pids: Sequence[int | None], warmup_s: float, duration_s: float) -> None:
        self._pids = [pid for pid in pids if pid is not None]
        self._complete = len(self._pids) == len(pids) and bool(self._pids)
        self._samples: list[tuple[float, float]] = []
        self._timers = [threading.Timer(delay, self._sample) for delay in (warmup_s, warmup_s + duration_s)]

    def _sample(self) -> None:
        readings = [process_cpu_s(pid) for pid in self._pids]
        if self._complete and all(reading is not None for reading in readings):
            self._samples.append((time.monotonic(), sum(reading or 0.0 for reading in readings)))

    def __enter__(self) -> CpuWindow:
        for timer in self._timers:
            timer.daemon = True
            timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for timer in self._timers:
            timer.cancel()

    def cores(self) -> float | None:
        if len(self._samples) < 2:
            return None
        (start_s, start_cpu), (end_s, end_cpu) = self._samples[0], self._samples[-1]
        return (end_cpu - start_cpu) / (end_s - start_s) if end_s > start_s else None


def local_listening_pid(host: str, port: int) -> int | None:
    """`listening_pid` for a broker on this machine; None for a remote one."""
    return listening_pid(port) if host in LOCAL_HOSTS else None
