"""Resource probes: real measurements against thresholds, transitions reported once, forced alarms."""

from __future__ import annotations

from pathlib import Path

from node.runtime.config import NodeConfig
from node.runtime.probes import (
    ResourceProbe,
    disk_free_bytes,
    memory_limit_bytes,
    rss_bytes,
    total_memory_bytes,
)


def test_measurements_are_plausible(tmp_path: Path) -> None:
    assert 1024 * 1024 < rss_bytes() < total_memory_bytes()
    free = disk_free_bytes(tmp_path)
    assert free is not None and free > 0
    assert disk_free_bytes(tmp_path / "missing") is None
    assert memory_limit_bytes(NodeConfig(memory_high_watermark=0.5)) == total_memory_bytes() // 2
    assert memory_limit_bytes(NodeConfig(memory_high_watermark_bytes=123)) == 123


def test_thresholds_raise_alarms_and_transitions_are_reported_once(tmp_path: Path) -> None:
    over = NodeConfig(memory_high_watermark_bytes=1, disk_free_limit_bytes=2**62)
    probe = ResourceProbe(over, tmp_path)
    assert sorted(probe.changes()) == [("disk", True), ("memory", True)]
    assert probe.changes() == []
    calm = ResourceProbe(NodeConfig(disk_free_limit_bytes=0), tmp_path)
    assert calm.changes() == []


def test_forced_alarm_toggles(tmp_path: Path) -> None:
    probe = ResourceProbe(NodeConfig(disk_free_limit_bytes=0), tmp_path)
    probe.toggle_forced("memory")
    assert probe.changes() == [("memory", True)]
    probe.toggle_forced("memory")
    assert probe.changes() == [("memory", False)]
