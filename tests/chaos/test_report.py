"""Reports from hand-built histories: throughput/latency series, fault spans, and the files written."""

from __future__ import annotations

import json
from pathlib import Path

from chaos.checker import check
from chaos.history import Delivery, Fault, Publish, Record, read_history
from chaos.report import fault_spans, report_text, series, write_report


def history() -> list[Record]:
    return [
        Publish("p0", 0, "r-p0-0", "q", "confirmed", 0.0, 10.0),
        Publish("p0", 1, "r-p0-1", "q", "confirmed", 100.0, 130.0),
        Fault("kill", "rmq1", 200.0),
        Publish("p0", 2, "r-p0-2", "q", "unknown", 210.0, None),
        Fault("up", "rmq1", 900.0),
        Fault("pause", "rmq1", 1000.0),
        Fault("resume", "rmq1", 1500.0),
        Fault("partition", "halves", 1600.0, "rmq1|rmq2"),
        Fault("heal", "network", 1700.0),
        Delivery("r-p0-0", "c0", "q", False, 20.0),
        Delivery("r-p0-1", "c0", "q", False, 1100.0),
        Fault("drain", "workload", 1800.0),
    ]


def test_series_bins_confirms_deliveries_and_latency() -> None:
    data = series(history(), bin_ms=500.0)
    assert data.confirmed_per_s[0] == 4.0  # two confirms in the first half second
    assert data.delivered_per_s[:3] == [2.0, 0.0, 2.0]
    assert data.latency_p50_ms[0] == 30.0 and data.latency_max_ms[0] == 30.0
    assert data.latency_p50_ms[1] is None


def test_fault_spans_pair_each_fault_with_its_undo() -> None:
    spans = [(s.kind, s.target, s.start_ms, s.end_ms) for s in fault_spans(history())]
    assert spans == [("kill", "rmq1", 200.0, 900.0), ("pause", "rmq1", 1000.0, 1500.0),
                     ("partition", "halves", 1600.0, 1700.0), ("drain", "workload", 1800.0, None)]


def test_write_report_writes_text_json_png_and_history(tmp_path: Path) -> None:
    records = history()
    publishes = [r for r in records if isinstance(r, Publish)]
    deliveries = [r for r in records if isinstance(r, Delivery)]
    result = check(publishes, deliveries)
    report = write_report(tmp_path, "demo", result, records, {"drained": True})
    assert report["valid"] and report["summary"]["confirmed"] == 2
    assert json.loads((tmp_path / "report.json").read_text())["scenario"] == "demo"
    assert "PASS" in (tmp_path / "report.txt").read_text()
    assert (tmp_path / "timeline.png").read_bytes().startswith(b"\x89PNG")
    assert list(read_history(tmp_path / "history.jsonl")) == records


def test_text_report_names_the_lost() -> None:
    records = history()
    publishes = [r for r in records if isinstance(r, Publish)]
    result = check(publishes, [])
    from chaos.report import report_json
    text = report_text(report_json("demo", result, records, {}))
    assert "FAIL" in text and "LOST 2" in text and "r-p0-0" in text


def test_reports_carry_availability_and_the_suite_table_has_a_row_per_run() -> None:
    from chaos.report import report_json, summary_table

    records = history()
    publishes = [r for r in records if isinstance(r, Publish)]
    deliveries = [r for r in records if isinstance(r, Delivery)]
    report = report_json("demo", check(publishes, deliveries), records, {"drained": True})
    # Faults: kill (nothing sent after it is confirmed), pause, partition; the 120 ms gap is between the confirms.
    assert report["availability"]["confirm_gap_ms_max"] == 120.0
    assert [f["first_confirm_after_ms"] for f in report["availability"]["faults"]] == [None, None, None, None,
                                                                                      None]
    assert "unavailability: longest gap between confirms 120 ms, longest wait for one confirm 30 ms" in report_text(
        report)
    table = summary_table([report, {**report, "scenario": "other", "valid": False}]).splitlines()
    assert len(table) == 4 and table[2].startswith("| demo | PASS | 3 | 2 | 2 | 0 | 0 |")
    assert table[3].startswith("| other | FAIL") and table[2].endswith("| 120 | 30 | never |")
