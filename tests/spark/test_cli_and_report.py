"""Argument parsing of `raftmq lag` and the text report, without Spark."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from spark_analytics import cli
from spark_analytics.report import render_report
from spark_analytics.transforms import LagConfig


def test_durations_need_a_unit() -> None:
    assert cli.duration_ms("250ms") == 250
    assert cli.duration_ms("10s") == 10_000
    assert cli.duration_ms("2m") == 120_000
    with pytest.raises(argparse.ArgumentTypeError):
        cli.duration_ms("10")


def test_lag_arguments() -> None:
    args = cli.lag_parser().parse_args(
        ["--input", "a", "--input", "b", "--output", "o", "--window", "5s", "--conf", "spark.x=1"]
    )
    assert args.input == ["a", "b"]
    assert args.window == 5_000
    assert args.lag_threshold == LagConfig().lag_threshold_ms
    assert args.master is None
    assert args.conf == [("spark.x", "1")]


def test_generate_subcommand_writes_telemetry(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["generate", "--records", "500", "--output", str(tmp_path), "--workers", "1"]) == 0
    assert "lagging follower: n3 of %2F/q0000" in capsys.readouterr().out
    assert len(list(tmp_path.glob("n*/telemetry/*.jsonl"))) == 3


def test_report_lists_only_followers_that_fell_out_of_sync() -> None:
    cluster = {
        "groups": 2,
        "followers": 4,
        "followers_out_of_sync": 1,
        "out_of_sync_ms": 12_500,
        "episodes": 1,
        "unrecovered_episodes": 0,
        "max_catch_up_ms": 12_500,
        "lag_entries_max": 1404,
    }
    followers = [
        {
            "group": "q",
            "follower": "n3",
            "out_of_sync_ms": 12_500,
            "lag_entries_max": 1404,
            "lag_ms_max": 24_000,
            "episodes": 1,
            "max_catch_up_ms": 12_500,
        },
        {"group": "q", "follower": "n2", "out_of_sync_ms": 0, "lag_entries_max": 3},
    ]
    episodes = [
        {"group": "q", "follower": "n3", "catch_up_ms": 12_500, "recovered": True, "max_lag_entries": 1404}
    ]
    report = render_report(cluster, followers, episodes, LagConfig(), records=1000, seconds=2.0)
    assert (
        "q n3: out of sync 12.5 s, max lag 1,404 entries / 24.0 s, episodes 1, longest catch-up 12.5 s"
        in report
    )
    assert "q n2" not in report
    assert "q n3: 12.5 s, max lag 1,404 entries" in report
    assert "queues: 2, followers: 4, out of sync at some point: 1" in report
