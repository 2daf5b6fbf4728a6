"""Statistics (percentiles, rates, ratios), confirm bookkeeping, worker aggregation and the results file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench import cli
from bench.confirms import ConfirmTracker
from bench.loadgen import WorkerResult
from bench.results import (
    RunReport,
    comparisons,
    format_history,
    format_table,
    load_history,
    read_json,
    write_chart,
    write_json,
)
from bench.stats import format_ratio, percentile, rate_per_s, ratio, summarize_latencies_ns
from bench.workloads import Measurement, measure


def naive_percentile(values: list[float], percent: float) -> float:
    """Nearest rank, the slow obvious way: the smallest value with at least percent% of values <= it."""
    ordered = sorted(values)
    for value in ordered:
        if sum(1 for other in ordered if other <= value) * 100 >= percent * len(ordered):
            return value
    return ordered[-1]


def test_percentiles_of_one_to_a_thousand() -> None:
    values = list(range(1, 1001))
    assert percentile(values, 50) == 500
    assert percentile(values, 99) == 990
    assert percentile(values, 99.9) == 999
    assert percentile(values, 100) == 1000
    assert percentile([7], 99.9) == 7


@given(st.lists(st.integers(min_value=0, max_value=10**6), min_size=1, max_size=200),
       st.sampled_from([1, 25, 50, 90, 99, 99.9, 100]))
def test_percentile_matches_naive_reference(values: list[int], percent: float) -> None:
    assert percentile(sorted(values), percent) == naive_percentile([float(v) for v in values], percent)


def test_percentile_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1], 0)


def test_latency_summary_is_in_milliseconds() -> None:
    summary = summarize_latencies_ns([2_000_000, 1_000_000, 3_000_000])
    assert (summary.samples, summary.p50_ms, summary.max_ms) == (3, 2.0, 3.0)
    assert summarize_latencies_ns([]).p99_ms is None


def test_rates_and_ratios() -> None:
    assert rate_per_s(500, 2.0) == 250.0
    assert rate_per_s(5, 0.0) == 0.0
    assert ratio(30.0, 60.0) == 0.5
    assert ratio(1.0, 0.0) is None
    assert ratio(None, 1.0) is None
    assert format_ratio(0.5) == "0.50x"
    assert format_ratio(None) == "n/a"


def test_confirm_tracker_multiple_and_out_of_order_single_acks() -> None:
    tracker = ConfirmTracker()
    tracker.on_published(10)
    assert tracker.settle(3, True) == 3
    assert tracker.settle(5, False) == 1
    assert tracker.outstanding == 6
    assert tracker.settle(5, False) == 0  # duplicate
    assert tracker.settle(6, True) == 2  # 4 and 6; 5 was already settled
    assert tracker.settle(7, False) == 1
    assert (tracker.settled_upto, tracker.outstanding) == (7, 3)
    assert tracker.settle(11, True) == 0  # never published


@given(st.lists(st.tuples(st.integers(min_value=1, max_value=30), st.booleans()), max_size=40))
def test_confirm_tracker_counts_each_tag_once(acks: list[tuple[int, bool]]) -> None:
    tracker = ConfirmTracker()
    tracker.on_published(30)
    settled: set[int] = set()
    for tag, multiple in acks:
        newly = set(range(1, tag + 1)) if multiple else {tag}
        assert tracker.settle(tag, multiple) == len(newly - settled)
        settled |= newly
        assert tracker.outstanding == 30 - len(settled)


def test_measure_sums_workers() -> None:
    results = [
        WorkerResult("publisher", published=100, confirmed=90, nacked=1, measured_s=2.0, cpu_s=0.5),
        WorkerResult("consumer", delivered=80, measured_s=2.0, cpu_s=1.0, latencies_ns=[1_000_000, 3_000_000]),
        WorkerResult("consumer", delivered=40, measured_s=2.0, latencies_ns=[2_000_000]),
    ]
    m = measure("c", "c", "rabbitmq", results)
    assert (m.confirmed_msgs_per_s, m.delivered_msgs_per_s, m.nacked_msgs) == (45.0, 60.0, 1)
    assert (m.latency_samples, m.latency_p50_ms, m.loadgen_cpu_max_fraction) == (3, 2.0, 0.5)
    assert m.error is None
    assert measure("a", "a", "x", [WorkerResult("consumer", error="boom")]).error == "boom"


def sample_report() -> RunReport:
    measurements = [
        Measurement("a", "a", "raftmq", confirmed_msgs_per_s=30_000.0, latency_p99_ms=6.0),
        Measurement("a", "a", "rabbitmq", confirmed_msgs_per_s=60_000.0, latency_p99_ms=12.0),
        Measurement("e@1000/s", "e", "rabbitmq", confirmed_msgs_per_s=1000.0, latency_p99_ms=2.0,
                    target_rate_msgs_per_s=1000.0),
        Measurement("c", "c", "raftmq", error="broker did not start"),
    ]
    return RunReport("2026-01-01T00:00:00Z", ["raftmq", "bench"], {"cpu_count": 2}, {"duration_s": 1.0},
                     measurements, ["a note"])


def test_comparisons_pair_brokers_by_label() -> None:
    pairs = {pair.label: pair for pair in comparisons(sample_report().measurements)}
    assert pairs["a"].throughput_ratio == 0.5
    assert pairs["a"].p99_ratio == 0.5
    assert pairs["e@1000/s"].raftmq is None
    assert pairs["e@1000/s"].throughput_ratio is None
    assert pairs["c"].throughput_ratio is None


def test_table_shows_figures_and_ratios() -> None:
    table = format_table(sample_report().measurements)
    assert "0.50x" in table
    assert "ERROR broker did not start" in table


def test_json_round_trip_and_chart(tmp_path: Path) -> None:
    report = sample_report()
    path = tmp_path / "run.json"
    write_json(report, path)
    data = json.loads(path.read_text())
    assert data["schema"] == 1
    assert {"label": "a", "throughput_ratio": 0.5, "p99_ratio": 0.5, "cpu_per_msg_ratio": None} in data["comparisons"]
    assert read_json(path) == report
    chart = tmp_path / "run.png"
    write_chart(report, chart)
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_history_lists_earlier_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_json(sample_report(), tmp_path / "bench-20260101T000000Z.json")
    (tmp_path / "bench-broken.json").write_text("{not json")
    history = load_history(tmp_path)
    assert [path.name for path, _ in history] == ["bench-20260101T000000Z.json"]
    text = format_history(history)
    assert "2026-01-01T00:00:00Z" in text
    assert "30,000" in text
    assert "0.50x" in text
    assert cli.main(["--history", "--output", str(tmp_path)]) == 0
    assert "60,000" in capsys.readouterr().out


def test_cli_rejects_unknown_workloads(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--workloads", "a,z"]) == 2
    assert "unknown workloads" in capsys.readouterr().err
    assert cli.parse_workloads("e,a") == ["a", "e"]
