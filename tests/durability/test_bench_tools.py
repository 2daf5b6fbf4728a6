"""The recovery and memory benchmarks (bench/recovery.py, bench/memory.py) on a tiny backlog, so they keep working.

Each starts a real node, fills a durable queue with a few thousand confirmed persistent messages, and (recovery,
memory --restart) kills it with SIGKILL and waits for the restarted node to report every message ready again.
Only the counts and the shape of the results are checked, never the times.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench import memory, recovery


def test_bench_recovery_restarts_with_every_message(tmp_path: Path) -> None:
    out = tmp_path / "recovery.json"
    assert recovery.main(["--messages", "3000", "--data-dir", str(tmp_path / "node"), "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["messages"] == 3000
    assert result["data_dir_bytes"] > 3000 * 100
    assert result["restart_to_all_ready_s"] >= result["restart_to_amqp_s"] > 0
    assert result["rss_after_recovery_bytes"] > 0


def test_bench_memory_measures_a_backlog_and_its_recovery(tmp_path: Path) -> None:
    out = tmp_path / "memory.json"
    assert memory.main(["--messages", "3000", "--body-size", "1024", "--restart", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["messages"] == 3000 and result["body_size_bytes"] == 1024
    assert result["rss_empty_bytes"] > 0 and result["rss_backlog_bytes"] > 0
    assert result["rss_recovered_bytes"] > 0
