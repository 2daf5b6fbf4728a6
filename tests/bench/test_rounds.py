"""`raftmq bench --rounds N`: the ABBA order, the median/range arithmetic of the per-round ratios, the table, the
JSON round trip (schema 1, minor 2, still read by --history) and the CLI wiring, with fake brokers only."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import statistics
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench import cli
from bench.brokers import BrokerStartError
from bench.client import Endpoint
from bench.interleaved import BrokerUnderTest, MeasureOnce, run_in_rounds
from bench.results import (
    RunReport,
    comparisons,
    format_history,
    format_markdown,
    format_table,
    load_history,
    load_warning,
    ratio_summaries,
    read_json,
    rounds_in,
    write_json,
)
from bench.rounds import Spread, broker_order, format_spread, measurement_schedule, median, spread
from bench.workloads import Measurement, RunSettings

# --- ABBA order ---------------------------------------------------------------------------------------------


def test_rounds_alternate_which_broker_goes_first() -> None:
    assert [broker_order(["raftmq", "rabbitmq"], number) for number in (1, 2, 3, 4)] == [
        ["raftmq", "rabbitmq"], ["rabbitmq", "raftmq"], ["raftmq", "rabbitmq"], ["rabbitmq", "raftmq"],
    ]
    assert measurement_schedule(["A", "B"], 3) == [(1, "A"), (1, "B"), (2, "B"), (2, "A"), (3, "A"), (3, "B")]
    assert measurement_schedule(["only"], 2) == [(1, "only"), (2, "only")]
    assert measurement_schedule([], 2) == []


def test_round_numbers_are_checked() -> None:
    with pytest.raises(ValueError):
        broker_order(["A", "B"], 0)
    with pytest.raises(ValueError):
        measurement_schedule(["A", "B"], 0)


@given(st.integers(min_value=1, max_value=50))
def test_every_broker_goes_first_equally_often_over_pairs_of_rounds(rounds: int) -> None:
    schedule = measurement_schedule(["A", "B"], rounds)
    firsts = [broker for index, (_, broker) in enumerate(schedule) if index % 2 == 0]
    assert abs(firsts.count("A") - firsts.count("B")) <= 1
    assert [number for number, _ in schedule] == sorted(number for number, _ in schedule)


# --- median and range ---------------------------------------------------------------------------------------


def test_median_of_odd_and_even_counts() -> None:
    assert median([3.0]) == 3.0
    assert median([0.9, 0.5, 0.7]) == 0.7
    assert median([0.5, 1.0]) == 0.75
    assert median([4.0, 1.0, 3.0, 2.0]) == 2.5
    with pytest.raises(ValueError):
        median([])


@given(st.lists(st.floats(min_value=0.001, max_value=1000.0), min_size=1, max_size=30))
def test_median_matches_the_standard_library(values: list[float]) -> None:
    assert median(values) == pytest.approx(statistics.median(values))
    found = spread(values)
    assert found is not None
    assert found.low <= found.median <= found.high
    assert (found.low, found.high, found.count) == (min(values), max(values), len(values))


def test_spread_skips_missing_rounds() -> None:
    assert spread([None, 0.5, None, 1.5]) == Spread(1.0, 0.5, 1.5, 2)
    assert spread([None, None]) is None
    assert spread([]) is None


def test_spread_formatting() -> None:
    assert format_spread(Spread(0.8, 0.5, 1.0, 3)) == "0.80x (0.50-1.00x)"
    assert format_spread(Spread(0.8, 0.8, 0.8, 1)) == "0.80x"
    assert format_spread(Spread(1.3801, 1.3797, 1.3805, 2)) == "1.38x (1.38-1.38x)"  # a tight range is still shown
    assert format_spread(Spread(12_000.0, 11_000.0, 13_500.0, 2), 0, "") == "12,000 (11,000-13,500)"
    assert format_spread(None) == "n/a"


# --- per-round ratios and their summary ---------------------------------------------------------------------


def pair(number: int, ours_rate: float, theirs_rate: float, ours_p99: float | None = 10.0) -> list[Measurement]:
    """One round of (a): raftmq and RabbitMQ, both at 0.5 broker cores."""
    ours = Measurement("a", "a", "raftmq", confirmed_msgs_per_s=ours_rate, delivered_msgs_per_s=ours_rate,
                       latency_p99_ms=ours_p99, broker_cpu_cores=0.5, load_average_1m=1.0 + number,
                       round_number=number)
    theirs = Measurement("a", "a", "rabbitmq", confirmed_msgs_per_s=theirs_rate, delivered_msgs_per_s=theirs_rate,
                         latency_p99_ms=20.0, broker_cpu_cores=0.5, load_average_1m=2.0, round_number=number)
    return [ours, theirs] if number % 2 == 1 else [theirs, ours]


def three_rounds() -> list[Measurement]:
    # throughput ratios 0.5, 1.0, 0.8; p99 ratios 0.5, n/a, 1.0; cpu/msg ratios 2.0, 1.0, 1.25
    return pair(1, 5_000.0, 10_000.0) + pair(2, 8_000.0, 8_000.0, None) + pair(3, 8_000.0, 10_000.0, 20.0)


def test_comparisons_pair_each_round_separately() -> None:
    pairs = comparisons(three_rounds())
    assert [(p.label, p.round_number) for p in pairs] == [("a", 1), ("a", 2), ("a", 3)]
    assert [p.throughput_ratio for p in pairs] == [0.5, 1.0, 0.8]
    assert [p.raftmq.round_number for p in pairs if p.raftmq] == [1, 2, 3]
    assert rounds_in(three_rounds()) == 3


def test_summary_is_the_median_of_the_per_round_ratios_with_their_range() -> None:
    (summary,) = ratio_summaries(three_rounds())
    assert summary.rounds == 3
    assert summary.throughput == Spread(0.8, 0.5, 1.0, 3)
    assert summary.p99 == Spread(0.75, 0.5, 1.0, 2)  # round 2 had no raftmq p99
    assert summary.cpu_per_msg == Spread(1.25, 1.0, 2.0, 3)


def test_table_of_several_rounds_shows_each_round_and_the_median() -> None:
    table = format_table(three_rounds())
    assert "rnd" in table
    assert "0.80x (0.50-1.00x)" in table  # throughput
    assert "1.25x (1.00-2.00x)" in table  # cpu/msg
    assert "ABBA" in table


def test_table_of_one_round_is_unchanged() -> None:
    table = format_table(pair(1, 5_000.0, 10_000.0))
    assert "rnd" not in table
    assert "median" not in table
    assert "0.50x" in table


# --- JSON and history ---------------------------------------------------------------------------------------


def report_of(measurements: list[Measurement], started_at: str = "2026-11-23T05:00:00Z") -> RunReport:
    return RunReport(started_at, ["raftmq", "bench", "--rounds", "3"], {"cpu_count": 2}, {"rounds": 3},
                     measurements, [])


def test_json_round_trip_of_several_rounds(tmp_path: Path) -> None:
    report = report_of(three_rounds())
    path = tmp_path / "bench-20261123T050000Z.json"
    write_json(report, path)
    data = json.loads(path.read_text())
    assert (data["schema"], data["schema_minor"], data["rounds"]) == (1, 2, 3)  # minor 2: kind, confirm_*, declare_ok_*
    assert data["comparisons"] == [{"label": "a", "throughput_ratio": 0.8, "p99_ratio": 0.75, "cpu_per_msg_ratio": 1.25}]
    assert [(c["round"], c["throughput_ratio"]) for c in data["round_comparisons"]] == [(1, 0.5), (2, 1.0), (3, 0.8)]
    (summary,) = data["ratio_summaries"]
    assert summary["throughput_ratio"] == {"median": 0.8, "min": 0.5, "max": 1.0, "rounds": 3}
    assert summary["p99_ratio"] == {"median": 0.75, "min": 0.5, "max": 1.0, "rounds": 2}
    assert [m["round_number"] for m in data["measurements"]] == [1, 1, 2, 2, 3, 3]
    assert read_json(path) == report


def test_files_written_before_rounds_read_as_one_round(tmp_path: Path) -> None:
    data = json.loads(json.dumps({"schema": 1, "started_at": "2026-11-23T03:00:00Z", "command": ["raftmq", "bench"],
                                  "machine": {}, "settings": {}, "notes": [], "comparisons": [],
                                  "measurements": [dataclasses.asdict(m) for m in pair(1, 5_000.0, 10_000.0)]}))
    for measurement in data["measurements"]:
        del measurement["round_number"]
    path = tmp_path / "bench-20261123T030000Z.json"
    path.write_text(json.dumps(data))
    report = read_json(path)
    assert {m.round_number for m in report.measurements} == {1}
    assert "0.50x" in format_history(load_history(tmp_path))


def test_history_and_markdown_show_median_and_range(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_json(report_of(pair(1, 5_000.0, 10_000.0), "2026-11-23T04:00:00Z"), tmp_path / "bench-20261123T040000Z.json")
    write_json(report_of(three_rounds()), tmp_path / "bench-20261123T050000Z.json")
    history = load_history(tmp_path)
    text = format_history(history)
    assert "a#3" in text
    assert "throughput 0.80x (0.50-1.00x)" in text
    markdown = format_markdown(history).splitlines()
    assert markdown[-2].startswith("| 2026-11-23 04:00 | a | 5,000 | 10,000 | 0.50x |")  # one round: as before
    row = markdown[-1]
    assert row.startswith("| 2026-11-23 05:00 | a (3 rounds) | 8,000 (5,000-8,000) | 10,000 (8,000-10,000) "
                          "| 0.80x (0.50-1.00x) |")
    assert "| 15.0 / 20.0 | 0.75x (0.50-1.00x) |" in row  # median p99s of the rounds that had one
    assert "| 1.25x (1.00-2.00x) | 2.0-4.0 / 2.0 |" in row
    assert cli.main(["--history", "--markdown", "--output", str(tmp_path)]) == 0
    assert "a (3 rounds)" in capsys.readouterr().out


# --- load warning -------------------------------------------------------------------------------------------


def test_load_warning_above_one_and_a_half(capsys: pytest.CaptureFixture[str]) -> None:
    busy = Measurement("a", "a", "raftmq", confirmed_msgs_per_s=1.0, load_average_1m=2.3)
    assert load_warning(dataclasses.replace(busy, load_average_1m=1.5)) is None
    assert load_warning(dataclasses.replace(busy, load_average_1m=None)) is None
    warning = load_warning(busy)
    assert warning is not None and "2.3" in warning
    cli._print_one(busy)
    assert "warning: 1-minute load average 2.3" in capsys.readouterr().out


# --- running rounds on fake brokers -------------------------------------------------------------------------


class FakeBrokers:
    """Brokers that only record what happens to them: starts, stops and measurements, in order."""

    def __init__(self, failing: tuple[str, ...] = ()) -> None:
        self.events: list[str] = []
        self.failing = failing

    def broker(self, name: str) -> BrokerUnderTest:
        return BrokerUnderTest(name, lambda workload: self.open(name, workload))

    @contextlib.contextmanager
    def open(self, name: str, workload: str) -> Iterator[MeasureOnce]:
        if name in self.failing:
            raise BrokerStartError("no such broker")
        self.events.append(f"start {name} {workload}")
        try:
            yield lambda settings: self.measure(name, workload)
        finally:
            self.events.append(f"stop {name} {workload}")

    def measure(self, name: str, workload: str) -> list[Measurement]:
        self.events.append(f"measure {name} {workload}")
        return [Measurement(workload, workload, name, confirmed_msgs_per_s=1000.0)]


def test_each_workload_starts_its_brokers_once_and_measures_them_in_abba_order() -> None:
    fake = FakeBrokers()
    shown: list[Measurement] = []
    found = run_in_rounds([fake.broker("raftmq"), fake.broker("rabbitmq")], ["a", "c"], RunSettings(), 3, shown.append)
    assert fake.events[:9] == [
        "start raftmq a", "start rabbitmq a",
        "measure raftmq a", "measure rabbitmq a", "measure rabbitmq a", "measure raftmq a",
        "measure raftmq a", "measure rabbitmq a",
        "stop rabbitmq a",
    ]
    assert fake.events[9] == "stop raftmq a"
    assert fake.events[10:12] == ["start raftmq c", "start rabbitmq c"]
    assert [(m.workload, m.round_number, m.broker) for m in found][:6] == [
        ("a", 1, "raftmq"), ("a", 1, "rabbitmq"), ("a", 2, "rabbitmq"), ("a", 2, "raftmq"),
        ("a", 3, "raftmq"), ("a", 3, "rabbitmq"),
    ]
    assert shown == found
    assert [s.throughput for s in ratio_summaries(found)] == [Spread(1.0, 1.0, 1.0, 3)] * 2


def test_a_broker_that_does_not_start_leaves_the_other_measured_every_round() -> None:
    fake = FakeBrokers(failing=("rabbitmq",))
    found = run_in_rounds([fake.broker("raftmq"), fake.broker("rabbitmq")], ["a"], RunSettings(), 2, lambda m: None)
    assert [(m.broker, m.round_number, m.error is not None) for m in found] == [
        ("rabbitmq", 1, True), ("raftmq", 1, False), ("raftmq", 2, False),
    ]
    assert fake.events == ["start raftmq a", "measure raftmq a", "measure raftmq a", "stop raftmq a"]


def test_cli_rounds_on_fake_brokers_writes_rounds_to_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeBrokers()
    ports = {"raftmq": 1, "rabbitmq": 2}

    def fake_node(name: str) -> contextlib.AbstractContextManager[Endpoint]:
        @contextlib.contextmanager
        def started() -> Iterator[Endpoint]:
            with fake.open(name, "a"):
                yield Endpoint("127.0.0.1", ports[name])

        return started()

    def fake_workload(workload: str, broker: str, endpoint: Endpoint, settings: RunSettings) -> list[Measurement]:
        assert endpoint.port == ports[broker]
        rate = 500.0 if broker == "raftmq" else 1000.0
        return [Measurement(workload, workload, broker, confirmed_msgs_per_s=rate, load_average_1m=0.5)]

    monkeypatch.setattr(cli, "raftmq_node", lambda: fake_node("raftmq"))
    monkeypatch.setattr(cli, "_rabbit_nodes", lambda count: fake_node("rabbitmq"))
    monkeypatch.setattr(cli, "rabbitmq_available", lambda: True)
    monkeypatch.setattr(cli, "rabbitmq_version", lambda: "test")
    monkeypatch.setattr(cli, "run_workload", fake_workload)
    monkeypatch.setattr(cli, "write_chart", lambda report, path: None)
    assert cli.main(["--workloads", "a", "--rounds", "2", "--output", str(tmp_path)]) == 0
    assert fake.events == ["start raftmq a", "start rabbitmq a", "stop rabbitmq a", "stop raftmq a"]
    out = capsys.readouterr().out
    assert "[rabbitmq] round 2/2: workload (a)" in out
    ((_, report),) = load_history(tmp_path)
    assert [(m.round_number, m.broker) for m in report.measurements] == [
        (1, "raftmq"), (1, "rabbitmq"), (2, "rabbitmq"), (2, "raftmq"),
    ]
    assert report.settings["rounds"] == 2


def test_cli_rejects_zero_rounds(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--rounds", "0"]) == 2
    assert "--rounds" in capsys.readouterr().err
