"""`raftmq chaos` end to end: list, check, and run on a real node (exit 0 when safe, 1 when loss is caught)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chaos.cli import main
from chaos.history import Delivery, Publish, write_history

SAFE = """
name = "cli-safe"
nodes = 1
[workload]
queues = ["cli-safe"]
publishers = 2
messages_per_publisher = 100
[[steps]]
action = "wait"
confirmed = 20
[[steps]]
action = "pause"
target = "random"
[[steps]]
action = "wait"
seconds = 0.5
[[steps]]
action = "resume"
target = "paused"
[[steps]]
action = "kill"
target = "leader-of-queue"
[[steps]]
action = "restart"
target = "down"
"""

# Transient messages on a non-durable queue with no consumer until the drain: a kill -9 loses them.
UNSAFE = """
name = "cli-unsafe"
nodes = 1
[workload]
queues = ["cli-unsafe"]
publishers = 2
consumers_per_queue = 0
durable = false
persistent = false
messages_per_publisher = 100
[[steps]]
action = "wait"
confirmed = 100
[[steps]]
action = "kill"
target = "rmq1"
[[steps]]
action = "restart"
target = "down"
"""


def test_list_names_the_scenarios(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    assert "kill-9-loop" in capsys.readouterr().out


def test_unknown_scenario_is_exit_2() -> None:
    assert main(["run", "no-such-scenario"]) == 2


def test_check_a_saved_history(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    write_history(path, [Publish("p", 0, "a", "q", "confirmed", 0, 1), Delivery("a", "c", "q", False, 2)])
    assert main(["check", str(path)]) == 0
    write_history(path, [Publish("p", 0, "a", "q", "confirmed", 0, 1)])
    assert main(["check", str(path)]) == 1


def test_run_pause_and_kill_on_a_real_node_passes(tmp_path: Path) -> None:
    scenario = tmp_path / "safe.toml"
    scenario.write_text(SAFE)
    assert main(["run", str(scenario), "--out", str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out" / "cli-safe" / "report.json").read_text())
    assert report["valid"] and report["summary"]["lost"] == 0 and report["summary"]["attempted"] == 200
    assert [f["kind"] for f in report["faults"]][:2] == ["pause", "kill"]
    assert (tmp_path / "out" / "cli-safe" / "timeline.png").exists()


def test_run_exits_1_when_confirmed_messages_are_lost(tmp_path: Path) -> None:
    scenario = tmp_path / "unsafe.toml"
    scenario.write_text(UNSAFE)
    assert main(["run", str(scenario), "--out", str(tmp_path / "out")]) == 1
    report = json.loads((tmp_path / "out" / "cli-unsafe" / "report.json").read_text())
    assert report["summary"]["lost"] >= 100 and report["summary"]["unexpected"] == 0
