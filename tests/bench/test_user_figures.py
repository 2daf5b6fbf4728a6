"""What users feel (issue 16): the arithmetic of delivered/s against confirmed/s (BACKLOG), confirm latency, the
new-queue trials' summary, the side-by-side table, the issue-16 report and its CLI wiring. Fake figures and fake
brokers only: nothing is timed here."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench import cli
from bench.client import Endpoint
from bench.clusters import ClusterNode
from bench.issue16 import describe, flow_labels, format_issue16, median_figure, targets
from bench.loadgen import WorkerResult
from bench.measurement import NEW_QUEUE, FailoverFigures, Measurement, delivery_shortfall
from bench.newqueue import NewQueueTrial, summarize
from bench.results import (
    RunReport,
    backlog_flag,
    format_history,
    format_markdown,
    format_table,
    read_json,
    write_json,
)
from bench.workloads import RunSettings, measure, new_queue_label, rate_label

MS = 1_000_000  # ns


# --- delivered/s against confirmed/s ------------------------------------------------------------------------


def test_delivery_shortfall_is_the_fraction_of_expected_deliveries_missing() -> None:
    assert delivery_shortfall(1000.0, 800.0) == pytest.approx(0.2)
    assert delivery_shortfall(1000.0, 1000.0) == 0.0
    assert delivery_shortfall(1000.0, 1100.0) == pytest.approx(-0.1)  # a warm-up backlog draining
    assert delivery_shortfall(100.0, 900.0, per_message=10) == pytest.approx(0.1)  # fanout to 10 queues
    assert delivery_shortfall(0.0, 50.0) is None


def flow(label: str, broker: str, confirmed: float, delivered: float, **figures: float | str | None) -> Measurement:
    workload = label[0]
    return Measurement(label, workload, broker, confirmed_msgs_per_s=confirmed, delivered_msgs_per_s=delivered,
                       **figures)  # type: ignore[arg-type]


def test_backlog_is_flagged_only_beyond_five_percent() -> None:
    assert flow("b", "raftmq", 1000.0, 940.0).backlog_growing
    assert not flow("b", "raftmq", 1000.0, 950.0).backlog_growing  # exactly 5%: not beyond
    assert not flow("b", "raftmq", 1000.0, 1200.0).backlog_growing
    assert flow("c", "raftmq", 1000.0, 9000.0).backlog_growing  # (c) should deliver 10,000/s
    assert not flow("c", "raftmq", 1000.0, 9600.0).backlog_growing
    assert not flow("a", "raftmq", 0.0, 0.0).backlog_growing
    assert not Measurement("a", "a", "raftmq", confirmed_msgs_per_s=10.0, error="boom").backlog_growing
    assert not Measurement("a/new-q", "a", "raftmq", kind=NEW_QUEUE, confirmed_msgs_per_s=10.0).backlog_growing
    assert backlog_flag(flow("b", "raftmq", 1000.0, 750.0)) == "BACKLOG (delivered 25% below confirmed)"
    assert backlog_flag(flow("b", "raftmq", 1000.0, 1000.0)) == ""


def test_measure_takes_confirm_latency_from_the_publishers() -> None:
    results = [
        WorkerResult("publisher", confirmed=10, measured_s=1.0, confirm_latencies_ns=[3 * MS, 1 * MS, 2 * MS]),
        WorkerResult("consumer", delivered=10, measured_s=1.0, latencies_ns=[5 * MS]),
    ]
    m = measure("a", "a", "raftmq", results)
    assert (m.confirm_p50_ms, m.confirm_p99_ms) == (2.0, 3.0)
    assert (m.latency_p50_ms, m.latency_p99_ms) == (5.0, 5.0)  # end to end, from the consumer
    assert measure("a", "a", "raftmq", [WorkerResult("publisher")]).confirm_p50_ms is None


def test_labels() -> None:
    assert (rate_label("b", 5000), new_queue_label("a")) == ("b@5000/s", "a/new-q")
    assert RunSettings().new_queue_trials == 0 and RunSettings().rates_for == ()  # library default: flows only


# --- new-queue trials -----------------------------------------------------------------------------------------


def test_new_queue_summary_takes_p50_and_p99_of_each_figure() -> None:
    trials = [
        NewQueueTrial("n1", 10 * MS, 1 * MS, 4 * MS, 3 * MS),
        NewQueueTrial("n2", 30 * MS, 1 * MS, 8 * MS, 9 * MS),
        NewQueueTrial("n3", 20 * MS, 1 * MS, 6 * MS, 5 * MS),
    ]
    m = summarize("b/new-q", "b", "raftmq", trials)
    assert m.is_new_queue and m.error is None
    assert (m.declare_ok_p50_ms, m.declare_ok_p99_ms) == (20.0, 30.0)
    assert (m.confirm_p50_ms, m.confirm_p99_ms) == (6.0, 8.0)
    assert (m.latency_p50_ms, m.latency_p99_ms, m.latency_max_ms, m.latency_samples) == (5.0, 9.0, 9.0, 3)
    assert m.confirmed_msgs_per_s == 0.0 and m.broker_cpu_us_per_msg is None
    assert m.note == "3 new queues on n1, n2, n3"


def test_a_trial_without_its_delivery_fails_the_summary_but_keeps_the_others_figures() -> None:
    trials = [NewQueueTrial("n1", 10 * MS, 1 * MS, 4 * MS, None), NewQueueTrial("n1", 12 * MS, 1 * MS, 6 * MS, 7 * MS),
              NewQueueTrial("n1", None, error="TimeoutError: timed out")]
    assert not trials[0].complete and trials[1].complete
    m = summarize("a/new-q", "a", "raftmq", trials)
    assert m.error == "2 of 3 new-queue trials failed: TimeoutError: timed out"
    assert (m.latency_samples, m.latency_p50_ms, m.confirm_p99_ms) == (1, 7.0, 6.0)
    assert summarize("a/new-q", "a", "raftmq", []).error == "0 of 0 new-queue trials failed: no trials"


# --- the side-by-side table ---------------------------------------------------------------------------------


def run_of_issue16(rounds: int = 1) -> list[Measurement]:
    found: list[Measurement] = []
    for number in range(1, rounds + 1):
        found += [
            flow("a", "raftmq", 10_000.0, 9_990.0, latency_p50_ms=50.0, latency_p99_ms=100.0, confirm_p99_ms=150.0,
                 round_number=number),
            flow("a", "rabbitmq", 5_000.0, 5_000.0, latency_p50_ms=80.0, latency_p99_ms=200.0, confirm_p99_ms=210.0,
                 round_number=number),
            flow("e@1000/s", "raftmq", 1_000.0, 1_000.0, latency_p99_ms=3.0, round_number=number),
            flow("a@5000/s", "raftmq", 5_000.0, 5_000.0, latency_p99_ms=4.0, round_number=number),
            flow("a@1000/s", "raftmq", 1_000.0, 1_000.0, latency_p99_ms=2.0, round_number=number),
            flow("a@1000/s", "rabbitmq", 1_000.0, 1_000.0, latency_p99_ms=1.0, round_number=number),
            flow("b", "raftmq", 4_000.0, 3_000.0 + 500.0 * number, latency_p99_ms=900.0, round_number=number),
            flow("b", "rabbitmq", 3_000.0, 3_000.0, latency_p99_ms=100.0, round_number=number),
            flow("b@leader", "raftmq", 3_000.0, 3_000.0, latency_p99_ms=50.0, round_number=number),
            flow("b@leader", "rabbitmq", 2_000.0, 2_000.0, latency_p99_ms=60.0, round_number=number),
            flow("b@1000/s", "raftmq", 1_000.0, 1_000.0, error="boom", round_number=number),
            Measurement("b/new-q", "b", "raftmq", kind=NEW_QUEUE, declare_ok_p50_ms=40.0, declare_ok_p99_ms=60.0,
                        confirm_p50_ms=600.0, confirm_p99_ms=700.0, latency_p50_ms=610.0, latency_p99_ms=710.0,
                        round_number=number),
            Measurement("b/new-q", "b", "rabbitmq", kind=NEW_QUEUE, declare_ok_p50_ms=30.0, declare_ok_p99_ms=35.0,
                        confirm_p50_ms=7.0, confirm_p99_ms=9.0, latency_p50_ms=8.0, latency_p99_ms=10.0,
                        round_number=number),
        ]
    return found


def test_table_puts_the_brokers_side_by_side_and_new_queues_apart() -> None:
    table = format_table(run_of_issue16())
    assert "10,000 / 5,000" in table  # confirmed/s
    assert "9,990 / 5,000" in table  # delivered/s
    assert "50.0 / 80.0" in table  # e2e p50
    assert "150.0 / 210.0" in table  # confirm p99
    assert "raftmq BACKLOG (delivered 12% below confirmed)" in table  # (b): 3,500 of 4,000
    assert "first message on a new queue" in table
    assert "40.0 / 30.0" in table and "700.0 / 9.0" in table
    assert "declare-ok p50" in table


def test_history_and_markdown_leave_new_queue_rates_out(tmp_path: Path) -> None:
    report = RunReport("2026-11-27T03:00:00Z", ["raftmq", "bench"], {}, {}, run_of_issue16(), [])
    markdown = format_markdown([(tmp_path / "x.json", report)])
    assert "| b/new-q |" not in markdown and "| a | 10,000 | 5,000 |" in markdown
    assert "new queue" in format_history([(tmp_path / "x.json", report)])


def test_json_keeps_the_new_figures_and_failover(tmp_path: Path) -> None:
    report = RunReport("2026-11-27T03:00:00Z", ["raftmq", "bench"], {}, {"rounds": 1}, run_of_issue16(), [],
                       (FailoverFigures("raftmq", (550.0, 610.0)),))
    path = tmp_path / "bench-20261127T030000Z.json"
    write_json(report, path)
    data = json.loads(path.read_text())
    assert data["schema_minor"] == 2
    assert data["failover"] == [{"broker": "raftmq", "first_confirm_ms": [550.0, 610.0], "error": None}]
    assert read_json(path) == report
    for measurement in data["measurements"]:  # a file of schema minor 1 has none of the new keys
        for key in ("kind", "confirm_p50_ms", "confirm_p99_ms", "declare_ok_p50_ms", "declare_ok_p99_ms"):
            del measurement[key]
    del data["failover"]
    path.write_text(json.dumps(data))
    older = read_json(path)
    assert {m.kind for m in older.measurements} == {"flow"} and older.failover == ()


# --- the issue-16 report ------------------------------------------------------------------------------------


def test_report_rows_in_order_with_e_standing_in_only_without_a_rates() -> None:
    measurements = run_of_issue16()
    assert flow_labels(measurements) == ["a", "a@1000/s", "a@5000/s", "b", "b@leader", "b@1000/s"]
    without_a_rates = [m for m in measurements if not m.label.startswith("a@")]
    assert flow_labels(without_a_rates) == ["a", "e@1000/s", "b", "b@leader", "b@1000/s"]
    assert describe("e@1000/s") == ("(a) durable classic queue, 1 node", "fixed 1,000 msg/s")
    assert describe("b@5000/s") == ("(b) quorum queue, 3 replicas on 3 nodes", "fixed 5,000 msg/s, clients on 2 followers")
    assert describe("c") is None and describe("a/new-q") is None


def test_report_cells_are_medians_over_rounds_that_did_not_fail() -> None:
    measurements = run_of_issue16(rounds=3)  # (b) raftmq delivered 3,500 / 4,000 / 4,500
    assert median_figure(measurements, "raftmq", "b", "delivered_msgs_per_s") == 4_000.0
    assert median_figure(measurements, "raftmq", "b@1000/s", "delivered_msgs_per_s") is None  # every round failed
    assert median_figure(measurements, "rabbitmq", "b@1000/s", "delivered_msgs_per_s") is None  # never measured


def test_targets_are_checked_against_the_figures() -> None:
    verdicts = {t.what: t.verdict for t in targets(run_of_issue16(), [FailoverFigures("raftmq", (250.0, 280.0))])}
    assert verdicts["(b) saturation: raftmq delivered/s at least RabbitMQ's"] == "met"  # 3,500 >= 3,000
    assert verdicts["(b) saturation: raftmq e2e p99 no higher than RabbitMQ's"] == "NOT met"  # 900 > 100
    assert verdicts["(b@leader) saturation: raftmq e2e p99 no higher than RabbitMQ's"] == "met"
    assert verdicts["raftmq delivered/s within 5% of confirmed/s in every flow"] == "NOT met"  # (b): 12.5% short
    assert verdicts["new quorum queue: first confirm under 20 ms (p99)"] == "NOT met"
    assert verdicts["new quorum queue: declare-ok under 50 ms (p99)"] == "NOT met"
    assert verdicts["failover at most 300 ms (every run)"] == "met"
    no_failover = {t.what: t.verdict for t in targets(run_of_issue16(), [FailoverFigures("raftmq", (), "no node")])}
    assert no_failover["failover at most 300 ms (every run)"] == "n/a"
    both = targets(run_of_issue16(), [FailoverFigures("raftmq", (250.0, 400.0, 280.0)),
                                      FailoverFigures("rabbitmq", (300.0, 310.0))])
    compared = [t for t in both if t.what == "failover (median) no slower than RabbitMQ's"]
    assert [(t.verdict, t.figures) for t in compared] == [("met", "280 / 305 ms")]
    assert {t.what: t.verdict for t in both}["failover at most 300 ms (every run)"] == "NOT met"  # 400 ms once


def test_issue16_text_has_every_part() -> None:
    text = format_issue16(run_of_issue16(), [FailoverFigures("raftmq", (550.0, 610.0, 580.0))],
                          "2026-11-27T03:00:00Z", "3.10.8", rounds=1)
    lines = text.splitlines()
    assert lines[0] == "Issue 16 figures: raftmq / RabbitMQ 3.10.8 in every cell, run started 2026-11-27T03:00:00Z"
    assert ("| (a) durable classic queue, 1 node | saturation | 10,000 / 5,000 | 9,990 / 5,000 | 50.0 / 80.0 "
            "| 100.0 / 200.0 | 150.0 / 210.0 |  |") in lines
    assert any(line.startswith("| (b) quorum queue, 3 replicas on 3 nodes | saturation, clients on 2 followers |")
               and "raftmq BACKLOG: delivered 12% below confirmed" in line for line in lines)
    assert any("fixed 1,000 msg/s, clients on 2 followers | error / - |" in line and "raftmq error: boom" in line
               for line in lines)
    assert "| (b) quorum queue, 3 replicas on 3 nodes | 40.0 / 30.0 | 60.0 / 35.0 | 600.0 / 7.0 | 700.0 / 9.0" \
        " | 610.0 / 8.0 | 710.0 / 10.0 |  |" in lines
    assert "| first confirm after the kill | median 580 ms, max 610 ms (n=3) | not measured |" in lines
    assert "| failover at most 300 ms (every run) | NOT met | median 580 ms, max 610 ms (n=3) |" in lines


# --- CLI wiring ---------------------------------------------------------------------------------------------


def test_cli_checks_rates_and_rates_for(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.parse_rates("1000, 5000") == (1000, 5000)
    assert cli.parse_rates_for("b,a") == ("b", "a")
    assert cli.main(["--rates-for", "c"]) == 2
    assert "--rates-for" in capsys.readouterr().err
    assert cli.main(["--rates", "0"]) == 2
    assert cli.main(["--new-queue-trials", "-1"]) == 2


def test_cli_report_issue16_runs_a_and_b_with_rates_new_queues_and_failover(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[tuple[str, str, RunSettings]] = []

    @contextlib.contextmanager
    def fake_broker(*args: object) -> Iterator[Endpoint]:
        yield Endpoint("127.0.0.1", 1)

    @contextlib.contextmanager
    def fake_cluster(*args: object) -> Iterator[SimpleNamespace]:
        yield SimpleNamespace(nodes=(ClusterNode("n1", Endpoint("127.0.0.1", 1)),))

    def fake_workload(workload: str, broker: str, endpoint: object, settings: RunSettings) -> list[Measurement]:
        seen.append((workload, broker, settings))
        return [m for m in run_of_issue16() if m.broker == broker and m.workload in (workload, "e")
                and m.label[0] == workload]

    def fake_quorum(broker: str, cluster: object, settings: RunSettings) -> list[Measurement]:
        seen.append(("b", broker, settings))
        return [m for m in run_of_issue16() if m.broker == broker and m.workload == "b"]

    monkeypatch.setattr(cli, "raftmq_node", fake_broker)
    monkeypatch.setattr(cli, "_rabbit_nodes", fake_broker)
    monkeypatch.setattr(cli, "raftmq_cluster", fake_cluster)
    monkeypatch.setattr(cli, "rabbitmq_cluster", fake_cluster)
    monkeypatch.setattr(cli, "rabbitmq_available", lambda: True)
    monkeypatch.setattr(cli, "rabbitmq_version", lambda: "3.10.8")
    monkeypatch.setattr(cli, "run_workload", fake_workload)
    monkeypatch.setattr(cli, "run_quorum_workload", fake_quorum)
    monkeypatch.setattr(cli, "write_chart", lambda report, path: None)
    failovers: list[tuple[int, str]] = []

    def fake_failover(runs: int, broker: str) -> FailoverFigures:
        failovers.append((runs, broker))
        return FailoverFigures(broker, (500.0 if broker == "raftmq" else 300.0,) * runs)

    monkeypatch.setattr(cli, "_measure_failover", fake_failover)
    status = cli.main(["--report", "issue16", "--duration", "1", "--output", str(tmp_path)])
    assert status == 1  # the fake (b)@1000/s carries an error
    assert [(workload, broker) for workload, broker, _ in seen] == [
        ("a", "raftmq"), ("b", "raftmq"), ("a", "rabbitmq"), ("b", "rabbitmq")]
    settings = seen[0][2]
    assert (settings.rates_for, settings.latency_rates_msgs_per_s, settings.new_queue_trials) == (
        ("a", "b"), (1000, 5000), 5)
    assert failovers == [(3, "raftmq"), (3, "rabbitmq")]
    out = capsys.readouterr().out
    assert "Issue 16 figures: raftmq / RabbitMQ 3.10.8" in out
    [markdown] = tmp_path.glob("bench-*-issue16.md")
    assert "| median 500 ms, max 500 ms (n=3) | median 300 ms, max 300 ms (n=3) |" in markdown.read_text()
    assert cli.main(["--history", "--report", "issue16", "--output", str(tmp_path)]) == 0
    assert "Issue 16 figures" in capsys.readouterr().out


def test_cli_default_run_has_new_queue_trials_but_no_extra_rates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[RunSettings] = []

    def fake_workload(workload: str, broker: str, endpoint: Endpoint, settings: RunSettings) -> list[Measurement]:
        seen.append(settings)
        return []

    monkeypatch.setattr(cli, "run_workload", fake_workload)
    assert cli.main(["--target", "127.0.0.1:1", "--workloads", "a", "--output", str(tmp_path)]) == 0
    assert (seen[0].new_queue_trials, seen[0].rates_for, seen[0].latency_rates_msgs_per_s) == (5, (), (1000, 2000, 5000))


def test_cli_report_issue16_in_rounds_gives_medians(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rounds_seen: list[str] = []

    @contextlib.contextmanager
    def fake_node(*args: object) -> Iterator[Endpoint]:
        yield Endpoint("127.0.0.1", 1)

    def fake_workload(workload: str, broker: str, endpoint: object, settings: RunSettings) -> list[Measurement]:
        rounds_seen.append(broker)
        return [flow("a", broker, 1000.0 * len(rounds_seen), 1000.0 * len(rounds_seen))]

    monkeypatch.setattr(cli, "raftmq_node", fake_node)
    monkeypatch.setattr(cli, "_rabbit_nodes", fake_node)
    monkeypatch.setattr(cli, "rabbitmq_available", lambda: True)
    monkeypatch.setattr(cli, "rabbitmq_version", lambda: "3.10.8")
    monkeypatch.setattr(cli, "run_workload", fake_workload)
    monkeypatch.setattr(cli, "write_chart", lambda report, path: None)
    argv = ["--report", "issue16", "--workloads", "a", "--rounds", "2", "--failover-runs", "0", "--output", str(tmp_path)]
    assert cli.main(argv) == 0
    assert rounds_seen == ["raftmq", "rabbitmq", "rabbitmq", "raftmq"]  # ABBA: raftmq 1,000 and 4,000
    out = capsys.readouterr().out
    assert "in every cell, run started" in out and "each cell the median of 2 rounds" in out
    assert "| (a) durable classic queue, 1 node | saturation | 2,500 / 2,500 |" in out
    assert "| first confirm after the kill | not measured | not measured |" in out
