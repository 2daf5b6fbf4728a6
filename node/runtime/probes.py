"""Memory and disk probes that raise and clear the node's resource alarms (RabbitMQ's watermarks).

Memory: resident set size from /proc/self/statm (falling back to `resource.getrusage` peak RSS) against
`memory_high_watermark_bytes`, or `memory_high_watermark` x total RAM. Disk: free bytes of the data directory's
file system (`os.statvfs`) against `disk_free_limit_bytes`. `changes()` returns only the alarms whose state
flipped since the last call, so the broker hears about each transition once. For tests, an alarm can be forced
on (`toggle_forced`, wired to SIGUSR1/SIGUSR2 when `test_signal_alarms` is set).
"""

from __future__ import annotations

import os
import resource
from pathlib import Path

import trio

from node.runtime.config import NodeConfig

ALARM_KINDS = ("memory", "disk")


def rss_bytes() -> int:
    """Resident set size of this process."""
    page_size = os.sysconf("SC_PAGE_SIZE")
    try:
        with open("/proc/self/statm", "rb") as handle:
            return int(handle.read().split()[1]) * page_size
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def total_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 0


def disk_free_bytes(path: Path) -> int | None:
    try:
        stats = os.statvfs(path)
    except OSError:
        return None
    return stats.f_bavail * stats.f_frsize


def memory_limit_bytes(config: NodeConfig) -> int:
    """The memory alarm threshold; 0 means no memory alarm."""
    if config.memory_high_watermark_bytes > 0:
        return config.memory_high_watermark_bytes
    return int(total_memory_bytes() * config.memory_high_watermark)


class ResourceProbe:
    """Tracks both alarms; call `changes()` periodically."""

    def __init__(self, config: NodeConfig, data_dir: Path) -> None:
        self.config = config
        self.data_dir = data_dir
        self.memory_limit_bytes = memory_limit_bytes(config)
        self.forced: dict[str, bool] = dict.fromkeys(ALARM_KINDS, False)
        self.active: dict[str, bool] = dict.fromkeys(ALARM_KINDS, False)
        self._forced_changed = trio.Event()

    def measure(self) -> dict[str, bool]:
        memory_over = 0 < self.memory_limit_bytes < rss_bytes()
        free = disk_free_bytes(self.data_dir)
        disk_under = free is not None and free < self.config.disk_free_limit_bytes
        return {
            "memory": memory_over or self.forced["memory"],
            "disk": disk_under or self.forced["disk"],
        }

    def changes(self) -> list[tuple[str, bool]]:
        now = self.measure()
        flipped = [(kind, now[kind]) for kind in ALARM_KINDS if now[kind] != self.active[kind]]
        self.active.update(now)
        return flipped

    def toggle_forced(self, kind: str) -> None:
        self.forced[kind] = not self.forced[kind]
        self._forced_changed.set()

    async def wait_forced_change(self) -> None:
        await self._forced_changed.wait()
        self._forced_changed = trio.Event()
